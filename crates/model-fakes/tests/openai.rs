//! The fake OpenAI APIs over real HTTP: Responses (as Codex reads it) and Chat Completions (as
//! opencode reads it): the streamed events of a write and of its follow-up, and the errors.

use std::time::Duration;

use agent_harness_model_fakes::{
    Api, FakeServer, openai_responses::add_file_patch, script::WRITTEN_CONTENT,
};
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

fn post(path: &str, body: Value) -> Request<Full<Bytes>> {
    Request::post(path)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a request")
}

/// The JSON `data` of each server-sent event (`[DONE]` left out).
fn data(body: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(body).expect("UTF-8");
    text.split("\n\n")
        .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).expect("JSON data"))
        .collect()
}

fn codex_request(input: Vec<Value>) -> Value {
    let mut all = vec![
        json!({ "type": "message", "role": "developer",
                "content": [{ "type": "input_text", "text": "<permissions instructions>" }] }),
        json!({ "type": "message", "role": "user", "content": [{ "type": "input_text",
                "text": "<environment_context>\n  <cwd>/work/dir</cwd>\n</environment_context>" }] }),
    ];
    all.extend(input);
    json!({
        "model": "gpt-5.3-codex",
        "stream": true,
        "store": false,
        "tools": [{ "type": "function", "name": "exec_command" },
                  { "type": "custom", "name": "apply_patch" }],
        "input": all,
    })
}

fn user(text: &str) -> Value {
    json!({ "type": "message", "role": "user", "content": [{ "type": "input_text", "text": text }] })
}

#[tokio::test]
async fn a_responses_write_streams_text_then_an_apply_patch_call_that_adds_the_file() {
    within(async {
        let server = FakeServer::start(Api::OpenAiResponses).await.unwrap();
        let request = codex_request(vec![user("go [write a.txt]")]);
        let (response, body) = send(&server, post("/v1/responses", request)).await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        let events = data(&body);
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(types.first(), Some(&"response.created"));
        assert_eq!(types.last(), Some(&"response.completed"));
        let text: String = events
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .map(|e| e["delta"].as_str().unwrap())
            .collect();
        assert_eq!(text, "I will write a.txt.");
        let done: Vec<&Value> = events
            .iter()
            .filter(|e| e["type"] == "response.output_item.done")
            .map(|e| &e["item"])
            .collect();
        assert_eq!(done.len(), 2, "{done:?}");
        assert_eq!(done[0]["type"], "message");
        assert_eq!(done[0]["content"][0]["text"], "I will write a.txt.");
        assert_eq!(done[1]["type"], "custom_tool_call");
        assert_eq!(done[1]["name"], "apply_patch");
        assert_eq!(
            done[1]["input"],
            add_file_patch("/work/dir/a.txt", WRITTEN_CONTENT)
        );
        let completed = events.last().unwrap();
        assert_eq!(completed["response"]["usage"]["total_tokens"], 101);

        let recorded = server.requests();
        assert_eq!(recorded.len(), 1);
        assert_eq!(recorded[0].api, "openai-responses");
        assert_eq!(recorded[0].model.as_deref(), Some("gpt-5.3-codex"));
        assert_eq!(recorded[0].user_texts, ["go [write a.txt]"]);
        assert!(recorded[0].is_turn_step());
    })
    .await
}

#[tokio::test]
async fn a_responses_request_answering_the_patch_gets_the_short_answer() {
    within(async {
        let server = FakeServer::start(Api::OpenAiResponses).await.unwrap();
        let request = codex_request(vec![
            user("go [write a.txt]"),
            json!({ "type": "custom_tool_call", "call_id": "c", "name": "apply_patch",
                    "input": "*** Begin Patch" }),
            json!({ "type": "custom_tool_call_output", "call_id": "c",
                    "output": "Success. Updated the following files:\nA /work/dir/a.txt\n" }),
        ]);
        let (_, body) = send(&server, post("/v1/responses", request)).await;
        let done: Vec<Value> = data(&body)
            .into_iter()
            .filter(|e| e["type"] == "response.output_item.done")
            .map(|e| e["item"].clone())
            .collect();
        assert_eq!(done.len(), 1);
        assert_eq!(
            done[0]["content"][0]["text"],
            "Wrote a.txt. Fake reply to \"go\"."
        );
        assert!(server.requests()[0].tool_result);
    })
    .await
}

#[tokio::test]
async fn a_responses_error_directive_answers_that_status_in_the_apis_shape() {
    within(async {
        let server = FakeServer::start(Api::OpenAiResponses).await.unwrap();
        let request = codex_request(vec![user("[error 500]")]);
        let (response, body) = send(&server, post("/v1/responses", request)).await;
        assert_eq!(response.status(), 500);
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], "server_error");
        let (response, _) = send(&server, post("/v1/chat/completions", json!({}))).await;
        assert_eq!(
            response.status(),
            404,
            "the Responses fake has no other route"
        );
    })
    .await
}

fn opencode_request(messages: Vec<Value>) -> Value {
    let mut all = vec![
        json!({ "role": "system", "content": "You are opencode.\n  Working directory: /w\n" }),
    ];
    all.extend(messages);
    json!({
        "model": "fake-model",
        "stream": true,
        "stream_options": { "include_usage": true },
        "tools": [{ "type": "function", "function": { "name": "write" } }],
        "messages": all,
    })
}

#[tokio::test]
async fn a_chat_write_streams_text_then_a_write_call_then_the_finish_and_done() {
    within(async {
        let server = FakeServer::start(Api::OpenAiChat).await.unwrap();
        let request = opencode_request(vec![
            json!({ "role": "user", "content": "go [write a.txt]" }),
        ]);
        let (response, body) = send(&server, post("/v1/chat/completions", request)).await;
        assert_eq!(response.status(), 200);
        assert!(
            std::str::from_utf8(&body)
                .unwrap()
                .ends_with("data: [DONE]\n\n")
        );
        let chunks = data(&body);
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "I will write a.txt.");
        let call = chunks
            .iter()
            .find_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0))
            .expect("a tool call");
        assert_eq!(call["function"]["name"], "write");
        let arguments: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(
            arguments,
            json!({ "filePath": "/w/a.txt", "content": WRITTEN_CONTENT })
        );
        let finish = chunks
            .iter()
            .find_map(|c| c["choices"][0]["finish_reason"].as_str())
            .unwrap();
        assert_eq!(finish, "tool_calls");
        assert!(chunks.last().unwrap()["usage"]["total_tokens"].is_number());
    })
    .await
}

#[tokio::test]
async fn a_chat_tool_result_gets_the_short_answer_and_a_title_request_a_plain_one() {
    within(async {
        let server = FakeServer::start(Api::OpenAiChat).await.unwrap();
        let request = opencode_request(vec![
            json!({ "role": "user", "content": "go [write a.txt]" }),
            json!({ "role": "assistant", "content": "", "tool_calls": [{ "id": "c",
                    "type": "function", "function": { "name": "write", "arguments": "{}" } }] }),
            json!({ "role": "tool", "tool_call_id": "c", "content": "Wrote file successfully." }),
        ]);
        let (_, body) = send(&server, post("/v1/chat/completions", request)).await;
        let text: String = data(&body)
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Wrote a.txt. Fake reply to \"go\".");

        let title = json!({ "model": "fake-model", "stream": false, "messages": [
            { "role": "system", "content": "You are a title generator." },
            { "role": "user", "content": "Generate a title for this conversation:\n" },
            { "role": "user", "content": "go [stall 30] [error 500]" },
        ]});
        let (response, body) = send(&server, post("/v1/chat/completions", title)).await;
        assert_eq!(response.status(), 200);
        let completion: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            completion["choices"][0]["message"]["content"],
            "Fake reply to \"go\"."
        );
        let recorded = server.requests();
        assert!(recorded[0].is_turn_step() && recorded[0].tool_result);
        assert!(recorded[1].is_model_call() && !recorded[1].is_turn_step());
    })
    .await
}

#[tokio::test]
async fn a_chat_error_directive_answers_that_status_in_the_apis_shape() {
    within(async {
        let server = FakeServer::start(Api::OpenAiChat).await.unwrap();
        let request = opencode_request(vec![json!({ "role": "user", "content": "[error 429]" })]);
        let (response, body) = send(&server, post("/v1/chat/completions", request)).await;
        assert_eq!(response.status(), 429);
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], "rate_limit_exceeded");
        assert_eq!(server.requests()[0].status, 429);
    })
    .await
}
