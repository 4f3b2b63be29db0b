//! Traces over OTLP to a real receiver (the testkit's): the spans of one turn and how they hang
//! together, the turn's context as the agent gets it, and an unreachable collector that costs
//! the calls nothing.

use agent_harness::pb::v1 as pb;
use agent_harness_testkit::otlp::{OtlpReceiver, ReceivedSpan};
use tonic::Request;

use crate::{
    harness::{Harness, bounded},
    operations::{sample, scrape},
    support::{Session, answer_request, prompt},
};

/// The caller's own trace: every span of the turn must join it.
const CALLER_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const CALLER_SPAN: &str = "b7ad6b7169203331";

fn one<'a>(spans: &'a [ReceivedSpan], name: &str) -> &'a ReceivedSpan {
    let found: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.name == name && s.trace_id == CALLER_TRACE)
        .collect();
    assert_eq!(found.len(), 1, "one {name} span in {spans:#?}");
    found[0]
}

#[tokio::test]
async fn a_turn_with_a_tool_call_and_a_permission_exports_its_spans_under_the_callers_trace() {
    bounded(async {
        let receiver = OtlpReceiver::start().await;
        let h = Harness::start_with(|config| {
            config.otlp_endpoint = Some(receiver.endpoint());
            config.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        })
        .await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let mut request = Request::new(
            session.control_request(prompt("traced\n@tool t1\n@permission\n@traceparent")),
        );
        request.metadata_mut().insert(
            "traceparent",
            format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01")
                .parse()
                .unwrap(),
        );
        let reply = session.client.control(request).await.unwrap().into_inner();
        let asked = watch.agent_request("session/request_permission").await;
        session
            .act(answer_request(&asked, Some("allow-once")))
            .await
            .expect("the answer is taken");
        let reported = watch.chunk("traceparent: ").await;
        watch.response_to(&reply.action_id).await;
        let reported = reported["params"]["update"]["content"]["text"]
            .as_str()
            .unwrap()
            .trim_start_matches("traceparent: ")
            .to_owned();

        let spans = receiver
            .wait_for(|spans| {
                ["turn", "tool_call", "permission_wait"].iter().all(|name| {
                    spans
                        .iter()
                        .any(|s| &s.name == name && s.trace_id == CALLER_TRACE)
                })
            })
            .await;
        let rpc = spans
            .iter()
            .find(|s| {
                s.trace_id == CALLER_TRACE
                    && s.attribute("rpc.method") == Some("Control")
                    && s.parent_span_id == CALLER_SPAN
            })
            .expect("the prompt's RPC span, under the caller's span");
        assert_eq!(rpc.attribute("rpc.system"), Some("grpc"));
        assert_eq!(rpc.service_name, "agent-harness");
        let turn = one(&spans, "turn");
        assert_eq!(
            turn.parent_span_id, rpc.span_id,
            "the turn hangs under its RPC"
        );
        assert_eq!(
            turn.attribute("agent_harness.session_id"),
            Some(session.id.as_str())
        );
        assert_eq!(turn.attribute("agent_harness.profile"), Some("mock"));
        assert_eq!(
            turn.attribute("agent_harness.action_id"),
            Some(reply.action_id.as_str())
        );
        assert_eq!(
            turn.attribute("agent_harness.stop_reason"),
            Some("end_turn")
        );
        let tool = one(&spans, "tool_call");
        assert_eq!(tool.parent_span_id, turn.span_id);
        assert_eq!(tool.attribute("agent_harness.tool_call_id"), Some("t1"));
        let wait = one(&spans, "permission_wait");
        assert_eq!(wait.parent_span_id, turn.span_id);
        assert_eq!(wait.attribute("agent_harness.outcome"), Some("answered"));
        // What the agent got in `_meta.traceparent` is the turn itself.
        assert_eq!(
            reported,
            format!("00-{}-{}-01", turn.trace_id, turn.span_id)
        );
        // The wait is timed in the metrics too (a histogram with buckets).
        let metrics = scrape(h.metrics_addr().unwrap()).await;
        assert_eq!(
            sample(&metrics, "agent_harness_permission_wait_seconds_count"),
            1.0
        );
        assert!(metrics.contains("agent_harness_permission_wait_seconds_bucket{le="));
    })
    .await;
}

#[tokio::test]
async fn an_unreachable_collector_fails_no_call_and_its_spans_are_dropped_and_counted() {
    bounded(async {
        // Nothing listens there: a port bound and closed again.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let h = Harness::start_with(|config| {
            config.otlp_endpoint = Some(endpoint);
            config.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        })
        .await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        for text in ["one\n@tool a", "two\n@tool b"] {
            let reply = session.prompt(text).await;
            let response = watch.response_to(&reply.action_id).await;
            assert_eq!(response["result"]["stopReason"], "end_turn");
        }
        let _ = session.get().await;
        let _: pb::AgentSession = session.get().await;
        let addr = h.metrics_addr().unwrap();
        // Each export fails at once (connection refused); wait for the count to show it.
        loop {
            let text = scrape(addr).await;
            if sample(&text, "agent_harness_trace_spans_dropped_total") > 0.0 {
                assert_eq!(
                    sample(&text, "agent_harness_trace_spans_exported_total"),
                    0.0
                );
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
}

/// A collector that cannot be reached is said in the server's log (a warning naming the error,
/// then at most one a minute), not only counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_collector_is_said_in_the_log() {
    bounded(async {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let dir = tempfile::tempdir().unwrap();
        let mut server = agent_harness_testkit::process::Serve::new()
            .args(["--otlp-endpoint", &endpoint, "--data-dir"])
            .arg(dir.path().join("data"))
            .start();
        let mut session = Session::create_with_client(
            pb::agent_session_service_client::AgentSessionServiceClient::new(
                server.channel().await,
            ),
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
        let reply = session.prompt("traced").await;
        watch.response_to(&reply.action_id).await;
        let warned = server
            .next_logged(
                "trace export to the OTLP collector failed; its spans are dropped (counted in \
                 agent_harness_trace_spans_dropped_total)",
            )
            .await
            .expect("the warning is logged");
        assert_eq!(warned["level"], "WARN", "{warned}");
        assert!(
            warned["fields"]["error"].is_string() || warned["error"].is_string(),
            "{warned}"
        );
    })
    .await;
}
