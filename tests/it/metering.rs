//! Metering over a real server and the mock agent: what agents report (`usage_update` costs,
//! prompt replies' tokens) summed per session, principal and profile by `GetUsage`, kept in the
//! store across a restart; budgets from the tokens file refusing prompts with BUDGET_EXHAUSTED.

use std::time::Duration;

use agent_harness::pb::v1::{self as pb};
use tonic::Code;

use crate::{
    auth::{self, ADA, BOB, TokensFile, client, with_tokens},
    harness::{Harness, assert_error, bounded, expect_err},
    operations::{sample, scrape},
    support::{Session, Watch, mock_profile, prompt},
};

/// Sends a prompt and waits for its reply: the usage the turn reported is stored with the
/// frames that reported it, so once the reply is in the log, so is the usage.
async fn turn(session: &mut Session, watch: &mut Watch, text: &str) -> serde_json::Value {
    let reply = session.prompt(text).await;
    watch.response_to(&reply.action_id).await
}

async fn usage(
    client: &mut auth::Client,
    principal: &str,
) -> Result<pb::GetUsageResponse, tonic::Status> {
    client
        .get_usage(pb::GetUsageRequest {
            principal: principal.to_owned(),
            since: None,
        })
        .await
        .map(|r| r.into_inner())
}

fn money(amount: &str, currency: &str) -> pb::Money {
    pb::Money {
        amount: amount.to_owned(),
        currency: currency.to_owned(),
    }
}

fn totals(input: u64, output: u64, costs: Vec<pb::Money>) -> Option<pb::UsageTotals> {
    Some(pb::UsageTotals {
        input_tokens: input,
        output_tokens: output,
        costs,
    })
}

#[tokio::test]
async fn three_turns_across_two_sessions_sum_per_principal_and_profile_and_survive_a_restart() {
    bounded(async {
        let data = tempfile::tempdir().unwrap();
        let configure = |config: &mut agent_harness::config::ServeConfig| {
            config.data_dir = data.path().join("data");
            config.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
            // Resumable, so the session reopens after the restart.
            mock_profile(config, "metered", &["--resume"]);
        };
        let h = Harness::start_with(configure).await;
        // In the data dir that outlives the first server, so the session reopens after it.
        let request = pb::CreateSessionRequest {
            profile: "metered".into(),
            cwd: agent_harness_testkit::workspace_in(data.path())
                .to_string_lossy()
                .into_owned(),
            ..Default::default()
        };
        let mut first = Session::create_with(&h, request.clone()).await;
        let mut second = Session::create_with(&h, request).await;
        let mut first_watch = first.watch().await;
        let mut second_watch = second.watch().await;
        // `usage_update` costs are the session's running total: 0.05, then 0.12 (adds 0.07).
        turn(
            &mut first,
            &mut first_watch,
            "one\n@usage 1000 200000 0.05 USD\n@turn-usage 100 20",
        )
        .await;
        turn(
            &mut first,
            &mut first_watch,
            "two\n@usage 2000 200000 0.12 USD\n@turn-usage 200 40",
        )
        .await;
        turn(
            &mut second,
            &mut second_watch,
            "three\n@usage 500 200000 0.03 USD\n@turn-usage 50 10",
        )
        .await;

        let expected = |answer: &pb::GetUsageResponse| {
            assert_eq!(
                answer.principals,
                vec![pb::PrincipalUsage {
                    principal: "local".into(),
                    totals: totals(350, 70, vec![money("0.15", "USD")]),
                }]
            );
            assert_eq!(
                answer.profiles,
                vec![pb::ProfileUsage {
                    profile: "metered".into(),
                    totals: totals(350, 70, vec![money("0.15", "USD")]),
                }]
            );
            let by_id = |id: &str| {
                answer
                    .sessions
                    .iter()
                    .find(|s| s.session_id == id)
                    .cloned()
                    .expect("the session's usage")
            };
            assert_eq!(
                by_id(&first.id).totals,
                totals(300, 60, vec![money("0.12", "USD")])
            );
            assert_eq!(
                by_id(&second.id).totals,
                totals(50, 10, vec![money("0.03", "USD")])
            );
            assert_eq!(answer.budget, None, "no tokens file, no budget");
        };
        let mut local = auth::client(&h, None, None);
        expected(&usage(&mut local, "").await.unwrap());

        // Prometheus carries the sums per profile only.
        let metrics = scrape(h.metrics_addr().unwrap()).await;
        assert_eq!(
            sample(
                &metrics,
                r#"agent_harness_usage_tokens_total{profile="metered",direction="input"}"#
            ),
            350.0,
            "{metrics}"
        );
        assert_eq!(
            sample(
                &metrics,
                r#"agent_harness_usage_cost_micros_total{profile="metered",currency="USD"}"#
            ),
            150_000.0
        );
        assert!(!metrics.contains(&first.id), "no session label");
        // Time to first output is a histogram with buckets (the dashboard's quantiles need them).
        assert!(
            sample(&metrics, "agent_harness_turn_first_output_seconds_count") >= 3.0,
            "{metrics}"
        );
        assert!(metrics.contains("agent_harness_turn_first_output_seconds_bucket{le="));

        h.shutdown().await;
        let h = Harness::start_with(configure).await;
        let mut local = auth::client(&h, None, None);
        expected(&usage(&mut local, "").await.unwrap());
        // The cost a session reports after the restart adds only what is new.
        let mut first = Session::attach(h.sessions(), &first.id);
        let mut watch = first.watch().await;
        turn(&mut first, &mut watch, "four\n@usage 100 200000 0.20 USD").await;
        let after = usage(&mut local, "local").await.unwrap();
        assert_eq!(
            after.principals[0].totals,
            totals(350, 70, vec![money("0.23", "USD")])
        );
        // All of it the agent's word: its profile does not go through the model proxy.
        assert_eq!(
            after.sources,
            vec![pb::SourceUsage {
                source: pb::UsageSource::Agent as i32,
                totals: totals(350, 70, vec![money("0.23", "USD")]),
            }]
        );
        h.shutdown().await;
    })
    .await;
}

async fn log_len(client: &mut auth::Client, id: &str) -> usize {
    client
        .read_log(pb::ReadLogRequest {
            session_id: id.to_owned(),
            after_offset: 0,
            limit: 5000,
        })
        .await
        .unwrap()
        .into_inner()
        .entries
        .len()
}

fn budget_rows(ada_budget: &str) -> String {
    let mut text = auth::tokens_text(&[(ADA, "ada", "user")]);
    text.push_str(&format!("budget = {ada_budget}\n\n"));
    text.push_str(&auth::tokens_text(&[(BOB, "bob", "user")]));
    text
}

#[tokio::test]
async fn a_spent_budget_refuses_the_next_prompt_storing_nothing_while_the_crossing_turn_ends_and_others_go_on()
 {
    bounded(async {
        let file = TokensFile::new(&[]);
        file.replace(&budget_rows(
            r#"{ cost = "0.10", currency = "USD", period = "month" }"#,
        ));
        let h = Harness::start_with(|config| {
            with_tokens(config, &file.path, Some(Duration::from_millis(50)))
        })
        .await;
        let mut ada = client(&h, Some(ADA), None);
        let mut bob = client(&h, Some(BOB), None);
        let request = crate::support::create_request(&h, "mock");
        let created = ada
            .create_session(request.clone())
            .await
            .unwrap()
            .into_inner();
        let id = created.session.unwrap().id;
        let mut watch = auth::watch(&mut ada, &id).await;
        let control = |text: &str| pb::ControlRequest {
            session_id: id.clone(),
            action: Some(prompt(text)),
            ..Default::default()
        };

        // The turn crosses the budget half-way (0.25 of 0.10) and still runs to its end.
        let reply = ada
            .control(control("spend\n@usage 1000 200000 0.25 USD\n@chunks 1 20"))
            .await
            .unwrap()
            .into_inner();
        let response = watch.response_to(&reply.action_id).await;
        assert_eq!(response["result"]["stopReason"], "end_turn");
        assert!(
            watch.entries.iter().any(|e| e.json.contains("#0:")),
            "the output after the crossing arrived"
        );

        let log_before = log_len(&mut ada, &id).await;
        let refused = expect_err(ada.control(control("more")).await);
        assert_error(&refused, Code::ResourceExhausted, "BUDGET_EXHAUSTED");
        assert!(
            refused.message().contains("0.25 of 0.10 USD"),
            "{}",
            refused.message()
        );
        assert_eq!(log_len(&mut ada, &id).await, log_before, "nothing stored");
        let queue = ada
            .get_queue(pb::GetQueueRequest {
                session_id: id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(queue.entries.is_empty());
        // A new session opened with a prompt is refused the same way; one without is not.
        let opened = pb::CreateSessionRequest {
            origin: Some(pb::create_session_request::Origin::TaskAssignment(
                pb::TaskAssignment {
                    prompt: "hello".into(),
                    ..Default::default()
                },
            )),
            ..request.clone()
        };
        assert_error(
            &expect_err(ada.create_session(opened).await),
            Code::ResourceExhausted,
            "BUDGET_EXHAUSTED",
        );

        // Ada's usage shows the spent budget; Bob is unaffected.
        let ada_usage = usage(&mut ada, "").await.unwrap();
        let budget = ada_usage.budget.expect("ada's budget");
        assert!(budget.exhausted);
        assert_eq!(budget.cost_limit, Some(money("0.10", "USD")));
        assert_eq!(budget.used, totals(0, 0, vec![money("0.25", "USD")]));
        assert_error(
            &expect_err(usage(&mut ada, "bob").await),
            Code::PermissionDenied,
            "FORBIDDEN",
        );
        let bobs = bob.create_session(request).await.unwrap().into_inner();
        let bobs_id = bobs.session.unwrap().id;
        bob.control(pb::ControlRequest {
            session_id: bobs_id,
            action: Some(prompt("bob's turn")),
            ..Default::default()
        })
        .await
        .expect("another principal is unaffected");
        assert_eq!(usage(&mut bob, "").await.unwrap().budget, None);

        // A malformed budget on reload is refused naming file and key; the old one holds.
        file.replace(&budget_rows(r#"{ cost = "lots", currency = "USD" }"#));
        let error = format!("{:#}", h.server().reload_tokens().unwrap().unwrap_err());
        assert!(
            error.contains("tokens.toml") && error.contains("tokens[0].budget.cost"),
            "{error}"
        );
        assert_error(
            &expect_err(ada.control(control("still spent")).await),
            Code::ResourceExhausted,
            "BUDGET_EXHAUSTED",
        );
        // A larger budget on reload applies at once.
        file.replace(&budget_rows(r#"{ cost = "1.00", currency = "USD" }"#));
        h.server().reload_tokens().unwrap().unwrap();
        ada.control(control("within budget again"))
            .await
            .expect("the new budget is in force");
    })
    .await;
}

#[tokio::test]
async fn a_compaction_is_refused_once_the_budget_is_spent_and_stores_nothing() {
    bounded(async {
        let file = TokensFile::new(&[]);
        file.replace(&budget_rows(
            r#"{ cost = "0.10", currency = "USD", period = "month" }"#,
        ));
        let h = Harness::start_with(|config| {
            with_tokens(config, &file.path, Some(Duration::from_millis(50)))
        })
        .await;
        let mut ada = client(&h, Some(ADA), None);
        let request = crate::support::create_request(&h, "mock");
        let id = ada
            .create_session(request)
            .await
            .unwrap()
            .into_inner()
            .session
            .unwrap()
            .id;
        let mut watch = auth::watch(&mut ada, &id).await;
        let reply = ada
            .control(pb::ControlRequest {
                session_id: id.clone(),
                action: Some(prompt("spend\n@usage 1000 200000 0.25 USD")),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        watch.response_to(&reply.action_id).await;

        let log_before = log_len(&mut ada, &id).await;
        let refused = expect_err(
            ada.control(pb::ControlRequest {
                session_id: id.clone(),
                action: Some(pb::control_request::Action::Compact(pb::CompactAction {})),
                ..Default::default()
            })
            .await,
        );
        assert_error(&refused, Code::ResourceExhausted, "BUDGET_EXHAUSTED");
        assert_eq!(log_len(&mut ada, &id).await, log_before, "nothing stored");
        let queue = ada
            .get_queue(pb::GetQueueRequest {
                session_id: id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(queue.entries.is_empty(), "nothing queued");
    })
    .await;
}

#[tokio::test]
async fn an_agent_reporting_six_quintillion_tokens_twice_is_clamped_and_get_usage_still_answers() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        for _ in 0..2 {
            turn(
                &mut session,
                &mut watch,
                "absurd\n@turn-usage 6000000000000000000 6000000000000000000",
            )
            .await;
        }
        let mut local = auth::client(&h, None, None);
        let answer = usage(&mut local, "")
            .await
            .expect("GetUsage answers, however large the figures");
        let sums = answer.principals[0].totals.clone().expect("the sums");
        // Each report was taken for a sane figure (clamped and logged), not for what it said.
        assert_eq!(sums.input_tokens, sums.output_tokens);
        assert!(
            sums.input_tokens > 0 && sums.input_tokens < 6_000_000_000_000_000_000,
            "{sums:?}"
        );
        h.shutdown().await;
    })
    .await;
}

/// A preset's model-proxy route whose key is not set at the runtime's start (an agent signed in
/// some other way) leaves the proxy off for that start, so the agent's own reports count.
#[tokio::test]
async fn without_the_presets_key_the_proxy_stays_off_and_the_agents_reports_count() {
    bounded(async {
        let h = Harness::start_with(|config| {
            crate::support::mock_profile_with(config, "keyless", &[], |profile| {
                let policy = profile.sandbox.as_mut().expect("boxed");
                policy.model = vec![agent_harness::model_proxy::ModelRoute {
                    provider: agent_harness::model_proxy::Provider::Anthropic,
                    key_var: "AGENT_HARNESS_TEST_UNSET_MODEL_KEY".into(),
                    upstream: None,
                    when_key_set: true,
                }];
            });
        })
        .await;
        let mut session = Session::create(&h, "keyless").await;
        let mut watch = session.watch().await;
        turn(&mut session, &mut watch, "count\n@turn-usage 120 30").await;
        let mut local = auth::client(&h, None, None);
        let answer = usage(&mut local, "").await.unwrap();
        let totals = answer.profiles[0].totals.clone().unwrap_or_default();
        assert_eq!((totals.input_tokens, totals.output_tokens), (120, 30));
        assert_eq!(answer.sources[0].source, pb::UsageSource::Agent as i32);
    })
    .await;
}
