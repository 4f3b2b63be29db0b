//! Agent features (docs/features.md): "start only if idle", permission rules and
//! timeouts, fork, what the agent reports about itself, and a chosen model and config options
//! re-applied after a reopen.

use std::time::Duration;

use agent_harness::{
    config::{PermissionRule, RuleDecision},
    pb::v1::{self as pb, control_request::Action},
};
use tonic::Code;

use crate::{
    harness::{Harness, assert_error, bounded, expect_err},
    support::{Session, answer_request, mock_profile_with, prompt, stop},
};

fn expecting_idle(session: &Session, action: Action) -> pb::ControlRequest {
    pb::ControlRequest {
        expect: pb::Expect::Idle as i32,
        ..session.control_request(action)
    }
}

fn rule(kind: &str, decision: RuleDecision) -> PermissionRule {
    PermissionRule {
        kind: Some(kind.to_owned()),
        title_regex: None,
        decision,
    }
}

#[tokio::test]
async fn expect_idle_while_a_turn_runs_is_refused_as_session_busy_and_stores_nothing() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("@wait-cancel").await;
        watch.status(pb::SessionStatus::Running).await;
        let action_id = uuid::Uuid::now_v7().to_string();
        let request = pb::ControlRequest {
            action_id: Some(action_id.clone()),
            ..expecting_idle(&session, prompt("only if idle"))
        };
        let refused = expect_err(session.control(request).await);
        assert_error(&refused, Code::FailedPrecondition, "SESSION_BUSY");
        let compact = expect_err(
            session
                .control(expecting_idle(
                    &session,
                    Action::Compact(pb::CompactAction {}),
                ))
                .await,
        );
        assert_error(&compact, Code::FailedPrecondition, "SESSION_BUSY");
        assert!(session.queue().await.is_empty(), "nothing was queued");
        // The running turn still logs its own output; nothing of the refused actions is there.
        let log = session.log().await;
        assert!(
            log.iter()
                .all(|e| e.action_id.as_deref() != Some(action_id.as_str())
                    && !e.json.contains("only if idle")
                    && !e.json.contains("/compact")),
            "the refused actions appear nowhere in the log"
        );
        session.act(stop(false)).await.unwrap();
        watch.response_to(&turn.action_id).await;
    })
    .await
}

#[tokio::test]
async fn expect_idle_on_an_idle_session_is_sent_and_with_work_queued_is_busy() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let sent = session
            .control(expecting_idle(&session, prompt("@wait-cancel")))
            .await
            .unwrap();
        assert_eq!(sent.status, pb::ControlStatus::Sent as i32);
        // Plain delivery still queues behind the turn; then "only if idle" sees the queue too.
        let queued = session.prompt("later").await;
        assert_eq!(queued.status, pb::ControlStatus::Queued as i32);
        session.act(stop(false)).await.unwrap();
        watch.response_to(&sent.action_id).await;
        watch.response_to(&queued.action_id).await;
        watch.status(pb::SessionStatus::Idle).await;
        let again = session
            .control(expecting_idle(&session, prompt("now idle")))
            .await
            .unwrap();
        assert_eq!(again.status, pb::ControlStatus::Sent as i32);
        // Only prompts and compacts take a condition.
        let odd = expect_err(session.control(expecting_idle(&session, stop(false))).await);
        assert_error(&odd, Code::InvalidArgument, "INVALID_ARGUMENT");
    })
    .await
}

#[tokio::test]
async fn a_rule_allowing_read_and_rejecting_execute_answers_each_without_a_person_and_logs_which_rule()
 {
    bounded(async {
        let h = Harness::start_with(|config| {
            mock_profile_with(config, "ruled", &[], |profile| {
                profile.permission_rules = vec![
                    rule("read", RuleDecision::AllowOnce),
                    rule("execute", RuleDecision::RejectOnce),
                ];
            })
        })
        .await;
        let mut session = Session::create(&h, "ruled").await;
        let mut watch = session.watch().await;
        let turn = session
            .prompt("@permission-kind read Read the notes\n@permission-kind execute Run rm -rf")
            .await;
        watch.chunk("permission: selected allow-once").await;
        watch.chunk("permission: selected reject-once").await;
        assert_eq!(
            watch.response_to(&turn.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        let decided: Vec<serde_json::Value> = session
            .log()
            .await
            .iter()
            .filter(|e| e.direction == pb::LogDirection::Event as i32)
            .map(|e| serde_json::from_str::<serde_json::Value>(&e.json).unwrap())
            .filter(|event| event["event"] == "permission_decided")
            .collect();
        assert_eq!(decided.len(), 2, "{decided:?}");
        assert_eq!(decided[0]["by"], "rule");
        assert_eq!(decided[0]["rule"], 0);
        assert_eq!(decided[0]["decision"], "allow_once");
        assert_eq!(decided[0]["answer"]["selected"], "allow-once");
        assert_eq!(decided[1]["rule"], 1);
        assert_eq!(decided[1]["decision"], "reject_once");
        assert_eq!(decided[1]["answer"]["selected"], "reject-once");
        // Nobody was asked: the session never waited for input.
        assert!(
            !watch
                .statuses
                .contains(&(pb::SessionStatus::AwaitingInput as i32)),
            "{:?}",
            watch.statuses
        );
    })
    .await
}

#[tokio::test]
async fn a_permission_timeout_answers_with_the_first_reject_option_and_logs_it() {
    bounded(async {
        let h = Harness::start_with(|config| {
            mock_profile_with(config, "impatient", &[], |profile| {
                profile.permission_timeout = Some(Duration::from_millis(200));
            })
        })
        .await;
        let mut session = Session::create(&h, "impatient").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("@permission").await;
        watch.status(pb::SessionStatus::AwaitingInput).await;
        watch.chunk("permission: selected reject-once").await;
        let event = watch.event("permission_decided").await;
        assert_eq!(event["by"], "timeout");
        assert_eq!(event["timeout"], "200ms");
        assert_eq!(event["answer"]["selected"], "reject-once");
        assert_eq!(
            watch.response_to(&turn.action_id).await["result"]["stopReason"],
            "end_turn"
        );
    })
    .await
}

#[tokio::test]
async fn a_turn_past_its_turn_timeout_ends_failed_and_the_next_prompt_gets_its_own_reply() {
    bounded(async {
        let h = Harness::start_with(|config| {
            mock_profile_with(config, "hurried", &[], |profile| {
                profile.turn_timeout = Some(Duration::from_millis(300));
            })
        })
        .await;
        let mut session = Session::create(&h, "hurried").await;
        let mut watch = session.watch().await;
        // The mock agent works until it is told to stop: as an agent retrying a model API.
        let stuck = session.prompt("@wait-cancel").await;
        let failed = watch.event("turn_failed").await;
        assert_eq!(failed["failed_turn"], stuck.action_id.as_str());
        let ended = watch.event("turn_ended").await;
        assert_eq!(ended["request_id"], stuck.action_id.as_str());
        assert_eq!(ended["stop_reason"], "failed");
        assert!(
            ended["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("turn timed out after 300ms")),
            "{ended}"
        );
        // The agent was asked to stop, and did; the session takes the next prompt.
        assert_eq!(
            watch.response_to(&stuck.action_id).await["result"]["stopReason"],
            "cancelled"
        );
        let next = session.prompt("after the limit").await;
        let answer = watch.response_to(&next.action_id).await;
        assert_eq!(answer["result"]["stopReason"], "end_turn");
        watch.chunk("echo: after the limit").await;
        let transcript = session.transcript().await;
        let failed = transcript
            .messages
            .iter()
            .find(|m| m.id == "1:agent")
            .unwrap();
        assert_eq!(failed.stop_reason, Some(pb::StopReason::Failed as i32));
        let replied = transcript
            .messages
            .iter()
            .find(|m| m.id == "2:agent")
            .unwrap();
        assert_eq!(replied.stop_reason, Some(pb::StopReason::EndTurn as i32));
    })
    .await
}

#[tokio::test]
async fn time_a_turn_waits_on_a_person_does_not_count_against_its_turn_timeout() {
    bounded(async {
        let h = Harness::start_with(|config| {
            mock_profile_with(config, "hurried", &[], |profile| {
                profile.turn_timeout = Some(Duration::from_millis(500));
            })
        })
        .await;
        let mut session = Session::create(&h, "hurried").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("@permission Deploy").await;
        let request = watch.agent_request("session/request_permission").await;
        // A person takes three times the limit to answer; the agent's own time is far below it.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let held = session.get().await;
        assert_eq!(held.status, pb::SessionStatus::AwaitingInput as i32);
        session
            .act(answer_request(&request, Some("allow-once")))
            .await
            .unwrap();
        assert_eq!(
            watch.response_to(&turn.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        let log = session.log().await;
        assert!(
            !log.iter().any(|entry| entry.json.contains("turn_failed")),
            "the turn was not timed out"
        );
    })
    .await
}

#[tokio::test]
async fn usage_updates_show_on_get_session_with_what_the_agent_says_about_itself() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let first = session
            .prompt("@usage 1000 200000\n@commands\n@plan Read|Write")
            .await;
        watch.response_to(&first.action_id).await;
        let got = session.get().await;
        let usage = got.usage.expect("usage is reported");
        assert_eq!((usage.used_tokens, usage.context_size), (1000, 200000));
        assert_eq!(usage.cost, None);
        let info = got.agent_info.expect("the mock agent names itself");
        assert_eq!(info.name, "agent-harness-mock");
        assert!(!info.version.is_empty());
        let capabilities: serde_json::Value =
            serde_json::from_str(&got.agent_capabilities_json).unwrap();
        assert!(
            capabilities["sessionCapabilities"]["resume"].is_object(),
            "{capabilities}"
        );
        let commands: serde_json::Value =
            serde_json::from_str(&got.available_commands_json).unwrap();
        assert_eq!(commands[0]["name"], "test");
        let plan: serde_json::Value = serde_json::from_str(&got.plan_json).unwrap();
        assert_eq!(plan[0]["content"], "Read");
        assert_eq!(plan[1]["status"], "pending");

        // A later update replaces the figures, with the cost when the agent sends one.
        let second = session.prompt("@usage 53000 200000 0.045 USD").await;
        watch.response_to(&second.action_id).await;
        let usage = session.get().await.usage.unwrap();
        assert_eq!(usage.used_tokens, 53000);
        let cost = usage.cost.expect("a cost");
        assert_eq!((cost.amount, cost.currency.as_str()), (0.045, "USD"));
        let metadata = session.transcript().await.metadata.unwrap();
        assert_eq!(metadata.usage.unwrap().used_tokens, 53000);
        assert_eq!(metadata.agent_info.unwrap().name, "agent-harness-mock");
        assert!(metadata.plan_json.contains("Write"));
    })
    .await
}

#[tokio::test]
async fn a_model_chosen_before_a_restart_is_re_applied_after_the_reopen() {
    bounded(async {
        // The data directory and the session's cwd outlive the first server.
        let data = tempfile::TempDir::new().unwrap();
        let on_data = |c: &mut agent_harness::config::ServeConfig| {
            c.data_dir = data.path().join("data");
        };
        let first = Harness::start_with(on_data).await;
        let mut request = crate::support::create_request(&first, "mock");
        request.cwd = agent_harness_testkit::workspace_in(data.path())
            .to_string_lossy()
            .into_owned();
        let mut session = Session::create_with(&first, request).await;
        let mut watch = session.watch().await;
        let chosen = session
            .act(crate::support::set_model("mock-smart"))
            .await
            .unwrap();
        watch.response_to(&chosen.action_id).await;
        // The record takes the model in the step after the logged answer.
        while session.get().await.model != "mock-smart" {
            watch.next_status().await;
        }
        drop(watch);
        first.shutdown().await;

        // The new mock agent process reports its default model for the resumed session.
        let second = Harness::start_with(on_data).await;
        let mut session = Session::attach(second.sessions(), &session.id);
        let mut watch = session.watch().await;
        let turn = session.prompt("after the restart").await;
        let event = watch.event("settings_reapplied").await;
        assert_eq!(event["model"], "mock-smart");
        assert_eq!(event["reported_model"], "mock-fast");
        watch.response_to(&turn.action_id).await;
        let frames = session.sent_frames().await;
        let resume = frames
            .iter()
            .rposition(|f| f["method"] == "session/resume")
            .expect("reopened by session/resume");
        let reapplied = frames
            .iter()
            .rposition(|f| {
                f["method"] == "session/set_config_option" && f["params"]["value"] == "mock-smart"
            })
            .expect("the model was asked for again");
        let prompt = frames
            .iter()
            .rposition(|f| f["method"] == "session/prompt")
            .unwrap();
        assert!(resume < reapplied && reapplied < prompt, "{frames:?}");
        assert_eq!(session.get().await.model, "mock-smart");
        second.shutdown().await;
    })
    .await
}

#[tokio::test]
async fn a_fork_of_a_session_with_two_turns_inherits_both_and_its_next_prompt_runs_on_the_forked_acp_session()
 {
    bounded(async {
        let h = Harness::start_with(|config| {
            mock_profile_with(config, "forkable", &["--resume", "--fork"], |_| {})
        })
        .await;
        let mut parent = Session::create(&h, "forkable").await;
        let mut watch = parent.watch().await;
        for text in ["first question", "second question"] {
            let turn = parent.prompt(text).await;
            watch.response_to(&turn.action_id).await;
        }
        let parent_record = parent.get().await;
        let forked = parent
            .client
            .fork_session(pb::ForkSessionRequest {
                session_id: parent.id.clone(),
                name: None,
            })
            .await
            .expect("the agent advertises session/fork")
            .into_inner()
            .session
            .unwrap();
        assert_ne!(forked.id, parent.id);
        assert_eq!(forked.name, "first question (fork)");
        assert_eq!(forked.status, pb::SessionStatus::Idle as i32);
        assert_ne!(forked.acp_session_id, parent_record.acp_session_id);

        let mut child = Session::attach(h.sessions(), &forked.id);
        let inherited = child.transcript().await.messages;
        let ids: Vec<&str> = inherited.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["1:user", "1:agent", "2:user", "2:agent"]);
        assert!(inherited.iter().all(|m| m.inherited), "{inherited:?}");

        let mut child_watch = child.watch().await;
        let turn = child.prompt("third question").await;
        child_watch.response_to(&turn.action_id).await;
        let frames = child.sent_frames().await;
        let fork = frames
            .iter()
            .find(|f| f["method"] == "session/fork")
            .expect("the runtime was opened by session/fork");
        assert_eq!(
            fork["params"]["sessionId"].as_str(),
            Some(parent_record.acp_session_id.as_str())
        );
        let prompt = frames
            .iter()
            .find(|f| f["method"] == "session/prompt")
            .unwrap();
        assert_eq!(
            prompt["params"]["sessionId"].as_str(),
            Some(forked.acp_session_id.as_str())
        );
        let messages = child.transcript().await.messages;
        assert_eq!(messages.len(), 6);
        assert_eq!(messages[4].id, "3:user");
        assert!(!messages[4].inherited && !messages[5].inherited);
        // The parent is untouched.
        assert_eq!(parent.transcript().await.messages.len(), 4);
    })
    .await
}

#[tokio::test]
async fn a_fork_whose_copied_log_would_not_fit_one_message_is_refused_as_a_limit_and_creates_nothing()
 {
    bounded(async {
        // A small message limit: the parent's log outgrows it in two turns.
        let h = Harness::start_with(|config| {
            config.limits.grpc_message_bytes = 96 * 1024;
            mock_profile_with(config, "forkable", &["--resume", "--fork"], |_| {})
        })
        .await;
        let mut parent = Session::create(&h, "forkable").await;
        let mut watch = parent.watch().await;
        let long = "x".repeat(20 * 1024);
        for _ in 0..2 {
            let turn = parent.prompt(&long).await;
            watch.response_to(&turn.action_id).await;
        }
        let before = crate::support::session_count(&h).await;
        let refused = expect_err(
            parent
                .client
                .fork_session(pb::ForkSessionRequest {
                    session_id: parent.id.clone(),
                    name: None,
                })
                .await,
        );
        assert_error(&refused, Code::InvalidArgument, "LIMIT_EXCEEDED");
        assert!(
            refused.message().contains("copied into the fork"),
            "{}",
            refused.message()
        );
        assert_eq!(crate::support::session_count(&h).await, before);
        // The parent goes on as before.
        let turn = parent.prompt("still here").await;
        watch.response_to(&turn.action_id).await;
    })
    .await
}

#[tokio::test]
async fn a_fork_against_an_agent_that_does_not_advertise_it_is_not_supported() {
    bounded(async {
        let h = Harness::start().await;
        let mut parent = Session::create(&h, "mock").await;
        let mut watch = parent.watch().await;
        let turn = parent.prompt("hello").await;
        watch.response_to(&turn.action_id).await;
        let before = crate::support::session_count(&h).await;
        let refused = expect_err(
            parent
                .client
                .fork_session(pb::ForkSessionRequest {
                    session_id: parent.id.clone(),
                    name: Some("copy".into()),
                })
                .await,
        );
        assert_error(&refused, Code::FailedPrecondition, "NOT_SUPPORTED");
        assert_eq!(crate::support::session_count(&h).await, before);
    })
    .await
}

#[tokio::test]
async fn a_config_option_chosen_before_a_restart_is_re_applied_after_the_reopen() {
    bounded(async {
        // The data directory and the session's cwd outlive the first server. The second
        // server's agent no longer offers `tone`.
        let data = tempfile::TempDir::new().unwrap();
        let with = |flags: &'static [&'static str]| {
            let dir = data.path().join("data");
            move |c: &mut agent_harness::config::ServeConfig| {
                c.data_dir = dir;
                mock_profile_with(c, "opts", flags, |_| {});
            }
        };
        let first = Harness::start_with(with(&[
            "--resume",
            "--config-option",
            "effort=low|high",
            "--config-option",
            "tone=plain|warm",
            "--bool-option",
            "web",
        ]))
        .await;
        let mut request = crate::support::create_request(&first, "opts");
        request.cwd = agent_harness_testkit::workspace_in(data.path())
            .to_string_lossy()
            .into_owned();
        let mut session = Session::create_with(&first, request).await;
        let mut watch = session.watch().await;
        for (config_id, value) in [("effort", "high"), ("tone", "warm"), ("web", "true")] {
            let set = Action::SetConfigOption(pb::SetConfigOptionAction {
                config_id: config_id.into(),
                value: value.into(),
            });
            let chosen = session.act(set).await.unwrap();
            watch.response_to(&chosen.action_id).await;
        }
        drop(watch);
        first.shutdown().await;

        // The new mock agent process reports its defaults for the resumed session.
        let second = Harness::start_with(with(&[
            "--resume",
            "--config-option",
            "effort=low|high",
            "--bool-option",
            "web",
        ]))
        .await;
        let mut session = Session::attach(second.sessions(), &session.id);
        let mut watch = session.watch().await;
        let turn = session.prompt("after the restart").await;
        let event = watch.event("settings_reapplied").await;
        assert_eq!(
            event["config_options"],
            serde_json::json!([
                {"config_id": "effort", "value": "high", "reported_value": "low"},
                {"config_id": "web", "value": true, "reported_value": false},
            ])
        );
        assert_eq!(event["skipped"][0]["config_id"], "tone");
        assert_eq!(event["skipped"][0]["value"], "warm");
        assert!(event.get("model").is_none(), "{event}");
        watch.response_to(&turn.action_id).await;
        let frames = session.sent_frames().await;
        let resume = frames
            .iter()
            .rposition(|f| f["method"] == "session/resume")
            .expect("reopened by session/resume");
        let reapplied: Vec<usize> = frames
            .iter()
            .enumerate()
            .filter(|(_, f)| f["method"] == "session/set_config_option")
            .map(|(i, _)| i)
            .filter(|i| *i > resume)
            .collect();
        let prompt = frames
            .iter()
            .rposition(|f| f["method"] == "session/prompt")
            .unwrap();
        assert_eq!(reapplied.len(), 2, "{frames:?}");
        assert!(reapplied.iter().all(|i| *i < prompt), "{frames:?}");
        let asked: Vec<(&serde_json::Value, &serde_json::Value)> = reapplied
            .iter()
            .map(|i| {
                let params = &frames[*i]["params"];
                (&params["configId"], &params["value"])
            })
            .collect();
        assert_eq!(
            asked,
            [
                (&serde_json::json!("effort"), &serde_json::json!("high")),
                (&serde_json::json!("web"), &serde_json::json!(true)),
            ]
        );
        second.shutdown().await;
    })
    .await
}

#[tokio::test]
async fn get_session_carries_the_models_and_config_options_a_model_picker_needs() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let got = session.get().await;
        let models: Vec<&str> = got.models.iter().map(|m| m.value.as_str()).collect();
        assert_eq!(models, ["mock-fast", "mock-smart"], "{:?}", got.models);
        assert_eq!(got.model, "mock-fast");
        let options: serde_json::Value = serde_json::from_str(&got.config_options_json).unwrap();
        assert!(
            options
                .as_array()
                .is_some_and(|o| o.iter().any(|o| o["category"] == "model")),
            "{options}"
        );

        // A model change shows in the next GetSession, with the same choices.
        let mut watch = session.watch().await;
        let set = session
            .act(Action::SetModel(pb::SetModelAction {
                model: "mock-smart".into(),
            }))
            .await
            .unwrap();
        watch.response_to(&set.action_id).await;
        // The actor takes the answer in just after it is logged (and streamed).
        let got = loop {
            let got = session.get().await;
            if got.model == "mock-smart" {
                break got;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(got.models.len(), 2);
    })
    .await
}
