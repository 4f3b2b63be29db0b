//! JSON-RPC 2.0 over newline-delimited stdio, as ACP frames it: what a line from the client is,
//! and the one writer every answer, notification and request of ours goes through, so lines
//! never interleave and leave in the order they were queued.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicI64, Ordering},
    },
};

use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt},
    sync::{mpsc, oneshot},
};

use super::errors::RpcError;

/// One line from the client, read.
#[derive(Debug)]
pub(crate) enum Incoming {
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    /// The client's answer to a request of ours: its `result`, or its `error` object.
    Response {
        id: Value,
        outcome: Result<Value, Value>,
    },
}

/// A line that is no JSON-RPC message: the error to answer, on the id the line had (`null` when
/// none could be read).
#[derive(Debug)]
pub(crate) struct Refused {
    pub(crate) id: Value,
    pub(crate) error: RpcError,
}

fn refused(id: Value, error: RpcError) -> Box<Refused> {
    Box::new(Refused { id, error })
}

/// The longest line read from the client by default: far above any ACP message a client sends
/// (a prompt's text and embedded resources), far below what would strain memory.
pub(crate) const DEFAULT_MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// What reading one line from the client gave.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line {
    /// A line, without its line break.
    Text(String),
    /// A line that is not UTF-8 (so no JSON either).
    NotUtf8,
    /// A line longer than the limit: read and dropped as it came, never held whole.
    TooLong { bytes: usize },
    /// The client closed stdin.
    End,
}

/// Reads lines of at most `max` bytes (the line break not counted). A longer one is skipped up
/// to its line break as it arrives, holding no more than `max` bytes of it; a client that never
/// ends its line cannot make this process grow.
pub(crate) struct LineReader<R> {
    input: R,
    max: usize,
    line: Vec<u8>,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    pub(crate) fn new(input: R, max: usize) -> Self {
        Self {
            input,
            max,
            line: Vec::new(),
        }
    }

    pub(crate) async fn next(&mut self) -> std::io::Result<Line> {
        self.line.clear();
        // Set once the line passed `max`: how long it was when it did.
        let mut skipped: Option<usize> = None;
        loop {
            let available = self.input.fill_buf().await?;
            if available.is_empty() {
                // The end of stdin ends a last line without a line break, too.
                return Ok(match skipped {
                    Some(bytes) => Line::TooLong { bytes },
                    None if self.line.is_empty() => Line::End,
                    None => self.take(),
                });
            }
            let (chunk, ended) = match memchr(available) {
                Some(at) => (&available[..at], Some(at + 1)),
                None => (available, None),
            };
            let used = ended.unwrap_or(available.len());
            match &mut skipped {
                Some(bytes) => *bytes += chunk.len(),
                None if self.line.len() + chunk.len() > self.max => {
                    skipped = Some(self.line.len() + chunk.len());
                    // What was held of it goes at once, and its room with it.
                    self.line = Vec::new();
                }
                None => self.line.extend_from_slice(chunk),
            }
            self.input.consume(used);
            if ended.is_some() {
                return Ok(match skipped {
                    Some(bytes) => Line::TooLong { bytes },
                    None => self.take(),
                });
            }
        }
    }

    fn take(&mut self) -> Line {
        let mut bytes = std::mem::take(&mut self.line);
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
        match String::from_utf8(bytes) {
            Ok(text) => Line::Text(text),
            Err(_) => Line::NotUtf8,
        }
    }
}

fn memchr(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|b| *b == b'\n')
}

/// The answer to a line that is no message at all: not UTF-8, or over the limit.
pub(crate) fn refused_line(line: &Line, max: usize) -> Option<RpcError> {
    match line {
        Line::NotUtf8 => Some(RpcError::parse("not JSON: the line is not UTF-8")),
        Line::TooLong { bytes } => Some(RpcError::harness(
            super::errors::code::INVALID_REQUEST,
            "LIMIT_EXCEEDED",
            format!("a line of {bytes} bytes is over the limit of {max} bytes; skipped"),
        )),
        Line::Text(_) | Line::End => None,
    }
}

/// Reads one line.
pub(crate) fn parse(line: &str) -> Result<Incoming, Box<Refused>> {
    let value: Value = serde_json::from_str(line)
        .map_err(|e| refused(Value::Null, RpcError::parse(format!("not JSON: {e}"))))?;
    let Value::Object(mut object) = value else {
        return Err(refused(
            Value::Null,
            RpcError::invalid_request("a JSON-RPC message is one JSON object per line"),
        ));
    };
    let id = object.remove("id");
    if let Some(id) = &id
        && !(id.is_string() || id.is_number() || id.is_null())
    {
        return Err(refused(
            Value::Null,
            RpcError::invalid_request("`id` must be a string, a number or null"),
        ));
    }
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(refused(
            id.unwrap_or(Value::Null),
            RpcError::invalid_request("`jsonrpc` must be \"2.0\""),
        ));
    }
    let params = object.remove("params").unwrap_or(Value::Null);
    match (object.remove("method"), id) {
        (Some(Value::String(method)), Some(id)) => Ok(Incoming::Request { id, method, params }),
        (Some(Value::String(method)), None) => Ok(Incoming::Notification { method, params }),
        (Some(_), id) => Err(refused(
            id.unwrap_or(Value::Null),
            RpcError::invalid_request("`method` must be a string"),
        )),
        (None, Some(id)) => {
            let outcome = match (object.remove("result"), object.remove("error")) {
                (Some(result), None) => Ok(result),
                (None, Some(error)) => Err(error),
                _ => {
                    return Err(refused(
                        Value::Null,
                        RpcError::invalid_request("a response holds exactly one of result, error"),
                    ));
                }
            };
            Ok(Incoming::Response { id, outcome })
        }
        (None, None) => Err(refused(
            Value::Null,
            RpcError::invalid_request("neither a request, a notification nor a response"),
        )),
    }
}

/// Where the client's answer to one of our requests goes: its `result`, or its `error`.
type Answer = oneshot::Sender<Result<Value, Value>>;

/// Where our lines go. Cloned freely; one task writes them out.
#[derive(Clone)]
pub(crate) struct Outbox {
    lines: mpsc::UnboundedSender<String>,
    next_id: Arc<AtomicI64>,
    waiting: Arc<Mutex<HashMap<i64, Answer>>>,
}

impl Outbox {
    /// An outbox and the task body that writes its lines to `out`, one per line, flushed each.
    pub(crate) fn new<W: AsyncWrite + Unpin + Send + 'static>(
        mut out: W,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (lines, mut queued) = mpsc::unbounded_channel::<String>();
        let writer = async move {
            while let Some(mut line) = queued.recv().await {
                line.push('\n');
                if out.write_all(line.as_bytes()).await.is_err() || out.flush().await.is_err() {
                    // The client went away; reading stdin's end stops the rest.
                    return;
                }
            }
        };
        let outbox = Self {
            lines,
            next_id: Arc::new(AtomicI64::new(1)),
            waiting: Arc::default(),
        };
        (outbox, writer)
    }

    fn send(&self, message: Value) {
        let _ = self.lines.send(message.to_string());
    }

    pub(crate) fn respond(&self, id: Value, result: Value) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "result": result}));
    }

    pub(crate) fn fail(&self, id: Value, error: RpcError) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "error": error.to_json()}));
    }

    pub(crate) fn answer(&self, id: Value, outcome: Result<Value, RpcError>) {
        match outcome {
            Ok(result) => self.respond(id, result),
            Err(error) => self.fail(id, error),
        }
    }

    pub(crate) fn notify(&self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// Sends a request of ours; its id, and where the client's answer will arrive.
    pub(crate) fn request(
        &self,
        method: &str,
        params: Value,
    ) -> (i64, oneshot::Receiver<Result<Value, Value>>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        self.waiting
            .lock()
            .expect("not poisoned")
            .insert(id, answer);
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        (id, answered)
    }

    /// Hands the client's answer to whoever waits on it; answers to ids we never sent (or gave
    /// up on) are dropped.
    pub(crate) fn answered(&self, id: &Value, outcome: Result<Value, Value>) {
        let Some(id) = id.as_i64() else { return };
        if let Some(waiter) = self.waiting.lock().expect("not poisoned").remove(&id) {
            let _ = waiter.send(outcome);
        }
    }

    /// Stops waiting for an answer to request `id`.
    pub(crate) fn forget(&self, id: i64) {
        self.waiting.lock().expect("not poisoned").remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_line_is_told_apart_and_ids_keep_their_shape() {
        match parse(r#"{"jsonrpc":"2.0","id":"7","method":"initialize","params":{}}"#) {
            Ok(Incoming::Request { id, method, .. }) => {
                assert_eq!(id, json!("7"));
                assert_eq!(method, "initialize");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(r#"{"jsonrpc":"2.0","method":"session/cancel","params":{}}"#),
            Ok(Incoming::Notification { .. })
        ));
        assert!(matches!(
            parse(r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32800,"message":"x"}}"#),
            Ok(Incoming::Response {
                outcome: Err(_),
                ..
            })
        ));
    }

    /// Every line `input` holds, read `max` bytes at most, the input arriving 7 bytes at a time.
    async fn lines_of(input: &[u8], max: usize) -> Vec<Line> {
        let mut reader = LineReader::new(tokio::io::BufReader::with_capacity(7, input), max);
        let mut lines = Vec::new();
        loop {
            let line = reader.next().await.expect("reads");
            if line == Line::End {
                return lines;
            }
            assert!(
                reader.line.capacity() <= 2 * max,
                "held more than the limit"
            );
            lines.push(line);
        }
    }

    #[tokio::test]
    async fn lines_over_the_limit_or_not_utf8_are_told_apart_and_the_next_line_reads_whole() {
        let text = |t: &str| Line::Text(t.to_owned());
        assert_eq!(
            lines_of(b"one\r\n\ntwo\nlast", 10).await,
            [text("one"), text(""), text("two"), text("last")]
        );
        assert_eq!(
            lines_of(b"0123456789\n0123456789a\nafter\n", 10).await,
            [
                text("0123456789"),
                Line::TooLong { bytes: 11 },
                text("after")
            ]
        );
        let long = [vec![b'x'; 1000], b"\n{}\n".to_vec()].concat();
        assert_eq!(
            lines_of(&long, 64).await,
            [Line::TooLong { bytes: 1000 }, text("{}")]
        );
        assert_eq!(
            lines_of(b"caf\xc3\n\xff\xfe\nok\n", 64).await,
            [Line::NotUtf8, Line::NotUtf8, text("ok")]
        );
        let unended = [vec![b'y'; 100]].concat();
        assert_eq!(lines_of(&unended, 10).await, [Line::TooLong { bytes: 100 }]);
    }

    #[test]
    fn broken_lines_are_answered_with_the_json_rpc_codes() {
        for (line, code) in [
            ("not json", -32700),
            ("[1,2]", -32600),
            (r#"{"id":1,"method":"initialize"}"#, -32600),
            (r#"{"jsonrpc":"2.0","id":1,"method":5}"#, -32600),
            (r#"{"jsonrpc":"2.0","id":{},"method":"x"}"#, -32600),
        ] {
            let refused = parse(line).expect_err(line);
            assert_eq!(refused.error.code, code, "{line}");
        }
    }
}
