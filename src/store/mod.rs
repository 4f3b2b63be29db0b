//! Durable storage of sessions, their logs, queues and action ids.
//!
//! One [`Store`] trait, written once and implemented per backend: the embedded default on SQLite
//! ([`sqlite`]), PostgreSQL for several replicas on one database ([`postgres`]) and an
//! in-memory one for unit tests ([`memory`]). The same conformance suite ([`conformance`]) runs
//! against every backend.
//!
//! Every change to a session is one [`Batch`], applied atomically: log entries (offsets assigned
//! by the session actor, dense and gap-free), queue operations, new action ids and the session
//! record. So taking the head of the queue and appending its frame is one transaction, and a
//! Control reply is sent only after its batch is durable.

#[cfg(test)]
pub(crate) mod conformance;
mod error;
mod gate;
mod landed;
#[cfg(test)]
pub(crate) mod memory;
pub mod postgres;
pub mod private;
pub mod sqlite;

use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime},
};

use async_trait::async_trait;
use serde_json::{Map, Value};
use uuid::Uuid;

pub use crate::domain::log::{Direction, LogEntry};
pub use crate::domain::usage::{UsageQuery, UsageRecord, UsageRow};
use crate::domain::{
    ActionId, Result,
    queue::QueuedEntry,
    session::{SessionRecord, SessionStatus},
};
pub use error::{BoxError, CommitError, StoreError};
pub use landed::{Probe, landed};

/// How long one statement may run before the store cancels it, unless configured
/// otherwise: a PostgreSQL statement (`statement_timeout`), a SQLite read.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);

/// SQLite `synchronous` mode: NORMAL survives process crashes, FULL also power loss.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Deserialize,
    serde::Serialize,
)]
#[serde(rename_all = "snake_case")]
pub enum SqliteSynchronous {
    #[default]
    Normal,
    Full,
}

/// Where an action id stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActionState {
    /// Waiting in the queue.
    Queued,
    /// Its frame is in the log (and went, or is going, to the runtime).
    Sent,
    /// Removed from the queue before dispatch (by RemoveQueuedAction or a clearing stop).
    Removed,
}

impl ActionState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Sent => "sent",
            Self::Removed => "removed",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "queued" => Some(Self::Queued),
            "sent" => Some(Self::Sent),
            "removed" => Some(Self::Removed),
            _ => None,
        }
    }
}

/// An action id as recorded: unique per session forever.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionRecord {
    pub action_id: ActionId,
    /// Canonical JSON of the request as first received (action and context), so a re-send can be
    /// told apart from a different action with the same id. Never changed by edits.
    pub fingerprint: String,
    pub state: ActionState,
    pub created_at: SystemTime,
}

/// One change to a session's queue.
#[derive(Debug, Clone, PartialEq)]
pub enum QueueOp {
    /// Append at the back.
    PushBack(QueuedEntry),
    /// Put in front of everything (an interrupt).
    PushFront(QueuedEntry),
    /// Replace an entry's content in place (an edit): same id, same position.
    Update(QueuedEntry),
    /// Remove one entry (dispatch, or RemoveQueuedAction).
    Remove(ActionId),
    /// Remove every entry.
    Clear,
}

/// One atomic change to one session.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    /// Appended in order; the first offset must be the session's head + 1, then dense.
    pub entries: Vec<LogEntry>,
    pub queue: Vec<QueueOp>,
    /// New action ids; an id already recorded for the session fails the whole batch.
    pub new_actions: Vec<ActionRecord>,
    /// State changes of recorded action ids.
    pub action_states: Vec<(ActionId, ActionState)>,
    /// Usage the agent reported, recorded with the frames that reported it.
    pub usage: Vec<UsageRecord>,
    /// The session record as it now stands (replaces the stored one).
    pub session: Option<SessionRecord>,
    /// The fence of the writer's lease on the session. With a fence, the batch applies
    /// only while that fence is still the session's current one; otherwise it fails whole with
    /// [`CommitError::Fenced`]. `None`: no check (one replica, or a store without leases).
    pub fence: Option<u64>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
            && self.queue.is_empty()
            && self.new_actions.is_empty()
            && self.action_states.is_empty()
            && self.usage.is_empty()
            && self.session.is_none()
    }
}

/// A page request over sessions, newest first. `owner_or_editor`: only sessions this principal
/// owns or edits (`None`: all, for the `local` principal).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionQuery {
    pub owner_or_editor: Option<String>,
    pub statuses: Vec<SessionStatus>,
    /// Every pair must match exactly.
    pub labels: BTreeMap<String, String>,
    pub page_size: usize,
    /// Resume after this (created_at, id) position, exclusive.
    pub after: Option<(SystemTime, Uuid)>,
}

/// What one retention pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// Closed sessions deleted, with everything they held.
    pub deleted: u64,
    /// Transactions they were deleted in (each at most the batch bound).
    pub batches: u64,
    /// The most sessions one of those transactions deleted.
    pub largest_batch: u64,
    /// Pages given back to the file system afterwards (SQLite with incremental vacuum).
    pub pages_reclaimed: u64,
}

/// A replica's hold on a session: while it holds the lease, it alone runs the session's
/// actor and runtime. `fence` grows by one every time the lease changes hands, so a write carrying
/// an older fence is recognised as coming from a former owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub session_id: Uuid,
    pub owner_replica: String,
    pub fence: u64,
    /// By the database's clock, so replicas with skewed clocks agree on expiry.
    pub expires_at: SystemTime,
}

/// A bridge connected to one replica, as that replica publishes it for the others:
/// a replica without a matching bridge of its own hands a remote session to the replica whose
/// stream the bridge holds. Published again well within the TTL; a stale row expires.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BridgeAd {
    pub bridge_id: String,
    /// The principal of the bridge's token: it owns the bridge id (empty from older replicas).
    pub principal: String,
    /// Its stream is up on that replica; `false`: only its runtimes wait there for it to redial
    /// (or another replica relays it), so the ad says whose the id is and takes no sessions.
    pub connected: bool,
    /// The replica holding the bridge's stream (its lease holder name, `id@address`).
    pub replica: String,
    pub labels: BTreeMap<String, String>,
    pub profiles: Vec<String>,
    /// Runtimes the bridge runs for that replica (placement prefers the least loaded).
    pub runtimes: u64,
}

/// The outcome of [`Store::claim_lease`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseClaim {
    /// The caller holds the lease now (newly claimed with a new fence, or renewed if it held it).
    Granted(Lease),
    /// Another replica holds an unexpired lease.
    HeldBy(Lease),
}

/// The outcome of [`Store::create_session_capped`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CappedCreate {
    Created,
    /// The owner has its maximum of live sessions already; nothing was stored.
    AtCap,
}

/// A session as the store holds it, in brief: its log head and a digest of its record and queue.
/// Whenever any of them changes, so does the mark (marks are compared, never read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeMark {
    pub head: u64,
    pub digest: String,
}

impl ChangeMark {
    /// The mark of a session read whole (stores without a digest of their own).
    pub fn of(head: u64, record: &SessionRecord, queue: &[QueuedEntry]) -> Self {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        format!("{record:?}{queue:?}").hash(&mut hasher);
        Self {
            head,
            digest: format!("{:016x}", hasher.finish()),
        }
    }
}

/// A hint that a session changed in the store: its log reached `head` (0: something else
/// changed — its record, its queue, or it was deleted). A nil `session` wakes everyone (sent
/// after a lost connection). Only a hint: the reader reads what changed from the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wake {
    pub session: Uuid,
    pub head: u64,
}

impl Wake {
    pub fn everyone() -> Self {
        Self {
            session: Uuid::nil(),
            head: 0,
        }
    }

    /// Whether a subscriber of `session` should look.
    pub fn concerns(&self, session: Uuid) -> bool {
        self.session == session || self.session.is_nil()
    }
}

/// The storage of the harness.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Stores a new session with an empty log. SESSION_EXISTS if the id is taken.
    async fn create_session(&self, record: &SessionRecord) -> Result<()>;

    /// Applies a batch atomically and durably before returning. A batch whose first
    /// offset is not head + 1, or that records an existing action id, fails whole and changes
    /// nothing.
    /// A fenced batch is [`CommitError::Fenced`], never a plain error; one whose commit's answer
    /// was lost is [`CommitError::Ambiguous`] (read back with [`landed`]).
    async fn commit(&self, session_id: Uuid, batch: Batch) -> Result<(), CommitError>;

    /// Waits until no transaction that may still write the session is open — one whose
    /// `COMMIT` answer was lost may still be running on the database — so what is read next
    /// stays true. A store serving one process has none (the default).
    async fn settle(&self, _session_id: Uuid) -> Result<()> {
        Ok(())
    }

    async fn get_session(&self, session_id: Uuid) -> Result<Option<SessionRecord>>;

    /// A page of sessions, newest first (by `created_at`, then id).
    async fn list_sessions(&self, query: &SessionQuery) -> Result<Vec<SessionRecord>>;

    /// Sessions owned by `owner` that are not closed.
    async fn count_live_sessions(&self, owner: &str) -> Result<u64>;

    /// Usage records summed per (session, principal, profile, currency). Usage outlives its
    /// session: a deleted session's spending still counts against its owner's budget.
    async fn usage(&self, query: &UsageQuery) -> Result<Vec<UsageRow>>;

    /// Stores a new session as [`Store::create_session`] does, unless its owner already has
    /// `max_live` sessions that are not closed: then nothing is stored. The count and the insert
    /// are one step for every process sharing the store, so a cap holds across replicas. The
    /// default, for a store serving one process, counts then creates: its caller runs one create
    /// at a time.
    async fn create_session_capped(
        &self,
        record: &SessionRecord,
        max_live: u64,
    ) -> Result<CappedCreate> {
        if self.count_live_sessions(&record.owner).await? >= max_live {
            return Ok(CappedCreate::AtCap);
        }
        self.create_session(record).await?;
        Ok(CappedCreate::Created)
    }

    /// Every session that is not closed, for recovery after a restart.
    async fn open_sessions(&self) -> Result<Vec<SessionRecord>>;

    /// Deletes a session with its log, queue and action ids. Whether it existed.
    async fn delete_session(&self, session_id: Uuid) -> Result<bool>;

    /// Retention: deletes up to `limit` closed sessions that closed before `closed_before` —
    /// each with its log, queue, labels, editors and action ids, as [`Store::delete_session`]
    /// does — in one transaction, the longest closed first; the ids deleted. A closed session is
    /// never written again, so its `updated_at` is when it closed. Passes may run on several
    /// replicas at once: a session is deleted once, and a batch another pass holds is skipped.
    async fn delete_closed_before(
        &self,
        closed_before: SystemTime,
        limit: usize,
    ) -> Result<Vec<Uuid>>;

    /// Gives back to the file system up to `max_pages` pages that deletes freed, where the
    /// store can (SQLite files created with incremental vacuum); the pages given back. The
    /// default, for a database that reclaims space itself (PostgreSQL's autovacuum), does
    /// nothing.
    async fn reclaim_space(&self, _max_pages: u64) -> Result<u64> {
        Ok(0)
    }

    /// Up to `limit` entries with offset > `after`, in order.
    async fn read_log(&self, session_id: Uuid, after: u64, limit: usize) -> Result<Vec<LogEntry>>;

    /// The offset of the newest entry (0 for an empty log).
    async fn head_offset(&self, session_id: Uuid) -> Result<u64>;

    /// The queue, next first.
    async fn load_queue(&self, session_id: Uuid) -> Result<Vec<QueuedEntry>>;

    async fn find_action(
        &self,
        session_id: Uuid,
        action_id: ActionId,
    ) -> Result<Option<ActionRecord>>;

    /// Claims the session's lease for `replica` for `ttl`: granted if it is free, expired, or
    /// already this replica's (then only renewed, same fence). A store serving one process has no
    /// rivals and always grants, with fence 1 (the default).
    async fn claim_lease(
        &self,
        session_id: Uuid,
        replica: &str,
        ttl: Duration,
    ) -> Result<LeaseClaim> {
        Ok(LeaseClaim::Granted(Lease {
            session_id,
            owner_replica: replica.to_owned(),
            fence: 1,
            expires_at: SystemTime::now() + ttl,
        }))
    }

    /// Extends by `ttl` from now each lease of `held` — `(session, fence)` — that `replica`
    /// still holds with that fence; the leases renewed. A lease another replica has taken, or one
    /// released, is not among them (the caller has lost it); a lease the caller does not list
    /// is left to lapse (it has stopped that session).
    async fn renew_leases(
        &self,
        _replica: &str,
        _held: &[(Uuid, u64)],
        _ttl: Duration,
    ) -> Result<Vec<Lease>> {
        Ok(Vec::new())
    }

    /// Gives up `replica`'s lease on the session if it still holds it with `fence`, so another
    /// replica may claim it at once. Whether it did.
    async fn release_lease(&self, _session_id: Uuid, _replica: &str, _fence: u64) -> Result<bool> {
        Ok(true)
    }

    /// The session's lease as stored, expired or not (`None`: never claimed, or no leases).
    async fn get_lease(&self, _session_id: Uuid) -> Result<Option<Lease>> {
        Ok(None)
    }

    /// Sessions that need an owner now, oldest first, for failover: not closed, with queued
    /// work or a turn in flight (running, or awaiting input), and no replica holding a live
    /// lease on them (never claimed, released, or expired: their owner is gone). An idle session
    /// is never among them, so failover costs what there is to take over, not what exists. A
    /// store serving one process has no other owners to lose (the default: none).
    async fn orphans_with_work(&self) -> Result<Vec<Uuid>> {
        Ok(Vec::new())
    }

    /// A [`ChangeMark`] for each of `sessions` that exists, in one read where the store can: the
    /// safety poll of the streams fed by the store, which wakes those whose session changed
    /// without a wake-up reaching them. A session missing from the answer is gone.
    async fn change_marks(&self, sessions: &[Uuid]) -> Result<Vec<(Uuid, ChangeMark)>> {
        let mut marks = Vec::with_capacity(sessions.len());
        for &id in sessions {
            let Some(record) = self.get_session(id).await? else {
                continue;
            };
            let queue = self.load_queue(id).await?;
            let head = self.head_offset(id).await?;
            marks.push((id, ChangeMark::of(head, &record, &queue)));
        }
        Ok(marks)
    }

    /// Replaces the bridges `replica` publishes with `bridges`, valid for `ttl`. A
    /// store serving one process has no other replicas to tell (the default: nothing).
    async fn publish_bridges(
        &self,
        _replica: &str,
        _bridges: &[BridgeAd],
        _ttl: Duration,
    ) -> Result<()> {
        Ok(())
    }

    /// Every bridge some replica published and whose publication has not expired.
    async fn bridge_ads(&self) -> Result<Vec<BridgeAd>> {
        Ok(Vec::new())
    }

    /// Wake-ups for the streams fed by the store (sessions whose actor runs on another replica,
    /// or on none yet), or `None` when the store has no way to tell (they then wait for the
    /// safety poll, see [`Store::change_marks`]). Subscribe before reading.
    fn wake_ups(&self) -> Option<tokio::sync::broadcast::Receiver<Wake>> {
        None
    }

    /// Whether the store can serve right now (for readiness): an embedded store always can; a
    /// database store asks its database (STORE_UNAVAILABLE when it cannot reach it).
    async fn check(&self) -> Result<()> {
        Ok(())
    }

    /// Finishes pending writes and releases the store's resources. Later writes fail.
    async fn close(&self) -> Result<()> {
        Ok(())
    }
}

/// The stored JSON form of a queued entry's work (`{"type":"prompt",…}` or `{"type":"compact"}`).
pub fn work_to_json(entry: &QueuedEntry) -> String {
    serde_json::to_string(&entry.work.to_action()).expect("actions serialise")
}

/// Reads back [`work_to_json`].
pub fn work_from_json(text: &str) -> Result<crate::domain::queue::QueuedWork> {
    let action: crate::domain::Action =
        serde_json::from_str(text).map_err(|e| StoreError::Corrupt {
            message: format!("stored queue entry is corrupt: {e}"),
            source: Some(e.into()),
        })?;
    crate::domain::queue::QueuedWork::from_action(&action)
        .ok_or_else(|| StoreError::corrupt("stored queue entry is not a prompt or compact").into())
}

/// The stored JSON form of a `context`.
pub fn context_to_json(context: &Option<Map<String, Value>>) -> Option<String> {
    context
        .as_ref()
        .map(|c| Value::Object(c.clone()).to_string())
}

/// Microseconds since the Unix epoch, the stored form of times.
pub fn to_micros(time: SystemTime) -> i64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

pub fn from_micros(micros: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + std::time::Duration::from_micros(micros.max(0) as u64)
}
