//! Pages of a session's log read once for every stream of this replica that is catching up on
//! it. When a thousand streams fall behind the live feed together, they need the same pages: the
//! first to ask reads a page from the store, the others wait for that read and take its entries
//! (the very same `Arc`s, so the gRPC layer's encoding of an entry is shared too).
//!
//! A stream takes from any page held that starts at or before its last offset the entries after
//! that offset. A page is read from an aligned offset (a multiple of the page size,
//! [`super::REPLAY_PAGE`]) when the
//! stream is far enough behind for that page to be full and not much more than it needs, so
//! streams a few entries apart meet on one read and then go on from the same offset; otherwise
//! (a stream just behind the head) from the stream's own offset, which reads no more than it needs.
//!
//! Pages are kept while any stream of their session is catching up and for [`KEEP`] after the
//! last one is done (streams that fell behind together do not all catch up at the same moment),
//! at most [`PAGES_KEPT`] per session; then all are let go. Memory stays bounded by pages, as it
//! was when every stream held its own.
//!
//! A full page never changes (the log is append-only and dense). A partial one (the log's tail)
//! may have grown since it was read, so a stream takes it only if the read began after the stream
//! needed it (its ticket), or if it reaches the offset the stream knows to be committed (its
//! target); otherwise the stream reads again, and that fresh read is shared in turn.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use uuid::Uuid;

use crate::{domain::Result, session::SharedEntry, store::Store};

/// Entries of one page, in offset order, shared by every stream that reads it.
pub(crate) type Page = Arc<[Arc<SharedEntry>]>;

/// Pages kept per session while its streams catch up: enough for a herd spread over a few
/// pages, far less than the one page each stream once held on its own.
pub(super) const PAGES_KEPT: usize = 8;

/// How long a session's pages are kept after its last stream caught up: long enough for the
/// rest of a herd to come by, short enough to hold nothing for long.
pub(super) const KEEP: std::time::Duration = std::time::Duration::from_secs(1);

/// Bytes of entries one page holds at most (besides its count; at least one entry): pages of
/// long frames — a long answer's chunks — would otherwise hold [`PAGES_KEPT`] times a thousand
/// of them per session.
pub(super) const PAGE_BYTES: usize = 2 * 1024 * 1024;

/// The shared pages of every session of this replica with a stream catching up.
pub(crate) struct CatchUpPages {
    sessions: Mutex<HashMap<Uuid, SessionPages>>,
    /// Orders needs and reads: a read whose ticket is above a need's began after it.
    tickets: AtomicU64,
    /// Entries per page: [`super::REPLAY_PAGE`] (less in tests, to keep them small).
    page: usize,
}

#[derive(Default)]
struct SessionPages {
    /// Streams of the session catching up now.
    readers: usize,
    /// By the offset they start after.
    pages: BTreeMap<u64, Arc<Slot>>,
    /// When the last reader left (none is reading now).
    idle_since: Option<tokio::time::Instant>,
    /// A task waits to let the pages go once idle for [`KEEP`].
    expiring: bool,
}

/// One page: read at most once, by whoever asks first.
struct Slot {
    /// The page holds the entries after this offset.
    start: u64,
    ticket: u64,
    /// The entries, and whether the read was cut (by count or bytes): more may follow.
    page: tokio::sync::OnceCell<(Page, bool)>,
}

impl CatchUpPages {
    pub(crate) fn with_page(page: usize) -> Self {
        Self {
            sessions: Default::default(),
            tickets: Default::default(),
            page,
        }
    }

    fn ticket(&self) -> u64 {
        self.tickets.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// A stream of `session` starts catching up. `target`: an offset the caller knows to be
    /// committed (the session's head as its actor published it, or a wake-up's head), if any.
    pub(crate) fn reader(self: &Arc<Self>, session: Uuid, target: Option<u64>) -> Reader {
        let ticket = self.ticket();
        self.sessions
            .lock()
            .expect("not poisoned")
            .entry(session)
            .or_default()
            .readers += 1;
        Reader {
            pages: self.clone(),
            session,
            ticket,
            target,
        }
    }

    /// How many sessions hold pages now (for tests: none once every stream caught up).
    #[cfg(test)]
    pub(crate) fn sessions_held(&self) -> usize {
        self.sessions.lock().expect("not poisoned").len()
    }
}

/// What a stream found among the pages held.
enum Found {
    /// Entries of this page from this index on; whether the page is full.
    Page(Page, usize, bool),
    /// A read under way that may serve: wait for it, then look again.
    Reading(Arc<Slot>),
    /// Nothing that serves: read.
    Nothing,
}

/// One stream catching up: it reads through the shared pages until dropped.
pub(crate) struct Reader {
    pages: Arc<CatchUpPages>,
    session: Uuid,
    ticket: u64,
    target: Option<u64>,
}

impl Reader {
    /// The entries after `after` from a page that holds them (from the index returned on; none
    /// when the log holds none), and whether that page is full (so the next may hold more).
    pub(crate) async fn next(&self, store: &dyn Store, after: u64) -> Result<(Page, usize, bool)> {
        let mut waited: Vec<Arc<Slot>> = Vec::new();
        loop {
            let slot = match self.find(after, &waited) {
                Found::Page(page, from, full) => return Ok((page, from, full)),
                Found::Reading(slot) => {
                    waited.push(slot.clone());
                    slot
                }
                Found::Nothing => self.new_slot(after, &waited),
            };
            // Whoever gets here first reads; the rest wait for that read. A read that failed
            // leaves the slot empty: the next one tries again.
            slot.page
                .get_or_try_init(|| async {
                    let mut entries = store
                        .read_log(self.session, slot.start, self.pages.page)
                        .await?;
                    let mut full = entries.len() == self.pages.page;
                    let mut bytes = 0;
                    if let Some(cut) = entries.iter().position(|e| {
                        bytes += e.json.len();
                        bytes > PAGE_BYTES
                    }) {
                        entries.truncate(cut.max(1));
                        full = true;
                    }
                    let page = entries
                        .into_iter()
                        .map(|e| Arc::new(SharedEntry::from(e)))
                        .collect::<Page>();
                    Ok::<_, crate::domain::Error>((page, full))
                })
                .await?;
            if let Some(found) = self.serves(&slot, after) {
                return Ok(found);
            }
            waited.push(slot);
        }
    }

    /// A page held that serves a stream after `after`, or a read under way (not waited for yet)
    /// that may.
    fn find(&self, after: u64, waited: &[Arc<Slot>]) -> Found {
        let sessions = self.pages.sessions.lock().expect("not poisoned");
        let Some(held) = sessions.get(&self.session) else {
            return Found::Nothing;
        };
        let mut reading = None;
        for slot in held.pages.range(..=after).rev().map(|(_, slot)| slot) {
            if slot.page.get().is_some() {
                if let Some((page, from, full)) = self.serves(slot, after) {
                    return Found::Page(page, from, full);
                }
            } else if reading.is_none() && !waited.iter().any(|w| Arc::ptr_eq(w, slot)) {
                reading = Some(slot.clone());
            }
        }
        reading.map_or(Found::Nothing, Found::Reading)
    }

    /// Whether `slot`'s page (read) serves a stream after `after`: a full one that holds entries
    /// after it, or a partial one read since the stream needed it or reaching its target.
    fn serves(&self, slot: &Slot, after: u64) -> Option<(Page, usize, bool)> {
        let (page, full) = slot.page.get()?;
        let from = page.partition_point(|e| e.offset <= after);
        if *full {
            return (from < page.len()).then(|| (page.clone(), from, true));
        }
        let last = page.last().map_or(slot.start, |e| e.offset);
        let fresh = slot.ticket > self.ticket || self.target.is_some_and(|target| last >= target);
        fresh.then(|| (page.clone(), from, false))
    }

    /// A new slot to read for a stream after `after`, in place of any held at its start.
    /// `waited`: the slots this stream waited for that did not serve it.
    fn new_slot(&self, after: u64, waited: &[Arc<Slot>]) -> Arc<Slot> {
        let page = self.pages.page as u64;
        let aligned = after - after % page;
        // Aligned when that page is sure to be full and what it holds before `after` is no more
        // than what the stream needs of it — unless an aligned read already ended before
        // `after` (its page was cut by bytes).
        let start = match self.target {
            Some(target)
                if target >= aligned + page
                    && after - aligned <= target - after
                    && !waited.iter().any(|slot| slot.start == aligned) =>
            {
                aligned
            }
            _ => after,
        };
        let slot = Arc::new(Slot {
            start,
            ticket: self.pages.ticket(),
            page: tokio::sync::OnceCell::new(),
        });
        let mut sessions = self.pages.sessions.lock().expect("not poisoned");
        let held = sessions.entry(self.session).or_default();
        held.pages.insert(start, slot.clone());
        while held.pages.len() > PAGES_KEPT {
            // The oldest positions go first: the herd moves forward.
            held.pages.pop_first();
        }
        slot
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let mut sessions = self.pages.sessions.lock().expect("not poisoned");
        let Some(held) = sessions.get_mut(&self.session) else {
            return;
        };
        held.readers -= 1;
        if held.readers > 0 {
            return;
        }
        held.idle_since = Some(tokio::time::Instant::now());
        if held.expiring {
            return; // the task already waiting sees the new time
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            sessions.remove(&self.session);
            return;
        };
        held.expiring = true;
        runtime.spawn(expire(Arc::downgrade(&self.pages), self.session));
    }
}

/// Lets a session's pages go once no stream has read them for [`KEEP`].
async fn expire(pages: std::sync::Weak<CatchUpPages>, session: Uuid) {
    loop {
        let until = {
            let Some(pages) = pages.upgrade() else { return };
            let mut sessions = pages.sessions.lock().expect("not poisoned");
            let Some(held) = sessions.get_mut(&session) else {
                return;
            };
            match held.idle_since {
                // Read again: the reader that leaves last starts the wait anew.
                _ if held.readers > 0 => {
                    held.expiring = false;
                    return;
                }
                Some(since) if since.elapsed() < KEEP => since + KEEP,
                _ => {
                    sessions.remove(&session);
                    return;
                }
            }
        };
        tokio::time::sleep_until(until).await;
    }
}
