//! Crash tests with the real binary: `kill -9` the server with a turn running and
//! two prompts queued, restart it on the same data directory, and check that every logged entry
//! is unchanged at its offset, the queue is intact, the interrupted turn reads FAILED and is never
//! re-sent, and a session that can be reopened drains its queue in order.

use std::{path::Path, time::Duration};

use agent_harness::pb::v1 as pb;

use crate::{
    harness::within,
    process::Serve,
    support::{Session, processes_with},
};

fn config_file(dir: &Path, marker: &str) -> std::path::PathBuf {
    let program = env!("CARGO_BIN_EXE_agent-harness");
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[profiles.plain]
command = "{program}"
args = ["mock-agent", "--stderr-at-start", "{marker}"]

[profiles.resumable]
command = "{program}"
args = ["mock-agent", "--resume", "--stderr-at-start", "{marker}"]
"#
        ),
    )
    .unwrap();
    path
}

/// Waits until no process carries the marker (the dead server's runtimes follow it).
async fn runtimes_gone(marker: &str) {
    for _ in 0..200 {
        if processes_with(marker).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "runtimes outlived their harness: {:?}",
        processes_with(marker)
    );
}

/// Before the kill: a turn running, two prompts queued. Returns the session, the log and the ids.
async fn crash_with_work_in_flight(
    profile: &str,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    String,
    Vec<pb::LogEntry>,
    [String; 3],
    String,
) {
    let dir = tempfile::tempdir().unwrap();
    let marker = uuid::Uuid::now_v7().to_string();
    let config = config_file(dir.path(), &marker);
    let data = dir.path().join("data");
    let mut server = Serve::on(&data, &config).start();
    let client = server.client().await;
    let mut session = Session::create_with_client(
        client,
        pb::CreateSessionRequest {
            profile: profile.into(),
            cwd: agent_harness_testkit::workspace_in(dir.path())
                .to_string_lossy()
                .into_owned(),
            ..Default::default()
        },
    )
    .await;
    let mut watch = session.watch().await;
    let running = session.prompt("@wait-cancel").await;
    watch.chunk("echo: @wait-cancel").await;
    let first = session.prompt("queued one").await;
    let second = session.prompt("queued two").await;
    assert_eq!((first.queue_position, second.queue_position), (1, 2));
    let log = session.log().await;
    assert!(!processes_with(&marker).is_empty(), "the runtime runs");
    server.kill_9();
    runtimes_gone(&marker).await;
    (
        dir,
        data,
        session.id.clone(),
        log,
        [running.action_id, first.action_id, second.action_id],
        marker,
    )
}

fn same_entry(before: &pb::LogEntry, after: &pb::LogEntry) {
    assert_eq!(before, after, "entry at offset {} changed", before.offset);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_a_session_that_cannot_reopen_keeps_its_log_is_disconnected_and_abandons_its_queue_visibly()
 {
    within(Duration::from_secs(60), async {
        let (dir, data, id, log, [running, first, second], _marker) =
            crash_with_work_in_flight("plain").await;
        let server = Serve::on(&data, dir.path().join("config.toml")).start();
        let mut session = Session::attach(server.client().await, &id);
        // Recovery runs in the session's actor once the server is up: wait for its event (the
        // stream replays the log, so it is found whether it came before or after this call).
        session.watch().await.event("queue_abandoned").await;
        let after = session.log().await;
        assert!(after.len() >= log.len());
        for (before, after) in log.iter().zip(&after) {
            same_entry(before, after);
        }
        // The queue is abandoned visibly, not left waiting for a reopen that cannot happen.
        assert!(session.queue().await.is_empty(), "the queue is empty");
        let abandoned = after
            .iter()
            .filter_map(|e| serde_json::from_str::<serde_json::Value>(&e.json).ok())
            .find(|f| f["event"] == "queue_abandoned")
            .expect("a queue_abandoned event is logged");
        assert_eq!(abandoned["reason"], "RUNTIME_CANNOT_REOPEN");
        assert_eq!(abandoned["action_ids"], serde_json::json!([first, second]));
        let got = session.get().await;
        assert_eq!(
            got.status,
            pb::SessionStatus::Disconnected as i32,
            "{}",
            got.status_reason
        );
        assert!(
            got.status_reason.starts_with("RUNTIME_CANNOT_REOPEN"),
            "{}",
            got.status_reason
        );
        // Each abandoned action reads REMOVED: re-sending it finds nothing queued.
        for (action_id, text) in [(&first, "queued one"), (&second, "queued two")] {
            let mut request = session.control_request(crate::support::prompt(text));
            request.action_id = Some(action_id.clone());
            let status = session.control(request).await.expect_err("removed");
            assert_eq!(
                crate::harness::error_reason(&status),
                "QUEUED_ACTION_NOT_FOUND",
                "{status:?}"
            );
        }
        // The runtime cannot be reopened (no resume, no load): nothing was re-sent.
        let sent = session.sent_frames().await;
        assert_eq!(
            sent.iter().filter(|f| f["id"] == running.as_str()).count(),
            1
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_a_session_with_only_a_turn_in_flight_on_the_builtin_mock_profile_is_reopened_at_once()
 {
    within(Duration::from_secs(60), async {
        let dir = tempfile::tempdir().unwrap();
        let marker = uuid::Uuid::now_v7().to_string();
        let config = config_file(dir.path(), &marker);
        let data = dir.path().join("data");
        let mut server = Serve::on(&data, &config).start();
        let mut session = Session::create_with_client(
            server.client().await,
            pb::CreateSessionRequest {
                profile: "mock".into(),
                cwd: agent_harness_testkit::workspace_in(dir.path())
                    .to_string_lossy()
                    .into_owned(),
                ..Default::default()
            },
        )
        .await;
        let mut watch = session.watch().await;
        session.prompt("@wait-cancel").await;
        watch.chunk("echo: @wait-cancel").await;
        server.restart();
        let mut session = Session::attach(server.client().await, &session.id);
        let mut watch = session.watch().await;
        // Nothing is queued, yet the session reopens without being asked to.
        watch.status(pb::SessionStatus::Idle).await;
        let sent = session.sent_frames().await;
        assert!(
            sent.iter().any(|f| f["method"] == "session/resume"),
            "reopened with session/resume"
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_the_interrupted_turn_reads_failed_is_never_resent_and_the_queue_drains_in_order()
 {
    within(Duration::from_secs(60), async {
        let (dir, data, id, log, [running, first, second], _marker) =
            crash_with_work_in_flight("resumable").await;
        let server = Serve::on(&data, dir.path().join("config.toml")).start();
        let mut session = Session::attach(server.client().await, &id);
        let mut watch = session.watch().await;
        assert_eq!(
            watch.response_to(&first).await["result"]["stopReason"],
            "end_turn"
        );
        assert_eq!(
            watch.response_to(&second).await["result"]["stopReason"],
            "end_turn"
        );
        let after = session.log().await;
        for (before, after) in log.iter().zip(&after) {
            same_entry(before, after);
        }
        let sent = session.sent_frames().await;
        assert_eq!(
            sent.iter().filter(|f| f["id"] == running.as_str()).count(),
            1,
            "the interrupted turn was not re-sent"
        );
        let prompts: Vec<&str> = sent
            .iter()
            .filter(|f| f["method"] == "session/prompt")
            .filter_map(|f| f["id"].as_str())
            .collect();
        assert_eq!(prompts, [running.as_str(), first.as_str(), second.as_str()]);
        assert!(
            sent.iter().any(|f| f["method"] == "session/resume"),
            "reopened with session/resume"
        );

        let transcript = session
            .client
            .get_transcript(pb::GetTranscriptRequest {
                session_id: id.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let agent_of = |request: &str| {
            let turn = transcript
                .messages
                .iter()
                .find(|m| m.request_id.as_deref() == Some(request))
                .unwrap()
                .turn;
            transcript
                .messages
                .iter()
                .find(|m| m.turn == turn && m.role == pb::MessageRole::Agent as i32)
                .cloned()
                .unwrap()
        };
        let interrupted = agent_of(&running);
        assert_eq!(interrupted.stop_reason, Some(pb::StopReason::Failed as i32));
        assert_eq!(interrupted.error.as_deref(), Some("harness restarted"));
        assert_eq!(
            agent_of(&first).stop_reason,
            Some(pb::StopReason::EndTurn as i32)
        );
        assert_eq!(
            agent_of(&second).stop_reason,
            Some(pb::StopReason::EndTurn as i32)
        );

        // Every view tells the three turns' ends, the interrupted one as failed by the restart.
        for view in [
            pb::SubscribeView::Log,
            pb::SubscribeView::Messages,
            pb::SubscribeView::All,
        ] {
            let ends = crate::turn_ended::turn_ends_until_caught_up(&mut session, view).await;
            let seen: Vec<(&str, i32, Option<&str>)> = ends
                .iter()
                .map(|e| (e.request_id.as_str(), e.stop_reason, e.error.as_deref()))
                .collect();
            assert_eq!(
                seen,
                [
                    (
                        running.as_str(),
                        pb::StopReason::Failed as i32,
                        Some("harness restarted")
                    ),
                    (first.as_str(), pb::StopReason::EndTurn as i32, None),
                    (second.as_str(), pb::StopReason::EndTurn as i32, None),
                ],
                "{view:?}"
            );
        }
    })
    .await
}
