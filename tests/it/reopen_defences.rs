//! The defences of a session against its agent's own defects and lost state: a profile's
//! `restart_after_cancel` (the runtime is stopped after a cancelled turn and the next turn
//! reopens it), and `on_reopen_failure = "fresh"` (a session its agent cannot reopen continues
//! in a new ACP session primed with the transcript, and a `context_rebuilt` event says so).

use agent_harness::pb::v1 as pb;
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
            .entry(|e, f| f["id"] == queued.action_id.as_str() && f.get("result").is_some())
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
            .entry(|e, f| f["id"] == next.action_id.as_str() && f.get("result").is_some())
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
