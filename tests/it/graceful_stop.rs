//! Stopping runtimes gracefully, with the real binary: agents that write their session files
//! lazily (the mock agent with `--session-dir` and a long `--save-delay`, as Claude Code does)
//! keep their sessions through a drain and through a `kill -9` of the harness, because the
//! harness (or its watchdog) closes stdin and sends SIGTERM before any SIGKILL; and a runtime
//! that ignores SIGTERM is SIGKILLed once its grace is over, with nothing of its tree left.

use std::{path::Path, time::Duration};

use agent_harness::pb::v1 as pb;

use crate::{
    harness::within,
    process::{Serve, ServeProcess},
    support::{Session, exited, processes_with},
};

/// Writes a config file with a profile `lazy`: the mock agent keeping its sessions in
/// `sessions`, written only on a stop (or a minute after a change), marked by `marker`.
fn lazy_config(dir: &Path, marker: &str) -> std::path::PathBuf {
    let program = env!("CARGO_BIN_EXE_agent-harness");
    let sessions = dir.join("agent-sessions");
    std::fs::create_dir_all(&sessions).unwrap();
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[profiles.lazy]
command = "{program}"
args = ["mock-agent", "--resume", "--session-dir", "{sessions}", "--save-delay", "60000", "--stderr-at-start", "{marker}"]
# The agent keeps its session files there: its box shows it read-write.
sandbox = {{ read_write = ["{sessions}"] }}
"#,
            sessions = sessions.display()
        ),
    )
    .unwrap();
    path
}

async fn create(server: &ServeProcess, dir: &Path, profile: &str) -> Session {
    Session::create_with_client(
        server.client().await,
        pb::CreateSessionRequest {
            profile: profile.into(),
            cwd: agent_harness_testkit::workspace_in(dir)
                .to_string_lossy()
                .into_owned(),
            ..Default::default()
        },
    )
    .await
}

/// A short first turn, answered.
async fn first_turn(session: &mut Session) {
    let mut watch = session.watch().await;
    let reply = session.prompt("first").await;
    let response = watch.response_to(&reply.action_id).await;
    assert_eq!(response["result"]["stopReason"], "end_turn", "{response}");
}

/// After the harness came back: [`second_prompt_runs`].
async fn next_prompt_runs(server: &ServeProcess, id: &str) -> bool {
    second_prompt_runs(&mut Session::attach(server.client().await, id)).await
}

/// The session's next prompt reopens it and ends with its own reply (`true`), or the session
/// was lost (`false`: its agent no longer knows it).
async fn second_prompt_runs(session: &mut Session) -> bool {
    let mut watch = session.watch().await;
    let reply = session.prompt("second").await;
    let id = reply.action_id.clone();
    // A reopen that failed ends in a fault (the agent no longer knows the session), and the
    // queued prompt never runs.
    let (_, frame) = watch
        .entry(move |e, f| {
            (e.direction == pb::LogDirection::FromRuntime as i32 && f["id"] == id.as_str())
                || (e.direction == pb::LogDirection::Event as i32 && f["event"] == "fault")
        })
        .await;
    if frame["event"] == "fault" {
        assert!(
            frame["detail"]
                .as_str()
                .is_some_and(|d| d.contains("Resource not found")),
            "lost, and nothing else: {frame}"
        );
        return false;
    }
    watch.chunk("echo: second").await;
    frame["result"]["stopReason"] == "end_turn"
}

/// The runtimes of the harness that was stopped: every process with the profile's marker.
async fn runtimes_gone(marker: &str) {
    exited(&processes_with(marker)).await;
}

#[derive(Clone, Copy, Debug)]
enum HarnessStop {
    /// SIGTERM: the harness drains, stopping its runtimes itself.
    Drain,
    /// `kill -9`: its watchdog (and the parent-death signal) stop the runtimes.
    Kill9,
}

/// `rounds` times: a new session, a short first turn, the harness stopped at once, started
/// again, and the session's next prompt. How many sessions were lost.
async fn lost_sessions(how: HarnessStop, rounds: usize) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let marker = uuid::Uuid::now_v7().to_string();
    let config = lazy_config(dir.path(), &marker);
    let mut server = Serve::on(dir.path().join("data"), &config).start();
    let mut lost = 0;
    for _ in 0..rounds {
        let mut session = create(&server, dir.path(), "lazy").await;
        first_turn(&mut session).await;
        match how {
            HarnessStop::Drain => {
                server.signal(libc::SIGTERM);
                let status = server.wait().await;
                assert!(status.success(), "drained: {status:?}");
            }
            HarnessStop::Kill9 => server.kill_9(),
        }
        // What a restarting pod also waits for: the old harness's processes to be gone.
        runtimes_gone(&marker).await;
        server.restart();
        if !next_prompt_runs(&server, &session.id).await {
            lost += 1;
        }
    }
    lost
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_right_after_a_first_turn_loses_none_of_ten_lazily_written_sessions() {
    within(Duration::from_secs(120), async {
        let lost = lost_sessions(HarnessStop::Drain, 10).await;
        assert_eq!(lost, 0, "{lost} of 10 sessions lost by a drain");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_right_after_a_first_turn_loses_none_of_ten_lazily_written_sessions() {
    within(Duration::from_secs(120), async {
        let lost = lost_sessions(HarnessStop::Kill9, 10).await;
        assert_eq!(lost, 0, "{lost} of 10 sessions lost by a kill -9");
    })
    .await
}

/// A profile `stubborn`: `sh -c` wrapping a mock agent that ignores SIGTERM, with a grace of 1 s.
fn stubborn_config(dir: &Path, marker: &str) -> std::path::PathBuf {
    let program = env!("CARGO_BIN_EXE_agent-harness");
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[profiles.stubborn]
command = "sh"
args = ["-c", "\"$0\" mock-agent --resume --ignore-sigterm --stderr-at-start {marker}; exit $?", "{program}"]
stop_grace = "1s"
"#
        ),
    )
    .unwrap();
    path
}

/// A stubborn runtime in a turn that needs no input (so the end of its stdin does not end it
/// either): its two processes.
async fn stubborn_runtime(server: &ServeProcess, dir: &Path, marker: &str) -> Session {
    let mut session = create(server, dir, "stubborn").await;
    let mut watch = session.watch().await;
    session.prompt("@sleep 600000").await;
    watch.chunk("echo: @sleep 600000").await;
    assert_eq!(
        processes_with(marker).len(),
        2,
        "the wrapper and the agent run"
    );
    session
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_that_ignores_sigterm_is_killed_when_its_grace_is_over_and_nothing_of_it_survives()
 {
    within(Duration::from_secs(60), async {
        let dir = tempfile::tempdir().unwrap();
        let marker = uuid::Uuid::now_v7().to_string();
        let config = stubborn_config(dir.path(), &marker);
        let mut server = Serve::on(dir.path().join("data"), &config).start();
        let mut session = stubborn_runtime(&server, dir.path(), &marker).await;
        let tree = processes_with(&marker);
        session
            .client
            .close_session(pb::CloseSessionRequest {
                session_id: session.id.clone(),
            })
            .await
            .unwrap();
        let killed = server
            .next_logged("a runtime outlived its stop grace; killing it")
            .await
            .expect("the grace ran out");
        assert_eq!(killed["grace"], "1s", "{killed}");
        exited(&tree).await;
        assert!(processes_with(&marker).is_empty());
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_kill_9_the_watchdog_kills_a_runtime_that_ignores_sigterm_once_its_grace_is_over() {
    within(Duration::from_secs(60), async {
        let dir = tempfile::tempdir().unwrap();
        let marker = uuid::Uuid::now_v7().to_string();
        let config = stubborn_config(dir.path(), &marker);
        let mut server = Serve::on(dir.path().join("data"), &config).start();
        stubborn_runtime(&server, dir.path(), &marker).await;
        let tree = processes_with(&marker);
        server.kill_9();
        // SIGTERM (the watchdog's, the parent-death signal) ends the wrapper but not the agent;
        // the watchdog's SIGKILL after the grace does.
        exited(&tree).await;
        assert!(processes_with(&marker).is_empty());
    })
    .await
}

#[tokio::test]
async fn a_bridge_stops_its_runtime_gracefully_so_a_lazily_written_session_reopens_after_idling() {
    within(crate::bridge::BRIDGE_TIMEOUT, async {
        let sessions = tempfile::tempdir().unwrap();
        let h = crate::harness::Harness::start_with(|config| {
            crate::bridge::remote_profile(
                config,
                "far",
                &[("pool", "lazy")],
                "lazy",
                Duration::from_secs(20),
                Duration::from_secs(30),
            );
            let far = std::sync::Arc::get_mut(config.profiles.get_mut("far").unwrap()).unwrap();
            far.idle_timeout = Some(Duration::from_millis(200));
        })
        .await;
        let bridge_profile = format!(
            "[profiles.lazy]\ncommand = {:?}\nargs = [\"mock-agent\", \"--resume\", \"--session-dir\", {sessions:?}, \"--save-delay\", \"60000\"]\n\
             sandbox = {{ read_write = [{sessions:?}] }}\n",
            agent_harness_testkit::service_bin().to_string_lossy(),
            sessions = sessions.path().to_string_lossy(),
        );
        let _bridge = crate::bridge::Bridge::start(
            &crate::bridge::url(h.addr()),
            "b-lazy",
            &[("pool", "lazy")],
            &bridge_profile,
            None,
        );
        let mut session = Session::create(&h, "far").await;
        let mut watch = session.watch().await;
        first_turn(&mut session).await;
        // Idle: the harness stops the runtime, and the bridge stops it gracefully.
        watch.status(pb::SessionStatus::Suspended).await;
        assert!(second_prompt_runs(&mut session).await, "the session was lost");
    })
    .await
}

#[tokio::test]
async fn a_stopped_runtime_is_sent_sigterm_and_ends_long_before_a_long_grace() {
    crate::harness::bounded(async {
        let marker = uuid::Uuid::now_v7().to_string();
        let h = crate::harness::Harness::start_with(|config| {
            crate::support::mock_profile_with(
                config,
                "patient",
                &["--resume", "--stderr-at-start", &marker],
                |p| p.resilience.stop_grace = Duration::from_secs(600),
            );
        })
        .await;
        let mut session = Session::create(&h, "patient").await;
        let mut watch = session.watch().await;
        // A turn that needs no input: the end of its stdin alone would not end the agent.
        session.prompt("@sleep 600000").await;
        watch.chunk("echo: @sleep 600000").await;
        let agent = processes_with(&marker);
        assert_eq!(agent.len(), 1);
        session
            .client
            .close_session(pb::CloseSessionRequest {
                session_id: session.id.clone(),
            })
            .await
            .unwrap();
        // Only SIGTERM ends it before the test's own bound (far below the grace).
        exited(&agent).await;
    })
    .await
}
