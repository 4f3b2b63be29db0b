//! The JSON-RPC line connection to a runtime: a reader task that turns stdout into validated
//! frames (one JSON object per line, bounded length), and a writer task that sends lines to
//! stdin. Neither ever blocks the session actor: the reader hands frames over a bounded channel
//! (back-pressuring the runtime, not the harness) and the writer is fed without waiting.

use std::sync::Arc;

use serde_json::Value;
use tokio::{
    io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, BufWriter},
    sync::mpsc,
};

/// How many bytes of an invalid line are kept in its fault event.
pub const PREVIEW_BYTES: usize = 1024;
/// The read and write buffers of a runtime's pipes. Small on purpose: they live as long as the
/// runtime, idle or not, and the read buffer is zeroed when made (so it is resident at once);
/// a longer line is read in several fills and a longer write bypasses the buffer.
const PIPE_BUFFER: usize = 4 * 1024;
/// A line buffer that grew past this for a long line is given back after it.
const LINE_BUFFER_KEPT: usize = 64 * 1024;
/// Lines waiting to be written to a runtime before it counts as not reading its input.
pub(crate) const WRITE_QUEUE_LINES: usize = 4096;

/// Why a line from a runtime was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InvalidLine {
    NotJson(String),
    /// Longer than the limit; `length` is then a lower bound.
    TooLong,
}

/// What the reader hands to the session actor.
#[derive(Debug)]
pub enum Inbound {
    /// One valid JSON line: its exact text and its parsed value.
    Frame { raw: String, value: Value },
    /// A line that is not JSON or is too long: a fault. Nothing more is read after it.
    Invalid {
        reason: InvalidLine,
        preview: String,
        length: usize,
    },
    /// Stdout reached its end (or failed).
    Closed,
    /// Writing to stdin failed: the runtime is not reading its input.
    WriteFailed(String),
}

/// A runtime event tagged with the epoch (connection) it belongs to, so events from an old
/// connection are recognised and ignored.
#[derive(Debug)]
pub struct RuntimeEvent {
    pub epoch: u32,
    pub inbound: Inbound,
}

fn preview(bytes: &[u8]) -> String {
    let end = bytes.len().min(PREVIEW_BYTES);
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Reads lines until the end of the stream or the first invalid line.
pub async fn read_lines<R: AsyncRead + Unpin>(
    stdout: R,
    epoch: u32,
    max_line: usize,
    events: mpsc::Sender<RuntimeEvent>,
) {
    let mut reader = BufReader::with_capacity(PIPE_BUFFER, stdout);
    let mut line: Vec<u8> = Vec::with_capacity(1024);
    let send = |inbound| {
        let events = events.clone();
        async move { events.send(RuntimeEvent { epoch, inbound }).await.is_ok() }
    };
    loop {
        line.clear();
        line.shrink_to(LINE_BUFFER_KEPT);
        // Read one line without ever holding more than `max_line` bytes of it.
        let complete = loop {
            let available = match reader.fill_buf().await {
                Ok(available) => available,
                Err(_) => break false,
            };
            if available.is_empty() {
                break false;
            }
            // The limit is on the line's bytes; its `\n` terminator is not counted.
            let (take, found) = match memchr(available) {
                Some(i) => (i, true),
                None => (available.len(), false),
            };
            let room = max_line + 1 - line.len().min(max_line + 1);
            line.extend_from_slice(&available[..take.min(room)]);
            reader.consume(take + usize::from(found));
            if line.len() > max_line {
                let _ = send(Inbound::Invalid {
                    reason: InvalidLine::TooLong,
                    preview: preview(&line),
                    length: line.len(),
                })
                .await;
                return;
            }
            if found {
                break true;
            }
        };
        if !complete && line.is_empty() {
            let _ = send(Inbound::Closed).await;
            return;
        }
        while matches!(line.last(), Some(b'\n' | b'\r')) {
            line.pop();
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            if !complete {
                let _ = send(Inbound::Closed).await;
                return;
            }
            continue;
        }
        let parsed = std::str::from_utf8(&line)
            .map_err(|e| e.to_string())
            .and_then(|text| {
                serde_json::from_str::<Value>(text)
                    .map_err(|e| e.to_string())
                    .and_then(|value| {
                        if value.is_object() {
                            Ok((text.to_owned(), value))
                        } else {
                            Err("a JSON-RPC message must be a JSON object".to_owned())
                        }
                    })
            });
        let inbound = match parsed {
            Ok((raw, value)) => Inbound::Frame { raw, value },
            Err(reason) => Inbound::Invalid {
                reason: InvalidLine::NotJson(reason),
                preview: preview(&line),
                length: line.len(),
            },
        };
        let fatal = matches!(inbound, Inbound::Invalid { .. });
        if !send(inbound).await || fatal {
            return;
        }
        if !complete {
            let _ = send(Inbound::Closed).await;
            return;
        }
    }
}

fn memchr(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&b| b == b'\n')
}

/// Feeds lines to a runtime's stdin.
#[derive(Debug, Clone)]
pub(crate) struct LineWriter {
    lines: mpsc::Sender<Arc<str>>,
    epoch: u32,
    events: mpsc::Sender<RuntimeEvent>,
    /// A full queue has been reported (once is enough: it is a fault).
    reported_full: Arc<std::sync::atomic::AtomicBool>,
}

impl LineWriter {
    /// Starts the writer task; a write failure is reported as [`Inbound::WriteFailed`].
    pub(crate) fn start<W: AsyncWrite + Unpin + Send + 'static>(
        stdin: W,
        epoch: u32,
        events: mpsc::Sender<RuntimeEvent>,
    ) -> Self {
        let (tx, mut rx) = mpsc::channel::<Arc<str>>(WRITE_QUEUE_LINES);
        let writer = Self {
            lines: tx,
            epoch,
            events: events.clone(),
            reported_full: Default::default(),
        };
        tokio::spawn(async move {
            let mut out = BufWriter::with_capacity(PIPE_BUFFER, stdin);
            while let Some(line) = rx.recv().await {
                let mut result = write_line(&mut out, &line).await;
                // Batch whatever else is already waiting, then flush once.
                while result.is_ok() {
                    match rx.try_recv() {
                        Ok(line) => result = write_line(&mut out, &line).await,
                        Err(_) => break,
                    }
                }
                if let Err(e) = result.and(out.flush().await) {
                    let _ = events
                        .send(RuntimeEvent {
                            epoch,
                            inbound: Inbound::WriteFailed(e.to_string()),
                        })
                        .await;
                    return;
                }
            }
            let _ = out.shutdown().await;
        });
        writer
    }

    /// Queues one line (without its newline). Fails when the runtime has stopped reading; a
    /// full queue is then also reported as [`Inbound::WriteFailed`], so the line that could not
    /// be queued ends in a fault rather than being dropped unnoticed.
    pub(crate) fn send(&self, line: Arc<str>) -> Result<(), &'static str> {
        self.lines.try_send(line).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => {
                const WHY: &str = "the runtime is not reading its input";
                if !self
                    .reported_full
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    let events = self.events.clone();
                    let epoch = self.epoch;
                    // The caller may be the actor that drains `events`: never wait here.
                    tokio::spawn(async move {
                        let _ = events
                            .send(RuntimeEvent {
                                epoch,
                                inbound: Inbound::WriteFailed(WHY.to_owned()),
                            })
                            .await;
                    });
                }
                WHY
            }
            mpsc::error::TrySendError::Closed(_) => "the runtime's input is closed",
        })
    }
}

async fn write_line<W: AsyncWrite + Unpin>(out: &mut W, line: &str) -> std::io::Result<()> {
    out.write_all(line.as_bytes()).await?;
    out.write_all(b"\n").await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::time::timeout;

    async fn read_all(input: &'static [u8], max_line: usize) -> Vec<Inbound> {
        let (tx, mut rx) = mpsc::channel(16);
        tokio::spawn(read_lines(input, 7, max_line, tx));
        let mut out = Vec::new();
        while let Some(event) = timeout(Duration::from_secs(5), rx.recv()).await.unwrap() {
            assert_eq!(event.epoch, 7);
            out.push(event.inbound);
        }
        out
    }

    #[tokio::test]
    async fn json_lines_arrive_with_their_exact_text_and_the_end_is_reported() {
        let events = read_all(b"{\"a\": 1}\r\n\n{\"b\":\"\xc3\xa9\"}", 1024).await;
        assert_eq!(events.len(), 3);
        let Inbound::Frame { raw, .. } = &events[0] else {
            panic!()
        };
        assert_eq!(raw, "{\"a\": 1}");
        let Inbound::Frame { raw, value } = &events[1] else {
            panic!()
        };
        assert_eq!(raw, "{\"b\":\"é\"}");
        assert_eq!(value["b"], "é");
        assert!(matches!(events[2], Inbound::Closed));
    }

    #[tokio::test]
    async fn a_line_that_is_not_json_is_reported_once_and_reading_stops() {
        let events = read_all(b"{\"ok\":1}\nthis is not json\n{\"never\":1}\n", 1024).await;
        assert_eq!(events.len(), 2);
        let Inbound::Invalid {
            reason,
            preview,
            length,
        } = &events[1]
        else {
            panic!()
        };
        assert!(matches!(reason, InvalidLine::NotJson(_)));
        assert_eq!(preview, "this is not json");
        assert_eq!(*length, 16);
    }

    #[tokio::test]
    async fn a_json_value_that_is_not_an_object_is_invalid() {
        let events = read_all(b"[1,2]\n", 1024).await;
        assert!(matches!(
            events[0],
            Inbound::Invalid {
                reason: InvalidLine::NotJson(_),
                ..
            }
        ));
    }

    #[tokio::test]
    async fn an_over_long_line_is_reported_with_a_bounded_preview() {
        static LONG: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        let long = LONG.get_or_init(|| {
            let mut v = b"{\"x\":\"".to_vec();
            v.extend(std::iter::repeat_n(b'y', 5000));
            v.extend(b"\"}\n");
            v
        });
        let events = read_all(long, 2048).await;
        assert_eq!(events.len(), 1);
        let Inbound::Invalid {
            reason,
            preview,
            length,
        } = &events[0]
        else {
            panic!()
        };
        assert_eq!(*reason, InvalidLine::TooLong);
        assert_eq!(preview.len(), PREVIEW_BYTES);
        assert!(*length > 2048);
    }

    #[tokio::test]
    async fn a_line_of_exactly_the_limit_is_a_frame_whatever_its_terminator() {
        // `{"a":1}` is 7 bytes: the limit counts the line, not its `\n`.
        let events = read_all(b"{\"a\":1}\n{\"b\":22}\n", 7).await;
        assert!(matches!(&events[0], Inbound::Frame { raw, .. } if raw == "{\"a\":1}"));
        assert!(matches!(
            events[1],
            Inbound::Invalid {
                reason: InvalidLine::TooLong,
                ..
            }
        ));
        assert_eq!(events.len(), 2);
    }

    #[tokio::test]
    async fn a_runtime_that_stops_reading_its_input_is_reported_as_a_write_failure_once() {
        // A pipe of 16 bytes that nobody reads: the writer task blocks, and the queue fills.
        let (client, _unread) = tokio::io::duplex(16);
        let (tx, mut rx) = mpsc::channel(4);
        let writer = LineWriter::start(client, 9, tx);
        let mut refused = 0;
        for _ in 0..WRITE_QUEUE_LINES + 16 {
            if writer.send("{\"a\":1}".into()).is_err() {
                refused += 1;
            }
        }
        assert!(refused > 0, "the queue is bounded");
        let event = timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("the full queue is reported")
            .unwrap();
        assert_eq!(event.epoch, 9);
        assert!(
            matches!(&event.inbound, Inbound::WriteFailed(why) if why.contains("not reading")),
            "{:?}",
            event.inbound
        );
        assert!(rx.try_recv().is_err(), "reported once");
    }

    #[tokio::test]
    async fn the_writer_sends_each_line_with_a_newline() {
        let (client, mut server) = tokio::io::duplex(1024);
        let (tx, _rx) = mpsc::channel(4);
        let writer = LineWriter::start(client, 1, tx);
        writer.send("{\"a\":1}".into()).unwrap();
        writer.send("{\"b\":2}".into()).unwrap();
        drop(writer);
        let mut text = String::new();
        use tokio::io::AsyncReadExt;
        timeout(Duration::from_secs(5), server.read_to_string(&mut text))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(text, "{\"a\":1}\n{\"b\":2}\n");
    }
}
