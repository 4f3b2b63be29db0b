//! One remote runtime: the harness's side of an agent a bridge runs, one task each. The task
//! numbers the harness's lines (keeping the ones the bridge has not acknowledged, bounded), drops
//! duplicate and refuses out-of-order bridge lines, and outlives a broken stream for
//! `reconnect_grace`, resending what the bridge did not take once the gateway attaches it to a
//! new stream. To the session actor it is a byte pipe with a stderr tail, an exit and a killer,
//! like a local child.

use std::{
    collections::VecDeque, io, os::unix::process::ExitStatusExt, process::ExitStatus, sync::Arc,
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, ReadHalf, WriteHalf},
    sync::{mpsc, oneshot},
    time::Instant,
};

use super::wire::{FromBridge, ToBridge};
use crate::{
    acp::process::{RuntimeKiller, StderrTail, StopRequest},
    domain::text::cap_foreign,
};

/// Lines the harness keeps for one runtime until the bridge acknowledges them.
pub const MAX_UNACKED_LINES: usize = 1024;
/// Events waiting for one runtime task.
pub(super) const RUNTIME_EVENTS: usize = 64;
/// Bytes buffered in the pipe between a runtime task and its session actor, each way.
const PIPE_BYTES: usize = 256 * 1024;
/// How long a send to a bridge stream may wait before the stream counts as broken.
const SEND_STALL: Duration = Duration::from_secs(10);
/// The default of `reconnect_grace`.
pub const DEFAULT_RECONNECT_GRACE: Duration = Duration::from_secs(30);
/// How long past a graceful stop's grace the harness waits for the bridge to report the exit.
const STOP_REPORT_MARGIN: Duration = Duration::from_secs(5);

/// A started remote runtime, shaped like a local one for the session actor.
pub struct SpawnedRemote {
    pub bridge_id: String,
    pub key: String,
    pub stdin: WriteHalf<DuplexStream>,
    pub stdout: ReadHalf<DuplexStream>,
    pub stderr: Arc<StderrTail>,
    pub killer: RuntimeKiller,
    pub exited: oneshot::Receiver<io::Result<ExitStatus>>,
}

/// Events of one runtime task.
pub(super) enum RuntimeEvent {
    Bridge(FromBridge),
    /// The bridge's stream is up (again): where the bridge stands.
    Attached {
        out: mpsc::Sender<ToBridge>,
        last_stdin_seq: u64,
    },
    Detached,
    /// The bridge says the runtime is gone (it was not in its hello).
    Gone(String),
}

/// Starts the task of runtime `key`, placed on bridge `bridge_id` whose stream is `out`: the
/// session actor's side of it, and the bridge's answer to the spawn (`Err` says why, as a
/// sentence). `forget` runs once the runtime has ended, before its exit is reported.
pub(super) fn start(
    bridge_id: String,
    key: String,
    out: mpsc::Sender<ToBridge>,
    grace: Duration,
    events: mpsc::Receiver<RuntimeEvent>,
    forget: impl FnOnce() + Send + 'static,
) -> (SpawnedRemote, oneshot::Receiver<Result<(), String>>) {
    let (actor_side, task_side) = tokio::io::duplex(PIPE_BYTES);
    let (stdout, stdin) = tokio::io::split(actor_side);
    let stderr = Arc::new(StderrTail::default());
    let (kill_tx, kill_rx) = oneshot::channel();
    let (exit_tx, exit_rx) = oneshot::channel();
    let (ready_tx, ready_rx) = oneshot::channel();
    let task = RuntimeTask {
        key: key.clone(),
        bridge_id: bridge_id.clone(),
        out: Some(out),
        next_stdin_seq: 1,
        unacked: VecDeque::new(),
        last_stdout_seq: 0,
        stderr: stderr.clone(),
        grace,
        detached_until: None,
        ready: Some(ready_tx),
        exited: Some(exit_tx),
    };
    tokio::spawn(task.run(task_side, events, kill_rx, forget));
    let spawned = SpawnedRemote {
        bridge_id,
        key,
        stdin,
        stdout,
        stderr,
        killer: RuntimeKiller::remote(kill_tx),
        exited: exit_rx,
    };
    (spawned, ready_rx)
}

/// One remote runtime's side of the harness (module doc).
struct RuntimeTask {
    key: String,
    bridge_id: String,
    /// The bridge stream, while it is up.
    out: Option<mpsc::Sender<ToBridge>>,
    next_stdin_seq: u64,
    /// Lines sent to the bridge and not yet acknowledged, oldest first.
    unacked: VecDeque<(u64, Vec<u8>)>,
    last_stdout_seq: u64,
    stderr: Arc<StderrTail>,
    grace: Duration,
    /// Set while the stream is broken: when to give up on the bridge.
    detached_until: Option<Instant>,
    ready: Option<oneshot::Sender<Result<(), String>>>,
    exited: Option<oneshot::Sender<io::Result<ExitStatus>>>,
}

impl RuntimeTask {
    async fn run(
        mut self,
        pipe: DuplexStream,
        mut events: mpsc::Receiver<RuntimeEvent>,
        mut kill: oneshot::Receiver<StopRequest>,
        forget: impl FnOnce(),
    ) {
        let (from_actor, mut to_actor) = tokio::io::split(pipe);
        let mut from_actor = BufReader::new(from_actor);
        let mut line = Vec::new();
        let mut actor_closed = false;
        let ending = loop {
            let can_send = self.out.is_some() && self.unacked.len() < MAX_UNACKED_LINES;
            let grace_end = self.detached_until;
            tokio::select! {
                request = &mut kill => match request {
                    Ok(StopRequest::Gracefully(grace)) => {
                        self.send(ToBridge::Kill { key: self.key.clone(), grace: Some(grace) }).await;
                        break self.stopped(&mut events, grace).await;
                    }
                    _ => {
                        self.send(ToBridge::Kill { key: self.key.clone(), grace: None }).await;
                        break None;
                    }
                },
                read = from_actor.read_until(b'\n', &mut line), if can_send && !actor_closed => {
                    match read {
                        Ok(0) | Err(_) => actor_closed = true,
                        Ok(_) => {
                            while matches!(line.last(), Some(b'\n' | b'\r')) {
                                line.pop();
                            }
                            let seq = self.next_stdin_seq;
                            self.next_stdin_seq += 1;
                            let text = std::mem::take(&mut line);
                            self.unacked.push_back((seq, text.clone()));
                            self.send(ToBridge::Stdin { key: self.key.clone(), seq, line: text }).await;
                        }
                    }
                }
                () = sleep_until(grace_end), if grace_end.is_some() => {
                    break Some(Err(io::Error::new(io::ErrorKind::ConnectionAborted, format!(
                        "bridge {} disconnected and did not come back within reconnect_grace {}",
                        self.bridge_id, humantime::format_duration(self.grace)))));
                }
                event = events.recv() => {
                    let Some(event) = event else { break None };
                    if let Some(ending) = self.on_event(event, &mut to_actor).await {
                        break Some(ending);
                    }
                }
            }
        };
        let _ = to_actor.shutdown().await;
        drop(to_actor);
        forget();
        if let Some(ready) = self.ready.take() {
            let why = match &ending {
                Some(Err(e)) => e.to_string(),
                _ => format!(
                    "bridge {} ended the runtime before it started",
                    self.bridge_id
                ),
            };
            let _ = ready.send(Err(why));
        }
        self.stderr.mark_closed();
        if let (Some(exited), Some(ending)) = (self.exited.take(), ending) {
            let _ = exited.send(ending);
        }
    }

    /// Sends to the bridge if its stream is up; a line that cannot go now stays unacknowledged
    /// and is resent on the next attach. A stream that takes nothing for [`SEND_STALL`] is
    /// treated as broken (a dead connection can look alive for a while; the bridge's keepalive
    /// redials and a fresh stream takes the runtime over), so the grace clock starts.
    async fn send(&mut self, message: ToBridge) {
        let Some(out) = &self.out else { return };
        match tokio::time::timeout(SEND_STALL, out.send(message)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => self.out = None,
            Err(_) => {
                tracing::warn!(bridge = %self.bridge_id, runtime = %self.key, "the bridge stream took nothing for {SEND_STALL:?}; waiting for a redial");
                self.out = None;
                self.detached_until
                    .get_or_insert_with(|| Instant::now() + self.grace);
            }
        }
    }

    /// Handles one event; `Some` ends the runtime with that exit.
    async fn on_event(
        &mut self,
        event: RuntimeEvent,
        to_actor: &mut WriteHalf<DuplexStream>,
    ) -> Option<io::Result<ExitStatus>> {
        let lost = |why: String| Some(Err(io::Error::new(io::ErrorKind::ConnectionAborted, why)));
        match event {
            RuntimeEvent::Attached {
                out,
                last_stdin_seq,
            } => {
                tracing::info!(bridge = %self.bridge_id, runtime = %self.key, resend = self.unacked.len(), "remote runtime taken up again");
                self.out = Some(out);
                self.detached_until = None;
                self.unacked.retain(|(seq, _)| *seq > last_stdin_seq);
                // Tell the bridge what arrived, so it resends only the rest.
                let ack = ToBridge::Ack {
                    key: self.key.clone(),
                    seq: self.last_stdout_seq,
                };
                self.send(ack).await;
                let resend: Vec<(u64, Vec<u8>)> = self.unacked.iter().cloned().collect();
                for (seq, line) in resend {
                    self.send(ToBridge::Stdin {
                        key: self.key.clone(),
                        seq,
                        line,
                    })
                    .await;
                }
                None
            }
            RuntimeEvent::Detached => {
                tracing::warn!(bridge = %self.bridge_id, runtime = %self.key, grace = ?self.grace, "bridge stream broken; waiting for the bridge");
                self.out = None;
                self.detached_until = Some(Instant::now() + self.grace);
                None
            }
            RuntimeEvent::Gone(why) => lost(why),
            RuntimeEvent::Bridge(message) => match message {
                FromBridge::Spawned { .. } => {
                    if let Some(ready) = self.ready.take() {
                        let _ = ready.send(Ok(()));
                    }
                    None
                }
                FromBridge::SpawnFailed {
                    error, stderr_tail, ..
                } => {
                    // Both texts are the bridge's to choose: capped, and so is what they make.
                    let mut why = format!(
                        "bridge {} could not start it: {}",
                        self.bridge_id,
                        cap_foreign(&error)
                    );
                    if !stderr_tail.trim().is_empty() {
                        why.push_str("; stderr: ");
                        why.push_str(&cap_foreign(stderr_tail.trim()));
                    }
                    let why = cap_foreign(&why);
                    if let Some(ready) = self.ready.take() {
                        let _ = ready.send(Err(why.clone()));
                    }
                    lost(why)
                }
                FromBridge::Ack { seq, .. } => {
                    if seq >= self.next_stdin_seq {
                        // An acknowledgement of lines never sent: the bridge is confused.
                        self.send(ToBridge::Kill {
                            key: self.key.clone(),
                            grace: None,
                        })
                        .await;
                        return lost(format!(
                            "bridge {} acknowledged line {seq}, which was never sent",
                            self.bridge_id
                        ));
                    }
                    while self.unacked.front().is_some_and(|(s, _)| *s <= seq) {
                        self.unacked.pop_front();
                    }
                    None
                }
                FromBridge::Stdout { seq, line, .. } => {
                    if seq <= self.last_stdout_seq {
                        return None; // a duplicate of a resent line
                    }
                    let fault = if seq != self.last_stdout_seq + 1 {
                        Some(format!(
                            "bridge {} sent line {seq} after line {}: lines were lost",
                            self.bridge_id, self.last_stdout_seq
                        ))
                    } else if line.contains(&b'\n') {
                        Some(format!(
                            "bridge {} sent a line holding a line break",
                            self.bridge_id
                        ))
                    } else {
                        None
                    };
                    if let Some(fault) = fault {
                        self.send(ToBridge::Kill {
                            key: self.key.clone(),
                            grace: None,
                        })
                        .await;
                        return lost(fault);
                    }
                    self.last_stdout_seq = seq;
                    let written = async {
                        to_actor.write_all(&line).await?;
                        to_actor.write_all(b"\n").await?;
                        to_actor.flush().await
                    };
                    if written.await.is_err() {
                        // The actor let go of the runtime (it was killed): nothing to do.
                        return lost("the session let go of the runtime".into());
                    }
                    self.send(ToBridge::Ack {
                        key: self.key.clone(),
                        seq,
                    })
                    .await;
                    None
                }
                FromBridge::Exited {
                    code,
                    signal,
                    stderr_tail,
                    ..
                } => Some(Ok(self.exit_status(code, signal, &stderr_tail))),
            },
        }
    }

    fn exit_status(&self, code: Option<i32>, signal: Option<i32>, stderr_tail: &str) -> ExitStatus {
        self.stderr.push(cap_foreign(stderr_tail).as_bytes());
        match (code, signal) {
            (Some(code), _) => ExitStatus::from_raw((code & 0xff) << 8),
            (None, Some(signal)) => ExitStatus::from_raw(signal & 0x7f),
            (None, None) => ExitStatus::from_raw(0),
        }
    }

    /// After a graceful stop was asked of the bridge: waits for it to report the exit (so a
    /// reopen starts only once the agent has written its state), at most the grace and a margin.
    /// What the agent still writes is acknowledged and dropped: nobody reads it any more.
    async fn stopped(
        &mut self,
        events: &mut mpsc::Receiver<RuntimeEvent>,
        grace: Duration,
    ) -> Option<io::Result<ExitStatus>> {
        let deadline = Instant::now() + grace + STOP_REPORT_MARGIN;
        loop {
            let event = tokio::select! {
                event = events.recv() => event?,
                () = tokio::time::sleep_until(deadline) => return None,
            };
            match event {
                RuntimeEvent::Bridge(FromBridge::Exited {
                    code,
                    signal,
                    stderr_tail,
                    ..
                }) => return Some(Ok(self.exit_status(code, signal, &stderr_tail))),
                RuntimeEvent::Bridge(FromBridge::Stdout { seq, .. })
                    if seq > self.last_stdout_seq =>
                {
                    self.last_stdout_seq = seq;
                    let key = self.key.clone();
                    self.send(ToBridge::Ack { key, seq }).await;
                }
                RuntimeEvent::Gone(_) => return None,
                RuntimeEvent::Attached { out, .. } => {
                    // A redialled bridge may not have heard the stop: say it again.
                    self.out = Some(out);
                    let key = self.key.clone();
                    self.send(ToBridge::Kill {
                        key,
                        grace: Some(grace),
                    })
                    .await;
                }
                RuntimeEvent::Detached => self.out = None,
                RuntimeEvent::Bridge(_) => {}
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
