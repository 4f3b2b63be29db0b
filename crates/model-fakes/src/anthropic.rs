//! The Anthropic Messages API as Claude Code calls it: `POST /v1/messages` (the query, e.g.
//! `?beta=true`, is ignored), streamed as server-sent events when the request says `"stream":
//! true` and as one JSON message otherwise; `POST /v1/messages/count_tokens`; anything else is a
//! 404 in the API's error shape.
//!
//! A streamed answer is `message_start`, `ping`, then per step a content block (`thinking` with a
//! `thinking_delta` and a `signature_delta`; `text` with `text_delta`s, held open across a
//! `[stall]`; `tool_use` with its input in `input_json_delta` pieces), then `message_delta` with
//! the stop reason and `message_stop`. Errors carry `x-should-retry: false`, so the SDK inside
//! the agent reports them at once instead of retrying with backoff.

use bytes::Bytes;
use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};

use crate::{
    record::{RecordedRequest, Recorder},
    script::{self, Conversation, Step, Stop, ToolResult, Turn},
    server::{self, ApiRequest, Body},
};

/// Claude Code's file-writing tool (input `file_path`, absolute, and `content`), as the `tools`
/// of a request from Claude Code 2.1.83 (claude-agent-acp 0.23.1) list it.
pub const WRITE_TOOL: &str = "Write";

/// The longest piece a text or a tool input is streamed in.
const PIECE_CHARS: usize = 24;

const API: &str = "anthropic";

pub(crate) async fn handle(request: ApiRequest, recorder: &Recorder) -> Response<Body> {
    let mut recorded = request.recorded(API);
    let ApiRequest {
        method, path, body, ..
    } = request;
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    let is_messages = path == "/v1/messages";
    if method != Method::POST || !(is_messages || path == "/v1/messages/count_tokens") {
        recorded.status = 404;
        recorder.push(recorded);
        return error(StatusCode::NOT_FOUND, "not_found_error", "no such route");
    }
    let Some(body) = parsed.filter(Value::is_object) else {
        recorded.status = 400;
        recorder.push(recorded);
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "the body is not a JSON object",
        );
    };
    let conversation = read(&body, &mut recorded);
    if !is_messages {
        recorded.status = 200;
        recorder.push(recorded);
        return server::json(StatusCode::OK, &json!({ "input_tokens": 100 }));
    }
    let turn = script::plan(&conversation);
    let model = recorded.model.clone().unwrap_or_default();
    let stream = recorded.stream;
    recorded.status = match &turn {
        Turn::Error { status, .. } => *status,
        Turn::Answer { .. } => 200,
    };
    let recorded = recorder.push(recorded);
    match turn {
        Turn::Error {
            status,
            message,
            retryable,
        } => {
            let status = StatusCode::from_u16(status).expect("a valid status");
            let kind = match status.as_u16() {
                401 => "authentication_error",
                429 => "rate_limit_error",
                _ => "api_error",
            };
            let mut response = error(status, kind, &message);
            if retryable {
                response.headers_mut().remove("x-should-retry");
            }
            response
        }
        Turn::Answer { steps, stop } if stream => {
            let (response, out) = server::event_stream();
            tokio::spawn(stream_answer(
                out,
                recorded.seq,
                model,
                steps,
                stop,
                recorder.clone(),
            ));
            response
        }
        Turn::Answer { steps, stop } => {
            recorder.served(recorded.seq, INPUT_TOKENS, WHOLE_OUTPUT_TOKENS);
            whole_answer(recorded.seq, &model, steps, stop).await
        }
    }
}

/// Reads the conversation the script needs and fills the recorded fields.
fn read(body: &Value, recorded: &mut RecordedRequest) -> Conversation {
    recorded.model = body["model"].as_str().map(str::to_owned);
    recorded.stream = body["stream"].as_bool().unwrap_or(false);
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    recorded.messages = messages.len();
    recorded.user_texts = messages
        .iter()
        .filter(|m| m["role"] == "user")
        .flat_map(|m| texts(&m["content"]))
        .filter(|t| !inserted_by_agent(t))
        .collect();
    recorded.last_user_text = recorded.user_texts.last().cloned();
    recorded.tools = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect();
    let tool_result = messages
        .last()
        .filter(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_array())
        .and_then(|blocks| blocks.iter().rev().find(|b| b["type"] == "tool_result"))
        .map(|b| ToolResult {
            is_error: b["is_error"].as_bool().unwrap_or(false),
        });
    recorded.tool_result = tool_result.is_some();
    Conversation {
        last_user_text: recorded.last_user_text.clone(),
        tool_result,
        cwd: working_directory(&body["system"]),
        offers_tools: !recorded.tools.is_empty(),
    }
}

/// The text blocks of a message's content (a string, or an array of blocks).
fn texts(content: &Value) -> Vec<String> {
    match content {
        Value::String(text) => vec![text.clone()],
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

/// Claude Code adds its own user texts (`<system-reminder>`, `<command-name>`,
/// `<local-command-stdout>`, …): they start with a tag, a person's prompt in a test does not.
fn inserted_by_agent(text: &str) -> bool {
    let mut chars = text.trim_start().chars();
    chars.next() == Some('<') && chars.next().is_some_and(|c| c.is_ascii_lowercase())
}

/// The working directory Claude Code names in its system prompt.
fn working_directory(system: &Value) -> Option<String> {
    let text = match system {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => return None,
    };
    ["Primary working directory: ", "Working directory: "]
        .iter()
        .find_map(|label| {
            text.lines()
                .find_map(|line| line.split_once(label).map(|(_, dir)| dir.trim().to_owned()))
        })
        .filter(|dir| !dir.is_empty())
}

fn error(status: StatusCode, kind: &str, message: &str) -> Response<Body> {
    let mut response = server::json(
        status,
        &json!({ "type": "error", "error": { "type": kind, "message": message } }),
    );
    response.headers_mut().insert(
        "x-should-retry",
        hyper::header::HeaderValue::from_static("false"),
    );
    response
}

fn stop_reason(stop: Stop) -> &'static str {
    match stop {
        Stop::EndTurn => "end_turn",
        Stop::ToolUse => "tool_use",
    }
}

/// The input tokens every answer reports.
const INPUT_TOKENS: u64 = 100;
/// The output tokens a whole (not streamed) answer reports.
const WHOLE_OUTPUT_TOKENS: u64 = 10;

fn usage(output_tokens: usize) -> Value {
    json!({
        "input_tokens": INPUT_TOKENS,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    })
}

fn tool_input(path: &str, content: &str) -> Value {
    json!({ "file_path": path, "content": content })
}

fn event(name: &str, data: Value) -> Bytes {
    format!("event: {name}\ndata: {data}\n\n").into()
}

/// `text` in pieces of at most [`PIECE_CHARS`] characters.
fn pieces(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars
        .chunks(PIECE_CHARS)
        .map(|piece| piece.iter().collect())
        .collect()
}

/// Streams the answer; stops as soon as the agent hangs up.
async fn stream_answer(
    out: server::Stream,
    seq: usize,
    model: String,
    steps: Vec<Step>,
    stop: Stop,
    recorder: Recorder,
) {
    let mut writer = Writer {
        out,
        index: 0,
        open_text: false,
        output_tokens: 0,
    };
    if writer.answer(seq, &model, steps, stop).await.is_ok() {
        recorder.served(seq, INPUT_TOKENS, writer.output_tokens.max(1) as u64);
    }
}

struct Writer {
    out: server::Stream,
    /// The index of the next content block.
    index: usize,
    /// Whether a text block is open (at index `index - 1`).
    open_text: bool,
    output_tokens: usize,
}

/// `Err(Gone)`: the client hung up; the stream stops.
struct Gone;

impl Writer {
    async fn send(&mut self, name: &str, data: Value) -> Result<(), Gone> {
        if self.out.send(event(name, data)).await {
            Ok(())
        } else {
            Err(Gone)
        }
    }

    async fn answer(
        &mut self,
        seq: usize,
        model: &str,
        steps: Vec<Step>,
        stop: Stop,
    ) -> Result<(), Gone> {
        self.send(
            "message_start",
            json!({ "type": "message_start", "message": {
                "id": format!("msg_fake_{seq}"), "type": "message", "role": "assistant",
                "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": usage(1),
            }}),
        )
        .await?;
        self.send("ping", json!({ "type": "ping" })).await?;
        for step in steps {
            match step {
                Step::Thinking(text) => {
                    self.close_text().await?;
                    self.block(json!({ "type": "thinking", "thinking": "", "signature": "" }))
                        .await?;
                    self.delta(json!({ "type": "thinking_delta", "thinking": text }))
                        .await?;
                    self.delta(json!({ "type": "signature_delta", "signature": "fake-signature" }))
                        .await?;
                    self.close().await?;
                }
                Step::Text(text) => {
                    if !self.open_text {
                        self.block(json!({ "type": "text", "text": "" })).await?;
                        self.open_text = true;
                    }
                    for piece in pieces(&text) {
                        self.output_tokens += 1;
                        self.delta(json!({ "type": "text_delta", "text": piece }))
                            .await?;
                    }
                }
                Step::Stall(duration) => {
                    if !self.out.stall(duration).await {
                        return Err(Gone);
                    }
                }
                Step::WriteFile { path, content } => {
                    self.close_text().await?;
                    self.block(json!({
                        "type": "tool_use", "id": format!("toolu_fake_{seq}_{}", self.index),
                        "name": WRITE_TOOL, "input": {},
                    }))
                    .await?;
                    let input = tool_input(&path, &content).to_string();
                    for piece in pieces(&input) {
                        self.delta(json!({ "type": "input_json_delta", "partial_json": piece }))
                            .await?;
                    }
                    self.close().await?;
                }
            }
        }
        self.close_text().await?;
        self.send(
            "message_delta",
            json!({ "type": "message_delta",
                "delta": { "stop_reason": stop_reason(stop), "stop_sequence": null },
                "usage": { "output_tokens": self.output_tokens.max(1) },
            }),
        )
        .await?;
        self.send("message_stop", json!({ "type": "message_stop" }))
            .await
    }

    async fn block(&mut self, content_block: Value) -> Result<(), Gone> {
        let index = self.index;
        self.index += 1;
        self.send(
            "content_block_start",
            json!({ "type": "content_block_start", "index": index, "content_block": content_block }),
        )
        .await
    }

    async fn delta(&mut self, delta: Value) -> Result<(), Gone> {
        let index = self.index - 1;
        self.send(
            "content_block_delta",
            json!({ "type": "content_block_delta", "index": index, "delta": delta }),
        )
        .await
    }

    async fn close(&mut self) -> Result<(), Gone> {
        let index = self.index - 1;
        self.send(
            "content_block_stop",
            json!({ "type": "content_block_stop", "index": index }),
        )
        .await
    }

    async fn close_text(&mut self) -> Result<(), Gone> {
        if self.open_text {
            self.open_text = false;
            self.close().await?;
        }
        Ok(())
    }
}

/// The same answer as one JSON message (`"stream": false`); a stall delays it.
async fn whole_answer(seq: usize, model: &str, steps: Vec<Step>, stop: Stop) -> Response<Body> {
    let mut content: Vec<Value> = Vec::new();
    for step in steps {
        match step {
            Step::Thinking(text) => content.push(
                json!({ "type": "thinking", "thinking": text, "signature": "fake-signature" }),
            ),
            Step::Text(text) => match content.last_mut() {
                Some(last) if last["type"] == "text" => {
                    let joined = format!("{}{text}", last["text"].as_str().unwrap_or(""));
                    last["text"] = Value::String(joined);
                }
                _ => content.push(json!({ "type": "text", "text": text })),
            },
            Step::Stall(duration) => tokio::time::sleep(duration).await,
            Step::WriteFile {
                path,
                content: written,
            } => {
                let id = format!("toolu_fake_{seq}_{}", content.len());
                content.push(json!({
                    "type": "tool_use", "id": id, "name": WRITE_TOOL,
                    "input": tool_input(&path, &written),
                }));
            }
        }
    }
    server::json(
        StatusCode::OK,
        &json!({
            "id": format!("msg_fake_{seq}"), "type": "message", "role": "assistant",
            "model": model, "content": content, "stop_reason": stop_reason(stop),
            "stop_sequence": null, "usage": usage(WHOLE_OUTPUT_TOKENS as usize),
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conversation_skips_texts_the_agent_inserts_and_finds_the_working_directory() {
        let body = json!({
            "model": "claude-sonnet-4-6",
            "stream": true,
            "system": [
                { "type": "text", "text": "You are an agent." },
                { "type": "text", "text": "Env:\n - Primary working directory: /work/here\n" },
            ],
            "tools": [{ "name": "Write" }, { "name": "Bash" }],
            "messages": [
                { "role": "user", "content": [
                    { "type": "text", "text": "<system-reminder>\nskills\n</system-reminder>" },
                    { "type": "text", "text": "first [write a.txt]" },
                ]},
                { "role": "assistant", "content": [{ "type": "tool_use", "id": "t", "name": "Write", "input": {} }] },
                { "role": "user", "content": [
                    { "type": "tool_result", "tool_use_id": "t", "content": "ok" },
                    { "type": "text", "text": "<system-reminder>todo</system-reminder>" },
                ]},
            ],
        });
        let mut recorded = RecordedRequest::default();
        let conversation = read(&body, &mut recorded);
        assert_eq!(
            conversation,
            Conversation {
                last_user_text: Some("first [write a.txt]".into()),
                tool_result: Some(ToolResult { is_error: false }),
                cwd: Some("/work/here".into()),
                offers_tools: true,
            }
        );
        assert_eq!(recorded.messages, 3);
        assert_eq!(recorded.user_texts, ["first [write a.txt]"]);
        assert_eq!(recorded.tools, ["Write", "Bash"]);
        assert!(recorded.stream && recorded.tool_result);
    }

    #[test]
    fn a_plain_string_content_is_one_text() {
        let body = json!({ "model": "m", "messages": [{ "role": "user", "content": "hi" }] });
        let mut recorded = RecordedRequest::default();
        let conversation = read(&body, &mut recorded);
        assert_eq!(conversation.last_user_text.as_deref(), Some("hi"));
        assert!(!conversation.offers_tools);
        assert_eq!(conversation.cwd, None);
    }
}
