//! The fake Anthropic Messages API over real HTTP: the SSE events Claude Code reads, the error
//! answers, and the shared routes.

use std::time::Duration;

use agent_harness_model_fakes::{Api, FakeServer, script::WRITTEN_CONTENT};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, client::conn::http1};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

async fn within<F: std::future::Future>(body: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), body)
        .await
        .expect("the test finishes in time")
}

/// Sends one request on a connection of its own; the answer's status, headers and whole body.
async fn send(server: &FakeServer, request: Request<Full<Bytes>>) -> (Response<()>, Bytes) {
    let stream = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("connects");
    let (mut sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let response = sender.send_request(request).await.expect("an answer");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("the body").to_bytes();
    (Response::from_parts(parts, ()), body)
}

fn messages(body: Value) -> Request<Full<Bytes>> {
    Request::post("/v1/messages?beta=true")
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a request")
}

fn claude_request(prompt: &str) -> Value {
    json!({
        "model": "claude-sonnet-4-6",
        "stream": true,
        "system": [{ "type": "text", "text": " - Primary working directory: /work/dir" }],
        "tools": [{ "name": "Write" }, { "name": "Read" }],
        "messages": [{ "role": "user", "content": [
            { "type": "text", "text": "<system-reminder>x</system-reminder>" },
            { "type": "text", "text": prompt },
        ]}],
    })
}

/// The `data` of each SSE event, with its `event` name checked against the data's type.
fn events(body: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(body).expect("UTF-8");
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|event| {
            let name = event
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .expect("an event name");
            let data: Value = serde_json::from_str(
                event
                    .lines()
                    .find_map(|l| l.strip_prefix("data: "))
                    .expect("data"),
            )
            .expect("JSON data");
            assert_eq!(data["type"], name);
            data
        })
        .collect()
}

#[tokio::test]
async fn a_write_prompt_streams_text_then_a_tool_use_whose_input_deltas_join_to_the_write() {
    within(async {
        let server = FakeServer::start(Api::Anthropic).await.unwrap();
        let (response, body) = send(&server, messages(claude_request("go [write a.txt]"))).await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        let events = events(&body);
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(types.first(), Some(&"message_start"));
        assert_eq!(types.last(), Some(&"message_stop"));
        let tool_start = events
            .iter()
            .find(|e| e["content_block"]["type"] == "tool_use")
            .expect("a tool_use block");
        assert_eq!(tool_start["content_block"]["name"], "Write");
        let index = &tool_start["index"];
        let input: String = events
            .iter()
            .filter(|e| &e["index"] == index && e["delta"]["type"] == "input_json_delta")
            .map(|e| e["delta"]["partial_json"].as_str().unwrap())
            .collect();
        assert_eq!(
            serde_json::from_str::<Value>(&input).unwrap(),
            json!({ "file_path": "/work/dir/a.txt", "content": WRITTEN_CONTENT })
        );
        let stop = events
            .iter()
            .find(|e| e["type"] == "message_delta")
            .unwrap();
        assert_eq!(stop["delta"]["stop_reason"], "tool_use");

        let recorded = server.requests();
        assert_eq!(recorded.len(), 1);
        assert_eq!(recorded[0].path, "/v1/messages");
        assert_eq!(recorded[0].model.as_deref(), Some("claude-sonnet-4-6"));
        assert_eq!(
            recorded[0].last_user_text.as_deref(),
            Some("go [write a.txt]")
        );
        assert!(recorded[0].is_turn_step());
    })
    .await
}

#[tokio::test]
async fn a_thinking_block_comes_first_and_the_text_quotes_the_marker() {
    within(async {
        let server = FakeServer::start(Api::Anthropic).await.unwrap();
        let (_, body) = send(&server, messages(claude_request("hello [think] there"))).await;
        let events = events(&body);
        let first_block = events
            .iter()
            .find(|e| e["type"] == "content_block_start")
            .unwrap();
        assert_eq!(first_block["content_block"]["type"], "thinking");
        assert!(
            events
                .iter()
                .any(|e| e["delta"]["type"] == "signature_delta")
        );
        let text: String = events
            .iter()
            .filter(|e| e["delta"]["type"] == "text_delta")
            .map(|e| e["delta"]["text"].as_str().unwrap())
            .collect();
        assert_eq!(text, "Fake reply to \"hello there\".");
    })
    .await
}

#[tokio::test]
async fn an_error_directive_answers_that_status_and_asks_for_no_retry() {
    within(async {
        let server = FakeServer::start(Api::Anthropic).await.unwrap();
        let (response, body) = send(&server, messages(claude_request("[error 429]"))).await;
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()["x-should-retry"], "false");
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "rate_limit_error");
        assert_eq!(server.requests()[0].status, 429);
    })
    .await
}

#[tokio::test]
async fn head_root_answers_and_get_requests_lists_what_was_recorded() {
    within(async {
        let server = FakeServer::start(Api::Anthropic).await.unwrap();
        let head = Request::head("/")
            .header("host", "127.0.0.1")
            .body(Full::new(Bytes::new()))
            .unwrap();
        assert_eq!(send(&server, head).await.0.status(), 200);
        let mut plain = claude_request("plain");
        plain["stream"] = json!(false);
        let (_, body) = send(&server, messages(plain)).await;
        let message: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(message["content"][0]["text"], "Fake reply to \"plain\".");
        assert_eq!(message["stop_reason"], "end_turn");

        let list = Request::get("/_requests")
            .header("host", "127.0.0.1")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let (_, body) = send(&server, list).await;
        let listed: Value = serde_json::from_slice(&body).unwrap();
        let summary: Vec<(String, String)> = listed
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["method"].as_str().unwrap().to_owned(),
                    r["path"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("HEAD".to_owned(), "/".to_owned()),
                ("POST".to_owned(), "/v1/messages".to_owned())
            ]
        );
        assert_eq!(listed[1]["messages"], 1);
    })
    .await
}

#[tokio::test]
async fn a_stalled_stream_keeps_one_text_block_open_across_the_stall() {
    within(async {
        let server = FakeServer::start(Api::Anthropic).await.unwrap();
        let (_, body) = send(&server, messages(claude_request("slow [stall 1]"))).await;
        let blocks = events(&body)
            .iter()
            .filter(|e| e["type"] == "content_block_start")
            .count();
        assert_eq!(blocks, 1);
        let text: String = events(&body)
            .iter()
            .filter(|e| e["delta"]["type"] == "text_delta")
            .map(|e| e["delta"]["text"].as_str().unwrap())
            .collect();
        assert_eq!(text, "Stalling for 1 s. Fake reply to \"slow\".");
    })
    .await
}
