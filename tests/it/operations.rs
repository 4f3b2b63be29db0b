//! Operations: Prometheus metrics, the W3C `traceparent` forwarded to the runtime, and
//! draining on SIGTERM with the real binary.

use std::{net::SocketAddr, time::Duration};

use agent_harness::pb::v1::{self as pb, agent_session_service_client::AgentSessionServiceClient};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::{
    harness::{Harness, assert_error, bounded, expect_err, within},
    process::Serve,
    support::{Session, prompt, stop},
};

pub(crate) async fn scrape(addr: SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text
}

/// The value of one sample line (`name{labels} value`) whose start matches `prefix`.
pub(crate) fn sample(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_metrics_scrape_after_a_turn_finds_the_counters_moved() {
    bounded(async {
        let h = Harness::start_with(|config| config.metrics_listen = Some("127.0.0.1:0".parse().unwrap())).await;
        let addr = h.metrics_addr().expect("a metrics endpoint");
        let mut session = Session::create(&h, "mock").await;
        let before = scrape(addr).await;
        let mut watch = session.watch().await;
        let reply = session.prompt("count me\n@chunks 3").await;
        watch.response_to(&reply.action_id).await;
        watch.status(pb::SessionStatus::Idle).await;
        let after = scrape(addr).await;
        for prefix in [
            "agent_harness_frames_appended_total{direction=\"from_runtime\"}",
            "agent_harness_frames_appended_total{direction=\"to_runtime\"}",
            "agent_harness_turns_total{stop_reason=\"end_turn\"}",
            "agent_harness_rpcs_total{method=\"/agent_harness.v1.AgentSessionService/Control\",code=\"Ok\"}",
            "agent_harness_rpc_duration_seconds_count{method=\"/agent_harness.v1.AgentSessionService/Control\",code=\"Ok\"}",
        ] {
            assert!(sample(&after, prefix) > sample(&before, prefix), "{prefix} moved:\n{after}");
        }
        assert!(sample(&after, "agent_harness_sessions{status=\"idle\"}") >= 1.0, "{after}");
        assert!(after.contains("agent_harness_queue_depth"));
        assert!(after.contains("agent_harness_subscribers"));
        // Errors are counted by their code.
        let _ = session.act(prompt("")).await;
        let errors = scrape(addr).await;
        assert!(
            sample(&errors, "agent_harness_rpcs_total{method=\"/agent_harness.v1.AgentSessionService/Control\",code=\"InvalidArgument\"}") >= 1.0,
            "{errors}"
        );
    })
    .await
}

#[tokio::test]
async fn a_turn_the_agent_answers_in_one_write_costs_two_commits_the_prompt_and_the_answer_with_the_turns_end()
 {
    bounded(async {
        let h = Harness::start_with(|config| {
            config.metrics_listen = Some("127.0.0.1:0".parse().unwrap())
        })
        .await;
        let addr = h.metrics_addr().expect("a metrics endpoint");
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        watch.status(pb::SessionStatus::Idle).await;
        let commits = || async { sample(&scrape(addr).await, "agent_harness_log_commits_total") };
        let before = commits().await;
        // The mock agent writes its echo and its answer in one write.
        let reply = session.prompt("one write").await;
        watch.response_to(&reply.action_id).await;
        let ended = watch.event("turn_ended").await;
        assert_eq!(ended["request_id"], reply.action_id.as_str());
        watch.status(pb::SessionStatus::Idle).await;
        assert_eq!(
            commits().await - before,
            2.0,
            "the prompt with its record, then the answer with its turn_ended and the idle status"
        );
        let stored = session.get().await;
        assert_eq!(stored.status, pb::SessionStatus::Idle as i32);
    })
    .await
}

#[tokio::test]
async fn the_traceparent_of_an_incoming_call_reaches_the_runtime_in_the_prompts_meta() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut request = tonic::Request::new(session.control_request(prompt("traced")));
        request
            .metadata_mut()
            .insert("traceparent", traceparent.parse().unwrap());
        let reply = session.client.control(request).await.unwrap().into_inner();
        let frames = session.sent_frames().await;
        let frame = frames
            .iter()
            .find(|f| f["id"] == reply.action_id.as_str())
            .unwrap();
        assert_eq!(frame["params"]["_meta"]["traceparent"], traceparent);
        // Without one, nothing is invented.
        let plain = session.prompt("untraced").await;
        let mut watch = session.watch().await;
        watch.response_to(&plain.action_id).await;
        let frames = session.sent_frames().await;
        let frame = frames
            .iter()
            .find(|f| f["id"] == plain.action_id.as_str())
            .unwrap();
        assert!(frame["params"].get("_meta").is_none());
    })
    .await
}

fn health_request(service: &str) -> HealthCheckRequest {
    HealthCheckRequest {
        service: service.to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_readiness_refuses_new_turns_accepts_stops_ends_streams_and_exits_0() {
    within(Duration::from_secs(60), async {
        let dir = tempfile::tempdir().unwrap();
        let serve = Serve::new()
            .args(["--drain-grace", "20s", "--data-dir"])
            .arg(dir.path().join("data"));
        let mut server = serve.start();
        let channel = server.channel().await;
        let mut session = Session::create_with_client(
            AgentSessionServiceClient::new(channel.clone()),
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

        let mut health = HealthClient::new(channel.clone());
        let readiness = "agent_harness.v1.AgentSessionService";
        let mut changes = health
            .watch(health_request(readiness))
            .await
            .unwrap()
            .into_inner();
        server.signal(libc::SIGTERM);
        while changes
            .message()
            .await
            .unwrap()
            .expect("the watch stays open")
            .status
            != ServingStatus::NotServing as i32
        {}
        // An open watch would hold the server up to its stop grace.
        drop(changes);
        assert_eq!(
            health
                .check(health_request(""))
                .await
                .unwrap()
                .into_inner()
                .status,
            ServingStatus::Serving as i32,
            "liveness stays SERVING"
        );
        let refused = expect_err(session.act(prompt("too late")).await);
        assert_error(&refused, Code::Unavailable, "DRAINING");
        assert_eq!(
            tonic_types::StatusExt::get_details_retry_info(&refused).and_then(|r| r.retry_delay),
            Some(Duration::from_secs(1))
        );
        let stopped = session
            .act(stop(false))
            .await
            .expect("a stop is still accepted");
        assert_eq!(stopped.status, pb::ControlStatus::Sent as i32);
        assert_eq!(
            watch.response_to(&running.action_id).await["result"]["stopReason"],
            "cancelled"
        );
        let end = watch.end().await;
        assert_error(&end, Code::Unavailable, "DRAINING");
        let seen = watch.entries.clone();
        let status = server.wait().await;
        assert_eq!(status.code(), Some(0), "exit 0 after draining");

        // After a restart the log holds every frame the stream saw, unchanged.
        server.restart();
        let mut again = Session::attach(server.client().await, &session.id);
        let log = again.log().await;
        for entry in &seen {
            assert_eq!(
                log.get(entry.offset as usize - 1),
                Some(entry),
                "offset {}",
                entry.offset
            );
        }
        assert!(
            log.iter().any(|e| e.json.contains("\"event\":\"drain\"")),
            "the drain is logged"
        );
        assert_eq!(
            again.get().await.status,
            pb::SessionStatus::Suspended as i32
        );
    })
    .await
}
