//! Usage read from the wire: the tokens a model API says a call took, read from its answer as it
//! streams past (server-sent events) or from its whole JSON body. The agent's own report is
//! never consulted here: what the provider charged is what the provider said.
//!
//! Each API says it in its own words:
//! - Anthropic Messages: `message_start` carries the input side (`input_tokens`, and the cache's
//!   `cache_creation_input_tokens` / `cache_read_input_tokens`, which `input_tokens` leaves out)
//!   and the model; `message_delta` carries the output so far (the last one is the total). A
//!   whole body has the same `usage` object.
//! - OpenAI Responses: `response.completed` (or `.incomplete` / `.failed`) carries the response
//!   with its `usage` (`input_tokens`, of which `input_tokens_details.cached_tokens` were read
//!   from the cache, and `output_tokens`).
//! - OpenAI Chat Completions: a chunk with a `usage` object (`prompt_tokens`, of which
//!   `prompt_tokens_details.cached_tokens`, and `completion_tokens`), the last chunk when the
//!   client asked for `stream_options.include_usage`.

use serde_json::Value;

use super::api::Api;

/// The most bytes of one event (or of a whole JSON body) read for its usage: an answer past it is
/// still passed on whole, only not read.
const MAX_EVENT_BYTES: usize = 8 << 20;

/// What one model call took, as its answer said.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WireUsage {
    /// Every input token, those read from and written to the provider's cache included.
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Of `input_tokens`, those read from the cache.
    pub cache_read_tokens: u64,
    /// Of `input_tokens`, those written to the cache (Anthropic's cache creation).
    pub cache_write_tokens: u64,
    /// The model that answered, as the answer names it.
    pub model: Option<String>,
}

impl WireUsage {
    pub fn tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

/// Reads an answer's usage from its bytes as they pass, without holding more than one event.
#[derive(Debug)]
pub struct UsageReader {
    api: Api,
    streamed: bool,
    /// The event (or body) being read.
    pending: Vec<u8>,
    /// The event grew past the cap: its bytes until the next boundary are skipped.
    skipping: bool,
    usage: WireUsage,
    /// Whether the answer said anything of usage at all.
    seen: bool,
}

impl UsageReader {
    /// A reader of an answer of `api`; `streamed` when it is `text/event-stream`.
    pub fn new(api: Api, streamed: bool) -> Self {
        Self {
            api,
            streamed,
            pending: Vec::new(),
            skipping: false,
            usage: WireUsage::default(),
            seen: false,
        }
    }

    /// Reads the next bytes of the answer.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        if !self.streamed {
            if self.pending.len() + bytes.len() > MAX_EVENT_BYTES {
                self.skipping = true;
            }
            if !self.skipping {
                self.pending.extend_from_slice(bytes);
            }
            return;
        }
        // Server-sent events: one line at a time, `data:` lines read as JSON.
        while let Some(end) = bytes.iter().position(|&b| b == b'\n') {
            let (line, rest) = bytes.split_at(end);
            bytes = &rest[1..];
            if self.skipping {
                self.skipping = false;
                self.pending.clear();
                continue;
            }
            self.pending.extend_from_slice(line);
            let line = std::mem::take(&mut self.pending);
            self.line(&line);
        }
        if self.skipping {
            return;
        }
        if self.pending.len() + bytes.len() > MAX_EVENT_BYTES {
            self.skipping = true;
            self.pending.clear();
        } else {
            self.pending.extend_from_slice(bytes);
        }
    }

    /// The answer ended: its usage, or `None` when it said none.
    pub fn finish(mut self) -> Option<WireUsage> {
        if self.streamed {
            if !self.skipping && !self.pending.is_empty() {
                let line = std::mem::take(&mut self.pending);
                self.line(&line);
            }
        } else if !self.skipping
            && let Ok(body) = serde_json::from_slice::<Value>(&self.pending)
        {
            self.body(&body);
        }
        self.seen.then_some(self.usage)
    }

    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let Ok(event) = serde_json::from_slice::<Value>(data.trim_ascii()) else {
            return; // `[DONE]`, or not JSON: nothing of usage
        };
        match self.api {
            Api::Anthropic => match event["type"].as_str() {
                Some("message_start") => self.anthropic(&event["message"]),
                Some("message_delta") => self.anthropic(&event),
                _ => {}
            },
            Api::OpenAiResponses => {
                if matches!(
                    event["type"].as_str(),
                    Some("response.completed" | "response.incomplete" | "response.failed")
                ) {
                    self.openai_responses(&event["response"]);
                }
            }
            Api::OpenAiChat => self.openai_chat(&event),
        }
    }

    fn body(&mut self, body: &Value) {
        match self.api {
            Api::Anthropic => self.anthropic(body),
            Api::OpenAiResponses => self.openai_responses(body),
            Api::OpenAiChat => self.openai_chat(body),
        }
    }

    fn model(&mut self, value: &Value) {
        if let Some(model) = value["model"].as_str().filter(|m| !m.is_empty()) {
            self.usage.model = Some(model.chars().take(200).collect());
        }
    }

    /// A message (or a `message_delta`): later figures replace earlier ones, since the deltas
    /// carry totals so far.
    fn anthropic(&mut self, message: &Value) {
        self.model(message);
        let usage = &message["usage"];
        if !usage.is_object() {
            return;
        }
        self.seen = true;
        let uncached = count(&usage["input_tokens"]);
        let written = count(&usage["cache_creation_input_tokens"]);
        let read = count(&usage["cache_read_input_tokens"]);
        if uncached.is_some() || written.is_some() || read.is_some() {
            let written = written.unwrap_or(self.usage.cache_write_tokens);
            let read = read.unwrap_or(self.usage.cache_read_tokens);
            let uncached = uncached.unwrap_or_else(|| {
                self.usage
                    .input_tokens
                    .saturating_sub(self.usage.cache_write_tokens)
                    .saturating_sub(self.usage.cache_read_tokens)
            });
            self.usage.cache_write_tokens = written;
            self.usage.cache_read_tokens = read;
            self.usage.input_tokens = uncached.saturating_add(written).saturating_add(read);
        }
        if let Some(output) = count(&usage["output_tokens"]) {
            self.usage.output_tokens = output;
        }
    }

    fn openai_responses(&mut self, response: &Value) {
        self.openai(
            response,
            ["input_tokens", "output_tokens", "input_tokens_details"],
        );
    }

    fn openai_chat(&mut self, chunk: &Value) {
        self.openai(
            chunk,
            [
                "prompt_tokens",
                "completion_tokens",
                "prompt_tokens_details",
            ],
        );
    }

    /// OpenAI's two APIs name the same three figures differently: input (cache reads included),
    /// output, and the input's details with its `cached_tokens`.
    fn openai(&mut self, value: &Value, [input, output, details]: [&str; 3]) {
        self.model(value);
        let usage = &value["usage"];
        if !usage.is_object() {
            return;
        }
        self.seen = true;
        self.usage.input_tokens = count(&usage[input]).unwrap_or(0);
        self.usage.output_tokens = count(&usage[output]).unwrap_or(0);
        self.usage.cache_read_tokens = count(&usage[details]["cached_tokens"]).unwrap_or(0);
    }
}

/// A token count as the answer wrote it; a negative, fractional or absurd one is not a count.
fn count(value: &Value) -> Option<u64> {
    value.as_u64().filter(|n| *n <= 1_000_000_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in chunks of `size` bytes, splitting lines and even UTF-8 anywhere.
    fn read(api: Api, streamed: bool, text: &str, size: usize) -> Option<WireUsage> {
        let mut reader = UsageReader::new(api, streamed);
        for chunk in text.as_bytes().chunks(size) {
            reader.feed(chunk);
        }
        reader.finish()
    }

    const ANTHROPIC_STREAM: &str = "event: message_start\r\n\
data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"claude-x\",\"usage\":{\"input_tokens\":100,\"cache_creation_input_tokens\":20,\"cache_read_input_tokens\":30,\"output_tokens\":1}}}\r\n\r\n\
event: content_block_delta\r\n\
data: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"h\u{e9}llo \\\"usage\\\"\"}}\r\n\r\n\
event: message_delta\r\n\
data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":42}}\r\n\r\n\
event: message_stop\r\n\
data: {\"type\":\"message_stop\"}\r\n\r\n";

    #[test]
    fn an_anthropic_stream_gives_its_input_with_the_cache_and_its_last_output_however_it_is_cut() {
        let expected = WireUsage {
            input_tokens: 150,
            output_tokens: 42,
            cache_read_tokens: 30,
            cache_write_tokens: 20,
            model: Some("claude-x".into()),
        };
        for size in [1, 2, 7, 64, 4096] {
            assert_eq!(
                read(Api::Anthropic, true, ANTHROPIC_STREAM, size).as_ref(),
                Some(&expected),
                "chunks of {size}"
            );
        }
    }

    #[test]
    fn a_whole_anthropic_body_gives_the_same() {
        let body = r#"{"id":"m","type":"message","model":"claude-x","content":[],
            "usage":{"input_tokens":7,"cache_read_input_tokens":3,"output_tokens":5}}"#;
        let usage = read(Api::Anthropic, false, body, 5).unwrap();
        assert_eq!((usage.input_tokens, usage.output_tokens), (10, 5));
        assert_eq!(usage.cache_read_tokens, 3);
    }

    #[test]
    fn openai_responses_and_chat_give_theirs_from_the_completed_event_and_the_usage_chunk() {
        let responses = "event: response.created\n\
data: {\"type\":\"response.created\",\"response\":{\"model\":\"gpt-x\",\"usage\":null}}\n\n\
event: response.completed\n\
data: {\"type\":\"response.completed\",\"response\":{\"model\":\"gpt-x\",\"usage\":{\"input_tokens\":100,\"input_tokens_details\":{\"cached_tokens\":40},\"output_tokens\":9}}}\n\n";
        let usage = read(Api::OpenAiResponses, true, responses, 3).unwrap();
        assert_eq!(
            (
                usage.input_tokens,
                usage.output_tokens,
                usage.cache_read_tokens
            ),
            (100, 9, 40)
        );
        assert_eq!(usage.model.as_deref(), Some("gpt-x"));

        let chat = "data: {\"model\":\"gpt-y\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n\
data: {\"model\":\"gpt-y\",\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":4}}\n\n\
data: [DONE]\n\n";
        let usage = read(Api::OpenAiChat, true, chat, 10).unwrap();
        assert_eq!((usage.input_tokens, usage.output_tokens), (11, 4));
    }

    #[test]
    fn an_answer_that_says_nothing_of_usage_or_is_not_json_gives_none() {
        assert_eq!(
            read(Api::Anthropic, false, "<html>bad gateway</html>", 4),
            None
        );
        assert_eq!(read(Api::OpenAiChat, true, "data: [DONE]\n\n", 4), None);
        let absurd = r#"{"usage":{"prompt_tokens":-5,"completion_tokens":1e30}}"#;
        let usage = read(Api::OpenAiChat, false, absurd, 64).unwrap();
        assert_eq!(usage.tokens(), 0);
    }

    #[test]
    fn an_event_past_the_cap_is_skipped_and_the_next_is_read() {
        let big = format!(
            "data: {{\"type\":\"content_block_delta\",\"text\":\"{}\"}}\n\n{}",
            "x".repeat(MAX_EVENT_BYTES + 10),
            "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":3}}\n\n"
        );
        let usage = read(Api::Anthropic, true, &big, 1 << 16).unwrap();
        assert_eq!(usage.output_tokens, 3);
    }
}
