//! The defences of a session against its agent's own defects and lost state: a profile's
//! `restart_after_cancel` and `restart_after_error` (the runtime is stopped after a cancelled or
//! failed turn and the next turn reopens it), and `on_reopen_failure = "fresh"` (a session its agent cannot reopen continues
//! in a new ACP session primed with the transcript, and a `context_rebuilt` event says so).

use agent_harness::{config::OnReopenFailure, pb::v1 as pb};
use serde_json::Value;

use crate::{
    harness::{Harness, bounded},
    support::{Session, Watch, mock_profile_with, stop},
};

fn frames(log: &[pb::LogEntry]) -> Vec<Value> {
    log.iter()
        .map(|e| serde_json::from_str(&e.json).expect("logged JSON"))
        .collect()
}

/// The methods the harness sent the runtime, in log order.
fn sent_methods(log: &[pb::LogEntry]) -> Vec<String> {
    log.iter()
        .filter(|e| e.direction == pb::LogDirection::ToRuntime as i32)
        .filter_map(|e| {
            let frame: Value = serde_json::from_str(&e.json).ok()?;
            Some(frame["method"].as_str()?.to_owned())
        })
        .collect()
}

/// A turn that waits for a stop, stopped: its response.
async fn cancelled_turn(session: &mut Session, watch: &mut Watch) -> Value {
    let running = session.prompt("@wait-cancel").await;
    watch.chunk("echo: @wait-cancel").await;
    session.act(stop(false)).await.unwrap();
    watch.response_to(&running.action_id).await
}

#[tokio::test]
async fn with_restart_after_cancel_the_runtime_stops_after_a_cancelled_turn_and_the_next_prompt_reopens_it()
 {
    bounded(async {
        // An agent that writes its session only on its way out: the reopen finds it only if the
        // stop was graceful and the reopen waited for it.
        let sessions = tempfile::tempdir().unwrap();
        let dir = sessions.path().to_str().unwrap();
        let flags = ["--resume", "--session-dir", dir, "--save-delay", "60000"];
        let h = Harness::start_with(|config| {
            mock_profile_with(config, "restarting", &flags, |p| {
                p.resilience.restart_after_cancel = true;
                shows(p, sessions.path());
            });
        })
        .await;
        let mut session = Session::create(&h, "restarting").await;
        let mut watch = session.watch().await;
        let response = cancelled_turn(&mut session, &mut watch).await;
        assert_eq!(response["result"]["stopReason"], "cancelled");
        let stopped = watch.event("runtime_stopped").await;
        assert_eq!(
            stopped["reason"],
            "restarted after a cancelled turn (restart_after_cancel)"
        );
        watch.status(pb::SessionStatus::Suspended).await;

        let next = session.prompt("after the stop").await;
        let answer = watch.response_to(&next.action_id).await;
        assert_eq!(answer["result"]["stopReason"], "end_turn");
        watch.chunk("echo: after the stop").await;
        let log = session.log().await;
        let started: Vec<u32> = frames(&log)
            .iter()
            .zip(&log)
            .filter(|(f, _)| f["event"] == "runtime_started")
            .map(|(_, e)| e.epoch)
            .collect();
        assert_eq!(started, [1, 2], "a second runtime took the next prompt");
        let methods = sent_methods(&log);
        let resumed = methods.iter().position(|m| m == "session/resume");
        let prompted = methods.iter().rposition(|m| m == "session/prompt");
        assert!(resumed < prompted && resumed.is_some(), "{methods:?}");
    })
    .await
}

#[tokio::test]
async fn with_restart_after_error_the_runtime_stops_after_a_turn_the_agent_failed_and_the_next_prompt_reopens_it()
 {
    bounded(async {
        let h = Harness::start_with(|config| {
            mock_profile_with(config, "restarting", &["--resume"], |p| {
                p.resilience.restart_after_error = true;
            });
            // The same agent without the flag: its runtime lives on after a failed turn.
            mock_profile_with(config, "plain", &["--resume"], |_| {});
        })
        .await;
        let mut session = Session::create(&h, "restarting").await;
        let mut watch = session.watch().await;
        // An answered turn changes nothing.
        let fine = session.prompt("fine").await;
        watch.response_to(&fine.action_id).await;
        let failing = session
            .prompt("@error -32603 the model API answered 500")
            .await;
        let answer = watch.response_to(&failing.action_id).await;
        assert_eq!(answer["error"]["code"], -32603, "{answer}");
        let stopped = watch.event("runtime_stopped").await;
        assert_eq!(
            stopped["reason"],
            "restarted after a failed turn (restart_after_error)"
        );
        watch.status(pb::SessionStatus::Suspended).await;
        let next = session.prompt("after the error").await;
        let answer = watch.response_to(&next.action_id).await;
        assert_eq!(answer["result"]["stopReason"], "end_turn");
        watch.chunk("echo: after the error").await;
        let log = session.log().await;
        let started = frames(&log)
            .iter()
            .filter(|f| f["event"] == "runtime_started")
            .count();
        assert_eq!(started, 2, "a second runtime took the next prompt");
        let methods = sent_methods(&log);
        assert!(
            methods.contains(&"session/resume".to_owned()),
            "{methods:?}"
        );

        let mut plain = Session::create(&h, "plain").await;
        let mut watch = plain.watch().await;
        let failing = plain.prompt("@error -32603 boom").await;
        watch.response_to(&failing.action_id).await;
        let next = plain.prompt("after").await;
        watch.response_to(&next.action_id).await;
        let log = plain.log().await;
        let started = frames(&log)
            .iter()
            .filter(|f| f["event"] == "runtime_started")
            .count();
        assert_eq!(started, 1, "without the flag the runtime lives on");
    })
    .await
}

#[tokio::test]
async fn with_restart_after_cancel_a_prompt_queued_behind_the_stopped_turn_runs_on_the_reopened_runtime()
 {
    bounded(async {
        let h = Harness::start_with(|config| {
            mock_profile_with(config, "restarting", &["--resume"], |p| {
                p.resilience.restart_after_cancel = true;
            });
        })
        .await;
        let mut session = Session::create(&h, "restarting").await;
        let mut watch = session.watch().await;
        let running = session.prompt("@wait-cancel").await;
        watch.chunk("echo: @wait-cancel").await;
        let mut interrupt = session.control_request(crate::support::prompt("instead"));
        interrupt.delivery = pb::Delivery::Interrupt as i32;
        let queued = session.control(interrupt).await.unwrap();
        assert_eq!(
            watch.response_to(&running.action_id).await["result"]["stopReason"],
            "cancelled"
        );
        let answer = watch.response_to(&queued.action_id).await;
        assert_eq!(answer["result"]["stopReason"], "end_turn");
        let (entry, _) = watch
            .entry(|_, f| f["id"] == queued.action_id.as_str() && f.get("result").is_some())
            .await;
        assert_eq!(entry.epoch, 2, "answered by the reopened runtime");
    })
    .await
}

#[tokio::test]
async fn without_restart_after_cancel_the_runtime_lives_on_after_a_cancelled_turn() {
    bounded(async {
        let h = Harness::start_with(|config| {
            mock_profile_with(config, "plain", &["--resume"], |_| {});
        })
        .await;
        let mut session = Session::create(&h, "plain").await;
        let mut watch = session.watch().await;
        cancelled_turn(&mut session, &mut watch).await;
        let next = session.prompt("same runtime").await;
        let (entry, _) = watch
            .entry(|_, f| f["id"] == next.action_id.as_str() && f.get("result").is_some())
            .await;
        assert_eq!(entry.epoch, 1);
        let log = session.log().await;
        assert!(
            !frames(&log).iter().any(|f| f["event"] == "runtime_stopped"),
            "nothing was stopped"
        );
    })
    .await
}

/// A profile `name` whose agent keeps its sessions in `sessions` (written at once) and whose idle
/// runtime is stopped after 100 ms; `fresh`: `on_reopen_failure = "fresh"`.
fn losing_profile(
    config: &mut agent_harness::config::ServeConfig,
    name: &str,
    sessions: &std::path::Path,
    fresh: bool,
) {
    let dir = sessions.to_str().unwrap();
    mock_profile_with(config, name, &["--resume", "--session-dir", dir], |p| {
        shows(p, sessions);
        p.idle_timeout = Some(std::time::Duration::from_millis(100));
        if fresh {
            p.resilience.on_reopen_failure = OnReopenFailure::Fresh;
            p.resilience.reopen_context_bytes = 4096;
        }
    });
}

/// A first turn, then the runtime stopped for idleness and the agent's session files gone (as
/// on a new pod, or another replica without the agent's files).
async fn first_turn_then_lost(
    session: &mut Session,
    watch: &mut Watch,
    sessions: &std::path::Path,
) {
    let first = session.prompt("remember the word tangerine").await;
    let answer = watch.response_to(&first.action_id).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn");
    watch.status(pb::SessionStatus::Suspended).await;
    for file in std::fs::read_dir(sessions).unwrap() {
        std::fs::remove_file(file.unwrap().path()).unwrap();
    }
}

#[tokio::test]
async fn with_on_reopen_failure_fresh_a_session_its_agent_lost_goes_on_in_a_new_one_primed_with_the_transcript()
 {
    bounded(async {
        let sessions = tempfile::tempdir().unwrap();
        let h = Harness::start_with(|config| {
            losing_profile(config, "fresh", sessions.path(), true);
        })
        .await;
        let mut session = Session::create(&h, "fresh").await;
        let mut watch = session.watch().await;
        first_turn_then_lost(&mut session, &mut watch, sessions.path()).await;

        let next = session.prompt("what was the word?").await;
        let rebuilt = watch.event("context_rebuilt").await;
        assert!(
            rebuilt["reason"].as_str().is_some_and(
                |r| r.contains("session/resume failed") && r.contains("Resource not found")
            ),
            "{rebuilt}"
        );
        assert_ne!(
            rebuilt["acp_session_id"],
            rebuilt["previous_acp_session_id"]
        );
        let answer = watch.response_to(&next.action_id).await;
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        watch.chunk("echo: what was the word?").await;
        // Usable again: the turn's end brings it back to IDLE (streamed after the answer, which
        // is logged before the actor takes it in).
        watch.status(pb::SessionStatus::Idle).await;

        // The prompt that followed carried the earlier conversation, ahead of the user's text.
        let frames = session.sent_frames().await;
        let methods: Vec<&str> = frames.iter().filter_map(|f| f["method"].as_str()).collect();
        let resume = methods.iter().position(|m| *m == "session/resume").unwrap();
        assert_eq!(methods[resume + 1], "session/new", "{methods:?}");
        let prompt = frames
            .iter()
            .find(|f| f["id"] == next.action_id.as_str())
            .unwrap();
        let blocks = prompt["params"]["prompt"].as_array().unwrap();
        let primer = blocks[0]["text"].as_str().unwrap();
        assert!(
            primer.contains("User: remember the word tangerine"),
            "{primer}"
        );
        assert!(
            primer.contains("Agent: echo: remember the word tangerine"),
            "{primer}"
        );
        assert!(primer.len() <= 4096);
        assert_eq!(prompt["params"]["sessionId"], rebuilt["acp_session_id"]);
        assert_eq!(blocks[1]["text"], "what was the word?");

        // The transcript shows it where it happened, and the user's text as written.
        let transcript = session.transcript().await;
        let user = transcript
            .messages
            .iter()
            .find(|m| m.request_id.as_deref() == Some(next.action_id.as_str()))
            .unwrap();
        let Some(pb::message_part::Kind::ContextRebuilt(part)) = &user.parts[0].kind else {
            panic!("{:?}", user.parts)
        };
        assert_eq!(part.turns, 1);
        assert_eq!(part.bytes, primer.len() as u64);
        assert_eq!(part.reason, rebuilt["reason"].as_str().unwrap());
        let Some(pb::message_part::Kind::Text(text)) = &user.parts[1].kind else {
            panic!("{:?}", user.parts)
        };
        assert_eq!(text.text, "what was the word?");
        assert_eq!(user.parts.len(), 2);

        // Only once: the prompt after it carries no transcript.
        let later = session.prompt("and now?").await;
        watch.response_to(&later.action_id).await;
        let frames = session.sent_frames().await;
        let prompt = frames
            .iter()
            .find(|f| f["id"] == later.action_id.as_str())
            .unwrap();
        assert_eq!(prompt["params"]["prompt"][0]["text"], "and now?");
    })
    .await
}

#[tokio::test]
async fn by_default_a_session_its_agent_lost_is_disconnected_with_the_agents_error_and_nothing_rebuilt()
 {
    bounded(async {
        let sessions = tempfile::tempdir().unwrap();
        let h = Harness::start_with(|config| {
            losing_profile(config, "plain", sessions.path(), false);
        })
        .await;
        let mut session = Session::create(&h, "plain").await;
        let mut watch = session.watch().await;
        first_turn_then_lost(&mut session, &mut watch, sessions.path()).await;

        let next = session.prompt("what was the word?").await;
        let fault = watch.event("fault").await;
        assert!(
            fault["detail"]
                .as_str()
                .is_some_and(|d| d.contains("Resource not found")),
            "{fault}"
        );
        watch.status(pb::SessionStatus::Disconnected).await;
        let log = session.log().await;
        let frames = frames(&log);
        assert!(!frames.iter().any(|f| f["event"] == "context_rebuilt"));
        assert!(
            !frames.iter().any(|f| f["id"] == next.action_id.as_str()),
            "the prompt was never sent"
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_kill_9_a_session_whose_agent_can_neither_resume_nor_load_drains_its_queue_in_a_fresh_session()
 {
    crate::harness::within(std::time::Duration::from_secs(60), async {
        let dir = tempfile::tempdir().unwrap();
        let marker = uuid::Uuid::now_v7().to_string();
        let program = env!("CARGO_BIN_EXE_agent-harness");
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            format!(
                r#"
[profiles.forgetful]
command = "{program}"
args = ["mock-agent", "--stderr-at-start", "{marker}"]
on_reopen_failure = "fresh"
"#
            ),
        )
        .unwrap();
        let data = dir.path().join("data");
        let mut server = crate::process::Serve::on(&data, &config).start();
        let mut session = Session::create_with_client(
            server.client().await,
            pb::CreateSessionRequest {
                profile: "forgetful".into(),
                cwd: agent_harness_testkit::workspace_in(dir.path())
                    .to_string_lossy()
                    .into_owned(),
                ..Default::default()
            },
        )
        .await;
        let mut watch = session.watch().await;
        let first = session.prompt("the plan is tangerine").await;
        watch.response_to(&first.action_id).await;
        let running = session.prompt("@wait-cancel").await;
        watch.chunk("echo: @wait-cancel").await;
        let queued = session.prompt("go on").await;
        assert_eq!(queued.queue_position, 1);
        server.kill_9();
        crate::support::exited(&crate::support::processes_with(&marker)).await;
        server.restart();

        let mut session = Session::attach(server.client().await, &session.id);
        let mut watch = session.watch().await;
        let rebuilt = watch.event("context_rebuilt").await;
        assert_eq!(
            rebuilt["reason"],
            "the runtime advertises neither session/resume nor session/load"
        );
        let answer = watch.response_to(&queued.action_id).await;
        assert_eq!(answer["result"]["stopReason"], "end_turn");
        let frames = session.sent_frames().await;
        let prompt = frames
            .iter()
            .find(|f| f["id"] == queued.action_id.as_str())
            .unwrap();
        let primer = prompt["params"]["prompt"][0]["text"].as_str().unwrap();
        assert!(primer.contains("User: the plan is tangerine"), "{primer}");
        assert!(primer.contains("User: @wait-cancel"), "{primer}");
        let sent_running = frames
            .iter()
            .filter(|f| f["id"] == running.action_id.as_str() && f["method"] == "session/prompt")
            .count();
        assert_eq!(sent_running, 1, "the interrupted turn is not re-sent");
    })
    .await
}

/// The agent's box shows `dir` read-write (where the mock agent keeps its session files).
fn shows(profile: &mut agent_harness::config::Profile, dir: &std::path::Path) {
    if let Some(policy) = profile.sandbox.as_mut() {
        policy
            .read_write
            .push(dir.canonicalize().expect("the directory exists"));
    }
}
