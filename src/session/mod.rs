//! The session engine: one actor (task) per agent session owning its runtime I/O, turn state,
//! queue and held interactions ([`actor`]), and the registry that creates, finds and authorises
//! sessions ([`manager`]).

pub(crate) mod actor;
mod input;
pub(crate) mod interactions;
pub(crate) mod manager;
pub(crate) mod metering;
pub(crate) mod metrics;
pub(crate) mod profile;
pub(crate) mod subscribe;
pub(crate) mod traces;
pub(crate) mod warm;
pub(crate) mod workspace;

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
};

use tokio::sync::{Semaphore, broadcast, mpsc, oneshot};
use uuid::Uuid;

use crate::{
    acp::process::ProcessTable,
    domain::{
        ActionId, Principal, Result,
        limits::Limits,
        queue::QueuedEntry,
        session::{SessionRecord, SessionStatus},
    },
    store::{LogEntry, Store},
    translate::Translator,
};

pub(crate) use input::ControlInput;
pub(crate) use manager::Sessions;
pub(crate) use profile::{PermissionPolicy, Profile};

/// Live events of one session, for subscribers. Entries are broadcast only after they are in the
/// log; queue and status events are full snapshots, so a subscriber that missed some can resync.
#[derive(Debug, Clone)]
pub(crate) enum SessionEvent {
    Entry(Arc<SharedEntry>),
    Queue(Arc<Vec<QueuedEntry>>),
    Status {
        status: SessionStatus,
        reason: String,
    },
    /// The session was deleted: streams end NOT_FOUND.
    Deleted,
}

/// A log entry as the live feed hands it to every subscriber, with a slot where the gRPC layer
/// keeps its wire encoding: an entry going to a thousand streams is encoded once, not a thousand
/// times (docs/benchmarks.md, fan-out). The session layer never reads or writes the slot.
#[derive(Debug)]
pub(crate) struct SharedEntry {
    entry: LogEntry,
    pub wire: std::sync::OnceLock<bytes::Bytes>,
}

impl From<LogEntry> for SharedEntry {
    fn from(entry: LogEntry) -> Self {
        Self {
            entry,
            wire: std::sync::OnceLock::new(),
        }
    }
}

impl std::ops::Deref for SharedEntry {
    type Target = LogEntry;
    fn deref(&self) -> &LogEntry {
        &self.entry
    }
}

/// Capacity of a session's live event feed; a subscriber further behind reads the log instead.
pub(crate) const EVENT_FEED_CAPACITY: usize = 512;

/// The engine's options; `config` assembles them from flags, env and the config file.
#[derive(Debug, Clone)]
pub(crate) struct EngineOptions {
    pub limits: Limits,
    pub profiles: BTreeMap<String, Arc<Profile>>,
    /// The `_meta` key of the hidden invocation block.
    pub meta_key: String,
    /// Where channel attachments are served from, for prompts made from an origin.
    pub static_files_base_url: Option<String>,
    /// Whether tokens are configured (then a profile without allowed cwd roots refuses all).
    pub tokens_configured: bool,
    /// This replica among others on one database.
    pub replica: ReplicaOptions,
    /// Principals' budgets (from the tokens file).
    pub budgets: metering::BudgetSource,
    /// Where turn spans go (off unless OTLP export is configured).
    pub traces: traces::Traces,
    /// What every box shares.
    pub sandbox: crate::acp::sandbox::SandboxSettings,
    /// What each model costs, for the model proxy's usage.
    pub prices: Arc<crate::domain::usage::PriceTable>,
    /// The names a profile may take its agent from (`preset = "…"`), to say so when one is
    /// asked for as a profile that is not configured.
    pub presets: Vec<String>,
}

/// Who this replica is and how it holds sessions.
#[derive(Debug, Clone)]
pub(crate) struct ReplicaOptions {
    /// The lease holder name: a random id minted at start, then `@` and the advertised address,
    /// so whoever reads a lease knows where to forward (`id@host:port`).
    pub id: String,
    pub lease_ttl: std::time::Duration,
    /// Whether other replicas may share the store (PostgreSQL): then leases are claimed, renewed
    /// and fenced; with SQLite the one process owns everything.
    pub shared_store: bool,
}

impl ReplicaOptions {
    /// A fresh replica id for a process reachable at `address`.
    pub(crate) fn new(address: &str, lease_ttl: std::time::Duration, shared_store: bool) -> Self {
        Self {
            id: format!("{}@{address}", Uuid::now_v7().simple()),
            lease_ttl,
            shared_store,
        }
    }

    /// The advertised address in a lease holder name.
    pub(crate) fn address_of(holder: &str) -> Option<&str> {
        holder.split_once('@').map(|(_, address)| address)
    }

    /// This replica's advertised address.
    pub(crate) fn address(&self) -> Option<&str> {
        Self::address_of(&self.id)
    }

    /// Whether `holder` (a lease's or a bridge publication's) names another run of this replica:
    /// another id at this replica's own address, left by a process that died here (`kill -9`,
    /// then a restart on the same address). Forwarding there would reach this very process.
    pub(crate) fn is_earlier_run(&self, holder: &str) -> bool {
        holder != self.id && Self::address_of(holder).is_some_and(|a| Some(a) == self.address())
    }
}

/// What every session shares with the rest of the harness. Its parts are the engine's own; the
/// rest of the harness reaches it only through the methods below.
pub(crate) struct EngineContext {
    store: Arc<dyn Store>,
    limits: Arc<Limits>,
    profiles: BTreeMap<String, Arc<Profile>>,
    /// The local runtime processes started here, marked and recorded so none outlives the harness.
    processes: ProcessTable,
    /// Bridges that dialled in, and the remote runtimes placed on them.
    gateway: Arc<crate::acp::remote::Gateway>,
    /// One permit per live runtime process (the live-runtime cap).
    runtime_slots: Arc<Semaphore>,
    meta_key: String,
    translator: Translator,
    /// Whether tokens are configured (then a profile without allowed cwd roots refuses all).
    tokens_configured: bool,
    /// Set on SIGTERM: new sessions and turn-occupying actions are refused with DRAINING.
    draining: AtomicBool,
    /// Tells every open stream when the harness ends them all.
    streams: tokio::sync::watch::Sender<subscribe::StreamStop>,
    /// Notified whenever a session's status changes (draining waits on it).
    activity: tokio::sync::Notify,
    /// Streams of sessions whose actor runs elsewhere, per session (held to the subscriber cap).
    remote_streams: subscribe::RemoteStreams,
    replica: ReplicaOptions,
    /// The warm pools of profiles with `warm_pool > 0`, by profile name.
    warm_pools: BTreeMap<String, Arc<warm::WarmPool>>,
    budgets: metering::BudgetSource,
    traces: traces::Traces,
    /// The boxes of local runtimes.
    sandbox: Arc<crate::acp::sandbox::Sandbox>,
    /// What each model costs, for the model proxy's usage.
    prices: Arc<crate::domain::usage::PriceTable>,
    /// Preset names and aliases (for PROFILE_NOT_FOUND's hint).
    presets: Vec<String>,
}

impl EngineContext {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        processes: ProcessTable,
        options: EngineOptions,
    ) -> Self {
        let warm_pools = options
            .profiles
            .iter()
            // A boxed profile has no warm pool (the config refuses one): its box needs the
            // session's cwd and owner, which a warm runtime starts without.
            .filter(|(_, p)| p.warm_pool > 0 && p.remote.is_none() && p.sandbox.is_none())
            .map(|(name, p)| (name.clone(), warm::WarmPool::new(p.clone())))
            .collect();
        Self {
            warm_pools,
            store,
            runtime_slots: Arc::new(Semaphore::new(options.limits.live_runtimes)),
            limits: Arc::new(options.limits),
            profiles: options.profiles,
            processes,
            gateway: crate::acp::remote::Gateway::new(),
            meta_key: options.meta_key,
            translator: Translator::new(options.static_files_base_url.as_deref()),
            tokens_configured: options.tokens_configured,
            draining: AtomicBool::new(false),
            streams: tokio::sync::watch::channel(Default::default()).0,
            activity: tokio::sync::Notify::new(),
            remote_streams: Default::default(),
            replica: options.replica,
            budgets: options.budgets,
            prices: options.prices,
            presets: options.presets,
            traces: options.traces,
            sandbox: Arc::new(crate::acp::sandbox::Sandbox::new(options.sandbox)),
        }
    }

    /// The local runtime processes started here.
    pub(crate) fn processes(&self) -> &ProcessTable {
        &self.processes
    }

    /// The boxes of local runtimes.
    pub(crate) fn sandbox(&self) -> &Arc<crate::acp::sandbox::Sandbox> {
        &self.sandbox
    }

    /// The paths no session's cwd may hold or lie in: the server's own files and the HOMEs.
    pub(crate) fn forbidden_cwds(&self) -> crate::acp::sandbox::ServerPaths {
        self.sandbox.settings().server_paths()
    }

    /// The bridges' side of the engine, which `RuntimeGatewayService.Connect` serves.
    pub(crate) fn gateway(&self) -> &Arc<crate::acp::remote::Gateway> {
        &self.gateway
    }

    pub(crate) fn replica(&self) -> &ReplicaOptions {
        &self.replica
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// From now on, new sessions and turn-occupying actions are refused with DRAINING (SIGTERM).
    pub(crate) fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Starts filling the warm pools (after leftovers of an earlier harness were reaped).
    pub(crate) fn start_warm_pools(self: &Arc<Self>) {
        for pool in self.warm_pools.values() {
            pool.start(self);
        }
    }

    /// Kills every warm runtime and stops refilling (draining, shutdown).
    pub(crate) fn stop_warm_pools(&self) {
        for pool in self.warm_pools.values() {
            pool.stop();
        }
    }

    /// A ready warm runtime of this profile, if it has a pool and one is ready.
    pub(crate) fn take_warm(&self, profile: &str) -> Option<warm::WarmRuntime> {
        self.warm_pools.get(profile)?.take()
    }

    /// Each warm pool's name, size and ready runtimes, for the metrics.
    pub(crate) fn warm_pool_gauges(&self) -> Vec<(String, u64, u64)> {
        self.warm_pools
            .iter()
            .map(|(name, pool)| (name.clone(), pool.size() as u64, pool.ready() as u64))
            .collect()
    }

    /// Ends every open stream, telling its caller why.
    pub(crate) fn stop_streams(&self, why: subscribe::StreamStop) {
        let _ = self.streams.send(why);
    }
}

impl Drop for EngineContext {
    fn drop(&mut self) {
        // The fillers hold their pools; stopping them lets the pools and their runtimes go.
        self.stop_warm_pools();
    }
}

/// The part of a session anyone may read without asking its actor.
pub(crate) struct Shared {
    pub id: Uuid,
    pub owner: String,
    pub editors: Vec<String>,
    record: Mutex<SessionRecord>,
    head: AtomicU64,
    /// The live feed: made for the first subscriber and dropped with the last, so a session
    /// nobody watches holds no feed buffer (its slots are most of an idle session's memory).
    events: Mutex<Option<broadcast::Sender<SessionEvent>>>,
    pub subscribers: AtomicUsize,
    queue_len: AtomicUsize,
    /// The fence of this replica's lease on the session; `None` with one replica.
    pub fence: Option<u64>,
    /// Set once the lease is lost (taken by another replica, or a write was fenced off): the
    /// actor stops its runtime at once and this handle is never used again.
    lost: tokio::sync::watch::Sender<bool>,
    /// The bridge running the session's runtime now, if it is remote.
    pub(crate) bridge: Mutex<Option<String>>,
    /// The transcript as GetTranscript last folded it: the next call folds only the entries
    /// committed since. Dropped with the session's handle.
    pub(crate) transcript: tokio::sync::Mutex<Option<crate::acp::fold::Fold>>,
}

impl Shared {
    fn new(record: SessionRecord, head: u64) -> Self {
        Self {
            id: record.id,
            owner: record.owner.clone(),
            editors: record.editors.clone(),
            record: Mutex::new(record),
            head: AtomicU64::new(head),
            events: Mutex::new(None),
            subscribers: AtomicUsize::new(0),
            queue_len: AtomicUsize::new(0),
            fence: None,
            lost: tokio::sync::watch::channel(false).0,
            bridge: Mutex::new(None),
            transcript: tokio::sync::Mutex::new(None),
        }
    }

    /// Whether this replica lost the session's lease (its actor stops, or has stopped).
    pub(crate) fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Watches for the lease being lost (local streams then go on from the store).
    pub(crate) fn watch_lost(&self) -> tokio::sync::watch::Receiver<bool> {
        self.lost.subscribe()
    }

    /// Tells the actor its lease is gone: it stops its runtime and never writes again.
    pub(crate) fn mark_lost(&self) {
        self.lost.send_replace(true);
    }

    /// The session record as it stands, with its head offset.
    pub(crate) fn snapshot(&self) -> (SessionRecord, u64) {
        let record = self.record.lock().expect("not poisoned").clone();
        (record, self.head())
    }

    pub(crate) fn status(&self) -> SessionStatus {
        self.record.lock().expect("not poisoned").status
    }

    pub(crate) fn head(&self) -> u64 {
        self.head.load(Ordering::Acquire)
    }

    /// Registers a receiver of live events, making the feed if there is none.
    pub(crate) fn subscribe_events(&self) -> broadcast::Receiver<SessionEvent> {
        self.events
            .lock()
            .expect("not poisoned")
            .get_or_insert_with(|| broadcast::channel(EVENT_FEED_CAPACITY).0)
            .subscribe()
    }

    /// Whether anyone receives live events now.
    pub(crate) fn has_live_subscribers(&self) -> bool {
        self.events
            .lock()
            .expect("not poisoned")
            .as_ref()
            .is_some_and(|feed| feed.receiver_count() > 0)
    }

    /// Sends an event to the live subscribers, if any.
    pub(crate) fn publish(&self, event: SessionEvent) {
        if let Some(feed) = self.events.lock().expect("not poisoned").as_ref() {
            let _ = feed.send(event);
        }
    }

    /// Drops the feed once no receiver is left (a subscriber went away).
    fn release_unused_feed(&self) {
        let mut events = self.events.lock().expect("not poisoned");
        if events
            .as_ref()
            .is_some_and(|feed| feed.receiver_count() == 0)
        {
            *events = None;
        }
    }

    fn set_record(&self, record: &SessionRecord) {
        *self.record.lock().expect("not poisoned") = record.clone();
    }

    /// How many Subscribe streams are open on this session.
    pub(crate) fn subscriber_count(&self) -> usize {
        self.subscribers.load(Ordering::Relaxed)
    }

    /// How many actions wait in the queue.
    pub(crate) fn queue_len(&self) -> usize {
        self.queue_len.load(Ordering::Relaxed)
    }

    fn set_queue_len(&self, len: usize) {
        self.queue_len.store(len, Ordering::Relaxed);
    }

    fn set_head(&self, head: u64) {
        self.head.store(head, Ordering::Release);
    }
}

/// What a Control did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ControlStatus {
    Sent,
    Queued(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ControlOutcome {
    pub action_id: ActionId,
    pub status: ControlStatus,
}

type Reply<T> = oneshot::Sender<Result<T>>;

/// Requests to a session actor.
pub(crate) enum Command {
    Control {
        principal: Principal,
        /// Boxed: a channel's slots are as large as its largest command, and every session's
        /// command channel keeps a block of them once used.
        input: Box<ControlInput>,
        traceparent: Option<String>,
        reply: Reply<ControlOutcome>,
    },
    GetQueue {
        reply: Reply<Vec<QueuedEntry>>,
    },
    EditQueued {
        principal: Principal,
        action_id: ActionId,
        text: String,
        reply: Reply<QueuedEntry>,
    },
    RemoveQueued {
        action_id: ActionId,
        reply: Reply<()>,
    },
    Close {
        reply: Reply<SessionRecord>,
    },
    Delete {
        reply: Reply<()>,
    },
    /// The harness is stopping: fail a turn still running, stop the runtime, SUSPEND.
    Drain {
        reply: Reply<()>,
    },
    /// The session's bridge now serves another replica: if idle, stop the runtime
    /// (SUSPENDED) and stop the actor, so the lease can go there. Whether it did.
    HandOff {
        reply: Reply<bool>,
    },
    /// The model proxy refused a call of the running turn: the owner's budget is spent
    /// (`reason`, as the refusal says it). The turn ends FAILED with it and the agent is told
    /// to stop; answered once that is logged, before the agent hears of the refusal.
    BudgetSpent {
        reason: String,
        reply: Reply<()>,
    },
}

impl Command {
    /// Answers the command with `error` without doing it.
    pub(crate) fn refuse(self, error: crate::domain::Error) {
        fn fail<T>(reply: Reply<T>, error: crate::domain::Error) {
            let _ = reply.send(Err(error));
        }
        match self {
            Self::Control { reply, .. } => fail(reply, error),
            Self::GetQueue { reply } => fail(reply, error),
            Self::EditQueued { reply, .. } => fail(reply, error),
            Self::RemoveQueued { reply, .. } => fail(reply, error),
            Self::Close { reply } => fail(reply, error),
            Self::Delete { reply } => fail(reply, error),
            Self::Drain { reply } => fail(reply, error),
            Self::HandOff { reply } => fail(reply, error),
            Self::BudgetSpent { reply, .. } => fail(reply, error),
        }
    }
}

/// A cheap, cloneable way to reach one session.
#[derive(Clone)]
pub(crate) struct SessionHandle {
    pub shared: Arc<Shared>,
    commands: mpsc::Sender<Command>,
}

impl SessionHandle {
    /// The queue as it stands (empty if the session is gone).
    pub(crate) async fn queue_snapshot(&self) -> Vec<QueuedEntry> {
        self.ask(|reply| Command::GetQueue { reply })
            .await
            .unwrap_or_default()
    }

    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(make(tx))
            .await
            .map_err(|_| self.gone())?;
        rx.await.map_err(|_| self.gone())?
    }

    /// Why the actor took no more commands. One that stopped because this replica lost the
    /// lease left the command undone (a write it had begun answers for itself): the session
    /// exists and runs elsewhere, so the caller is told to retry, never that it is not found.
    fn gone(&self) -> crate::domain::Error {
        let id = self.shared.id.to_string();
        if self.shared.is_lost() {
            crate::domain::Error::new(
                crate::domain::ErrorCode::ReplicaUnavailable,
                format!(
                    "session {id}: this replica gave the session up while the call waited \
                     (another replica runs it now); nothing was done: retry, with the same \
                     action_id for a Control"
                ),
            )
        } else {
            crate::domain::Error::session_not_found(&id)
        }
    }
}

/// Log entries read per page when a stored log is folded.
const FOLD_PAGE: usize = 1000;

/// Folds a session's stored log from where `fold` stands up to `up_to` (inclusive), page by
/// page, and drops the fold's turn-end and urgency notes: whoever folds a stored log is catching
/// up on history, not watching it happen. On a read failure `fold` keeps what it applied, a true
/// prefix of the log.
pub(crate) async fn fold_stored_log(
    store: &dyn Store,
    session_id: Uuid,
    fold: &mut crate::acp::fold::Fold,
    up_to: u64,
) -> crate::domain::Result<()> {
    let mut at = fold.head();
    let result = async {
        while at < up_to {
            let limit = FOLD_PAGE.min(usize::try_from(up_to - at).unwrap_or(FOLD_PAGE));
            let page = store.read_log(session_id, at, limit).await?;
            let Some(last) = page.last() else { break };
            at = last.offset;
            for entry in &page {
                fold.apply(entry);
            }
        }
        Ok(())
    }
    .await;
    fold.take_turn_ends();
    fold.take_urgent();
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::conformance::fixtures;

    #[tokio::test]
    async fn a_call_left_waiting_by_an_actor_that_lost_the_lease_is_told_to_retry_not_that_the_session_is_gone()
     {
        let shared = Arc::new(Shared::new(fixtures::session("ada", 0), 0));
        let (commands, mailbox) = mpsc::channel(1);
        let handle = SessionHandle {
            shared: shared.clone(),
            commands,
        };
        // The actor stopped, its mailbox with it, after the lease was lost.
        shared.mark_lost();
        drop(mailbox);
        let error = handle
            .ask(|reply| Command::GetQueue { reply })
            .await
            .expect_err("nobody answers");
        assert_eq!(error.code, crate::domain::ErrorCode::ReplicaUnavailable);

        // An actor that stopped for any other reason (closed, deleted): not found, as before.
        let other = Arc::new(Shared::new(fixtures::session("ada", 0), 0));
        let (commands, mailbox) = mpsc::channel(1);
        drop(mailbox);
        let handle = SessionHandle {
            shared: other,
            commands,
        };
        let error = handle
            .ask(|reply| Command::GetQueue { reply })
            .await
            .expect_err("nobody answers");
        assert_eq!(error.code, crate::domain::ErrorCode::SessionNotFound);
    }

    #[test]
    fn a_session_holds_a_live_feed_only_while_someone_subscribes() {
        let shared = Shared::new(fixtures::session("ada", 0), 0);
        assert!(!shared.has_live_subscribers());
        shared.publish(SessionEvent::Deleted); // nobody listens: nothing is made
        assert!(shared.events.lock().unwrap().is_none());

        let mut first = shared.subscribe_events();
        let second = shared.subscribe_events();
        assert!(shared.has_live_subscribers());
        shared.publish(SessionEvent::Deleted);
        assert!(matches!(first.try_recv(), Ok(SessionEvent::Deleted)));

        drop(second);
        shared.release_unused_feed();
        assert!(
            shared.events.lock().unwrap().is_some(),
            "one receiver is left"
        );
        drop(first);
        shared.release_unused_feed();
        assert!(shared.events.lock().unwrap().is_none());
        assert!(!shared.has_live_subscribers());
    }
}
