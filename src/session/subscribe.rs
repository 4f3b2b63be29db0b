//! Subscribe: register for live events first, replay the log from `after_offset + 1`
//! in bounded pages, send `caught_up`, then stream live. A subscriber that falls behind the live
//! feed is moved back to reading the log — never an unbounded buffer, never a silent gap: within
//! one stream every offset arrives once, in order. Each subscriber runs in its own task, so a slow
//! one never slows the session.
//!
//! The resume rule: every event is stamped with a resume cursor, the highest offset
//! up to which everything this view reflects has been sent. Events of one offset that go out
//! together (an entry and the snapshot it changes, a `turn_ended` entry and its TurnEnded) carry
//! the previous clean cursor until the last of them, so resubscribing after any event re-sends
//! at most what the client may not have seen (entries again by offset, snapshots as upserts), and
//! never skips anything. Pending snapshots go out before any status, queue, turn-ended, caught-up
//! or heartbeat event, and at once when a turn ends or a permission or elicitation is held.
//!
//! The live source differs by where the session's actor runs. With a local actor ([`start`]) it
//! is the actor's event feed. Without one ([`start_remote`]: another replica owns the session, or
//! nobody does) it is the store: on a wake-up from [`crate::store::Store::wake_ups`] (NOTIFY)
//! that says something new, the status and queue are read from the store and sent when they
//! changed, and the log is read after the last delivered offset. A wake-up can be lost on the
//! way, so [`RemoteStreams`] also runs one safety poll per replica every [`SAFETY_POLL`]: one
//! read of a mark of every session streamed that way, waking only the streams whose session
//! changed. A stream of an idle session therefore reads nothing at all. Everything else — the
//! catch-up, the folding, the cursors — is the same code.
//!
//! What streams of one session need alike is done once per replica: the pages of the log read
//! while catching up ([`pages`]: a thousand streams that fall behind together cost one read per
//! page, not a thousand) and the transcript folded for MESSAGES and ALL ([`shared_fold`]: a
//! MESSAGES stream holds no fold of its own — the session's live fold folds each entry once for
//! all of them, and they queue changed messages by id, read when the client takes them).
//!
//! What one client can make the server hold is bounded: a stream queues at most
//! [`STREAM_BUFFER`] events and [`STREAM_BUFFER_BYTES`] bytes (or one larger event) for its
//! client, and waits when that is full — the live feed goes on without it and it catches up from
//! the store when the client reads again; a principal has at most `limits.subscribers_per_principal`
//! streams open on a replica; and the memory of streams that ended is given back to the system
//! ([`trim`]).

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore, broadcast, mpsc, watch},
    time::{Instant, sleep_until},
};

use uuid::Uuid;

mod pages;
mod shared_fold;
mod trim;

use super::{SessionEvent, SessionHandle, SharedEntry};
use crate::{
    acp::{
        fold::Fold,
        transcript::{Message, TurnEnd},
    },
    domain::{
        Error, ErrorCode, Result,
        queue::QueuedEntry,
        session::{SessionRecord, SessionStatus},
    },
    store::{ChangeMark, Store, Wake},
};

/// A stream or read that would start past the session's head.
pub(crate) fn offset_out_of_range(after: u64, head: u64) -> Error {
    Error::new(
        ErrorCode::OffsetOutOfRange,
        format!("after_offset {after} is beyond the head offset {head}"),
    )
    .with("head_offset", head)
}

/// What a subscriber asked to see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum View {
    All,
    Log,
    Messages,
}

impl View {
    fn entries(self) -> bool {
        matches!(self, Self::All | Self::Log)
    }
    fn messages(self) -> bool {
        matches!(self, Self::All | Self::Messages)
    }
}

/// One event of a stream, with the log offset it reflects.
#[derive(Debug, Clone)]
pub(crate) enum StreamEvent {
    Entry(Arc<SharedEntry>),
    /// Shared with the session's fold (and every other stream sending this version of it).
    Message(Arc<Message>),
    Queue(Arc<Vec<QueuedEntry>>),
    TurnEnded(TurnEnd),
    Status {
        status: SessionStatus,
        reason: String,
    },
    CaughtUp {
        head: u64,
    },
    Heartbeat {
        head: u64,
    },
}

impl StreamEvent {
    /// About how many bytes the event takes, queued and encoded: what counts toward a stream's
    /// byte budget.
    fn weight(&self) -> usize {
        const OVERHEAD: usize = 64;
        OVERHEAD
            + match self {
                Self::Entry(entry) => entry.json.len() + entry.actor.len(),
                Self::Message(message) => message.approx_bytes(),
                Self::Queue(queue) => queue.iter().map(QueuedEntry::approx_bytes).sum(),
                Self::TurnEnded(end) => end.error.as_ref().map_or(0, String::len),
                Self::Status { reason, .. } => reason.len(),
                Self::CaughtUp { .. } | Self::Heartbeat { .. } => 0,
            }
    }
}

/// Items of a stream: events, or the error that ends it.
pub(crate) type StreamItem = std::result::Result<(u64, StreamEvent), Error>;

/// What a stream queues for its client.
enum Queued {
    Item(StreamItem),
    /// A message of the session's live fold that changed, by id: resolved to the message as it
    /// stands when the client takes it, so no snapshot waits in a queue (see
    /// [`shared_fold::LiveFold`]).
    Message {
        cursor: u64,
        id: String,
    },
}

/// An item on its way to the client, with its share of the stream's byte budget.
type Shared = (Queued, Option<OwnedSemaphorePermit>);

/// The client's end of a stream: its items in order. Each holds its share of the stream's byte
/// budget until the next one is taken, so the one being encoded still counts; dropping the
/// receiver ends the stream.
pub(crate) struct StreamReceiver {
    rx: mpsc::Receiver<Shared>,
    room: Arc<Semaphore>,
    held: Option<OwnedSemaphorePermit>,
    /// The live fold the messages it is sent by id are read from (MESSAGES view).
    live: Option<Arc<std::sync::Mutex<shared_fold::LiveFold>>>,
    /// The ids queued and not taken yet (shared with the stream, which queues each once).
    queued_refs: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

impl StreamReceiver {
    /// The item a queued one stands for: a message by id is read from the live fold now
    /// (`None`: it is gone from the transcript, nothing to send).
    fn resolve(&mut self, (queued, share): Shared) -> Option<StreamItem> {
        self.held = share;
        match queued {
            Queued::Item(item) => Some(item),
            Queued::Message { cursor, id } => {
                // Let go of the id before the message is read: a change the stream folds from
                // now on queues it again, and one folded before is in what is read here.
                self.queued_refs.lock().expect("not poisoned").remove(&id);
                let live = self.live.as_ref()?.lock().expect("not poisoned");
                let message = live.message(&id)?;
                Some(Ok((cursor, StreamEvent::Message(message))))
            }
        }
    }
}

#[cfg(test)]
impl StreamReceiver {
    pub(crate) async fn recv(&mut self) -> Option<StreamItem> {
        loop {
            self.held = None;
            let queued = self.rx.recv().await?;
            if let Some(item) = self.resolve(queued) {
                return Some(item);
            }
        }
    }

    pub(crate) fn try_recv(
        &mut self,
    ) -> std::result::Result<StreamItem, mpsc::error::TryRecvError> {
        loop {
            self.held = None;
            let queued = self.rx.try_recv()?;
            if let Some(item) = self.resolve(queued) {
                return Ok(item);
            }
        }
    }
}

impl futures::Stream for StreamReceiver {
    type Item = StreamItem;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<StreamItem>> {
        loop {
            self.held = None;
            match self.rx.poll_recv(cx) {
                std::task::Poll::Ready(Some(queued)) => {
                    if let Some(item) = self.resolve(queued) {
                        return std::task::Poll::Ready(Some(item));
                    }
                }
                other => return other.map(|_| None),
            }
        }
    }
}

impl Drop for StreamReceiver {
    fn drop(&mut self) {
        // A subscription waiting for room gives up at once.
        self.room.close();
    }
}

/// Entries read from the log per page while catching up.
pub(crate) const REPLAY_PAGE: usize = 1000;
/// Events buffered per subscriber before the network takes them.
pub(crate) const STREAM_BUFFER: usize = 256;
/// Bytes of events buffered per subscriber before the network takes them (one event larger
/// than this goes alone). A slow reader's stream holds no more; what the session does meanwhile
/// is read from the store once the client takes events again.
pub(crate) const STREAM_BUFFER_BYTES: usize = 256 * 1024;
/// Live message snapshots are sent at most this often per message.
pub(crate) const MESSAGE_COALESCE: Duration = Duration::from_millis(50);
/// A heartbeat is sent after this long without any other event.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(5);
/// How often the safety poll of the streams fed by the store runs (once per replica, however
/// many streams): a lost notification delays a stream by about this much, never more, and
/// never loses anything.
pub(crate) const SAFETY_POLL: Duration = Duration::from_secs(5);
/// Entries a stream folds into the live fold at a time while catching it up.
const FOLD_BATCH: usize = 32;
/// What a message queued by id counts toward a stream's byte budget (its snapshot is read when
/// the client takes it).
const REF_WEIGHT: u32 = 64;
/// Live events taken one after another once the stream wakes, before it looks at its timers
/// and the client again.
const LIVE_BURST: usize = 64;

/// Why the harness ends every stream (draining, or a revoked token).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum StreamStop {
    #[default]
    Open,
    Draining,
}

/// Where a stream starts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamStart {
    pub after: u64,
    /// The session's head as the caller read it (from the store if the actor had not published
    /// it yet).
    pub head: u64,
    pub view: View,
}

/// Starts a subscription task; the receiver is the stream.
/// `streams`: the streams of this replica fed by the store; those of this session (opened while
/// another replica owned it) count toward the same cap, and this one joins them if the session
/// moves away while it runs.
pub(crate) fn start(
    handle: SessionHandle,
    from: StreamStart,
    store: Arc<dyn crate::store::Store>,
    meta_key: String,
    stop: watch::Receiver<StreamStop>,
    streams: &RemoteStreams,
    admission: Admission,
) -> Result<StreamReceiver> {
    let Admission {
        max_subscribers,
        principal,
    } = admission;
    let StreamStart { after, head, view } = from;
    let shared = handle.shared.clone();
    let count = shared.subscribers.fetch_add(1, Ordering::AcqRel) + 1;
    let guard = SubscriberGuard::Local(handle.clone());
    if count + streams.count(shared.id) > max_subscribers {
        return Err(too_many_subscribers(shared.id, max_subscribers));
    }
    let head = head.max(shared.head());
    if after > head {
        return Err(offset_out_of_range(after, head));
    }
    // Registration first, so nothing appended from now on can be missed.
    let live = shared.subscribe_events();
    let id = shared.id;
    Ok(spawn(
        id,
        Source::Local {
            lost: handle.shared.watch_lost(),
            handle,
            live,
        },
        StreamStart { after, head, view },
        Feed {
            store,
            streams: streams.clone(),
        },
        meta_key,
        stop,
        Guards {
            session: Some(guard),
            principal,
        },
    ))
}

/// Starts a subscription to a session with no actor on this replica: the store is
/// both the catch-up and the live source. `record` is the session as the caller found it in the
/// store (its access already checked); `from.head` the store's head.
/// `streams` counts them per session against `max_subscribers`: the cap holds on each replica,
/// as counting across replicas would cost a database round trip per stream.
pub(crate) fn start_remote(
    store: Arc<dyn Store>,
    record: &SessionRecord,
    from: StreamStart,
    meta_key: String,
    stop: watch::Receiver<StreamStop>,
    streams: &RemoteStreams,
    admission: Admission,
) -> Result<StreamReceiver> {
    let Admission {
        max_subscribers,
        principal,
    } = admission;
    let slot = streams.admit(record.id, max_subscribers)?;
    if from.after > from.head {
        return Err(offset_out_of_range(from.after, from.head));
    }
    // Registration first: a commit after this point wakes the stream.
    let source = Source::Remote(Remote::new(&store, streams));
    Ok(spawn(
        record.id,
        source,
        from,
        Feed {
            store,
            streams: streams.clone(),
        },
        meta_key,
        stop,
        Guards {
            session: Some(SubscriberGuard::Remote { _slot: slot }),
            principal,
        },
    ))
}

/// What a new stream is admitted with: its session's cap, and its place under its principal's.
pub(crate) struct Admission {
    pub(crate) max_subscribers: usize,
    pub(crate) principal: PrincipalSlot,
}

/// What counts a stream toward its caps while it lives.
struct Guards {
    session: Option<SubscriberGuard>,
    principal: PrincipalSlot,
}

fn too_many_subscribers(id: Uuid, max_subscribers: usize) -> Error {
    Error::new(
        ErrorCode::TooManySubscribers,
        format!("session {id} has its maximum of {max_subscribers} subscribers"),
    )
    .with("limit", "subscribers_per_session")
    .with("max", max_subscribers)
}

fn too_many_streams(principal: &str, max: usize) -> Error {
    Error::new(
        ErrorCode::TooManySubscribers,
        format!(
            "{principal} has its maximum of {max} open Subscribe streams on this replica; \
             close some first"
        ),
    )
    .with("limit", "subscribers_per_principal")
    .with("max", max)
}

/// The open streams of this replica fed by the store (sessions without a local actor), per
/// session, and the safety poll they share.
#[derive(Clone)]
pub(crate) struct RemoteStreams(Arc<Feeds>);

struct Feeds {
    open: std::sync::Mutex<HashMap<Uuid, usize>>,
    /// Every stream of this replica (local or fed by the store), per principal.
    principals: std::sync::Mutex<HashMap<String, usize>>,
    /// Gives memory back once many streams have ended (see [`trim::Trim`]).
    trim: trim::Trim,
    /// What the safety poll found changed: a [`Wake`] with head 0 per session. Made, and the
    /// poll started, by the first stream.
    polled: std::sync::OnceLock<broadcast::Sender<Wake>>,
    /// The poll's period.
    every: Duration,
    /// The log pages streams of one session read while catching up, read once for them all.
    pages: Arc<pages::CatchUpPages>,
    /// The fold MESSAGES and ALL streams of one session share.
    folds: Arc<shared_fold::SharedFolds>,
}

impl Default for RemoteStreams {
    fn default() -> Self {
        Self::polling_every(SAFETY_POLL)
    }
}

impl std::fmt::Debug for RemoteStreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteStreams")
            .field("sessions", &self.watched().len())
            .finish()
    }
}

impl RemoteStreams {
    /// With a safety poll of this period ([`SAFETY_POLL`] but in tests).
    pub(crate) fn polling_every(every: Duration) -> Self {
        Self::with(every, REPLAY_PAGE)
    }

    /// With a safety poll of this period, reading catch-up pages of `page` entries.
    fn with(every: Duration, page: usize) -> Self {
        Self(Arc::new(Feeds {
            open: Default::default(),
            principals: Default::default(),
            trim: Default::default(),
            polled: Default::default(),
            every,
            pages: Arc::new(pages::CatchUpPages::with_page(page)),
            folds: Default::default(),
        }))
    }

    /// How many streams of the session are open.
    pub(crate) fn count(&self, id: Uuid) -> usize {
        let open = self.0.open.lock().expect("not poisoned");
        open.get(&id).copied().unwrap_or(0)
    }

    /// One more stream of `principal` (the acting user, for a service), unless it has `max`
    /// open on this replica already.
    pub(crate) fn admit_principal(&self, principal: &str, max: usize) -> Result<PrincipalSlot> {
        let mut principals = self.0.principals.lock().expect("not poisoned");
        let count = principals.entry(principal.to_owned()).or_default();
        if *count >= max {
            if *count == 0 {
                principals.remove(principal);
            }
            return Err(too_many_streams(principal, max));
        }
        *count += 1;
        Ok(PrincipalSlot {
            feeds: self.0.clone(),
            principal: principal.to_owned(),
        })
    }

    /// One more stream of the session, unless it has `max` already.
    fn admit(&self, id: Uuid, max: usize) -> Result<RemoteSlot> {
        let mut open = self.0.open.lock().expect("not poisoned");
        let count = open.entry(id).or_default();
        if *count >= max {
            return Err(too_many_subscribers(id, max));
        }
        *count += 1;
        Ok(RemoteSlot {
            streams: self.clone(),
            id,
        })
    }

    /// One more stream of the session, already admitted elsewhere (a stream whose session's
    /// lease moved away from this replica: it goes on from the store).
    fn join(&self, id: Uuid) -> RemoteSlot {
        *self
            .0
            .open
            .lock()
            .expect("not poisoned")
            .entry(id)
            .or_default() += 1;
        RemoteSlot {
            streams: self.clone(),
            id,
        }
    }

    /// The sessions with a stream open.
    fn watched(&self) -> Vec<Uuid> {
        self.0
            .open
            .lock()
            .expect("not poisoned")
            .keys()
            .copied()
            .collect()
    }

    /// The safety poll's wake-ups, starting the poll if it is not running yet.
    fn polled(&self, store: &Arc<dyn Store>) -> broadcast::Receiver<Wake> {
        self.0
            .polled
            .get_or_init(|| {
                let (sender, _) = broadcast::channel(POLL_BUFFER);
                tokio::spawn(safety_poll(
                    Arc::downgrade(&self.0),
                    Arc::downgrade(store),
                    self.0.every,
                ));
                sender
            })
            .subscribe()
    }
}

/// Safety-poll wake-ups buffered per stream; one that lags looks anyway.
const POLL_BUFFER: usize = 256;

/// Every `every` ([`SAFETY_POLL`]), one read of the marks of every session with a stream fed by
/// the store here; each session whose mark changed since the last poll (or that is new to the
/// poll, or gone) wakes its streams. Ends with the engine or the store.
async fn safety_poll(
    feeds: std::sync::Weak<Feeds>,
    store: std::sync::Weak<dyn Store>,
    every: Duration,
) {
    let mut marks: HashMap<Uuid, Option<ChangeMark>> = HashMap::new();
    let mut tick = tokio::time::interval_at(Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (Some(feeds), Some(store)) = (feeds.upgrade(), store.upgrade()) else {
            return;
        };
        let streams = RemoteStreams(feeds);
        let watched = streams.watched();
        marks.retain(|id, _| watched.contains(id));
        if watched.is_empty() {
            continue;
        }
        let found: HashMap<Uuid, ChangeMark> = match store.change_marks(&watched).await {
            Ok(found) => found.into_iter().collect(),
            Err(error) => {
                tracing::debug!(%error, "the safety poll of streams fed by the store failed");
                continue;
            }
        };
        let Some(polled) = streams.0.polled.get() else {
            continue;
        };
        for id in watched {
            let now = found.get(&id).cloned();
            if marks.get(&id) != Some(&now) {
                let _ = polled.send(Wake {
                    session: id,
                    head: 0,
                });
                marks.insert(id, now);
            }
        }
    }
}

/// A stream counted toward its principal's cap until it ends.
pub(crate) struct PrincipalSlot {
    feeds: Arc<Feeds>,
    principal: String,
}

impl Drop for PrincipalSlot {
    fn drop(&mut self) {
        let left = {
            let mut principals = self.feeds.principals.lock().expect("not poisoned");
            if let Some(count) = principals.get_mut(&self.principal) {
                *count -= 1;
                if *count == 0 {
                    principals.remove(&self.principal);
                }
            }
            principals.values().sum::<usize>()
        };
        self.feeds.trim.stream_ended(left);
    }
}

/// A stream counted in [`RemoteStreams`] until it ends.
struct RemoteSlot {
    streams: RemoteStreams,
    id: Uuid,
}

impl Drop for RemoteSlot {
    fn drop(&mut self) {
        let mut open = self.streams.0.open.lock().expect("not poisoned");
        if let Some(count) = open.get_mut(&self.id) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.id);
            }
        }
    }
}

/// Where a stream reads what its live source does not carry, and how it goes on from the store.
struct Feed {
    store: Arc<dyn Store>,
    streams: RemoteStreams,
}

fn spawn(
    id: Uuid,
    source: Source,
    from: StreamStart,
    feed: Feed,
    meta_key: String,
    stop: watch::Receiver<StreamStop>,
    guards: Guards,
) -> StreamReceiver {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let room = Arc::new(Semaphore::new(STREAM_BUFFER_BYTES));
    let fold_share = from.view.messages().then(|| feed.streams.0.folds.join(id));
    // MESSAGES streams share the session's live fold; ALL streams fold their own, as their
    // snapshots go between entries at exact offsets.
    let live = match (&fold_share, from.view) {
        (Some(share), View::Messages) => Some(share.live(&meta_key)),
        _ => None,
    };
    let queued_refs: Arc<std::sync::Mutex<std::collections::HashSet<String>>> = Arc::default();
    let subscription = Subscription {
        id,
        source,
        store: feed.store,
        tx,
        room: room.clone(),
        view: from.view,
        last: from.after,
        clean: from.after,
        turn_end_pending: false,
        live_mode: false,
        fold: (from.view == View::All).then(|| Fold::new(meta_key)),
        fold_share,
        live: live.clone(),
        flushed: from.after,
        queued_refs: queued_refs.clone(),
        streams: feed.streams,
        dirty: BTreeSet::new(),
        next_heartbeat: Instant::now() + HEARTBEAT,
        sent: false,
        stop,
        _guard: guards.session,
        _principal: guards.principal,
    };
    tokio::spawn(subscription.run());
    StreamReceiver {
        rx,
        room,
        held: None,
        live,
        queued_refs,
    }
}

/// Where live events come from.
enum Source {
    /// The session's actor runs here: its event feed.
    Local {
        handle: SessionHandle,
        live: broadcast::Receiver<SessionEvent>,
        /// Turns true when this replica loses the session's lease: its actor stops and the
        /// feed goes quiet, so the stream goes on from the store.
        lost: watch::Receiver<bool>,
    },
    /// It does not: the store, read on each wake-up.
    Remote(Remote),
}

struct Remote {
    /// The store's wake-ups; `None`: it cannot wake us, the safety poll alone paces the stream.
    wakes: Option<broadcast::Receiver<Wake>>,
    /// The safety poll's wake-ups (`None` once the engine is gone).
    polled: Option<broadcast::Receiver<Wake>>,
    /// The highest head a wake-up announced that the stream has looked at the store since: the
    /// reads after it saw that commit whole (it was durable before it was announced), so a
    /// wake-up up to this head brings nothing new. The log's cursor alone could not say as much:
    /// the status is read before the log.
    seen: u64,
    /// What was last sent, to send only changes.
    status: Option<(SessionStatus, String)>,
    queue: Option<Vec<QueuedEntry>>,
}

impl Remote {
    /// Registered for the store's wake-ups and the safety poll's, before anything is read.
    fn new(store: &Arc<dyn Store>, streams: &RemoteStreams) -> Self {
        Self {
            wakes: store.wake_ups(),
            polled: Some(streams.polled(store)),
            seen: 0,
            status: None,
            queue: None,
        }
    }

    /// Whether a wake-up of this stream's session calls for a look at the store: a head not
    /// seen yet, or 0 (something besides the log changed, the poll found a change, or everyone
    /// is woken).
    fn is_news(&mut self, wake: Wake) -> bool {
        if wake.head != 0 && wake.head <= self.seen {
            return false;
        }
        self.seen = self.seen.max(wake.head);
        true
    }
}

/// The next wake-up of a receiver that may be gone (`None`: never).
async fn next_wake(
    wakes: &mut Option<broadcast::Receiver<Wake>>,
) -> std::result::Result<Wake, broadcast::error::RecvError> {
    match wakes {
        Some(wakes) => wakes.recv().await,
        None => std::future::pending().await,
    }
}

/// What woke a live stream.
enum Woken {
    Event(std::result::Result<SessionEvent, broadcast::error::RecvError>),
    /// Look at the store; with the head the wake-up announced, if it did.
    Store(Option<u64>),
    /// The session's lease moved to another replica: from now on the store is the source.
    LeaseLost,
}

/// The next live event (local), or the next time to look at the store (remote).
async fn next_live(source: &mut Source, id: Uuid) -> Woken {
    match source {
        Source::Local { live, lost, .. } => tokio::select! {
            // Whatever the actor logged before it stopped is delivered first.
            biased;
            event = live.recv() => Woken::Event(event),
            _ = lost.wait_for(|lost| *lost) => Woken::LeaseLost,
        },
        Source::Remote(remote) => loop {
            let (wake, from_poll) = tokio::select! {
                wake = next_wake(&mut remote.wakes) => (wake, false),
                wake = next_wake(&mut remote.polled) => (wake, true),
            };
            match wake {
                Ok(wake) if wake.concerns(id) && remote.is_news(wake) => {
                    return Woken::Store((wake.head != 0).then_some(wake.head));
                }
                Ok(_) => {}
                // Some wake-up for us may be among those dropped.
                Err(broadcast::error::RecvError::Lagged(_)) => return Woken::Store(None),
                Err(broadcast::error::RecvError::Closed) if from_poll => remote.polled = None,
                Err(broadcast::error::RecvError::Closed) => remote.wakes = None,
            }
        },
    }
}

/// Counts a stream toward its session's subscriber cap while it lives.
enum SubscriberGuard {
    Local(SessionHandle),
    /// Held for its `Drop`.
    Remote {
        _slot: RemoteSlot,
    },
}

impl Drop for SubscriberGuard {
    fn drop(&mut self) {
        if let Self::Local(handle) = self {
            handle.shared.subscribers.fetch_sub(1, Ordering::AcqRel);
            // The subscription's receiver is dropped before its guard (field order).
            handle.shared.release_unused_feed();
        }
    }
}

struct Subscription {
    id: Uuid,
    /// Declared before the guard: a local feed's receiver is dropped first.
    source: Source,
    store: Arc<dyn crate::store::Store>,
    /// Joined if the session's lease moves away while the stream runs.
    streams: RemoteStreams,
    tx: mpsc::Sender<Shared>,
    /// The stream's byte budget ([`STREAM_BUFFER_BYTES`]): each event queued holds its share
    /// until the client's side takes the next one.
    room: Arc<Semaphore>,
    view: View,
    /// The last offset delivered (or folded, for the messages view).
    last: u64,
    /// The resume cursor: everything this view reflects up to this offset has been sent.
    clean: u64,
    /// A TurnEnded for `last` is still to be sent.
    turn_end_pending: bool,
    /// Past the catch-up: snapshots are coalesced, except urgent ones.
    live_mode: bool,
    fold: Option<Fold>,
    /// The session's shared fold, which `fold` meets now and then (with it, for MESSAGES/ALL).
    fold_share: Option<shared_fold::FoldShare>,
    /// Messages changed since their last snapshot.
    dirty: BTreeSet<String>,
    /// MESSAGES: the session's live fold, which folds for every MESSAGES stream here.
    live: Option<Arc<std::sync::Mutex<shared_fold::LiveFold>>>,
    /// MESSAGES: every change up to this offset has been queued.
    flushed: u64,
    /// MESSAGES: the messages queued by id that the client has not taken yet: a change of one
    /// of them needs no second entry (it is read when taken, so it shows the change).
    queued_refs: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    next_heartbeat: Instant,
    /// Something was sent since `next_heartbeat` was set (it is moved on once per wake-up, not
    /// per event: reading the clock was a visible share of a busy stream's cost).
    sent: bool,
    stop: watch::Receiver<StreamStop>,
    _guard: Option<SubscriberGuard>,
    /// Counts the stream toward its principal's cap while it lives.
    _principal: PrincipalSlot,
}

/// The client went away, or the stream was ended.
struct Gone;

impl Subscription {
    async fn run(mut self) {
        let _ = self.serve().await;
    }

    async fn serve(&mut self) -> std::result::Result<(), Gone> {
        if self.live.is_some() {
            // What the client saw before it left is not news: the changes after its offset are.
            self.advance_live(Some(self.last)).await?;
        }
        let start = self.fold.take().and_then(|fold| {
            let share = self.fold_share.as_ref()?;
            Some(share.start(fold.meta_key(), self.last))
        });
        if let Some(mut fold) = start {
            // The fold state as of `after_offset`: folded, not sent (what the client saw before
            // it left is not news). From the session's shared fold when it is not past there.
            self.fold_to(&mut fold, self.last).await?;
            self.fold = Some(fold);
            self.meet_shared_fold();
        }
        self.catch_up_to_head().await?;
        self.meet_shared_fold();
        self.send_status_and_queue().await?;
        self.send(StreamEvent::CaughtUp { head: self.last }).await?;
        self.live_mode = true;
        self.live().await
    }

    /// The session's status and queue as they stand now (after the catch-up, and again after
    /// falling behind the live feed, whose status and queue events may have been dropped).
    async fn send_status_and_queue(&mut self) -> std::result::Result<(), Gone> {
        let handle = match &mut self.source {
            Source::Local { handle, .. } => handle.clone(),
            Source::Remote(remote) => {
                // Forget what was sent, so both go out as they stand now.
                remote.status = None;
                remote.queue = None;
                let stored = self.read_stored().await?;
                return self.send_stored_changes(stored).await;
            }
        };
        let (record, _) = handle.shared.snapshot();
        self.send(StreamEvent::Status {
            status: record.status,
            reason: record.status_reason,
        })
        .await?;
        let queue = handle.queue_snapshot().await;
        self.send(StreamEvent::Queue(Arc::new(queue))).await
    }

    /// Remote: the status and queue as the store holds them. A session gone from the store ends
    /// the stream with SESSION_NOT_FOUND.
    async fn read_stored(
        &mut self,
    ) -> std::result::Result<(SessionRecord, Vec<QueuedEntry>), Gone> {
        let record = match self.store.get_session(self.id).await {
            Ok(Some(record)) => record,
            Ok(None) => {
                self.send_error(Error::session_not_found(&self.id.to_string()))
                    .await;
                return Err(Gone);
            }
            Err(e) => return Err(self.fail_now(e)),
        };
        let queue = self
            .store
            .load_queue(self.id)
            .await
            .map_err(|e| self.fail_now(e))?;
        Ok((record, queue))
    }

    /// Remote: sends the status and the queue, each only if it changed since last sent.
    async fn send_stored_changes(
        &mut self,
        (record, queue): (SessionRecord, Vec<QueuedEntry>),
    ) -> std::result::Result<(), Gone> {
        let Source::Remote(remote) = &mut self.source else {
            return Ok(());
        };
        let status = (record.status, record.status_reason);
        let new_status = (remote.status.as_ref() != Some(&status)).then(|| status.clone());
        let new_queue = (remote.queue.as_ref() != Some(&queue)).then(|| queue.clone());
        remote.status = Some(status);
        remote.queue = Some(queue);
        if let Some((status, reason)) = new_status {
            self.send(StreamEvent::Status { status, reason }).await?;
        }
        if let Some(queue) = new_queue {
            self.send(StreamEvent::Queue(Arc::new(queue))).await?;
        }
        Ok(())
    }

    /// The session's head as the live source knows it (`None`: only the store knows; the
    /// catch-up reads all it has).
    fn source_head(&self) -> Option<u64> {
        match &self.source {
            Source::Local { handle, .. } => Some(handle.shared.head()),
            Source::Remote(_) => None,
        }
    }

    fn fail_now(&self, error: Error) -> Gone {
        let _ = self.tx.try_send((Queued::Item(Err(error)), None));
        Gone
    }

    /// Sends an event that is not a message snapshot: pending snapshots go first, so the event's
    /// cursor never passes a snapshot the client has not received.
    async fn send(&mut self, event: StreamEvent) -> std::result::Result<(), Gone> {
        if !matches!(event, StreamEvent::Entry(_)) {
            self.flush_messages().await?;
        }
        let cursor = self.cursor();
        self.send_at(cursor, event).await
    }

    /// The resume cursor for an event sent now.
    fn cursor(&mut self) -> u64 {
        if !self.pending() {
            self.clean = self.last;
        }
        self.clean
    }

    /// Whether changes are folded that no snapshot has gone out for yet.
    fn pending(&self) -> bool {
        match self.live {
            Some(_) => self.flushed < self.last,
            None => !self.dirty.is_empty() || self.turn_end_pending,
        }
    }

    /// Queues an event once the stream's byte budget has room for it: a slow reader's stream
    /// waits here, holding no more than the budget, while the live feed goes on without it (it
    /// catches up from the store when it takes events again).
    async fn send_at(&mut self, cursor: u64, event: StreamEvent) -> std::result::Result<(), Gone> {
        let share = event.weight().min(STREAM_BUFFER_BYTES) as u32;
        self.queue(Queued::Item(Ok((cursor, event))), share).await
    }

    /// Queues a message of the live fold by id (read when the client takes it).
    async fn send_message_ref(&mut self, cursor: u64, id: String) -> std::result::Result<(), Gone> {
        self.queue(Queued::Message { cursor, id }, REF_WEIGHT).await
    }

    /// Queues `item` once `share` of the byte budget is free; the permit goes with it.
    async fn queue(&mut self, item: Queued, share: u32) -> std::result::Result<(), Gone> {
        self.sent = true;
        let permit = self
            .room
            .clone()
            .acquire_many_owned(share)
            .await
            .map_err(|_| Gone)?;
        self.tx.send((item, Some(permit))).await.map_err(|_| Gone)
    }

    /// Sends the error that ends the stream (it holds no share of the budget).
    async fn send_error(&mut self, error: Error) {
        let _ = self.tx.send((Queued::Item(Err(error)), None)).await;
    }

    /// Ends the stream if the server is draining (checked between replay pages too, so a long
    /// catch-up does not hold the drain up).
    fn check_draining(&mut self) -> std::result::Result<(), Gone> {
        if *self.stop.borrow() == StreamStop::Draining {
            let _ = self.tx.try_send((Queued::Item(Err(draining())), None));
            return Err(Gone);
        }
        Ok(())
    }

    /// Folds the log into `fold` from where it stands up to `up_to` (inclusive), through the
    /// shared pages, and drops its turn-end and urgency notes: this is history, not news.
    async fn fold_to(&mut self, fold: &mut Fold, up_to: u64) -> std::result::Result<(), Gone> {
        if fold.head() < up_to {
            let reader = self.streams.0.pages.reader(self.id, Some(up_to));
            while fold.head() < up_to {
                let (page, start, _) = match reader.next(self.store.as_ref(), fold.head()).await {
                    Ok(page) => page,
                    Err(e) => return Err(self.fail_now(e)),
                };
                let before = fold.head();
                for entry in page[start..].iter().take_while(|e| e.offset <= up_to) {
                    fold.apply(entry);
                }
                if fold.head() == before {
                    break; // the session was deleted under us: the live feed says so
                }
            }
        }
        fold.take_turn_ends();
        fold.take_urgent();
        Ok(())
    }

    /// Meets the session's shared fold (see [`shared_fold`]); only between entries, when the
    /// fold holds no turn-end or urgency note.
    fn meet_shared_fold(&mut self) {
        if let (Some(fold), Some(share)) = (&mut self.fold, &self.fold_share) {
            share.meet(fold);
        }
    }

    /// Catches up until the head is reached: an entry committed while this subscriber
    /// registered may not be on the live feed, but the head already counts it.
    async fn catch_up_to_head(&mut self) -> std::result::Result<(), Gone> {
        loop {
            let before = self.last;
            let target = self.source_head();
            self.catch_up(target).await?;
            // No progress although the head says more: the session was deleted under us (the
            // store has every entry the head counts). The live feed says so; spinning never would.
            if self.source_head().is_none_or(|head| head <= self.last) || self.last == before {
                return Ok(());
            }
        }
    }

    /// Reads the log from `last + 1` up to the head, in bounded pages shared with the session's
    /// other streams catching up (see [`pages`]). `target`: an offset known to be committed
    /// now, if the caller knows one (it lets a page read a moment ago serve this stream too).
    async fn catch_up(&mut self, target: Option<u64>) -> std::result::Result<(), Gone> {
        if self.live.is_some() {
            // MESSAGES: nothing goes out per entry. The session's live fold is brought up to the
            // head (read once for every MESSAGES stream here) and the stream stands there; its
            // next flush sends what changed.
            let head = self.advance_live(target).await?;
            self.last = self.last.max(head);
            return Ok(());
        }
        let reader = self.streams.0.pages.reader(self.id, target);
        loop {
            self.check_draining()?;
            let (page, start, full) = match reader.next(self.store.as_ref(), self.last).await {
                Ok(page) => page,
                Err(e) => return Err(self.fail_now(e)),
            };
            for entry in &page[start..] {
                self.deliver(entry.clone()).await?;
            }
            if !full {
                return Ok(());
            }
        }
    }

    async fn deliver(&mut self, entry: Arc<SharedEntry>) -> std::result::Result<(), Gone> {
        debug_assert_eq!(entry.offset, self.last + 1);
        self.last = entry.offset;
        if let Some(live) = &self.live {
            // Folded once for every MESSAGES stream of the session here (by whichever delivers
            // the entry first); turn ends go out with the snapshots, in order, at the flush.
            let urgent = {
                let mut live = live.lock().expect("not poisoned");
                live.offer(&entry);
                live.last_urgent() > self.flushed
            };
            if urgent && self.live_mode {
                self.flush_messages().await?;
            }
            return Ok(());
        }
        // The turn's end is a logged harness event, so every view tells it the same way.
        let turn_end = TurnEnd::from_entry(&entry);
        self.turn_end_pending = turn_end.is_some();
        let mut urgent = false;
        if let Some(fold) = &mut self.fold {
            self.dirty.extend(fold.apply(&entry));
            fold.take_turn_ends();
            urgent = fold.take_urgent();
        }
        if self.view.entries() {
            self.send(StreamEvent::Entry(entry)).await?;
        }
        if let Some(turn_end) = turn_end {
            self.flush_messages().await?;
            self.turn_end_pending = false;
            self.send(StreamEvent::TurnEnded(turn_end)).await?;
            return Ok(());
        }
        if urgent && self.live_mode {
            // A turn's final snapshot or a new held request: never held back by coalescing.
            self.flush_messages().await?;
        }
        Ok(())
    }

    async fn flush_messages(&mut self) -> std::result::Result<(), Gone> {
        if self.live.is_some() {
            return self.flush_live().await;
        }
        let Some(fold) = &self.fold else {
            return Ok(());
        };
        if self.dirty.is_empty() {
            return Ok(());
        }
        // In transcript order, so a client upserting them sees turns grow in sequence.
        // Looked up by id, not by scanning the transcript: a flush costs what changed, however
        // long the session's history.
        let dirty = std::mem::take(&mut self.dirty);
        let mut positions: Vec<usize> = dirty.iter().filter_map(|id| fold.position(id)).collect();
        positions.sort_unstable();
        let snapshots: Vec<Arc<Message>> = positions
            .into_iter()
            .map(|i| fold.messages()[i].clone())
            .collect();
        // Only the last snapshot moves the cursor: a client that leaves in between gets them all
        // again (idempotent upserts), never too few.
        let count = snapshots.len();
        let clean = self.clean;
        for (i, message) in snapshots.into_iter().enumerate() {
            let cursor = if i + 1 == count && !self.turn_end_pending {
                self.clean = self.last;
                self.last
            } else {
                clean
            };
            self.send_at(cursor, StreamEvent::Message(message)).await?;
        }
        Ok(())
    }

    /// MESSAGES: queues what changed since the last flush, from the session's live fold (which
    /// may stand further on than this stream has read: those entries are committed, and the
    /// stream goes on after them).
    async fn flush_live(&mut self) -> std::result::Result<(), Gone> {
        let Some(live) = self.live.clone() else {
            return Ok(());
        };
        if self.flushed >= self.last {
            return Ok(());
        }
        self.advance_live(Some(self.last)).await?;
        let (steps, head) = {
            let live = live.lock().expect("not poisoned");
            (live.jump(self.flushed), live.head())
        };
        let head = head.max(self.last);
        self.last = head;
        self.flushed = head;
        // Only the last event moves the cursor to the head, and a turn's end to its own offset:
        // a client that leaves in between gets the rest again (upserts), never too few.
        let count = steps.len();
        for (i, step) in steps.into_iter().enumerate() {
            match step {
                shared_fold::Jumped::TurnEnded(at, end) => {
                    self.clean = at;
                    self.send_at(at, StreamEvent::TurnEnded(end)).await?;
                }
                shared_fold::Jumped::Message(id) => {
                    if !self
                        .queued_refs
                        .lock()
                        .expect("not poisoned")
                        .insert(id.clone())
                    {
                        continue;
                    }
                    let cursor = if i + 1 == count { head } else { self.clean };
                    self.send_message_ref(cursor, id).await?;
                }
            }
        }
        self.clean = head;
        Ok(())
    }

    /// MESSAGES: brings the session's live fold up to `up_to` (inclusive; `None`: all the
    /// store holds) through the shared pages, if it is not there yet; where it stands then.
    async fn advance_live(&mut self, up_to: Option<u64>) -> std::result::Result<u64, Gone> {
        let Some(live) = self.live.clone() else {
            return Ok(self.last);
        };
        let reader = self.streams.0.pages.reader(self.id, up_to);
        loop {
            let head = live.lock().expect("not poisoned").head();
            if up_to.is_some_and(|up_to| head >= up_to) {
                return Ok(head);
            }
            self.check_draining()?;
            let (page, start, full) = match reader.next(self.store.as_ref(), head).await {
                Ok(page) => page,
                Err(e) => return Err(self.fail_now(e)),
            };
            let within = |offset: u64| up_to.is_none_or(|up_to| offset <= up_to);
            let entries: Vec<_> = page[start..]
                .iter()
                .take_while(|e| within(e.offset))
                .collect();
            // A few entries at a time, yielding in between: a long log folded when the first
            // stream of a session opens must not keep other calls off this thread.
            for batch in entries.chunks(FOLD_BATCH) {
                {
                    let mut live = live.lock().expect("not poisoned");
                    for entry in batch {
                        live.offer(entry);
                    }
                }
                tokio::task::yield_now().await;
            }
            let now = live.lock().expect("not poisoned").head();
            // No progress: the log holds no more (or the session was deleted under us: the
            // live feed says so).
            if now == head || (!full && up_to.is_none()) {
                return Ok(now);
            }
        }
    }

    async fn live(&mut self) -> std::result::Result<(), Gone> {
        let mut flush_at: Option<Instant> = None;
        loop {
            if std::mem::take(&mut self.sent) {
                self.next_heartbeat = Instant::now() + HEARTBEAT;
            }
            let heartbeat = self.next_heartbeat;
            tokio::select! {
                // Live events first: whatever was logged before the stream is ended is delivered.
                biased;
                woken = next_live(&mut self.source, self.id) => match woken {
                    Woken::Event(event) => {
                        self.on_live(event).await?;
                        // Take the rest of a burst without arming the select again: its timer
                        // and notifications cost more than delivering an event.
                        for _ in 1..LIVE_BURST {
                            let Source::Local { live, .. } = &mut self.source else {
                                break;
                            };
                            let event = match live.try_recv() {
                                Ok(event) => Ok(event),
                                Err(broadcast::error::TryRecvError::Empty) => break,
                                Err(broadcast::error::TryRecvError::Lagged(n)) => {
                                    Err(broadcast::error::RecvError::Lagged(n))
                                }
                                Err(broadcast::error::TryRecvError::Closed) => {
                                    Err(broadcast::error::RecvError::Closed)
                                }
                            };
                            self.on_live(event).await?;
                        }
                    }
                    Woken::Store(head) => {
                        // Status and queue read before the log, so they never run ahead of the
                        // entries sent with them.
                        let stored = self.read_stored().await?;
                        self.catch_up(head).await?;
                        self.send_stored_changes(stored).await?;
                    }
                    Woken::LeaseLost => {
                        // Another replica runs the session now and writes its log: the stream
                        // reads it from the store, as on any replica that does not own it.
                        tracing::debug!(session = %self.id, "lease lost: the stream goes on from the store");
                        self.source = Source::Remote(Remote::new(&self.store, &self.streams));
                        // Counted with the session's other streams fed by the store here, which
                        // puts it in the safety poll; the lost handle's count lets it go.
                        self._guard = Some(SubscriberGuard::Remote {
                            _slot: self.streams.join(self.id),
                        });
                        let stored = self.read_stored().await?;
                        self.catch_up(None).await?;
                        self.send_stored_changes(stored).await?;
                    }
                },
                _ = sleep_until(heartbeat) => {
                    let head = self.source_head().unwrap_or(self.last).max(self.last);
                    self.send(StreamEvent::Heartbeat { head }).await?;
                    // Only when idle: the first change after a meet copies the fold's index
                    // (a cost of the whole transcript), which must not come with every turn.
                    self.meet_shared_fold();
                }
                _ = sleep_until_opt(flush_at) => {
                    flush_at = None;
                    self.flush_messages().await?;
                }
                _ = self.stop.changed() => {
                    if *self.stop.borrow() == StreamStop::Draining {
                        self.send_error(draining()).await;
                        return Err(Gone);
                    }
                }
                _ = self.tx.closed() => return Err(Gone),
            }
            if !self.pending() {
                flush_at = None;
            } else if flush_at.is_none() {
                flush_at = Some(Instant::now() + MESSAGE_COALESCE);
            }
        }
    }

    /// One event of the live feed (or the feed's error).
    async fn on_live(
        &mut self,
        event: std::result::Result<SessionEvent, broadcast::error::RecvError>,
    ) -> std::result::Result<(), Gone> {
        match event {
            Ok(SessionEvent::Entry(entry)) => {
                if entry.offset <= self.last {
                    return Ok(()); // already read from the log
                }
                if entry.offset > self.last + 1 {
                    return self.catch_up(Some(entry.offset)).await; // a gap: the log has it
                }
                self.deliver(entry).await
            }
            Ok(SessionEvent::Queue(queue)) => self.send(StreamEvent::Queue(queue)).await,
            Ok(SessionEvent::Status { status, reason }) => {
                self.send(StreamEvent::Status { status, reason }).await
            }
            Ok(SessionEvent::Deleted) => {
                self.send_error(Error::session_not_found(&self.id.to_string()))
                    .await;
                Err(Gone)
            }
            Err(broadcast::error::RecvError::Lagged(_)) => {
                // Fell behind the live feed: back to the log, then on with the feed. Status and
                // queue events dropped with the lag are replaced by how both stand now.
                let target = self.source_head();
                self.catch_up(target).await?;
                self.send_status_and_queue().await
            }
            Err(broadcast::error::RecvError::Closed) => Err(Gone),
        }
    }
}

fn draining() -> Error {
    Error::new(
        ErrorCode::Draining,
        "the server is draining; resubscribe elsewhere from your last offset",
    )
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
