//! Remote runtimes: agents a bridge runs elsewhere, reached over the bridge's one
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
use crate::domain::{Error, ErrorCode, text::cap_foreign};

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
/// The default of `reconnect_grace`.
pub const DEFAULT_RECONNECT_GRACE: Duration = Duration::from_secs(30);

/// Bounds of a bridge's hello: it is kept in memory for as long as the bridge is connected,
/// logged, and published to the other replicas, so a bigger one is refused whole.
pub const MAX_HELLO_LABELS: usize = 64;
pub const MAX_HELLO_PROFILES: usize = 256;
/// Runtimes a hello may list as still running (four replicas' worth at the default
/// `limits.live_runtimes`); each listed session may cost a store read to find its owner.
pub const MAX_HELLO_RUNNING: usize = 1024;
/// Bytes of each hello text: bridge id, version, label key or value, profile name, runtime key.
pub const MAX_HELLO_TEXT: usize = 256;

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
    /// The principals whose bridges may run it (`None`: any).
    pub principals: Option<&'a [String]>,
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
    /// The principal of the token the bridge connected with: it owns the bridge id while the
    /// bridge is held here (connected, or runtimes waiting for it to redial).
    principal: String,
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

impl BridgeEntry {
    /// Whether the bridge id is taken: its stream is up, or runtimes wait for it to redial.
    fn held(&self) -> bool {
        self.out.is_some() || !self.runtimes.is_empty()
    }

    /// Whether placement may hand this bridge a runtime wanting `labels` and `principals`.
    fn serves(&self, labels: &BTreeMap<String, String>, principals: Option<&[String]>) -> bool {
        self.relayed_by.is_none()
            && labels_match(labels, &self.labels)
            && principal_allowed(principals, &self.principal)
    }
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

/// A connected bridge as other replicas should see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeSummary {
    pub bridge_id: String,
    pub principal: String,
    /// Its stream is up here (not relayed): runtimes may be placed on it.
    pub connected: bool,
    pub labels: BTreeMap<String, String>,
    pub profiles: Vec<String>,
    pub runtimes: u64,
}

/// Whether a bridge with `have` labels serves a profile asking for `want`.
pub fn labels_match(want: &BTreeMap<String, String>, have: &BTreeMap<String, String>) -> bool {
    want.iter().all(|(k, v)| have.get(k) == Some(v))
}

/// Whether a bridge connected as `principal` may serve a profile allowing `allowed` principals
/// (`None`: any).
pub fn principal_allowed(allowed: Option<&[String]>, principal: &str) -> bool {
    allowed.is_none_or(|allowed| allowed.iter().any(|p| p == principal))
}

/// Checks a hello against the bounds above (LIMIT_EXCEEDED naming the field, never quoting it)
/// and that it names itself.
pub fn check_hello(hello: &Hello) -> Result<(), Error> {
    fn count(limit: &str, max: usize, n: usize, what: &str) -> Result<(), Error> {
        match n > max {
            true => Err(Error::limit(limit, max, format!("the hello's {n} {what}"))),
            false => Ok(()),
        }
    }
    fn bytes<'a>(
        limit: &str,
        texts: impl IntoIterator<Item = &'a str>,
        what: &str,
    ) -> Result<(), Error> {
        match texts.into_iter().any(|t| t.len() > MAX_HELLO_TEXT) {
            true => Err(Error::limit(
                limit,
                MAX_HELLO_TEXT,
                format!("a {what} of the hello (bytes)"),
            )),
            false => Ok(()),
        }
    }
    bytes("hello.bridge_id", [hello.bridge_id.as_str()], "bridge_id")?;
    bytes("hello.version", [hello.version.as_str()], "version")?;
    count(
        "hello.labels",
        MAX_HELLO_LABELS,
        hello.labels.len(),
        "labels",
    )?;
    let label_texts = hello
        .labels
        .iter()
        .flat_map(|(k, v)| [k.as_str(), v.as_str()]);
    bytes("hello.label", label_texts, "label key or value")?;
    count(
        "hello.profiles",
        MAX_HELLO_PROFILES,
        hello.profiles.len(),
        "profiles",
    )?;
    bytes(
        "hello.profile",
        hello.profiles.iter().map(String::as_str),
        "profile name",
    )?;
    count(
        "hello.running",
        MAX_HELLO_RUNNING,
        hello.running.len(),
        "running runtimes",
    )?;
    bytes(
        "hello.runtime_key",
        hello.running.iter().map(|r| r.key.as_str()),
        "runtime key",
    )?;
    // Compared exactly, logged, and shown in metrics: printable and not blank.
    if hello.bridge_id.trim().is_empty() || hello.bridge_id.chars().any(char::is_control) {
        return Err(Error::invalid(
            "the hello needs a bridge_id that is not blank and holds no control characters",
        ));
    }
    Ok(())
}

/// The refusal of a hello naming a bridge id another principal holds.
pub fn held_by_another(bridge_id: &str) -> Error {
    Error::new(
        ErrorCode::Forbidden,
        format!("bridge id {bridge_id:?} is held by another principal's bridge"),
    )
}

/// A bridge admitted by [`Gateway::admit`], to be served by [`Gateway::serve`].
pub struct Admitted {
    bridge_id: String,
    generation: u64,
    out: mpsc::Sender<ToBridge>,
    reattach: Vec<(mpsc::Sender<RuntimeEvent>, u64)>,
    gone: Vec<mpsc::Sender<RuntimeEvent>>,
    orphans: Vec<String>,
}

impl std::fmt::Debug for Admitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("bridge_id", &self.bridge_id)
            .finish_non_exhaustive()
    }
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

    /// The bridges held here, for the other replicas: those whose stream is up here (placement
    /// may use them), and those whose runtimes wait for them or that another replica relays
    /// (they only say whose the bridge id is).
    pub fn summaries(&self) -> Vec<BridgeSummary> {
        let state = self.state.lock().expect("not poisoned");
        let mut found: Vec<BridgeSummary> = state
            .bridges
            .iter()
            .filter(|(_, b)| b.held())
            .map(|(id, b)| BridgeSummary {
                bridge_id: id.clone(),
                principal: b.principal.clone(),
                connected: b.out.is_some() && b.relayed_by.is_none(),
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

    /// Whether a bridge matching `labels` (of one of `principals`, if given) is connected here.
    pub fn has_match(
        &self,
        labels: &BTreeMap<String, String>,
        principals: Option<&[String]>,
    ) -> bool {
        self.place(labels, principals).is_some()
    }

    /// The principal holding `bridge_id` here (connected, or its runtimes waiting for a redial).
    pub fn holder(&self, bridge_id: &str) -> Option<String> {
        let state = self.state.lock().expect("not poisoned");
        state
            .bridges
            .get(bridge_id)
            .filter(|b| b.held())
            .map(|b| b.principal.clone())
    }

    /// Refuses (FORBIDDEN) a hello of `principal` naming a bridge id another principal holds
    /// here; changes nothing.
    pub fn check_owner(&self, bridge_id: &str, principal: &str) -> Result<(), Error> {
        match self.holder(bridge_id) {
            Some(holder) if holder != principal => Err(held_by_another(bridge_id)),
            _ => Ok(()),
        }
    }

    /// Resolves once a bridge connects here or a bridge's stream here ends (after this call).
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }

    /// Resolves once a bridge connects here (after this call).
    pub fn connected(&self) -> tokio::sync::futures::Notified<'_> {
        self.connected.notified()
    }

    /// The least-loaded connected bridge whose labels include `labels`, of one of `principals`.
    fn place(
        &self,
        labels: &BTreeMap<String, String>,
        principals: Option<&[String]>,
    ) -> Option<(String, mpsc::Sender<ToBridge>)> {
        let state = self.state.lock().expect("not poisoned");
        state
            .bridges
            .iter()
            .filter(|(_, b)| b.serves(labels, principals))
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
            if let Some(found) = self.place(spec.labels, spec.principals) {
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

    /// The per-bridge series in the Prometheus text format, rendered at scrape time from the
    /// bridges held now: the `metrics` facade cannot remove a labelled series, so a bridge's
    /// series would outlive it there (one series per bridge id ever seen).
    pub fn exposition(&self) -> String {
        use std::fmt::Write;
        let state = self.state.lock().expect("not poisoned");
        let mut held: Vec<(&String, usize)> = state
            .bridges
            .iter()
            .filter(|(_, b)| b.held())
            .map(|(id, b)| (id, b.runtimes.len()))
            .collect();
        if held.is_empty() {
            return String::new();
        }
        held.sort();
        let mut text = format!(
            "# HELP {BRIDGE_RUNTIMES} Remote runtimes each bridge runs for this replica.\n\
             # TYPE {BRIDGE_RUNTIMES} gauge\n"
        );
        for (id, runtimes) in held {
            let _ = writeln!(
                text,
                "{BRIDGE_RUNTIMES}{{bridge=\"{}\"}} {runtimes}",
                escape_label(id)
            );
        }
        text
    }

    fn forget(&self, key: &str) {
        let mut state = self.state.lock().expect("not poisoned");
        let Some(entry) = state.runtimes.remove(key) else {
            return;
        };
        if let Some(bridge) = state.bridges.get_mut(&entry.bridge_id) {
            bridge.runtimes.remove(key);
            // A bridge that left and whose last runtime is gone leaves no trace (its id is free).
            if !bridge.held() {
                state.bridges.remove(&entry.bridge_id);
                drop(state);
                self.changed.notify_waiters();
            }
        }
    }

    /// Serves one bridge stream of `principal` ([`Gateway::admit`], then [`Gateway::serve`]).
    pub async fn serve_bridge<S>(
        self: &Arc<Self>,
        hello: Hello,
        principal: &str,
        inbound: S,
        out: mpsc::Sender<ToBridge>,
        relayed_by: Option<String>,
    ) -> Result<(), Refused>
    where
        S: futures::Stream<Item = Result<FromBridge, Refused>> + Unpin,
    {
        let admitted = self
            .admit(&hello, principal, out, relayed_by)
            .map_err(|e| Refused(e.message))?;
        self.serve(admitted, inbound).await
    }

    /// Registers a bridge stream of `principal`: checks the hello's bounds, refuses (FORBIDDEN)
    /// a bridge id another principal holds here, then takes over from an earlier stream of the
    /// same bridge and sorts the runtimes its hello lists. A refused hello changes nothing.
    pub fn admit(
        &self,
        hello: &Hello,
        principal: &str,
        out: mpsc::Sender<ToBridge>,
        relayed_by: Option<String>,
    ) -> Result<Admitted, Error> {
        check_hello(hello)?;
        let bridge_id = hello.bridge_id.clone();
        let listed: HashMap<&str, &StillRunning> =
            hello.running.iter().map(|r| (r.key.as_str(), r)).collect();
        let admitted = {
            let mut state = self.state.lock().expect("not poisoned");
            if let Some(previous) = state.bridges.get(&bridge_id)
                && previous.held()
                && previous.principal != principal
            {
                return Err(held_by_another(&bridge_id));
            }
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
                match listed.get(key.as_str()) {
                    Some(running) => {
                        reattach.push((entry.events.clone(), running.last_stdin_seq));
                        kept.insert(key);
                    }
                    None => gone.push(entry.events.clone()),
                }
            }
            let orphans: Vec<String> = listed
                .keys()
                .filter(|k| !kept.contains(**k))
                .map(|k| (*k).to_owned())
                .collect();
            state.bridges.insert(
                bridge_id.clone(),
                BridgeEntry {
                    principal: principal.to_owned(),
                    labels: hello.labels.clone(),
                    profiles: hello.profiles.clone(),
                    relayed_by,
                    out: Some(out.clone()),
                    generation,
                    runtimes: kept,
                },
            );
            if reconnect {
                metrics::counter!(BRIDGE_RECONNECTS).increment(1);
            }
            Admitted {
                bridge_id: bridge_id.clone(),
                generation,
                out,
                reattach,
                gone,
                orphans,
            }
        };
        metrics::gauge!(BRIDGES_CONNECTED).set(self.connected_bridges() as f64);
        // Bounded by check_hello, and capped again: a log line is no place for a whole hello.
        tracing::info!(bridge = %bridge_id, %principal, labels = %cap_foreign(&labels_text(&hello.labels)),
            profiles = %cap_foreign(&format!("{:?}", hello.profiles)), version = %hello.version,
            running = hello.running.len(), "bridge connected");
        self.connected.notify_waiters();
        self.changed.notify_waiters();
        Ok(admitted)
    }

    /// Serves an admitted bridge stream: takes up the runtimes its hello lists, faults the ones
    /// it no longer runs, then hands each message to its runtime until the stream ends. A
    /// message the harness cannot place (an unknown runtime key) is dropped and counted; it
    /// never reaches another runtime.
    pub async fn serve<S>(
        self: &Arc<Self>,
        admitted: Admitted,
        mut inbound: S,
    ) -> Result<(), Refused>
    where
        S: futures::Stream<Item = Result<FromBridge, Refused>> + Unpin,
    {
        use futures::StreamExt;
        let Admitted {
            bridge_id,
            generation,
            out,
            reattach,
            gone,
            orphans,
        } = admitted;
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

/// A Prometheus label value, escaped as the text format wants.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
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
                    self.stderr.push(cap_foreign(&stderr_tail).as_bytes());
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
            principals: None,
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
            let _ = gateway
                .serve_bridge(hello, "local", inbound, out_tx, None)
                .await;
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
                    .serve_bridge(hello("b1", &[]), "local", inbound, out_tx, relayed_by)
                    .await;
            }
        });
        connected.await;
        assert_eq!(gateway.relayed_by("b1").as_deref(), Some("10.0.0.3:50051"));
        assert!(gateway.summaries().iter().all(|s| !s.connected));
        assert!(!gateway.has_match(&BTreeMap::new(), None));
        let any = BTreeMap::new();
        let mut short = spec(&any);
        short.startup_timeout = Duration::from_millis(100);
        assert!(gateway.spawn(short).await.is_err());
    }

    /// A bridge of `principal` served in the background.
    fn connect_as(
        gateway: &Arc<Gateway>,
        hello: Hello,
        principal: &str,
    ) -> (
        mpsc::Receiver<ToBridge>,
        mpsc::Sender<Result<FromBridge, Refused>>,
    ) {
        let (out_tx, out_rx) = mpsc::channel(OUTBOUND_MESSAGES);
        let (in_tx, in_rx) = mpsc::channel(16);
        let admitted = gateway
            .admit(&hello, principal, out_tx, None)
            .expect("admitted");
        let gateway = gateway.clone();
        tokio::spawn(async move {
            let inbound = tokio_stream::wrappers::ReceiverStream::new(in_rx);
            let _ = gateway.serve(admitted, inbound).await;
        });
        (out_rx, in_tx)
    }

    #[tokio::test]
    async fn a_hello_naming_a_bridge_id_another_principal_holds_is_refused_and_changes_nothing() {
        let gateway = Gateway::new();
        let (mut out, inbound) = connect_as(&gateway, hello("b1", &[]), "victim");
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
        let mut impostor = hello("b1", &[]);
        impostor.running = vec![StillRunning {
            key: key.clone(),
            last_stdin_seq: 0,
            last_stdout_seq: 0,
        }];
        let (impostor_out, mut impostor_rx) = mpsc::channel(OUTBOUND_MESSAGES);
        let refused = gateway
            .admit(&impostor, "mallory", impostor_out.clone(), None)
            .unwrap_err();
        assert_eq!(refused.code, ErrorCode::Forbidden);
        assert_eq!(gateway.holder("b1").as_deref(), Some("victim"));
        assert_eq!(gateway.summaries()[0].principal, "victim");
        assert!(gateway.check_owner("b1", "mallory").is_err());
        gateway.check_owner("b1", "victim").unwrap();
        // Within the reconnect grace the id stays the victim's.
        drop(inbound);
        runtime.stdin.write_all(b"{\"a\":1}\n").await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), async {
            while gateway.connected_bridges() > 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the stream ended");
        let refused = gateway
            .admit(&impostor, "mallory", impostor_out, None)
            .unwrap_err();
        assert_eq!(refused.code, ErrorCode::Forbidden);
        let summaries = gateway.summaries();
        assert_eq!(summaries.len(), 1, "still published, as the victim's");
        assert!(!summaries[0].connected && summaries[0].principal == "victim");
        assert!(
            impostor_rx.try_recv().is_err(),
            "nothing reached the impostor"
        );
        // The victim's bridge redials and gets the line the impostor never saw.
        let mut again = hello("b1", &[]);
        again.running = vec![StillRunning {
            key: key.clone(),
            last_stdin_seq: 0,
            last_stdout_seq: 0,
        }];
        let (mut out, _inbound) = connect_as(&gateway, again, "victim");
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
                seq: 1,
                line: b"{\"a\":1}".to_vec()
            }
        );
        drop(runtime);
    }

    #[tokio::test]
    async fn without_tokens_every_bridge_is_local_and_a_redial_takes_its_id_over_as_before() {
        let gateway = Gateway::new();
        let (_out, _inbound) = connect_as(&gateway, hello("b1", &[]), "local");
        let (out_tx, _out_rx) = mpsc::channel(OUTBOUND_MESSAGES);
        gateway
            .admit(&hello("b1", &[]), "local", out_tx, None)
            .expect("the same principal takes its id over");
    }

    #[test]
    fn a_hello_over_its_bounds_is_refused_limit_exceeded_without_quoting_it() {
        let many: Vec<(String, String)> = (0..=MAX_HELLO_LABELS)
            .map(|i| (format!("k{i}"), "v".into()))
            .collect();
        let mut big = hello("b1", &[]);
        big.labels = many.into_iter().collect();
        let long = "x".repeat(MAX_HELLO_TEXT + 1);
        let cases = [
            big,
            Hello {
                labels: [(long.clone(), "v".into())].into(),
                ..hello("b1", &[])
            },
            Hello {
                labels: [("k".into(), long.clone())].into(),
                ..hello("b1", &[])
            },
            Hello {
                profiles: vec!["p".into(); MAX_HELLO_PROFILES + 1],
                ..hello("b1", &[])
            },
            Hello {
                profiles: vec![long.clone()],
                ..hello("b1", &[])
            },
            Hello {
                version: long.clone(),
                ..hello("b1", &[])
            },
            hello(&long, &[]),
            Hello {
                running: vec![StillRunning::default(); MAX_HELLO_RUNNING + 1],
                ..hello("b1", &[])
            },
        ];
        for case in cases {
            let error = check_hello(&case).unwrap_err();
            assert_eq!(error.code, ErrorCode::LimitExceeded, "{error:?}");
            assert!(!error.message.contains("xxxx"), "{}", error.message);
        }
        let mut at_bounds = hello("b1", &[]);
        at_bounds.labels = (0..MAX_HELLO_LABELS)
            .map(|i| (format!("{i:0>256}"), "v".repeat(MAX_HELLO_TEXT)))
            .collect();
        check_hello(&at_bounds).unwrap();
        assert_eq!(
            check_hello(&hello(" ", &[])).unwrap_err().code,
            ErrorCode::InvalidArgument
        );
    }

    #[tokio::test]
    async fn a_bridges_series_leave_the_exposition_when_the_bridge_leaves() {
        let gateway = Gateway::new();
        let (mut out, inbound) = connect_as(&gateway, hello("b\"1", &[]), "local");
        assert!(
            gateway
                .exposition()
                .contains("agent_harness_bridge_runtimes{bridge=\"b\\\"1\"} 0"),
            "{}",
            gateway.exposition()
        );
        let spawning = tokio::spawn({
            let gateway = gateway.clone();
            async move {
                let labels = BTreeMap::new();
                let mut short = spec(&labels);
                short.reconnect_grace = Duration::from_millis(100);
                gateway.spawn(short).await
            }
        });
        let ToBridge::Spawn { key, .. } = next(&mut out).await else {
            panic!("spawn first")
        };
        inbound.send(Ok(FromBridge::Spawned { key })).await.unwrap();
        let runtime = spawning.await.unwrap().expect("spawned");
        assert!(
            gateway.exposition().contains("} 1"),
            "{}",
            gateway.exposition()
        );
        // The stream breaks; the runtime outlives it for the grace, then the bridge is gone.
        drop(inbound);
        let _ = tokio::time::timeout(Duration::from_secs(5), runtime.exited)
            .await
            .expect("faulted after the grace");
        tokio::time::timeout(Duration::from_secs(5), async {
            while !gateway.exposition().is_empty() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the series went with the bridge");
        assert_eq!(gateway.holder("b\"1"), None, "the id is free again");
    }

    #[tokio::test]
    async fn a_spawn_failure_of_megabytes_is_capped_and_marked_as_cut() {
        let gateway = Gateway::new();
        let (mut out, inbound) = connect(&gateway, hello("b1", &[]));
        let spawning = tokio::spawn({
            let gateway = gateway.clone();
            async move { gateway.spawn(spec(&BTreeMap::new())).await.err() }
        });
        let ToBridge::Spawn { key, .. } = next(&mut out).await else {
            panic!("spawn first")
        };
        inbound
            .send(Ok(FromBridge::SpawnFailed {
                key,
                error: "e".repeat(4 << 20),
                stderr_tail: "s".repeat(4 << 20),
            }))
            .await
            .unwrap();
        let why = spawning.await.unwrap().expect("failed");
        assert!(
            why.len() <= crate::domain::text::MAX_FOREIGN_TEXT_BYTES,
            "{}",
            why.len()
        );
        assert!(why.ends_with(crate::domain::text::CUT_MARK));
    }

    #[tokio::test]
    async fn placement_hands_a_runtime_only_to_a_bridge_of_an_allowed_principal() {
        let gateway = Gateway::new();
        let (_out, _inbound) = connect_as(&gateway, hello("a-theirs", &[]), "mallory");
        let any = BTreeMap::new();
        let allowed = vec!["sandbox-7".to_owned()];
        assert!(!gateway.has_match(&any, Some(&allowed)));
        assert!(gateway.has_match(&any, None));
        let (mut out, _inbound) = connect_as(&gateway, hello("ours", &[]), "sandbox-7");
        assert!(gateway.has_match(&any, Some(&allowed)));
        let spawning = tokio::spawn({
            let gateway = gateway.clone();
            let allowed = allowed.clone();
            async move {
                let any = BTreeMap::new();
                let mut wanted = spec(&any);
                wanted.principals = Some(&allowed);
                gateway.spawn(wanted).await.err()
            }
        });
        assert!(matches!(next(&mut out).await, ToBridge::Spawn { .. }));
        spawning.abort();
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
