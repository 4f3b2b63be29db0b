//! The gateway: the bridges connected to this replica and the remote runtimes placed on them.
//! It admits a bridge's hello (each bridge id belongs to the principal whose token connected
//! it), takes over from the bridge's earlier stream, places new runtimes on the least-loaded
//! matching bridge, hands each message of a stream to its runtime's task, and says which
//! bridges it holds (for the other replicas, metrics, and relayed streams).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    sync::{Notify, mpsc},
    time::Instant,
};

use super::{
    BRIDGE_RECONNECTS, BRIDGE_RUNTIMES, BRIDGE_UNKNOWN_KEYS, BRIDGES_CONNECTED,
    runtime::{self, RUNTIME_EVENTS, RuntimeEvent, SpawnedRemote},
    wire::{FromBridge, Hello, Refused, StillRunning, ToBridge, check_hello, held_by_another},
};
use crate::domain::{Error, text::cap_foreign};

/// Where to run a remote runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteSpec<'a> {
    pub labels: &'a BTreeMap<String, String>,
    /// The principals whose bridges may run it (`None`: any).
    pub principals: Option<&'a [String]>,
    pub bridge_profile: &'a str,
    pub cwd: &'a str,
    pub session_id: &'a str,
    /// Who the session belongs to: the bridge expands `{principal}` in its roots and keeps a
    /// HOME per owner with it.
    pub owner: &'a str,
    /// How long to wait for a matching bridge, then for it to start the runtime.
    pub startup_timeout: Duration,
    pub reconnect_grace: Duration,
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
        let forget = {
            let gateway = self.clone();
            let key = key.clone();
            move || gateway.forget(&key)
        };
        let (spawned, ready_rx) = runtime::start(
            bridge_id.clone(),
            key.clone(),
            out.clone(),
            spec.reconnect_grace,
            events_rx,
            forget,
        );
        let spawn = ToBridge::Spawn {
            key: key.clone(),
            profile: spec.bridge_profile.to_owned(),
            cwd: spec.cwd.to_owned(),
            session_id: spec.session_id.to_owned(),
            owner: spec.owner.to_owned(),
        };
        if out.send(spawn).await.is_err() {
            return Err(format!("bridge {bridge_id} disconnected"));
        }
        let answer = tokio::time::timeout_at(deadline, ready_rx).await;
        match answer {
            Ok(Ok(Ok(()))) => {
                tracing::info!(bridge = %bridge_id, runtime = %key, profile = spec.bridge_profile, "remote runtime started");
                Ok(spawned)
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
        // Runtimes the harness does not know (it restarted, or gave up on them): stop them, as a
        // harness stops a runtime (their sessions may reopen them by resume).
        for key in orphans {
            let grace = Some(crate::acp::process::DEFAULT_STOP_GRACE);
            let _ = out.send(ToBridge::Kill { key, grace }).await;
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
