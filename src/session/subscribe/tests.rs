//! Streams fed by the store: what wakes them and what they read. Each test sets the safety poll's
//! period: so long that only a wake-up can explain a delivery, or short so that a test need not
//! wait for it. Nothing here measures time; what is counted is reads and polls.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use tokio::sync::{broadcast, mpsc, watch};
use uuid::Uuid;

use super::*;
use crate::{
    domain::{ActionId, ErrorCode, Result, queue::QueuedEntry, session::SessionRecord},
    store::{
        ActionRecord, Batch, ChangeMark, CommitError, LogEntry, QueueOp, SessionQuery, Store, Wake,
        conformance::fixtures::{entries, frames, prompt, queue, session},
        memory::MemoryStore,
    },
};

/// Longer than any test: a stream that gets news under it was woken, not polled.
const NEVER: Duration = Duration::from_secs(3600);
/// A poll period a test can wait out many times over.
const OFTEN: Duration = Duration::from_millis(10);
/// Every wait of a test.
const TIMEOUT: Duration = Duration::from_secs(30);

async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TIMEOUT, future)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// A memory store that counts the reads a stream makes and the safety polls, and whose
/// wake-ups the test sends (or does not: a lost notification).
struct Watched {
    inner: MemoryStore,
    wakes: Option<broadcast::Sender<Wake>>,
    /// Reads of a session's log, record or queue.
    reads: AtomicUsize,
    /// Reads of a session's log alone.
    log_reads: AtomicUsize,
    /// Safety polls so far.
    polls: watch::Sender<usize>,
    /// The sessions the last poll asked for.
    last_poll: AtomicUsize,
}

impl Watched {
    fn new(with_wake_ups: bool) -> Arc<Self> {
        Arc::new(Self {
            inner: MemoryStore::new(),
            wakes: with_wake_ups.then(|| broadcast::channel(64).0),
            reads: AtomicUsize::new(0),
            log_reads: AtomicUsize::new(0),
            polls: watch::channel(0).0,
            last_poll: AtomicUsize::new(0),
        })
    }

    fn wake(&self, session: Uuid, head: u64) {
        let _ = self
            .wakes
            .as_ref()
            .expect("wake-ups")
            .send(Wake { session, head });
    }

    fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }

    fn read(&self) {
        self.reads.fetch_add(1, Ordering::SeqCst);
    }

    fn log_reads(&self) -> usize {
        self.log_reads.load(Ordering::SeqCst)
    }

    /// Waits until the safety poll has run `n` times in all.
    async fn polled(&self, n: usize) -> usize {
        let mut polls = self.polls.subscribe();
        within("the safety polls", polls.wait_for(|polls| *polls >= n))
            .await
            .map(|polls| *polls)
            .expect("the store lives")
    }
}

#[async_trait]
impl Store for Watched {
    async fn create_session(&self, record: &SessionRecord) -> Result<()> {
        self.inner.create_session(record).await
    }
    async fn commit(&self, session_id: Uuid, batch: Batch) -> Result<(), CommitError> {
        self.inner.commit(session_id, batch).await
    }
    async fn get_session(&self, session_id: Uuid) -> Result<Option<SessionRecord>> {
        self.read();
        self.inner.get_session(session_id).await
    }
    async fn list_sessions(&self, query: &SessionQuery) -> Result<Vec<SessionRecord>> {
        self.inner.list_sessions(query).await
    }
    async fn count_live_sessions(&self, owner: &str) -> Result<u64> {
        self.inner.count_live_sessions(owner).await
    }
    async fn usage(&self, query: &crate::store::UsageQuery) -> Result<Vec<crate::store::UsageRow>> {
        self.inner.usage(query).await
    }
    async fn open_sessions(&self) -> Result<Vec<SessionRecord>> {
        self.inner.open_sessions().await
    }
    async fn delete_session(&self, session_id: Uuid) -> Result<bool> {
        self.inner.delete_session(session_id).await
    }
    async fn delete_closed_before(
        &self,
        closed_before: std::time::SystemTime,
        limit: usize,
    ) -> Result<Vec<Uuid>> {
        self.inner.delete_closed_before(closed_before, limit).await
    }
    async fn read_log(&self, session_id: Uuid, after: u64, limit: usize) -> Result<Vec<LogEntry>> {
        self.read();
        self.log_reads.fetch_add(1, Ordering::SeqCst);
        self.inner.read_log(session_id, after, limit).await
    }
    async fn head_offset(&self, session_id: Uuid) -> Result<u64> {
        self.read();
        self.inner.head_offset(session_id).await
    }
    async fn load_queue(&self, session_id: Uuid) -> Result<Vec<QueuedEntry>> {
        self.read();
        self.inner.load_queue(session_id).await
    }
    async fn find_action(
        &self,
        session_id: Uuid,
        action_id: ActionId,
    ) -> Result<Option<ActionRecord>> {
        self.inner.find_action(session_id, action_id).await
    }
    async fn change_marks(&self, sessions: &[Uuid]) -> Result<Vec<(Uuid, ChangeMark)>> {
        // One read for them all, as a database store makes it (not counted as a stream's).
        let marks = self.inner.change_marks(sessions).await;
        self.last_poll.store(sessions.len(), Ordering::SeqCst);
        self.polls.send_modify(|polls| *polls += 1);
        marks
    }
    fn wake_ups(&self) -> Option<broadcast::Receiver<Wake>> {
        self.wakes.as_ref().map(|w| w.subscribe())
    }
}

/// A stream of `record` as a replica without its actor opens it (from offset 0), taken to its
/// `caught_up`.
async fn open(
    store: &Arc<Watched>,
    streams: &RemoteStreams,
    record: &SessionRecord,
) -> StreamReceiver {
    let head = store.inner.head_offset(record.id).await.unwrap();
    let dyn_store: Arc<dyn Store> = store.clone();
    let mut stream = start_remote(
        dyn_store,
        record,
        StreamStart {
            after: 0,
            head,
            view: View::Log,
        },
        "test/meta".to_owned(),
        watch::channel(StreamStop::Open).1,
        streams,
        Admission {
            max_subscribers: 64,
            principal: streams.admit_principal("test", usize::MAX).unwrap(),
        },
    )
    .expect("the stream opens");
    within("caught_up", async {
        while !matches!(news(&mut stream).await, StreamEvent::CaughtUp { .. }) {}
    })
    .await;
    stream
}

/// The next event that is not a heartbeat.
async fn news(stream: &mut StreamReceiver) -> StreamEvent {
    loop {
        let (_, event) = stream
            .recv()
            .await
            .expect("the stream stays open")
            .expect("the stream does not fail");
        if !matches!(event, StreamEvent::Heartbeat { .. }) {
            return event;
        }
    }
}

/// The offsets of the next `n` entries.
async fn entry_offsets(stream: &mut StreamReceiver, n: usize) -> Vec<u64> {
    within("the entries", async {
        let mut offsets = Vec::new();
        while offsets.len() < n {
            if let StreamEvent::Entry(entry) = news(stream).await {
                offsets.push(entry.offset);
            }
        }
        offsets
    })
    .await
}

/// The next queue the stream sends.
async fn next_queue(stream: &mut StreamReceiver) -> Arc<Vec<QueuedEntry>> {
    within("the queue", async {
        loop {
            if let StreamEvent::Queue(queue) = news(stream).await {
                return queue;
            }
        }
    })
    .await
}

async fn stored_session(store: &Arc<Watched>, created_ms: u64) -> SessionRecord {
    let record = session("user:alice", created_ms);
    store.create_session(&record).await.unwrap();
    record
}

#[tokio::test]
async fn idle_streams_fed_by_the_store_read_nothing_and_share_one_safety_poll() {
    let store = Watched::new(true);
    let streams = RemoteStreams::polling_every(OFTEN);
    let mut opened = Vec::new();
    for i in 0..5 {
        let record = stored_session(&store, i).await;
        for _ in 0..4 {
            opened.push(open(&store, &streams, &record).await);
        }
    }
    // The first poll meets every session, whose streams then look once; by the third, done.
    let first = store.polled(3).await;
    let reads = store.reads();
    store.polled(first + 20).await;
    assert_eq!(store.reads(), reads, "idle streams read nothing");
    assert_eq!(
        store.last_poll.load(Ordering::SeqCst),
        5,
        "one poll asks for every session with a stream, once"
    );
    for stream in &mut opened {
        assert!(
            !matches!(stream.try_recv(), Ok(Ok((_, StreamEvent::Entry(_))))),
            "nothing to deliver"
        );
    }
}

#[tokio::test]
async fn a_wake_up_with_a_new_head_delivers_and_one_already_seen_reads_nothing() {
    let store = Watched::new(true);
    let streams = RemoteStreams::polling_every(NEVER);
    let record = stored_session(&store, 1).await;
    let mut stream = open(&store, &streams, &record).await;

    store
        .commit(record.id, entries(frames(1, 2)))
        .await
        .unwrap();
    store.wake(record.id, 2);
    assert_eq!(entry_offsets(&mut stream, 2).await, [1, 2]);

    let reads = store.reads();
    // The same head again (a repeated notification), an older one, and another session's.
    store.wake(record.id, 2);
    store.wake(record.id, 1);
    store.wake(Uuid::now_v7(), 9);
    // Something besides the log (head 0) is always looked at; it comes after those, in order.
    store
        .commit(record.id, queue(vec![QueueOp::PushBack(prompt("later"))]))
        .await
        .unwrap();
    store.wake(record.id, 0);
    assert_eq!(next_queue(&mut stream).await.len(), 1);
    assert_eq!(
        store.reads() - reads,
        3,
        "one look (record, queue, log) for the wake-up with news, none for the others"
    );

    // A new head after that is news again.
    store
        .commit(record.id, entries(frames(3, 3)))
        .await
        .unwrap();
    store.wake(record.id, 3);
    assert_eq!(entry_offsets(&mut stream, 1).await, [3]);
}

#[tokio::test]
async fn a_change_whose_wake_up_was_lost_reaches_the_stream_at_the_safety_poll() {
    // No wake-ups at all: every one is lost.
    let store = Watched::new(false);
    let streams = RemoteStreams::polling_every(OFTEN);
    let record = stored_session(&store, 1).await;
    let mut stream = open(&store, &streams, &record).await;

    store
        .commit(record.id, entries(frames(1, 3)))
        .await
        .unwrap();
    assert_eq!(entry_offsets(&mut stream, 3).await, [1, 2, 3]);

    // A change of the queue alone.
    store
        .commit(record.id, queue(vec![QueueOp::PushBack(prompt("queued"))]))
        .await
        .unwrap();
    assert_eq!(next_queue(&mut stream).await.len(), 1);

    // A session deleted without a word ends its stream.
    store.inner.delete_session(record.id).await.unwrap();
    let ended = within("the end of the stream", async {
        loop {
            match stream.recv().await {
                Some(Ok(_)) => continue,
                other => return other,
            }
        }
    })
    .await;
    let error = ended.expect("an error ends the stream").unwrap_err();
    assert_eq!(error.code, ErrorCode::SessionNotFound);
}

// ---- streams of a session whose actor runs here: what they share ------------------------------

use crate::session::{SessionHandle, Shared};

/// A session "running here" for the streams: its shared state, with no actor behind it (the
/// queue reads as empty). Entries reach the streams by [`append`]; its live feed holds `feed`.
fn local_session(record: &SessionRecord, feed: usize) -> SessionHandle {
    let (commands, _) = mpsc::channel(1);
    let shared = Shared::new(record.clone(), 0);
    *shared.events.lock().unwrap() = Some(broadcast::channel(feed).0);
    SessionHandle {
        shared: Arc::new(shared),
        commands,
    }
}

thread_local! {
    /// Never sends: the streams stay open (a stop signal whose sender is gone would wake a stream
    /// at every turn of its loop).
    static OPEN: watch::Sender<StreamStop> = watch::channel(StreamStop::Open).0;
}

/// Commits `log` and then publishes it as the actor does (head first), all without yielding: no
/// stream runs in between, so a feed shorter than the log leaves every stream behind at once.
async fn append(store: &Arc<Watched>, handle: &SessionHandle, log: Vec<LogEntry>) {
    let head = log.last().expect("entries").offset;
    store
        .inner
        .commit(handle.shared.id, entries(log.clone()))
        .await
        .unwrap();
    handle.shared.set_head(head);
    for entry in log {
        handle
            .shared
            .publish(crate::session::SessionEvent::Entry(Arc::new(entry.into())));
    }
}

/// A local stream of the session from `after`, taken to its `caught_up`; the snapshots sent
/// before it, last per message id.
async fn open_local(
    store: &Arc<Watched>,
    streams: &RemoteStreams,
    handle: &SessionHandle,
    after: u64,
    view: View,
) -> (StreamReceiver, Vec<Arc<crate::acp::transcript::Message>>) {
    let dyn_store: Arc<dyn Store> = store.clone();
    let mut stream = start(
        handle.clone(),
        StreamStart {
            after,
            head: handle.shared.head(),
            view,
        },
        dyn_store,
        "test/meta".to_owned(),
        OPEN.with(|open| open.subscribe()),
        streams,
        Admission {
            max_subscribers: 2000,
            principal: streams.admit_principal("test", usize::MAX).unwrap(),
        },
    )
    .expect("the stream opens");
    let mut snapshots = Vec::new();
    within("caught_up", async {
        loop {
            match news(&mut stream).await {
                StreamEvent::CaughtUp { .. } => break,
                StreamEvent::Message(message) => snapshots.push(message),
                _ => {}
            }
        }
    })
    .await;
    (stream, snapshots)
}

/// Small pages and a small live feed, so a thousand streams fall behind over a short log (the
/// sizes change how much is read, not how).
const SMALL_PAGE: usize = 20;
const SMALL_FEED: usize = 16;

#[tokio::test]
async fn a_thousand_streams_that_fall_behind_together_read_each_page_of_the_log_once() {
    const STREAMS: usize = 1000;
    let store = Watched::new(false);
    let streams = RemoteStreams::with(NEVER, SMALL_PAGE);
    let record = stored_session(&store, 1).await;
    let handle = local_session(&record, SMALL_FEED);
    let mut opened = Vec::new();
    for _ in 0..STREAMS {
        opened.push(open_local(&store, &streams, &handle, 0, View::Log).await.0);
    }

    // Three full pages and half of a fourth, four times what the live feed holds: every stream
    // misses most of it and goes back to the log, all at the same moment.
    let head = 3 * SMALL_PAGE as u64 + SMALL_PAGE as u64 / 2;
    assert!(head > 4 * SMALL_FEED as u64);
    let before = store.log_reads();
    append(&store, &handle, frames(1, head)).await;

    for stream in &mut opened {
        let offsets = entry_offsets(stream, head as usize).await;
        assert!(
            offsets.iter().copied().eq(1..=head),
            "every offset once, in order"
        );
    }
    let pages = head.div_ceil(SMALL_PAGE as u64) as usize;
    // Exactly one read per page, however the streams' catch-ups interleave: a page is kept while
    // any stream reads and for a while after, the pages are aligned (so every stream meets the
    // same ones), a full page never changes, and the last (partial) one reaches the head every
    // stream knew of when it fell behind, so none reads it again.
    assert_eq!(store.log_reads() - before, pages, "one read per page");

    within("the pages let go", async {
        while streams.0.pages.sessions_held() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn streams_starting_behind_together_share_their_page_reads_too() {
    let store = Watched::new(false);
    let streams = RemoteStreams::with(NEVER, SMALL_PAGE);
    let record = stored_session(&store, 1).await;
    let handle = local_session(&record, SMALL_FEED);
    let head = SMALL_PAGE as u64 + 10;
    append(&store, &handle, frames(1, head)).await;

    // Opened together (none is read before all are): each starts from the beginning.
    let before = store.log_reads();
    let dyn_store: Arc<dyn Store> = store.clone();
    let mut opened: Vec<_> = (0..100)
        .map(|_| {
            start(
                handle.clone(),
                StreamStart {
                    after: 0,
                    head,
                    view: View::Log,
                },
                dyn_store.clone(),
                "test/meta".to_owned(),
                OPEN.with(|open| open.subscribe()),
                &streams,
                Admission {
                    max_subscribers: 2000,
                    principal: streams.admit_principal("test", usize::MAX).unwrap(),
                },
            )
            .expect("the stream opens")
        })
        .collect();
    for stream in &mut opened {
        assert!(
            entry_offsets(stream, head as usize)
                .await
                .into_iter()
                .eq(1..=head)
        );
    }
    assert_eq!(store.log_reads() - before, 2, "two pages, each read once");
}

/// A `session/update` frame from the agent adding `text` to its message.
fn chunk(offset: u64, text: &str) -> LogEntry {
    crate::store::conformance::fixtures::frame(
        offset,
        &serde_json::json!({"jsonrpc": "2.0", "method": "session/update", "params": {
            "sessionId": "s",
            "update": {"sessionUpdate": "agent_message_chunk",
                       "content": {"type": "text", "text": text}}}})
        .to_string(),
    )
}

#[tokio::test]
async fn a_hundred_messages_streams_of_an_idle_session_hold_one_transcript_between_them() {
    const STREAMS: usize = 100;
    let store = Watched::new(false);
    let streams = RemoteStreams::polling_every(NEVER);
    let record = stored_session(&store, 1).await;
    let handle = local_session(&record, crate::session::EVENT_FEED_CAPACITY);
    // One big message: 200 chunks of 10 KiB.
    let text = "x".repeat(10 * 1024);
    let log: Vec<LogEntry> = (1..=200).map(|offset| chunk(offset, &text)).collect();
    append(&store, &handle, log).await;

    let mut opened = Vec::new();
    for _ in 0..STREAMS {
        let (stream, snapshots) = open_local(&store, &streams, &handle, 0, View::Messages).await;
        let last = snapshots.last().expect("the message's snapshot");
        assert_eq!(last.id, "0:agent");
        assert_eq!(
            last.parts,
            [crate::acp::transcript::Part::Text(text.repeat(200))],
            "each stream sends the message whole"
        );
        opened.push((stream, snapshots));
    }
    // Snapshots already sent are the client's business: only what the streams hold counts.
    for (_, snapshots) in &mut opened {
        snapshots.clear();
    }

    let live = streams.0.folds.live_of(record.id).expect("the live fold");
    let message = {
        let live = live.lock().unwrap();
        assert_eq!(live.head(), 200);
        live.message("0:agent").expect("the big message")
    };
    assert_eq!(
        Arc::strong_count(&message),
        2,
        "the live fold holds the one copy of the big message (and this test's look at it); no \
         stream holds one"
    );
    drop(message);

    // A stream resuming where the live fold stands starts from it: nothing is read or folded.
    // (Once the pages the others read are let go, so that any read would show.)
    within("the pages let go", async {
        while streams.0.pages.sessions_held() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let before = store.log_reads();
    let (_resumed, snapshots) = open_local(&store, &streams, &handle, 200, View::Messages).await;
    assert!(snapshots.is_empty(), "nothing new to send");
    assert_eq!(
        store.log_reads() - before,
        0,
        "nothing is read: the live fold stands at the head already"
    );
}

#[tokio::test]
async fn messages_streams_sharing_a_fold_each_send_every_change_live_and_share_again_when_idle() {
    let store = Watched::new(false);
    let streams = RemoteStreams::polling_every(NEVER);
    let record = stored_session(&store, 1).await;
    let handle = local_session(&record, crate::session::EVENT_FEED_CAPACITY);
    let mut opened = Vec::new();
    for view in [View::Messages, View::All, View::Messages] {
        opened.push(open_local(&store, &streams, &handle, 0, view).await.0);
    }
    // Round by round, each stream sends the text so far.
    let word = "chunk ";
    for round in 1..=5u64 {
        append(&store, &handle, vec![chunk(round, word)]).await;
        for stream in &mut opened {
            let text = within("the round's snapshot", async {
                loop {
                    if let StreamEvent::Message(message) = news(stream).await {
                        return message.parts.clone();
                    }
                }
            })
            .await;
            assert_eq!(
                text,
                [crate::acp::transcript::Part::Text(
                    word.repeat(round as usize)
                )]
            );
        }
    }
    // The ALL stream folds its own and meets the shared fold when idle; the MESSAGES streams
    // hold no fold: the live one folded each chunk once for both.
    within("the ALL stream shares its fold again", async {
        loop {
            let shared = streams.0.folds.latest(record.id).expect("a shared fold");
            // The registry, the ALL stream and this look.
            if shared.head() == 5 && shared.sharers() == 3 {
                return;
            }
            drop(shared);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let live = streams.0.folds.live_of(record.id).expect("the live fold");
    assert_eq!(live.lock().unwrap().head(), 5);
}
