//! Remote runtimes (SPEC §16): agents a bridge runs elsewhere, reached over the bridge's one
//! `Connect` stream. To the session actor a remote runtime looks exactly like a local child: a
//! byte pipe of JSON-RPC lines each way (an in-memory duplex), a stderr tail, an exit, a killer.
//! So the actor, log-before-act, faults and reopen are the same code for both.
//!
//! The [`Gateway`] knows the connected bridges (labels, profiles, load) and places new runtimes
//! on the least-loaded one that matches. Each remote runtime has one task that numbers the
//! harness's lines (keeping the ones the bridge has not acknowledged, bounded), drops duplicate
//! and refuses out-of-order bridge lines, and survives a broken stream for `reconnect_grace`:
//! when the bridge dials again and lists the runtime in its hello, both sides resend what the
//! other did not take and the session goes on with no fault and no gap.
//!
//! Flow control: every channel is bounded. A slow actor stops the runtime task writing into the
//! pipe, which stops the bridge stream being read; a bridge that does not acknowledge stops the
//! runtime task taking the actor's lines, whose own bounded queue then faults the runtime as
//! "not reading its input".

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    io,
    os::unix::process::ExitStatusExt,
    process::ExitStatus,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, ReadHalf, WriteHalf},
    sync::{Notify, mpsc, oneshot},
    time::Instant,
};

use super::process::{RuntimeKiller, StderrTail};

/// Lines the harness keeps for one runtime until the bridge acknowledges them.
pub const MAX_UNACKED_LINES: usize = 1024;
/// Messages waiting to go out on one bridge stream.
pub const OUTBOUND_MESSAGES: usize = 256;
/// Events waiting for one runtime task.
const RUNTIME_EVENTS: usize = 64;
/// Bytes buffered in the pipe between a runtime task and its session actor, each way.
const PIPE_BYTES: usize = 256 * 1024;
/// How long a send to a bridge stream may wait before the stream counts as broken.
const SEND_STALL: Duration = Duration::from_secs(10);
/// The default of `reconnect_grace` (SPEC §16).
pub const DEFAULT_RECONNECT_GRACE: Duration = Duration::from_secs(30);

/// What a bridge sends, decoded from the wire by the transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromBridge {
    Spawned {
        key: String,
    },
    SpawnFailed {
        key: String,
        error: String,
        stderr_tail: String,
    },
    Stdout {
        key: String,
        seq: u64,
        line: Vec<u8>,
    },
    Exited {
        key: String,
        code: Option<i32>,
        signal: Option<i32>,
        stderr_tail: String,
    },
    Ack {
        key: String,
        seq: u64,
    },
}

impl FromBridge {
    fn key(&self) -> &str {
        match self {
            Self::Spawned { key }
            | Self::SpawnFailed { key, .. }
            | Self::Stdout { key, .. }
            | Self::Exited { key, .. }
            | Self::Ack { key, .. } => key,
        }
    }
}

/// What the harness sends to a bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToBridge {
    Spawn {
        key: String,
        profile: String,
        cwd: String,
        session_id: String,
    },
    Stdin {
        key: String,
        seq: u64,
        line: Vec<u8>,
    },
    Kill {
        key: String,
    },
    Ack {
        key: String,
        seq: u64,
    },
}

/// A bridge's hello: who it is and what it still runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hello {
    pub bridge_id: String,
    pub labels: BTreeMap<String, String>,
    pub profiles: Vec<String>,
    pub version: String,
    pub running: Vec<StillRunning>,
}

/// A runtime a bridge kept through a broken stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StillRunning {
    pub key: String,
    pub last_stdin_seq: u64,
    pub last_stdout_seq: u64,
}

/// Where to run a remote runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteSpec<'a> {
    pub labels: &'a BTreeMap<String, String>,
    pub bridge_profile: &'a str,
    pub cwd: &'a str,
    pub session_id: &'a str,
    /// How long to wait for a matching bridge, then for it to start the runtime.
    pub startup_timeout: Duration,
    pub reconnect_grace: Duration,
}

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
enum RuntimeEvent {
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

struct BridgeEntry {
    labels: BTreeMap<String, String>,
    profiles: Vec<String>,
    /// The replica relaying this stream (the bridge's own stream is there): no new runtimes
    /// are placed on it here, and idle sessions on it move there.
    relayed_by: Option<String>,
    /// `None` while the bridge's stream is broken.
    out: Option<mpsc::Sender<ToBridge>>,
    /// Counts the bridge's streams; a stream that ends acts only if it is still the current one.
    generation: u64,
    runtimes: BTreeSet<String>,
}

struct RuntimeEntry {
    bridge_id: String,
    events: mpsc::Sender<RuntimeEvent>,
}

#[derive(Default)]
struct State {
    bridges: HashMap<String, BridgeEntry>,
    runtimes: HashMap<String, RuntimeEntry>,
}

/// The connected bridges and the remote runtimes placed on them.
#[derive(Default)]
pub struct Gateway {
    state: Mutex<State>,
    /// Woken when a bridge connects, so a placement waiting for one looks again.
    connected: Notify,
    /// Woken when a bridge connects or its stream ends, so the replica publishes its bridges.
    changed: Notify,
}

/// A connected bridge as other replicas should see it (SPEC §16).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeSummary {
    pub bridge_id: String,
    pub labels: BTreeMap<String, String>,
    pub profiles: Vec<String>,
    pub runtimes: u64,
}

/// Whether a bridge with `have` labels serves a profile asking for `want`.
pub fn labels_match(want: &BTreeMap<String, String>, have: &BTreeMap<String, String>) -> bool {
    want.iter().all(|(k, v)| have.get(k) == Some(v))
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").finish_non_exhaustive()
    }
}

/// Why a bridge stream was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

pub fn labels_text(labels: &BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{{{}}}", pairs.join(", "))
}

impl Gateway {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Connected bridges, for logs and metrics.
    pub fn connected_bridges(&self) -> usize {
        let state = self.state.lock().expect("not poisoned");
        state.bridges.values().filter(|b| b.out.is_some()).count()
    }

    /// The bridges whose stream is up here, for the other replicas.
    pub fn summaries(&self) -> Vec<BridgeSummary> {
        let state = self.state.lock().expect("not poisoned");
        let mut found: Vec<BridgeSummary> = state
            .bridges
            .iter()
            .filter(|(_, b)| b.out.is_some() && b.relayed_by.is_none())
            .map(|(id, b)| BridgeSummary {
                bridge_id: id.clone(),
                labels: b.labels.clone(),
                profiles: b.profiles.clone(),
                runtimes: b.runtimes.len() as u64,
            })
            .collect();
        found.sort_by(|a, b| a.bridge_id.cmp(&b.bridge_id));
        found
    }

    /// The replica relaying the bridge's stream here, if it is relayed and up.
    pub fn relayed_by(&self, bridge_id: &str) -> Option<String> {
        let state = self.state.lock().expect("not poisoned");
        state
            .bridges
            .get(bridge_id)
            .filter(|b| b.out.is_some())
            .and_then(|b| b.relayed_by.clone())
    }

    /// Whether a bridge matching `labels` is connected here now.
    pub fn has_match(&self, labels: &BTreeMap<String, String>) -> bool {
        self.place(labels).is_some()
    }

    /// Resolves once a bridge connects here or a bridge's stream here ends (after this call).
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }

    /// Resolves once a bridge connects here (after this call).
    pub fn connected(&self) -> tokio::sync::futures::Notified<'_> {
        self.connected.notified()
    }

    /// The least-loaded connected bridge whose labels include `labels`.
    fn place(&self, labels: &BTreeMap<String, String>) -> Option<(String, mpsc::Sender<ToBridge>)> {
        let state = self.state.lock().expect("not poisoned");
        state
            .bridges
            .iter()
            .filter(|(_, b)| labels_match(labels, &b.labels) && b.relayed_by.is_none())
            .filter_map(|(id, b)| b.out.clone().map(|out| (b.runtimes.len(), id, out)))
            .min_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)))
            .map(|(_, id, out)| (id.clone(), out))
    }

    /// Starts a runtime on a matching bridge: waits (within `startup_timeout`) for one to be
    /// connected, asks it to spawn, and waits for its answer. The error is a sentence.
    pub async fn spawn(self: &Arc<Self>, spec: RemoteSpec<'_>) -> Result<SpawnedRemote, String> {
        let deadline = Instant::now() + spec.startup_timeout;
        let (bridge_id, out) = loop {
            let notified = self.connected.notified();
            if let Some(found) = self.place(spec.labels) {
                break found;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(format!(
                    "no connected bridge matched labels {} within {}",
                    labels_text(spec.labels),
                    humantime::format_duration(spec.startup_timeout)
                ));
            }
        };
        let key = uuid::Uuid::now_v7().to_string();
        let (events_tx, events_rx) = mpsc::channel(RUNTIME_EVENTS);
        {
            let mut state = self.state.lock().expect("not poisoned");
            let Some(bridge) = state.bridges.get_mut(&bridge_id) else {
                return Err(format!("bridge {bridge_id} went away"));
            };
            bridge.runtimes.insert(key.clone());
            state.runtimes.insert(
                key.clone(),
                RuntimeEntry {
                    bridge_id: bridge_id.clone(),
                    events: events_tx,
                },
            );
        }
        self.runtimes_gauge(&bridge_id);
        let (actor_side, task_side) = tokio::io::duplex(PIPE_BYTES);
        let (stdout, stdin) = tokio::io::split(actor_side);
        let stderr = Arc::new(StderrTail::default());
        let (kill_tx, kill_rx) = oneshot::channel();
        let (exit_tx, exit_rx) = oneshot::channel();
        let (ready_tx, ready_rx) = oneshot::channel();
        let task = RuntimeTask {
            gateway: self.clone(),
            key: key.clone(),
            bridge_id: bridge_id.clone(),
            out: Some(out.clone()),
            next_stdin_seq: 1,
            unacked: VecDeque::new(),
            last_stdout_seq: 0,
            stderr: stderr.clone(),
            grace: spec.reconnect_grace,
            detached_until: None,
            ready: Some(ready_tx),
            exited: Some(exit_tx),
        };
        tokio::spawn(task.run(task_side, events_rx, kill_rx));
        let spawn = ToBridge::Spawn {
            key: key.clone(),
            profile: spec.bridge_profile.to_owned(),
            cwd: spec.cwd.to_owned(),
            session_id: spec.session_id.to_owned(),
        };
        let killer = RuntimeKiller::remote(kill_tx);
        if out.send(spawn).await.is_err() {
            return Err(format!("bridge {bridge_id} disconnected"));
        }
        let answer = tokio::time::timeout_at(deadline, ready_rx).await;
        match answer {
            Ok(Ok(Ok(()))) => {
                tracing::info!(bridge = %bridge_id, runtime = %key, profile = spec.bridge_profile, "remote runtime started");
                Ok(SpawnedRemote {
                    bridge_id,
                    key,
                    stdin,
                    stdout,
                    stderr,
                    killer,
                    exited: exit_rx,
                })
            }
            Ok(Ok(Err(why))) => Err(why),
            Ok(Err(_)) => Err(format!(
                "bridge {bridge_id} lost the runtime before it started"
            )),
            Err(_) => Err(format!(
                "bridge {bridge_id} did not start profile {} within {}",
                spec.bridge_profile,
                humantime::format_duration(spec.startup_timeout)
            )),
        }
    }

    fn runtimes_gauge(&self, bridge_id: &str) {
        let count = {
            let state = self.state.lock().expect("not poisoned");
            state.bridges.get(bridge_id).map_or(0, |b| b.runtimes.len())
        };
        metrics::gauge!(BRIDGE_RUNTIMES, "bridge" => bridge_id.to_owned()).set(count as f64);
    }

    fn forget(&self, key: &str) {
        let bridge_id = {
            let mut state = self.state.lock().expect("not poisoned");
            let Some(entry) = state.runtimes.remove(key) else {
                return;
            };
            if let Some(bridge) = state.bridges.get_mut(&entry.bridge_id) {
                bridge.runtimes.remove(key);
            }
            entry.bridge_id
        };
        self.runtimes_gauge(&bridge_id);
    }

    /// Serves one bridge stream: registers the bridge (taking over from an earlier stream of
    /// the same bridge), takes up the runtimes its hello lists, faults the ones it no longer
    /// runs, then hands each message to its runtime until the stream ends. A message the
    /// harness cannot place (an unknown runtime key) is dropped and counted; it never reaches
    /// another runtime.
    pub async fn serve_bridge<S>(
        self: &Arc<Self>,
        hello: Hello,
        mut inbound: S,
        out: mpsc::Sender<ToBridge>,
        relayed_by: Option<String>,
    ) -> Result<(), Refused>
    where
        S: futures::Stream<Item = Result<FromBridge, Refused>> + Unpin,
    {
        use futures::StreamExt;
        if hello.bridge_id.trim().is_empty() || hello.bridge_id.len() > 256 {
            return Err(Refused(
                "the hello needs a bridge_id of 1 to 256 bytes".into(),
            ));
        }
        let bridge_id = hello.bridge_id.clone();
        let listed: HashMap<String, StillRunning> = hello
            .running
            .iter()
            .map(|r| (r.key.clone(), r.clone()))
            .collect();
        let (generation, reattach, gone, orphans) = {
            let mut state = self.state.lock().expect("not poisoned");
            let previous = state.bridges.remove(&bridge_id);
            let reconnect = previous.is_some();
            let generation = previous.as_ref().map_or(0, |p| p.generation + 1);
            let known = previous.map(|p| p.runtimes).unwrap_or_default();
            let mut reattach = Vec::new();
            let mut gone = Vec::new();
            let mut kept = BTreeSet::new();
            for key in known {
                let Some(entry) = state.runtimes.get(&key) else {
                    continue;
                };
                match listed.get(&key) {
                    Some(running) => {
                        reattach.push((entry.events.clone(), running.last_stdin_seq));
                        kept.insert(key);
                    }
                    None => gone.push(entry.events.clone()),
                }
            }
            let orphans: Vec<String> = listed
                .keys()
                .filter(|k| !kept.contains(*k))
                .cloned()
                .collect();
            state.bridges.insert(
                bridge_id.clone(),
                BridgeEntry {
                    labels: hello.labels.clone(),
                    profiles: hello.profiles.clone(),
                    relayed_by: relayed_by.clone(),
                    out: Some(out.clone()),
                    generation,
                    runtimes: kept,
                },
            );
            if reconnect {
                metrics::counter!(BRIDGE_RECONNECTS).increment(1);
            }
            (generation, reattach, gone, orphans)
        };
        metrics::gauge!(BRIDGES_CONNECTED).set(self.connected_bridges() as f64);
        self.runtimes_gauge(&bridge_id);
        tracing::info!(bridge = %bridge_id, labels = %labels_text(&hello.labels), profiles = ?hello.profiles,
            version = %hello.version, running = hello.running.len(), "bridge connected");
        self.connected.notify_waiters();
        self.changed.notify_waiters();
        for (events, last_stdin_seq) in reattach {
            let _ = events
                .send(RuntimeEvent::Attached {
                    out: out.clone(),
                    last_stdin_seq,
                })
                .await;
        }
        for events in gone {
            let _ = events
                .send(RuntimeEvent::Gone(format!(
                    "bridge {bridge_id} reconnected without it: the agent is gone"
                )))
                .await;
        }
        // Runtimes the harness does not know (it restarted, or gave up on them): stop them.
        for key in orphans {
            let _ = out.send(ToBridge::Kill { key }).await;
        }

        let result = loop {
            let message = match inbound.next().await {
                None => break Ok(()),
                Some(Err(refused)) => break Err(refused),
                Some(Ok(message)) => message,
            };
            let events = {
                let state = self.state.lock().expect("not poisoned");
                state
                    .runtimes
                    .get(message.key())
                    .filter(|r| r.bridge_id == bridge_id)
                    .map(|r| r.events.clone())
            };
            match events {
                // Waiting here is the flow control: a slow runtime stops the stream being read.
                Some(events) => {
                    let _ = events.send(RuntimeEvent::Bridge(message)).await;
                }
                None => {
                    metrics::counter!(BRIDGE_UNKNOWN_KEYS).increment(1);
                    tracing::debug!(bridge = %bridge_id, key = message.key(), "a message for an unknown runtime was dropped");
                }
            }
        };

        let detached: Vec<mpsc::Sender<RuntimeEvent>> = {
            let mut state = self.state.lock().expect("not poisoned");
            let current = state
                .bridges
                .get(&bridge_id)
                .is_some_and(|b| b.generation == generation);
            if !current {
                Vec::new()
            } else {
                let bridge = state.bridges.get_mut(&bridge_id).expect("just checked");
                bridge.out = None;
                let keys: Vec<String> = bridge.runtimes.iter().cloned().collect();
                if keys.is_empty() {
                    state.bridges.remove(&bridge_id);
                }
                keys.iter()
                    .filter_map(|k| state.runtimes.get(k).map(|r| r.events.clone()))
                    .collect()
            }
        };
        metrics::gauge!(BRIDGES_CONNECTED).set(self.connected_bridges() as f64);
        self.changed.notify_waiters();
        tracing::info!(bridge = %bridge_id, runtimes = detached.len(), error = ?result.as_ref().err(), "bridge stream ended");
        for events in detached {
            let _ = events.send(RuntimeEvent::Detached).await;
        }
        result
    }
}

pub(crate) const BRIDGES_CONNECTED: &str = "agent_harness_bridges_connected";
pub(crate) const BRIDGE_RUNTIMES: &str = "agent_harness_bridge_runtimes";
pub(crate) const BRIDGE_RECONNECTS: &str = "agent_harness_bridge_reconnects_total";
/// Sessions whose lease this replica gave up because their bridge serves another replica.
pub(crate) const BRIDGE_LEASE_MOVES: &str = "agent_harness_bridge_lease_moves_total";
/// Runtimes of a redialled bridge relayed to the replica owning their sessions.
pub(crate) const BRIDGE_RELAYED_RUNTIMES: &str = "agent_harness_bridge_relayed_runtimes_total";
pub(crate) const BRIDGE_UNKNOWN_KEYS: &str = "agent_harness_bridge_unknown_runtime_messages_total";

/// One remote runtime's side of the harness (module doc).
struct RuntimeTask {
    gateway: Arc<Gateway>,
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
        mut kill: oneshot::Receiver<()>,
    ) {
        let (from_actor, mut to_actor) = tokio::io::split(pipe);
        let mut from_actor = BufReader::new(from_actor);
        let mut line = Vec::new();
        let mut actor_closed = false;
        let ending = loop {
            let can_send = self.out.is_some() && self.unacked.len() < MAX_UNACKED_LINES;
            let grace_end = self.detached_until;
            tokio::select! {
                _ = &mut kill => {
                    self.send(ToBridge::Kill { key: self.key.clone() }).await;
                    break None;
                }
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
        self.gateway.forget(&self.key);
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
                    let mut why = format!("bridge {} could not start it: {error}", self.bridge_id);
                    if !stderr_tail.trim().is_empty() {
                        why.push_str("; stderr: ");
                        why.push_str(stderr_tail.trim());
                    }
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
                } => {
                    self.stderr.push(stderr_tail.as_bytes());
                    let status = match (code, signal) {
                        (Some(code), _) => ExitStatus::from_raw((code & 0xff) << 8),
                        (None, Some(signal)) => ExitStatus::from_raw(signal & 0x7f),
                        (None, None) => ExitStatus::from_raw(0),
                    };
                    Some(Ok(status))
                }
            },
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn hello(id: &str, labels: &[(&str, &str)]) -> Hello {
        Hello {
            bridge_id: id.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            profiles: vec!["mock".into()],
            ..Default::default()
        }
    }

    fn spec<'a>(labels: &'a BTreeMap<String, String>) -> RemoteSpec<'a> {
        RemoteSpec {
            labels,
            bridge_profile: "mock",
            cwd: "/",
            session_id: "s",
            startup_timeout: Duration::from_secs(5),
            reconnect_grace: Duration::from_secs(5),
        }
    }

    /// A bridge served in the background: what the harness sends it, and a sender of its messages.
    fn connect(
        gateway: &Arc<Gateway>,
        hello: Hello,
    ) -> (
        mpsc::Receiver<ToBridge>,
        mpsc::Sender<Result<FromBridge, Refused>>,
    ) {
        let (out_tx, out_rx) = mpsc::channel(OUTBOUND_MESSAGES);
        let (in_tx, in_rx) = mpsc::channel(16);
        let gateway = gateway.clone();
        tokio::spawn(async move {
            let inbound = tokio_stream::wrappers::ReceiverStream::new(in_rx);
            let _ = gateway.serve_bridge(hello, inbound, out_tx, None).await;
        });
        (out_rx, in_tx)
    }

    #[tokio::test]
    async fn a_stream_relayed_by_another_replica_is_neither_placed_on_nor_published() {
        let gateway = Gateway::new();
        let (out_tx, _out_rx) = mpsc::channel(OUTBOUND_MESSAGES);
        let (_in_tx, in_rx) = mpsc::channel::<Result<FromBridge, Refused>>(16);
        let connected = gateway.connected();
        tokio::spawn({
            let gateway = gateway.clone();
            async move {
                let inbound = tokio_stream::wrappers::ReceiverStream::new(in_rx);
                let relayed_by = Some("10.0.0.3:50051".to_owned());
                let _ = gateway
                    .serve_bridge(hello("b1", &[]), inbound, out_tx, relayed_by)
                    .await;
            }
        });
        connected.await;
        assert_eq!(gateway.relayed_by("b1").as_deref(), Some("10.0.0.3:50051"));
        assert!(gateway.summaries().is_empty());
        assert!(!gateway.has_match(&BTreeMap::new()));
        let any = BTreeMap::new();
        let mut short = spec(&any);
        short.startup_timeout = Duration::from_millis(100);
        assert!(gateway.spawn(short).await.is_err());
    }

    async fn next(rx: &mut mpsc::Receiver<ToBridge>) -> ToBridge {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("in time")
            .expect("open")
    }

    #[tokio::test]
    async fn placement_waits_for_a_matching_bridge_and_names_the_labels_when_none_comes() {
        let gateway = Gateway::new();
        let labels: BTreeMap<String, String> = [("pool".into(), "gpu".into())].into();
        let _other = connect(&gateway, hello("b1", &[("pool", "cpu")]));
        let mut short = spec(&labels);
        short.startup_timeout = Duration::from_millis(200);
        let error = gateway.spawn(short).await.err().expect("no bridge matched");
        assert!(error.contains("pool=gpu"), "{error}");
    }

    #[tokio::test]
    async fn lines_travel_numbered_both_ways_and_duplicates_are_dropped() {
        let gateway = Gateway::new();
        let (mut out, inbound) = connect(&gateway, hello("b1", &[]));
        let spawning = tokio::spawn({
            let gateway = gateway.clone();
            async move { gateway.spawn(spec(&BTreeMap::new())).await }
        });
        let ToBridge::Spawn { key, .. } = next(&mut out).await else {
            panic!("spawn first")
        };
        inbound
            .send(Ok(FromBridge::Spawned { key: key.clone() }))
            .await
            .unwrap();
        let mut runtime = spawning.await.unwrap().expect("spawned");
        runtime.stdin.write_all(b"{\"a\":1}\n").await.unwrap();
        assert_eq!(
            next(&mut out).await,
            ToBridge::Stdin {
                key: key.clone(),
                seq: 1,
                line: b"{\"a\":1}".to_vec()
            }
        );
        for seq in [1, 1, 2] {
            let line = format!("{{\"n\":{seq}}}").into_bytes();
            inbound
                .send(Ok(FromBridge::Stdout {
                    key: key.clone(),
                    seq,
                    line,
                }))
                .await
                .unwrap();
        }
        let mut buf = vec![0u8; 16];
        let mut got = Vec::new();
        while got.len() < 16 {
            let n = runtime.stdout.read(&mut buf).await.unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, b"{\"n\":1}\n{\"n\":2}\n");
    }

    #[tokio::test]
    async fn a_gap_in_the_bridges_numbers_ends_the_runtime_as_lost() {
        let gateway = Gateway::new();
        let (mut out, inbound) = connect(&gateway, hello("b1", &[]));
        let spawning = tokio::spawn({
            let gateway = gateway.clone();
            async move { gateway.spawn(spec(&BTreeMap::new())).await }
        });
        let ToBridge::Spawn { key, .. } = next(&mut out).await else {
            panic!()
        };
        inbound
            .send(Ok(FromBridge::Spawned { key: key.clone() }))
            .await
            .unwrap();
        let runtime = spawning.await.unwrap().unwrap();
        inbound
            .send(Ok(FromBridge::Stdout {
                key: key.clone(),
                seq: 3,
                line: b"{}".to_vec(),
            }))
            .await
            .unwrap();
        let exit = tokio::time::timeout(Duration::from_secs(5), runtime.exited)
            .await
            .unwrap()
            .unwrap();
        assert!(exit.unwrap_err().to_string().contains("lost"));
        assert_eq!(next(&mut out).await, ToBridge::Kill { key });
    }

    #[tokio::test]
    async fn after_a_broken_stream_the_redialled_bridge_gets_what_it_had_not_received_again() {
        let gateway = Gateway::new();
        let (mut out, inbound) = connect(&gateway, hello("b1", &[]));
        let spawning = tokio::spawn({
            let gateway = gateway.clone();
            async move { gateway.spawn(spec(&BTreeMap::new())).await }
        });
        let ToBridge::Spawn { key, .. } = next(&mut out).await else {
            panic!()
        };
        inbound
            .send(Ok(FromBridge::Spawned { key: key.clone() }))
            .await
            .unwrap();
        let mut runtime = spawning.await.unwrap().unwrap();
        runtime
            .stdin
            .write_all(b"{\"one\":1}\n{\"two\":2}\n")
            .await
            .unwrap();
        for seq in [1, 2] {
            assert!(matches!(next(&mut out).await, ToBridge::Stdin { seq: s, .. } if s == seq));
        }
        // The bridge took line 1 only, then the stream broke.
        drop(inbound);
        drop(out);
        let mut again = hello("b1", &[]);
        again.running = vec![StillRunning {
            key: key.clone(),
            last_stdin_seq: 1,
            last_stdout_seq: 0,
        }];
        let (mut out, _inbound) = connect(&gateway, again);
        assert_eq!(
            next(&mut out).await,
            ToBridge::Ack {
                key: key.clone(),
                seq: 0
            }
        );
        assert_eq!(
            next(&mut out).await,
            ToBridge::Stdin {
                key,
                seq: 2,
                line: b"{\"two\":2}".to_vec()
            }
        );
    }
}
