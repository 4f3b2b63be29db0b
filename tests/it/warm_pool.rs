//! Warm pools: a profile's `warm_pool = N` keeps N runtimes started and initialized;
//! a new session takes one and only sends `session/new`; a replacement starts in the
//! background; a warm runtime that dies is replaced and never handed out; warm runtimes count
//! against the live-runtime cap and die with the harness.

use std::time::Duration;

use agent_harness::pb::v1::{self as pb, agent_session_service_client::AgentSessionServiceClient};
use serde_json::Value;
use tonic::Code;

use crate::{
    harness::{Harness, assert_error, bounded, expect_err},
    operations::{sample, scrape},
    process::Serve,
    support::{Session, create_request, exited, mock_profile_with, processes_with, stop},
};

/// A harness with a `warm` profile keeping `size` runtimes, each marked with `marker` on its
/// command line, a `cold` profile of the same agent without a pool, and metrics.
async fn warm_harness(marker: &str, size: usize, live_runtimes: Option<usize>) -> Harness {
    Harness::start_with(|config| {
        config.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        if let Some(cap) = live_runtimes {
            config.limits.live_runtimes = cap;
        }
        mock_profile_with(
            config,
            "warm",
            &["--resume", "--stderr-at-start", marker],
            |p| {
                p.warm_pool = size;
                // A warm runtime starts before its session's owner and cwd: never boxed.
                p.sandbox = None;
            },
        );
        mock_profile_with(config, "cold", &["--resume"], |_| {});
    })
    .await
}

/// Waits until the pool reports `ready` runtimes and `live` marked processes (warm or in a
/// session) run; returns their pids.
async fn pool_ready(h: &Harness, marker: &str, ready: usize, live: usize) -> Vec<u32> {
    let addr = h.metrics_addr().expect("a metrics endpoint");
    loop {
        let text = scrape(addr).await;
        let gauge = sample(&text, "agent_harness_warm_pool_ready{profile=\"warm\"}");
        let mut pids = processes_with(marker);
        if gauge == ready as f64 && pids.len() == live {
            pids.sort_unstable();
            return pids;
        }
        // Nothing to wait on from outside: the pool fills in the background.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The log's `runtime_started` event of the session.
async fn runtime_started(session: &mut Session) -> Value {
    session
        .log()
        .await
        .iter()
        .filter(|e| e.direction == pb::LogDirection::Event as i32)
        .map(|e| serde_json::from_str::<Value>(&e.json).unwrap())
        .find(|e| e["event"] == "runtime_started")
        .expect("the start is logged")
}

#[tokio::test]
async fn a_session_on_a_warm_profile_takes_an_already_started_runtime() {
    bounded(async {
        let marker = uuid::Uuid::now_v7().to_string();
        let h = warm_harness(&marker, 1, None).await;
        let warm = pool_ready(&h, &marker, 1, 1).await;
        let text = scrape(h.metrics_addr().unwrap()).await;
        assert_eq!(
            sample(&text, "agent_harness_warm_pool_size{profile=\"warm\"}"),
            1.0
        );

        let mut session = Session::create(&h, "warm").await;
        let started = runtime_started(&mut session).await;
        assert_eq!(started["warm"], true, "{started}");
        assert_eq!(started["pid"], warm[0], "the runtime that was waiting");

        // The handshake is in the session's log in order, initialize first, answered before
        // session/new was sent.
        let log = session.log().await;
        let frames: Vec<(i32, Value)> = log
            .iter()
            .map(|e| (e.direction, serde_json::from_str(&e.json).unwrap()))
            .collect();
        let position = |direction: pb::LogDirection, what: &dyn Fn(&Value) -> bool| {
            frames
                .iter()
                .position(|(d, f)| *d == direction as i32 && what(f))
                .unwrap_or_else(|| panic!("not logged: {frames:?}"))
        };
        let initialize = position(pb::LogDirection::ToRuntime, &|f| {
            f["method"] == "initialize"
        });
        let answered = position(pb::LogDirection::FromRuntime, &|f| {
            f["id"] == frames[initialize].1["id"]
        });
        let new_session = position(pb::LogDirection::ToRuntime, &|f| {
            f["method"] == "session/new"
        });
        assert!(
            initialize < answered && answered < new_session,
            "{frames:?}"
        );
        assert_eq!(
            frames[new_session].1["params"]["cwd"],
            h.workspace().to_string_lossy().as_ref(),
            "session/new carries the session's cwd"
        );

        // The session works, and a replacement is started in the background.
        let reply = session.prompt("hello").await;
        let mut watch = session.watch().await;
        let response = watch.response_to(&reply.action_id).await;
        assert_eq!(response["result"]["stopReason"], "end_turn", "{response}");
        let refilled = pool_ready(&h, &marker, 1, 2).await;
        assert!(
            refilled.contains(&warm[0]),
            "the session's runtime lives on"
        );
    })
    .await
}

#[tokio::test]
async fn a_cold_profile_starts_its_runtime_when_the_session_is_created() {
    bounded(async {
        let marker = uuid::Uuid::now_v7().to_string();
        let h = warm_harness(&marker, 1, None).await;
        pool_ready(&h, &marker, 1, 1).await;
        let mut session = Session::create(&h, "cold").await;
        let started = runtime_started(&mut session).await;
        assert!(started.get("warm").is_none(), "{started}");
        assert_eq!(
            processes_with(&marker).len(),
            1,
            "the warm one is untouched"
        );
    })
    .await
}

#[tokio::test]
async fn a_warm_runtime_that_dies_is_replaced_and_never_handed_out() {
    bounded(async {
        let marker = uuid::Uuid::now_v7().to_string();
        let h = warm_harness(&marker, 1, None).await;
        let dead = pool_ready(&h, &marker, 1, 1).await[0];
        // SAFETY: kill only sends a signal, to our own child.
        unsafe { libc::kill(dead as libc::pid_t, libc::SIGKILL) };
        // Once it is gone, the one marked process the full pool reports is its replacement.
        exited(&[dead]).await;
        let replacement = pool_ready(&h, &marker, 1, 1).await[0];
        assert_ne!(replacement, dead);
        let mut session = Session::create(&h, "warm").await;
        let started = runtime_started(&mut session).await;
        assert_eq!(started["warm"], true, "{started}");
        assert_eq!(started["pid"], replacement, "never the dead one");
    })
    .await
}

#[tokio::test]
async fn a_warm_runtime_that_dies_during_the_handshake_is_replaced_by_a_cold_start_and_creation_succeeds()
 {
    bounded(async {
        let marker = uuid::Uuid::now_v7().to_string();
        let dir = tempfile::tempdir().unwrap();
        let crash = dir.path().join("crash-once");
        let crash_arg = crash.to_string_lossy().into_owned();
        let h = Harness::start_with(|config| {
            config.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
            mock_profile_with(
                config,
                "warm",
                &[
                    "--stderr-at-start",
                    &marker,
                    "--crash-on-new-session-once",
                    &crash_arg,
                ],
                |p| {
                    p.warm_pool = 1;
                    p.sandbox = None;
                },
            );
        })
        .await;
        let warm = pool_ready(&h, &marker, 1, 1).await[0];
        // The runtime waiting in the pool will crash when the session's session/new reaches it.
        std::fs::write(&crash, b"").unwrap();

        let mut session = Session::create(&h, "warm").await;
        assert!(
            !crash.exists(),
            "the warm runtime was asked for session/new"
        );
        let events: Vec<Value> = session
            .log()
            .await
            .iter()
            .filter(|e| e.direction == pb::LogDirection::Event as i32)
            .map(|e| serde_json::from_str::<Value>(&e.json).unwrap())
            .collect();
        let starts: Vec<&Value> = events
            .iter()
            .filter(|e| e["event"] == "runtime_started")
            .collect();
        assert_eq!(starts.len(), 2, "{events:?}");
        assert_eq!(starts[0]["warm"], true, "{events:?}");
        assert_eq!(starts[0]["pid"], warm, "{events:?}");
        assert_eq!(
            starts[1]["warm"],
            Value::Null,
            "the second start is cold: {events:?}"
        );
        assert_eq!(starts[1]["epoch"], 2, "{events:?}");
        let failed = events
            .iter()
            .find(|e| e["event"] == "warm_runtime_failed")
            .unwrap_or_else(|| panic!("the failed warm runtime is logged: {events:?}"));
        assert_eq!(failed["epoch"], 1, "{failed}");
        assert!(
            failed["stderr_tail"]
                .as_str()
                .is_some_and(|t| t.contains("crashing on session/new")),
            "{failed}"
        );

        // The session runs on the cold runtime.
        let reply = session.prompt("hello").await;
        let mut watch = session.watch().await;
        let response = watch.response_to(&reply.action_id).await;
        assert_eq!(response["result"]["stopReason"], "end_turn", "{response}");
    })
    .await
}

#[tokio::test]
async fn warm_runtimes_count_against_the_live_runtime_cap() {
    bounded(async {
        let marker = uuid::Uuid::now_v7().to_string();
        let h = warm_harness(&marker, 1, Some(2)).await;
        pool_ready(&h, &marker, 1, 1).await;
        // The session takes the warm runtime; its replacement fills the second slot.
        let _first = Session::create(&h, "warm").await;
        pool_ready(&h, &marker, 1, 2).await;
        let status = expect_err(
            h.sessions()
                .create_session(create_request(&h, "cold"))
                .await,
        );
        assert_error(&status, Code::ResourceExhausted, "TOO_MANY_RUNTIMES");
    })
    .await
}

#[tokio::test]
async fn stopping_the_harness_kills_its_warm_runtimes() {
    bounded(async {
        let marker = uuid::Uuid::now_v7().to_string();
        let h = warm_harness(&marker, 2, None).await;
        let warm = pool_ready(&h, &marker, 2, 2).await;
        h.shutdown().await;
        exited(&warm).await;
        assert_eq!(
            processes_with(&marker),
            [0u32; 0],
            "nothing marked outlives it"
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_kills_the_warm_runtimes_while_turns_still_run() {
    bounded(async {
        let marker = uuid::Uuid::now_v7().to_string();
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            format!(
                "[profiles.warm]\ncommand = {:?}\nargs = [\"mock-agent\", \"--stderr-at-start\", \
                 {marker:?}]\nwarm_pool = 2\nsandbox = \"off\"\n",
                agent_harness_testkit::service_bin().to_string_lossy()
            ),
        )
        .unwrap();
        let mut server = Serve::on(dir.path().join("data"), &config)
            .args(["--drain-grace", "60s"])
            .start();
        // The pool fills in the background and says nothing when full: polled through /proc.
        let warm = loop {
            let warm = processes_with(&marker);
            if warm.len() >= 2 {
                break warm;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let channel = server.channel().await;
        let mut session = Session::create_with_client(
            AgentSessionServiceClient::new(channel),
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
        let running = session.prompt("@wait-cancel").await;
        watch.chunk("echo: @wait-cancel").await;

        server.signal(libc::SIGTERM);
        exited(&warm).await;
        assert_eq!(
            processes_with(&marker),
            [0u32; 0],
            "no warm runtime is left"
        );
        assert!(
            server.try_wait().is_none(),
            "the warm runtimes are gone while the server still drains its running turn"
        );
        session.act(stop(false)).await.expect("a stop is accepted");
        watch.response_to(&running.action_id).await;
        assert!(server.wait().await.success());
    })
    .await
}
