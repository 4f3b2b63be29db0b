//! Runtime faults: each one is logged as an event, fails the running turn, kills the
//! process and leaves the session DISCONNECTED with a reason; the server keeps serving; the next
//! prompt reopens the session when the runtime advertises resume (and is RUNTIME_DISCONNECTED
//! when it cannot); an idle timeout SUSPENDS and reopens on demand.

use std::time::Duration;

use agent_harness::{config::ServeConfig, pb::v1 as pb};
use tonic::Code;

use crate::{
    harness::{Harness, assert_error, bounded, expect_err},
    support::{Session, exited, mock_profile_with, processes_with, prompt, set_model, stop},
};

/// One fault: the script of the turn that provokes it (and what to send after, if anything).
struct Fault {
    kind: &'static str,
    script: &'static str,
    then: Option<pb::control_request::Action>,
}

fn faults() -> Vec<Fault> {
    vec![
        Fault {
            kind: "exit",
            script: "@crash 9",
            then: None,
        },
        Fault {
            kind: "closed_output",
            script: "@close-stdout",
            then: None,
        },
        Fault {
            kind: "invalid_line",
            script: "@garbage",
            then: None,
        },
        Fault {
            kind: "line_too_long",
            script: "@long 70000",
            then: None,
        },
        Fault {
            kind: "timeout",
            script: "@silent",
            then: Some(set_model("mock-smart")),
        },
        Fault {
            kind: "cancel_grace",
            script: "@ignore-cancel\n@wait-cancel",
            then: Some(stop(false)),
        },
    ]
}

/// Profiles `fragile` (no resume) and `resumable`, each marked so their processes can be found,
/// with short timeouts and a small line limit so every fault comes quickly.
fn configure(config: &mut ServeConfig, marker: &str) {
    config.limits.runtime_line_bytes = 64 * 1024;
    for (name, resume) in [("fragile", false), ("resumable", true)] {
        let mut flags = vec!["--stderr-at-start", marker];
        if resume {
            flags.push("--resume");
        }
        mock_profile_with(config, name, &flags, |p| {
            p.startup_timeout = Duration::from_millis(1500);
            p.cancel_grace = Duration::from_millis(300);
        });
    }
}

async fn provoke(session: &mut Session, fault: &Fault) -> pb::ControlResponse {
    let mut watch = session.watch().await;
    let turn = session.prompt(fault.script).await;
    watch.chunk("echo:").await;
    if let Some(action) = &fault.then {
        session
            .act(action.clone())
            .await
            .expect("the follow-up is accepted");
    }
    let event = watch.event("fault").await;
    assert_eq!(event["kind"], fault.kind, "{event}");
    assert_eq!(
        event["failed_turn"],
        turn.action_id.as_str(),
        "the running turn failed: {event}"
    );
    watch.status(pb::SessionStatus::Disconnected).await;
    turn
}

#[tokio::test]
async fn every_fault_disconnects_the_session_and_the_server_serves_on() {
    for fault in faults() {
        bounded(async {
            let marker = uuid::Uuid::now_v7().to_string();
            let h = Harness::start_with(|config| configure(config, &marker)).await;
            let mut session = Session::create(&h, "fragile").await;
            let turn = provoke(&mut session, &fault).await;
            let got = session.get().await;
            assert_eq!(
                got.status,
                pb::SessionStatus::Disconnected as i32,
                "{}",
                fault.kind
            );
            assert!(
                !got.status_reason.is_empty(),
                "{}: a reason is given",
                fault.kind
            );
            // The kill is under way once DISCONNECTED is recorded; the runtime's processes end.
            exited(&processes_with(&marker)).await;

            // The transcript shows the turn FAILED.
            let transcript = session
                .client
                .get_transcript(pb::GetTranscriptRequest {
                    session_id: session.id.clone(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            let agent = transcript
                .messages
                .iter()
                .find(|m| m.role == pb::MessageRole::Agent as i32 && m.turn == 1)
                .unwrap_or_else(|| panic!("{}: an agent message for the turn", fault.kind));
            assert_eq!(
                agent.stop_reason,
                Some(pb::StopReason::Failed as i32),
                "{}",
                fault.kind
            );
            let _ = turn;

            // Without resume the session cannot be reopened: refused, nothing stored.
            let before = session.log().await.len();
            let status = expect_err(session.act(prompt("again")).await);
            assert_error(&status, Code::FailedPrecondition, "RUNTIME_DISCONNECTED");
            assert_eq!(
                session.log().await.len(),
                before,
                "{}: nothing stored",
                fault.kind
            );
            assert_error(
                &expect_err(session.act(set_model("mock-smart")).await),
                Code::FailedPrecondition,
                "RUNTIME_DISCONNECTED",
            );

            // The same server serves a new session.
            let mut fresh = Session::create(&h, "fragile").await;
            let mut watch = fresh.watch().await;
            let reply = fresh.prompt("still serving").await;
            watch.response_to(&reply.action_id).await;
        })
        .await;
    }
}

#[tokio::test]
async fn a_faulted_session_reopens_on_the_next_prompt_when_the_runtime_can_resume() {
    for fault in faults() {
        bounded(async {
            let marker = uuid::Uuid::now_v7().to_string();
            let h = Harness::start_with(|config| configure(config, &marker)).await;
            let mut session = Session::create(&h, "resumable").await;
            provoke(&mut session, &fault).await;
            let mut watch = session.watch().await;
            let reply = session.prompt("after the fault").await;
            assert_eq!(
                reply.status,
                pb::ControlStatus::Queued as i32,
                "{}: queued behind the reopen",
                fault.kind
            );
            assert_eq!(reply.queue_position, 1);
            assert_eq!(
                watch.response_to(&reply.action_id).await["result"]["stopReason"],
                "end_turn",
                "{}",
                fault.kind
            );
            let frames = session.sent_frames().await;
            let resumes = frames
                .iter()
                .filter(|f| f["method"] == "session/resume")
                .count();
            assert_eq!(resumes, 1, "{}: reopened with session/resume", fault.kind);
            let started = session
                .log()
                .await
                .iter()
                .filter(|e| e.json.contains("runtime_started"))
                .count();
            assert_eq!(started, 2, "{}: a second epoch", fault.kind);
            assert_eq!(session.get().await.status, pb::SessionStatus::Idle as i32);
        })
        .await;
    }
}

#[tokio::test]
async fn an_idle_timeout_suspends_the_runtime_and_a_prompt_reopens_it() {
    bounded(async {
        let marker = uuid::Uuid::now_v7().to_string();
        let h = Harness::start_with(|config| {
            mock_profile_with(
                config,
                "sleepy",
                &["--stderr-at-start", &marker, "--load"],
                |p| {
                    p.idle_timeout = Some(Duration::from_millis(200));
                },
            )
        })
        .await;
        let mut session = Session::create(&h, "sleepy").await;
        let mut watch = session.watch().await;
        watch.status(pb::SessionStatus::Suspended).await;
        // SUSPENDED is recorded as the stop begins; the runtime's processes (its box) end.
        exited(&processes_with(&marker)).await;
        let got = session.get().await;
        assert_eq!(got.status, pb::SessionStatus::Suspended as i32);
        assert!(got.status_reason.contains("idle"));
        let reply = session.prompt("wake up").await;
        assert_eq!(reply.status, pb::ControlStatus::Queued as i32);
        watch.response_to(&reply.action_id).await;
        let frames = session.sent_frames().await;
        assert!(
            frames.iter().any(|f| f["method"] == "session/load"),
            "reopened with session/load"
        );
    })
    .await
}
