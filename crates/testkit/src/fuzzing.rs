//! Invariants of the code that reads hostile input from runtimes, shared by the `cargo fuzz`
//! targets in `fuzz/` and by the property tests that run in `cargo test` (`tests/it/hostile.rs`).
//! Each function panics when an invariant breaks; that is what both tools look for.
//!
//! - [`runtime_lines`]: the runtime line reader (`acp::connection::read_lines`) against a
//!   plain reference model: the same frames, the same fault at the same place, nothing after it,
//!   every frame a JSON object within the line limit, previews bounded.
//! - [`fold_entries`] / [`fold_bytes`]: the fold (`acp::fold`) never panics, is
//!   deterministic, announces every change it makes (a subscriber keeping the last snapshot of
//!   each announced message ends with exactly the transcript), and pages cover every message
//!   once.

use std::{
    collections::{BTreeMap, HashSet},
    pin::Pin,
    task::{Context, Poll},
    time::{Duration, UNIX_EPOCH},
};

use serde_json::Value;
use tokio::{
    io::{AsyncRead, ReadBuf},
    sync::mpsc,
};

use agent_harness::{
    acp::{
        connection::{Inbound, InvalidLine, PREVIEW_BYTES, read_lines},
        fold::{Fold, page_turns},
    },
    domain::{
        ActionId,
        invocation::DEFAULT_META_KEY,
        log::{Direction, LogEntry},
    },
};

/// Hands out its bytes at most `chunk` at a time, so lines straddle reads.
struct Trickle<'a> {
    data: &'a [u8],
    chunk: usize,
}

impl AsyncRead for Trickle<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = self.data.len().min(self.chunk).min(buf.remaining());
        buf.put_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Poll::Ready(Ok(()))
    }
}

/// What the reader should report, in a comparable form.
#[derive(Debug, PartialEq, Eq)]
enum Expected {
    Frame(String),
    NotJson { preview: String, length: usize },
    TooLong,
    Closed,
}

fn preview(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(PREVIEW_BYTES)]).into_owned()
}

/// The reader's contract, written as plainly as possible: lines end at `\n`; a line's bytes
/// (without its `\n`) may number at most `max_line`; trailing `\r` is dropped; blank lines are
/// skipped; the first line that is too long or not a JSON object is the last thing reported;
/// the end of input is reported as closed.
fn model(input: &[u8], max_line: usize) -> Vec<Expected> {
    let mut out = Vec::new();
    let mut pos = 0;
    loop {
        if pos >= input.len() {
            out.push(Expected::Closed);
            return out;
        }
        let rest = &input[pos..];
        let (content, complete) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (&rest[..i], true),
            None => (rest, false),
        };
        pos += content.len() + usize::from(complete);
        if content.len() > max_line {
            out.push(Expected::TooLong);
            return out;
        }
        let mut line = content;
        while let [head @ .., b'\r' | b'\n'] = line {
            line = head;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            if complete {
                continue;
            }
            out.push(Expected::Closed);
            return out;
        }
        let object = std::str::from_utf8(line)
            .ok()
            .filter(|text| serde_json::from_str::<Value>(text).is_ok_and(|v| v.is_object()));
        match object {
            Some(text) => out.push(Expected::Frame(text.to_owned())),
            None => {
                out.push(Expected::NotJson {
                    preview: preview(line),
                    length: line.len(),
                });
                return out;
            }
        }
        if !complete {
            out.push(Expected::Closed);
            return out;
        }
    }
}

/// Runs the runtime line reader over `input` (delivered `chunk` bytes at a time) and checks it
/// against the reference model.
pub fn runtime_lines(input: &[u8], max_line: usize, chunk: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    let events = runtime.block_on(async {
        // Room for every event the input can cause, so the reader never waits on us.
        let (tx, mut rx) = mpsc::channel(input.len() + 2);
        let reader = Trickle {
            data: input,
            chunk: chunk.max(1),
        };
        tokio::time::timeout(Duration::from_secs(10), read_lines(reader, 1, max_line, tx))
            .await
            .expect("the reader finishes a finite input");
        let mut events = Vec::new();
        while let Ok(event) = rx.try_recv() {
            assert_eq!(event.epoch, 1);
            events.push(event.inbound);
        }
        events
    });
    let got: Vec<Expected> = events
        .into_iter()
        .map(|inbound| match inbound {
            Inbound::Frame { raw, value } => {
                assert!(value.is_object(), "a frame is a JSON object");
                assert!(raw.len() <= max_line, "a frame is within the line limit");
                assert!(!raw.contains('\n'), "a frame is one line");
                assert_eq!(serde_json::from_str::<Value>(&raw).ok(), Some(value));
                Expected::Frame(raw)
            }
            Inbound::Invalid {
                reason: InvalidLine::TooLong,
                preview,
                length,
            } => {
                assert!(
                    length > max_line,
                    "a too-long line is longer than the limit"
                );
                assert!(
                    preview.chars().count() <= PREVIEW_BYTES,
                    "the preview is bounded"
                );
                Expected::TooLong
            }
            Inbound::Invalid {
                reason: InvalidLine::NotJson(_),
                preview,
                length,
            } => Expected::NotJson { preview, length },
            Inbound::Closed => Expected::Closed,
            Inbound::WriteFailed(e) => panic!("the reader never reports a write failure: {e}"),
        })
        .collect();
    assert_eq!(
        got,
        model(input, max_line),
        "the reader differs from its contract"
    );
}

/// Decodes fuzz bytes into runtime line reader parameters and input.
pub fn runtime_lines_bytes(data: &[u8]) {
    let [a, b, input @ ..] = data else {
        return;
    };
    // Small limits reach the too-long path; the chunk size moves lines across reads.
    runtime_lines(input, usize::from(*a) % 200 + 1, usize::from(*b) % 64 + 1);
}

/// A few action ids for decoded entries to share (so responses meet their requests).
fn action_ids() -> [ActionId; 4] {
    [
        "01890a5d-ac96-774b-bcce-b302099a8057",
        "01890a5d-ac96-774b-bcce-b302099a8058",
        "01890a5d-ac96-774b-bcce-b302099a8059",
        "01890a5d-ac96-774b-bcce-b302099a805a",
    ]
    .map(|text| ActionId::parse_v7(text).expect("a v7 id"))
}

/// A log entry at `offset`.
pub fn entry(
    offset: u64,
    direction: Direction,
    json: String,
    action: Option<usize>,
    epoch: u32,
) -> LogEntry {
    LogEntry {
        offset,
        direction,
        json,
        actor: "fuzz".to_owned(),
        action_id: action.map(|i| action_ids()[i % 4]),
        epoch,
        created_at: UNIX_EPOCH + Duration::from_secs(offset),
    }
}

/// Decodes fuzz bytes into log entries: one per line, the first byte choosing direction, action
/// id and epoch, the rest the JSON text.
pub fn fold_bytes(data: &[u8]) {
    let entries: Vec<LogEntry> = data
        .split(|&b| b == b'\n')
        .filter(|line| !line.is_empty())
        .enumerate()
        .map(|(i, line)| {
            let tag = line[0];
            let direction = match tag % 3 {
                0 => Direction::ToRuntime,
                1 => Direction::FromRuntime,
                _ => Direction::Event,
            };
            let action = (tag & 0x04 != 0).then_some(usize::from(tag >> 6));
            entry(
                i as u64 + 1,
                direction,
                String::from_utf8_lossy(&line[1..]).into_owned(),
                action,
                u32::from((tag >> 3) & 0x03),
            )
        })
        .collect();
    fold_entries(&entries);
}

/// Folds `entries` (dense offsets from 1) and checks the fold's invariants.
pub fn fold_entries(entries: &[LogEntry]) {
    let mut fold = Fold::new(DEFAULT_META_KEY);
    // What a MESSAGES-view subscriber would hold: the last snapshot of each announced message.
    let mut announced: BTreeMap<String, agent_harness::acp::transcript::Message> = BTreeMap::new();
    for entry in entries {
        for id in fold.apply(entry) {
            let message = fold
                .message(&id)
                .unwrap_or_else(|| panic!("announced message {id} exists"));
            announced.insert(id, message.clone());
        }
    }
    let again = Fold::of(DEFAULT_META_KEY, entries);
    assert_eq!(
        fold.messages(),
        again.messages(),
        "the fold is deterministic"
    );
    assert_eq!(
        fold.metadata(),
        again.metadata(),
        "the fold is deterministic"
    );
    assert_eq!(fold.turns(), again.turns());
    assert_eq!(fold.head(), entries.last().map_or(0, |e| e.offset));

    let mut ids = HashSet::new();
    for message in fold.messages().iter().map(|m| &**m) {
        assert!(ids.insert(message.id.clone()), "message ids are unique");
        assert!(
            message.turn <= fold.turns(),
            "a message's turn is one of the fold's"
        );
        if message.turn == 0 {
            assert!(
                message.id == "0:agent" || message.id.starts_with("0:control:"),
                "only agent output and controls precede the first turn: {}",
                message.id
            );
        }
        assert!(
            message.first_offset <= message.last_offset && message.last_offset <= fold.head(),
            "a message's offsets lie within the log: {message:?}"
        );
        assert_eq!(
            announced.get(&message.id),
            Some(message),
            "every change to a message is announced to subscribers"
        );
    }
    assert_eq!(announced.len(), fold.messages().len());

    // Pages of turns, of any size, cover every message exactly once, oldest first.
    for page_size in [1, 2, 7] {
        let mut seen = Vec::new();
        let mut after = 0;
        while let Some((from, to)) = page_turns(fold.turns(), after, page_size) {
            seen.extend(fold.turn_range(from, to).map(|m| m.id.clone()));
            after = to;
        }
        let all: Vec<String> = fold.messages().iter().map(|m| m.id.clone()).collect();
        let mut sorted_seen = seen.clone();
        sorted_seen.sort();
        let mut sorted_all = all.clone();
        sorted_all.sort();
        assert_eq!(sorted_seen, sorted_all, "pages cover every message once");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_of_exactly_the_limit_is_a_frame_and_one_byte_more_is_too_long() {
        runtime_lines(b"{\"a\":1}\n", 7, 3);
        runtime_lines(b"{\"a\":1}", 7, 64);
        runtime_lines(b"{\"a\":12}\n{\"b\":1}\n", 7, 1);
        runtime_lines(b"{\"a\":1}\r\n\n  \nnope\n{}", 8, 2);
    }

    #[test]
    fn fold_bytes_survive_garbage() {
        fold_bytes(b"\x01{\"jsonrpc\":\"2.0\"}\n\x00not json\n\x05{}");
    }
}
