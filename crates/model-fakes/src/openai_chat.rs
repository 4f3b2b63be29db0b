//! The OpenAI Chat Completions API as opencode calls it (through `@ai-sdk/openai-compatible`):
//! `POST /v1/chat/completions`, streamed as `data:` chunks ending with `data: [DONE]` when the
//! request says `"stream": true`, one JSON completion otherwise; anything else is a 404 in the
//! API's error shape.
//!
//! The conversation is `messages` (`system`, `user`, `assistant` with `tool_calls`, `tool` with
//! the result). A streamed answer is `chat.completion.chunk`s: the role, text in `content`
//! deltas (a thought in `reasoning_content`), a `[write]` as one `tool_calls` delta calling the
//! agent's file-writing function — opencode's `write` (`filePath`, absolute, and `content`), or
//! Qwen Code's `write_file` (`file_path`, `content`) when that is what the request offers — then
//! the finish reason
//! (`tool_calls` or `stop`) and a usage chunk. opencode also asks for a title in a request
//! without tools: a side request, answered plainly.

use bytes::Bytes;
use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};

use crate::{
    record::{RecordedRequest, Recorder},
    script::{self, Conversation, Step, Stop, ToolResult, Turn},
    server::{self, ApiRequest, Body},
};

/// opencode's file-writing tool (arguments `filePath`, absolute, and `content`).
pub const WRITE_TOOL: &str = "write";

/// Qwen Code's file-writing tool (arguments `file_path`, absolute, and `content`).
pub const QWEN_WRITE_TOOL: &str = "write_file";

/// The file-writing function the agent offers: its name and its path argument.
#[derive(Debug, Clone, Copy)]
struct Writer {
    name: &'static str,
    path_key: &'static str,
}

impl Writer {
    /// opencode's, unless the request offers only Qwen Code's.
    fn offered(tools: &[String]) -> Self {
        let offers = |name: &str| tools.iter().any(|t| t == name);
        if offers(QWEN_WRITE_TOOL) && !offers(WRITE_TOOL) {
            Self {
                name: QWEN_WRITE_TOOL,
                path_key: "file_path",
            }
        } else {
            Self {
                name: WRITE_TOOL,
                path_key: "filePath",
            }
        }
    }

    fn arguments(self, path: &str, content: &str) -> String {
        let mut arguments = serde_json::Map::new();
        arguments.insert(self.path_key.to_owned(), json!(path));
        arguments.insert("content".to_owned(), json!(content));
        Value::Object(arguments).to_string()
    }
}

/// The longest piece a text is streamed in.
const PIECE_CHARS: usize = 24;

const API: &str = "openai-chat";

pub(crate) async fn handle(request: ApiRequest, recorder: &Recorder) -> Response<Body> {
    let mut recorded = request.recorded(API);
    let ApiRequest {
        method, path, body, ..
    } = request;
    if method != Method::POST || path != "/v1/chat/completions" {
        recorded.status = 404;
        recorder.push(recorded);
        return error(StatusCode::NOT_FOUND, "not_found", "no such route");
    }
    let Some(body) = serde_json::from_slice::<Value>(&body)
        .ok()
        .filter(Value::is_object)
    else {
        recorded.status = 400;
        recorder.push(recorded);
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "the body is not a JSON object",
        );
    };
    let conversation = read(&body, &mut recorded);
    let writer = Writer::offered(&recorded.tools);
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
            let code = match status.as_u16() {
                401 => "invalid_api_key",
                429 => "rate_limit_exceeded",
                _ => "server_error",
            };
            let mut response = error(status, code, &message);
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
                (steps, stop, writer),
                recorder.clone(),
            ));
            response
        }
        Turn::Answer { steps, stop } => {
            recorder.served(recorded.seq, INPUT_TOKENS, WHOLE_OUTPUT_TOKENS);
            whole_answer(recorded.seq, &model, steps, stop, writer).await
        }
    }
}

/// Reads the conversation the script needs and fills the recorded fields.
fn read(body: &Value, recorded: &mut RecordedRequest) -> Conversation {
    recorded.model = body["model"].as_str().map(str::to_owned);
    recorded.stream = body["stream"].as_bool().unwrap_or(false);
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    recorded.messages = messages.len();
    recorded.tools = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
        .collect();
    let offers_tools = !recorded.tools.is_empty();
    // A side request (no tools) wraps the conversation in its own instructions: only the texts
    // of the conversation it quotes count as the person's.
    recorded.user_texts = messages
        .iter()
        .filter(|m| m["role"] == "user")
        .flat_map(|m| texts(&m["content"]))
        .filter(|t| !inserted_by_agent(t))
        .collect();
    recorded.last_user_text = recorded.user_texts.last().cloned();
    let tool_result = messages
        .last()
        .filter(|m| m["role"] == "tool")
        .map(|m| ToolResult {
            is_error: texts(&m["content"])
                .iter()
                .any(|t| t.to_lowercase().contains("error")),
        });
    recorded.tool_result = tool_result.is_some();
    // opencode says it in the system prompt; Qwen Code in the context it sends as a first user
    // message.
    let cwd = messages
        .iter()
        .filter(|m| m["role"] == "system" || m["role"] == "user")
        .flat_map(|m| texts(&m["content"]))
        .find_map(|t| {
            t.lines().find_map(|line| {
                [
                    "Working directory: ",
                    "I'm currently working in the directory: ",
                ]
                .iter()
                .find_map(|label| line.split_once(label))
                .map(|(_, dir)| dir.trim().to_owned())
            })
        })
        .filter(|dir| !dir.is_empty());
    Conversation {
        last_user_text: recorded.last_user_text.clone(),
        tool_result,
        cwd,
        offers_tools,
    }
}

/// The texts of a message's content (a string, or an array of `text` parts).
fn texts(content: &Value) -> Vec<String> {
    match content {
        Value::String(text) => vec![text.clone()],
        Value::Array(parts) => parts
            .iter()
            .filter(|p| p["type"] == "text")
            .filter_map(|p| p["text"].as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

/// opencode's own user texts: the title request's instruction (`Generate a title for this
/// conversation:`) and tagged reminders (`<system-reminder>`).
fn inserted_by_agent(text: &str) -> bool {
    let trimmed = text.trim_start();
    let mut chars = trimmed.chars();
    (chars.next() == Some('<') && chars.next().is_some_and(|c| c.is_ascii_lowercase()))
        || trimmed.starts_with("Generate a title for this conversation")
}

fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let kind = if status.is_client_error() && status != StatusCode::TOO_MANY_REQUESTS {
        "invalid_request_error"
    } else {
        code
    };
    let mut response = server::json(
        status,
        &json!({ "error": { "message": message, "type": kind, "code": code, "param": null } }),
    );
    response.headers_mut().insert(
        "x-should-retry",
        hyper::header::HeaderValue::from_static("false"),
    );
    response
}

fn finish_reason(stop: Stop) -> &'static str {
    match stop {
        Stop::EndTurn => "stop",
        Stop::ToolUse => "tool_calls",
    }
}

/// The input tokens every answer reports.
const INPUT_TOKENS: u64 = 100;
/// The output tokens a whole (not streamed) answer reports.
const WHOLE_OUTPUT_TOKENS: u64 = 10;

fn usage(output_tokens: usize) -> Value {
    json!({
        "prompt_tokens": INPUT_TOKENS,
        "completion_tokens": output_tokens,
        "total_tokens": INPUT_TOKENS as usize + output_tokens,
    })
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
    (steps, stop, writer): (Vec<Step>, Stop, Writer),
    recorder: Recorder,
) {
    let chunk = |delta: Value, finish: Option<&str>| -> Bytes {
        let data = json!({
            "id": format!("chatcmpl-fake-{seq}"), "object": "chat.completion.chunk",
            "created": 0, "model": model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
        });
        format!("data: {data}\n\n").into()
    };
    let mut output_tokens = 0;
    let mut calls = 0;
    if !out
        .send(chunk(json!({ "role": "assistant", "content": "" }), None))
        .await
    {
        return;
    }
    for step in steps {
        let sent = match step {
            Step::Thinking(text) => {
                out.send(chunk(json!({ "reasoning_content": text }), None))
                    .await
            }
            Step::Text(text) => {
                let mut sent = true;
                for piece in pieces(&text) {
                    output_tokens += 1;
                    sent = out.send(chunk(json!({ "content": piece }), None)).await;
                    if !sent {
                        break;
                    }
                }
                sent
            }
            Step::Stall(duration) => out.stall(duration).await,
            Step::WriteFile { path, content } => {
                let call = json!({ "tool_calls": [{
                    "index": calls, "id": format!("call_fake_{seq}_{calls}"), "type": "function",
                    "function": { "name": writer.name, "arguments": writer.arguments(&path, &content) },
                }]});
                calls += 1;
                out.send(chunk(call, None)).await
            }
        };
        if !sent {
            return;
        }
    }
    if !out.send(chunk(json!({}), Some(finish_reason(stop)))).await {
        return;
    }
    let usage = json!({
        "id": format!("chatcmpl-fake-{seq}"), "object": "chat.completion.chunk", "created": 0,
        "model": model, "choices": [], "usage": usage(output_tokens.max(1)),
    });
    if !out.send(format!("data: {usage}\n\n")).await {
        return;
    }
    recorder.served(seq, INPUT_TOKENS, output_tokens.max(1) as u64);
    let _ = out.send("data: [DONE]\n\n").await;
}

/// The same answer as one JSON completion (`"stream": false`); a stall delays it.
async fn whole_answer(
    seq: usize,
    model: &str,
    steps: Vec<Step>,
    stop: Stop,
    writer: Writer,
) -> Response<Body> {
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut tool_calls = Vec::new();
    for step in steps {
        match step {
            Step::Thinking(text) => reasoning.push_str(&text),
            Step::Text(text) => content.push_str(&text),
            Step::Stall(duration) => tokio::time::sleep(duration).await,
            Step::WriteFile {
                path,
                content: written,
            } => tool_calls.push(json!({
                "id": format!("call_fake_{seq}_{}", tool_calls.len()), "type": "function",
                "function": { "name": writer.name, "arguments": writer.arguments(&path, &written) },
            })),
        }
    }
    let mut message = json!({ "role": "assistant", "content": content });
    if !reasoning.is_empty() {
        message["reasoning_content"] = Value::String(reasoning);
    }
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    server::json(
        StatusCode::OK,
        &json!({
            "id": format!("chatcmpl-fake-{seq}"), "object": "chat.completion", "created": 0,
            "model": model,
            "choices": [{ "index": 0, "message": message, "finish_reason": finish_reason(stop) }],
            "usage": usage(WHOLE_OUTPUT_TOKENS as usize),
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_calls_qwen_codes_write_file_when_only_that_is_offered() {
        let qwen = Writer::offered(&["read_file".into(), "write_file".into()]);
        assert_eq!(qwen.name, "write_file");
        let arguments: Value = serde_json::from_str(&qwen.arguments("/w/a.txt", "hi")).unwrap();
        assert_eq!(
            arguments,
            json!({ "file_path": "/w/a.txt", "content": "hi" })
        );
        let opencode = Writer::offered(&["write".into(), "write_file".into()]);
        assert_eq!(opencode.name, "write");
        let arguments: Value = serde_json::from_str(&opencode.arguments("/w/a.txt", "hi")).unwrap();
        assert_eq!(
            arguments,
            json!({ "filePath": "/w/a.txt", "content": "hi" })
        );
    }

    #[test]
    fn the_conversation_finds_the_cwd_in_the_system_prompt_and_sees_the_tool_result() {
        let body = json!({
            "model": "fake-model",
            "stream": true,
            "tools": [{ "type": "function", "function": { "name": "write" } },
                      { "type": "function", "function": { "name": "bash" } }],
            "messages": [
                { "role": "system", "content": "You are opencode.\n  Working directory: /work/here\n" },
                { "role": "user", "content": [{ "type": "text", "text": "first [write a.txt]" }] },
                { "role": "assistant", "content": "", "tool_calls": [{ "id": "c", "type": "function",
                    "function": { "name": "write", "arguments": "{}" } }] },
                { "role": "tool", "tool_call_id": "c", "content": "Wrote file successfully." },
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
        assert_eq!(recorded.messages, 4);
        assert_eq!(recorded.tools, ["write", "bash"]);
        assert!(recorded.stream && recorded.tool_result);
    }

    #[test]
    fn a_title_request_is_a_side_request_quoting_the_prompt() {
        let body = json!({ "model": "m", "messages": [
            { "role": "system", "content": "You are a title generator." },
            { "role": "user", "content": "Generate a title for this conversation:\n" },
            { "role": "user", "content": "hello [stall 30]" },
        ]});
        let mut recorded = RecordedRequest::default();
        let conversation = read(&body, &mut recorded);
        assert!(!conversation.offers_tools);
        assert_eq!(recorded.user_texts, ["hello [stall 30]"]);
    }
}
