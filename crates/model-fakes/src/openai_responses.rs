//! The OpenAI Responses API as Codex (`codex-acp`) calls it: `POST /v1/responses` with `"stream":
//! true`, answered as server-sent events; anything else is a 404 in the API's error shape.
//!
//! Codex sends the whole conversation every time (`"store": false`): `input` holds `message`
//! items (its own developer and `<environment_context>` texts among them), the model's earlier
//! output items, and `custom_tool_call_output` / `function_call_output` items answering its tool
//! calls. A streamed answer is `response.created`, then per output item
//! `response.output_item.added`, its deltas and `response.output_item.done` (Codex acts on the
//! `done` item), then `response.completed` with the usage. A `[write]` is the freeform
//! `apply_patch` tool Codex offers (a `custom_tool_call` whose input is an `*** Add File:`
//! patch). Errors carry `x-should-retry: false`, though Codex retries by its provider's
//! `request_max_retries` (set it to 0 for the fake).

use bytes::Bytes;
use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};

use crate::{
    record::{RecordedRequest, Recorder},
    script::{self, Conversation, Step, ToolResult, Turn},
    server::{self, ApiRequest, Body},
};

/// Codex's file-editing tool: a freeform (`custom`) tool whose input is a patch.
pub const PATCH_TOOL: &str = "apply_patch";

/// The longest piece a text is streamed in.
const PIECE_CHARS: usize = 24;

const API: &str = "openai-responses";

pub(crate) async fn handle(request: ApiRequest, recorder: &Recorder) -> Response<Body> {
    let mut recorded = request.recorded(API);
    let ApiRequest {
        method, path, body, ..
    } = request;
    if method != Method::POST || path != "/v1/responses" {
        recorded.status = 404;
        recorder.push(recorded);
        return error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "no such route",
        );
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
                401 => "invalid_api_key",
                429 => "rate_limit_exceeded",
                _ => "server_error",
            };
            let mut response = error(status, kind, &message);
            if retryable {
                response.headers_mut().remove("x-should-retry");
            }
            response
        }
        Turn::Answer { steps, .. } if stream => {
            let (response, out) = server::event_stream();
            tokio::spawn(stream_answer(
                out,
                recorded.seq,
                model,
                steps,
                recorder.clone(),
            ));
            response
        }
        Turn::Answer { steps, .. } => {
            recorder.served(recorded.seq, INPUT_TOKENS, WHOLE_OUTPUT_TOKENS);
            whole_answer(recorded.seq, &model, steps).await
        }
    }
}

/// Reads the conversation the script needs and fills the recorded fields.
fn read(body: &Value, recorded: &mut RecordedRequest) -> Conversation {
    recorded.model = body["model"].as_str().map(str::to_owned);
    recorded.stream = body["stream"].as_bool().unwrap_or(false);
    let input = match &body["input"] {
        Value::Array(items) => items.clone(),
        Value::String(text) => vec![json!({ "type": "message", "role": "user", "content": text })],
        _ => Vec::new(),
    };
    recorded.messages = input.len();
    let user_texts: Vec<String> = input
        .iter()
        .filter(|item| item["role"] == "user")
        .flat_map(|item| texts(&item["content"]))
        .collect();
    let cwd = user_texts
        .iter()
        .find_map(|t| between(t, "<cwd>", "</cwd>"));
    recorded.user_texts = user_texts
        .into_iter()
        .filter(|t| !inserted_by_agent(t))
        .collect();
    recorded.last_user_text = recorded.user_texts.last().cloned();
    recorded.tools = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect();
    // The model's tool call was answered when the last item is its output (Codex sends the
    // call and its output as the last two items of the next request).
    let tool_result = input
        .last()
        .filter(|item| {
            matches!(
                item["type"].as_str(),
                Some("custom_tool_call_output" | "function_call_output")
            )
        })
        .map(|item| ToolResult {
            is_error: !patch_succeeded(&item["output"]),
        });
    recorded.tool_result = tool_result.is_some();
    Conversation {
        last_user_text: recorded.last_user_text.clone(),
        tool_result,
        cwd,
        offers_tools: !recorded.tools.is_empty(),
    }
}

/// The text parts of a message's content (a string, or an array of `input_text` parts).
fn texts(content: &Value) -> Vec<String> {
    match content {
        Value::String(text) => vec![text.clone()],
        Value::Array(parts) => parts
            .iter()
            .filter(|p| p["type"] == "input_text" || p["type"] == "text")
            .filter_map(|p| p["text"].as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

/// Codex adds user texts of its own (`<environment_context>`, `<user_instructions>`, …): they
/// start with a tag, a person's prompt in a test does not.
fn inserted_by_agent(text: &str) -> bool {
    let mut chars = text.trim_start().chars();
    chars.next() == Some('<') && chars.next().is_some_and(|c| c.is_ascii_lowercase())
}

fn between(text: &str, open: &str, close: &str) -> Option<String> {
    let (_, rest) = text.split_once(open)?;
    let (inside, _) = rest.split_once(close)?;
    Some(inside.trim().to_owned()).filter(|s| !s.is_empty())
}

/// Codex reports an applied patch as `Success. Updated the following files: …` (a string, or
/// an array of text parts); anything else (a rejection, an error) is a failed call.
fn patch_succeeded(output: &Value) -> bool {
    let text = match output {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        other => other.to_string(),
    };
    text.contains("Success")
}

/// The patch that adds `path` with `content`.
pub fn add_file_patch(path: &str, content: &str) -> String {
    let mut patch = format!("*** Begin Patch\n*** Add File: {path}\n");
    for line in content.lines() {
        patch.push_str(&format!("+{line}\n"));
    }
    patch.push_str("*** End Patch\n");
    patch
}

fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let kind = if status == StatusCode::NOT_FOUND || status == StatusCode::BAD_REQUEST {
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

/// The input tokens every answer reports.
const INPUT_TOKENS: u64 = 100;
/// The output tokens a whole (not streamed) answer reports.
const WHOLE_OUTPUT_TOKENS: u64 = 10;

fn usage(output_tokens: usize) -> Value {
    json!({
        "input_tokens": INPUT_TOKENS,
        "input_tokens_details": { "cached_tokens": 0 },
        "output_tokens": output_tokens,
        "output_tokens_details": { "reasoning_tokens": 0 },
        "total_tokens": INPUT_TOKENS as usize + output_tokens,
    })
}

fn event(data: Value) -> Bytes {
    let name = data["type"].as_str().unwrap_or("message").to_owned();
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

fn message_item(id: &str, text: &str) -> Value {
    json!({
        "type": "message", "id": id, "role": "assistant", "status": "completed",
        "content": [{ "type": "output_text", "text": text, "annotations": [] }],
    })
}

fn reasoning_item(id: &str, text: &str) -> Value {
    json!({
        "type": "reasoning", "id": id,
        "summary": [{ "type": "summary_text", "text": text }],
    })
}

fn patch_item(id: &str, call_id: &str, path: &str, content: &str) -> Value {
    json!({
        "type": "custom_tool_call", "id": id, "status": "completed", "call_id": call_id,
        "name": PATCH_TOOL, "input": add_file_patch(path, content),
    })
}

/// Streams the answer; stops as soon as the agent hangs up.
async fn stream_answer(
    out: server::Stream,
    seq: usize,
    model: String,
    steps: Vec<Step>,
    recorder: Recorder,
) {
    let mut writer = Writer {
        out,
        seq,
        output: Vec::new(),
        open_text: None,
        output_tokens: 0,
    };
    if writer.answer(&model, steps).await.is_ok() {
        recorder.served(seq, INPUT_TOKENS, writer.output_tokens.max(1) as u64);
    }
}

struct Writer {
    out: server::Stream,
    seq: usize,
    /// The output items done so far.
    output: Vec<Value>,
    /// The message item being streamed: its id and its text so far.
    open_text: Option<(String, String)>,
    output_tokens: usize,
}

/// `Err(Gone)`: the client hung up; the stream stops.
struct Gone;

impl Writer {
    async fn send(&mut self, data: Value) -> Result<(), Gone> {
        if self.out.send(event(data)).await {
            Ok(())
        } else {
            Err(Gone)
        }
    }

    fn response(&self, model: &str, status: &str, usage: Value) -> Value {
        json!({
            "id": format!("resp_fake_{}", self.seq), "object": "response", "model": model,
            "status": status, "output": self.output, "usage": usage,
        })
    }

    async fn answer(&mut self, model: &str, steps: Vec<Step>) -> Result<(), Gone> {
        let created = self.response(model, "in_progress", Value::Null);
        self.send(json!({ "type": "response.created", "response": created }))
            .await?;
        for step in steps {
            match step {
                Step::Thinking(text) => {
                    self.close_text().await?;
                    let id = self.next_id("rs");
                    let index = self.output.len();
                    self.send(
                        json!({ "type": "response.output_item.added", "output_index": index,
                        "item": { "type": "reasoning", "id": id, "summary": [] } }),
                    )
                    .await?;
                    self.send(json!({ "type": "response.reasoning_summary_part.added",
                        "item_id": id, "output_index": index, "summary_index": 0,
                        "part": { "type": "summary_text", "text": "" } }))
                        .await?;
                    self.send(json!({ "type": "response.reasoning_summary_text.delta",
                        "item_id": id, "output_index": index, "summary_index": 0, "delta": text }))
                        .await?;
                    self.done(reasoning_item(&id, &text)).await?;
                }
                Step::Text(text) => {
                    if self.open_text.is_none() {
                        let id = self.next_id("msg");
                        let index = self.output.len();
                        self.send(json!({ "type": "response.output_item.added",
                            "output_index": index, "item": { "type": "message", "id": id,
                            "role": "assistant", "status": "in_progress", "content": [] } }))
                            .await?;
                        self.send(json!({ "type": "response.content_part.added",
                            "item_id": id, "output_index": index, "content_index": 0,
                            "part": { "type": "output_text", "text": "", "annotations": [] } }))
                            .await?;
                        self.open_text = Some((id, String::new()));
                    }
                    let index = self.output.len();
                    for piece in pieces(&text) {
                        self.output_tokens += 1;
                        let id = self.open_text.as_ref().map(|(id, _)| id.clone());
                        self.send(json!({ "type": "response.output_text.delta", "item_id": id,
                            "output_index": index, "content_index": 0, "delta": piece }))
                            .await?;
                        if let Some((_, so_far)) = self.open_text.as_mut() {
                            so_far.push_str(&piece);
                        }
                    }
                }
                Step::Stall(duration) => {
                    if !self.out.stall(duration).await {
                        return Err(Gone);
                    }
                }
                Step::WriteFile { path, content } => {
                    self.close_text().await?;
                    let id = self.next_id("ctc");
                    let call_id = format!("call_fake_{}_{}", self.seq, self.output.len());
                    let index = self.output.len();
                    self.send(
                        json!({ "type": "response.output_item.added", "output_index": index,
                        "item": { "type": "custom_tool_call", "id": id, "status": "in_progress",
                            "call_id": call_id, "name": PATCH_TOOL, "input": "" } }),
                    )
                    .await?;
                    let item = patch_item(&id, &call_id, &path, &content);
                    let input = item["input"].as_str().unwrap_or_default().to_owned();
                    for piece in pieces(&input) {
                        self.send(json!({ "type": "response.custom_tool_call_input.delta",
                            "item_id": id, "output_index": index, "delta": piece }))
                            .await?;
                    }
                    self.done(item).await?;
                }
            }
        }
        self.close_text().await?;
        let completed = self.response(model, "completed", usage(self.output_tokens.max(1)));
        self.send(json!({ "type": "response.completed", "response": completed }))
            .await
    }

    fn next_id(&self, prefix: &str) -> String {
        format!("{prefix}_fake_{}_{}", self.seq, self.output.len())
    }

    /// `response.output_item.done` for the next output item.
    async fn done(&mut self, item: Value) -> Result<(), Gone> {
        let index = self.output.len();
        self.output.push(item.clone());
        self.send(
            json!({ "type": "response.output_item.done", "output_index": index, "item": item }),
        )
        .await
    }

    async fn close_text(&mut self) -> Result<(), Gone> {
        if let Some((id, text)) = self.open_text.take() {
            let index = self.output.len();
            self.send(json!({ "type": "response.output_text.done", "item_id": id,
                "output_index": index, "content_index": 0, "text": text }))
                .await?;
            self.done(message_item(&id, &text)).await?;
        }
        Ok(())
    }
}

/// The same answer as one JSON response (`"stream": false`); a stall delays it.
async fn whole_answer(seq: usize, model: &str, steps: Vec<Step>) -> Response<Body> {
    let mut output: Vec<Value> = Vec::new();
    let mut text = String::new();
    let flush = |output: &mut Vec<Value>, text: &mut String| {
        if !text.is_empty() {
            let id = format!("msg_fake_{seq}_{}", output.len());
            output.push(message_item(&id, text));
            text.clear();
        }
    };
    for step in steps {
        match step {
            Step::Thinking(thought) => {
                flush(&mut output, &mut text);
                let id = format!("rs_fake_{seq}_{}", output.len());
                output.push(reasoning_item(&id, &thought));
            }
            Step::Text(more) => text.push_str(&more),
            Step::Stall(duration) => tokio::time::sleep(duration).await,
            Step::WriteFile { path, content } => {
                flush(&mut output, &mut text);
                let id = format!("ctc_fake_{seq}_{}", output.len());
                let call_id = format!("call_fake_{seq}_{}", output.len());
                output.push(patch_item(&id, &call_id, &path, &content));
            }
        }
    }
    flush(&mut output, &mut text);
    server::json(
        StatusCode::OK,
        &json!({
            "id": format!("resp_fake_{seq}"), "object": "response", "model": model,
            "status": "completed", "output": output, "usage": usage(WHOLE_OUTPUT_TOKENS as usize),
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conversation_skips_codex_texts_finds_the_cwd_and_sees_the_patch_result() {
        let body = json!({
            "model": "gpt-5.3-codex",
            "stream": true,
            "tools": [{ "type": "function", "name": "exec_command" },
                      { "type": "custom", "name": "apply_patch" }],
            "input": [
                { "type": "message", "role": "developer", "content": [
                    { "type": "input_text", "text": "<permissions instructions>x" }] },
                { "type": "message", "role": "user", "content": [
                    { "type": "input_text",
                      "text": "<environment_context>\n  <cwd>/work/here</cwd>\n</environment_context>" }] },
                { "type": "message", "role": "user", "content": [
                    { "type": "input_text", "text": "first [write a.txt]" }] },
                { "type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": "p" },
                { "type": "custom_tool_call_output", "call_id": "c",
                  "output": "Success. Updated the following files:\nA a.txt\n" },
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
        assert_eq!(recorded.messages, 5);
        assert_eq!(recorded.user_texts, ["first [write a.txt]"]);
        assert_eq!(recorded.tools, ["exec_command", "apply_patch"]);
        assert!(recorded.stream && recorded.tool_result);
    }

    #[test]
    fn a_rejected_patch_is_a_failed_tool_call() {
        let body = json!({ "model": "m", "tools": [{ "name": "apply_patch" }], "input": [
            { "type": "message", "role": "user", "content": "go [write a.txt]" },
            { "type": "custom_tool_call_output", "call_id": "c", "output": "patch rejected by user" },
        ]});
        let conversation = read(&body, &mut RecordedRequest::default());
        assert_eq!(
            conversation.tool_result,
            Some(ToolResult { is_error: true })
        );
    }

    #[test]
    fn the_patch_adds_the_file_line_by_line() {
        assert_eq!(
            add_file_patch("/w/a.txt", "one\ntwo\n"),
            "*** Begin Patch\n*** Add File: /w/a.txt\n+one\n+two\n*** End Patch\n"
        );
    }
}
