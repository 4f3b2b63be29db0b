//! The folds a session's MESSAGES and ALL streams on this replica share.
//!
//! MESSAGES streams share one live fold ([`LiveFold`], below): none folds on its own.
//!
//! Each ALL stream folds the entries it delivers itself, because its snapshots must show each
//! message as of the stream's own offset, and streams stand at different offsets. But folding is
//! deterministic: two folds at the same offset are equal. So a stream that reaches the offset of
//! the session's shared fold takes a clone of it in place of its own, and one that gets further
//! leaves a clone of its own there. A [`Fold`] clone shares every message (and map) until one side
//! changes it, so streams that stand still — all of them, once a session is idle — hold one
//! transcript between them: a new message of the running turn is copied by each stream that
//! changes it, and given back at the next meeting.
//!
//! A stream meets the shared fold when it starts (to begin from it instead of folding the log
//! from the start), when it has caught up, and at a heartbeat (sent only when the session is
//! idle). Never per turn: after a meeting, the stream's first change copies the fold's message
//! list and index — pointers and keys, but as many as the transcript has messages — so meeting
//! at every turn's end would make each turn cost the whole history once per stream.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
};

use uuid::Uuid;

use crate::{
    acp::{
        fold::Fold,
        transcript::{Message, TurnEnd},
    },
    domain::log::LogEntry,
};

/// The shared folds of this replica's sessions with a MESSAGES or ALL stream.
#[derive(Default)]
pub(crate) struct SharedFolds {
    sessions: Mutex<HashMap<Uuid, SessionFold>>,
}

#[derive(Default)]
struct SessionFold {
    /// Streams holding a [`FoldShare`] of the session.
    streams: usize,
    /// The furthest fold a stream left here.
    latest: Option<Fold>,
    /// The live fold of its MESSAGES streams (made by the first).
    live: Option<Arc<Mutex<LiveFold>>>,
}

impl SharedFolds {
    /// A stream of `session` joins its shared fold (let go when the last one leaves).
    pub(crate) fn join(self: &Arc<Self>, session: Uuid) -> FoldShare {
        self.sessions
            .lock()
            .expect("not poisoned")
            .entry(session)
            .or_default()
            .streams += 1;
        FoldShare {
            folds: self.clone(),
            session,
        }
    }

    /// The session's live fold, if a MESSAGES stream made one (for tests).
    #[cfg(test)]
    pub(crate) fn live_of(&self, session: Uuid) -> Option<Arc<Mutex<LiveFold>>> {
        self.sessions
            .lock()
            .expect("not poisoned")
            .get(&session)
            .and_then(|s| s.live.clone())
    }

    /// The session's shared fold now (for tests).
    #[cfg(test)]
    pub(crate) fn latest(&self, session: Uuid) -> Option<Fold> {
        self.sessions
            .lock()
            .expect("not poisoned")
            .get(&session)
            .and_then(|s| s.latest.clone())
    }
}

/// A stream's membership in its session's shared fold.
pub(crate) struct FoldShare {
    folds: Arc<SharedFolds>,
    session: Uuid,
}

impl FoldShare {
    /// The fold to start from for a stream whose fold must stand at `at`: a clone of the shared
    /// one if it is not past `at` (the stream folds the rest), else a new one.
    pub(crate) fn start(&self, meta_key: &str, at: u64) -> Fold {
        let sessions = self.folds.sessions.lock().expect("not poisoned");
        sessions
            .get(&self.session)
            .and_then(|s| s.latest.as_ref())
            .filter(|latest| latest.head() <= at && latest.meta_key() == meta_key)
            .cloned()
            .unwrap_or_else(|| Fold::new(meta_key))
    }

    /// The session's live fold (see [`LiveFold`]), made on first use.
    pub(crate) fn live(&self, meta_key: &str) -> Arc<Mutex<LiveFold>> {
        let mut sessions = self.folds.sessions.lock().expect("not poisoned");
        sessions
            .entry(self.session)
            .or_default()
            .live
            .get_or_insert_with(|| Arc::new(Mutex::new(LiveFold::new(meta_key))))
            .clone()
    }

    /// Meets the shared fold: `fold` takes it if both stand at one offset (letting its own
    /// copies go), or leaves a clone of itself there if it is further on.
    pub(crate) fn meet(&self, fold: &mut Fold) {
        let mut sessions = self.folds.sessions.lock().expect("not poisoned");
        let shared = sessions.entry(self.session).or_default();
        match &shared.latest {
            Some(latest) if latest.meta_key() != fold.meta_key() => {}
            Some(latest) if latest.head() == fold.head() => *fold = latest.clone(),
            Some(latest) if latest.head() > fold.head() => {}
            _ => shared.latest = Some(fold.clone()),
        }
    }
}

impl Drop for FoldShare {
    fn drop(&mut self) {
        let mut sessions = self.folds.sessions.lock().expect("not poisoned");
        if let Some(shared) = sessions.get_mut(&self.session) {
            shared.streams -= 1;
            if shared.streams == 0 {
                sessions.remove(&self.session);
            }
        }
    }
}

/// The one fold of a session that its MESSAGES streams on this replica share, live: each entry is
/// folded once for all of them, by the first stream that delivers it, and a stream sends only
/// references to the messages that changed (resolved to the message as it stands when the client
/// takes the event: see [`super::StreamReceiver`]). So a MESSAGES stream holds no message of its
/// own — not a copy of a long answer as it grows, not the snapshots a slow reader has not taken
/// — and a thousand of them fold, and keep, one transcript.
///
/// A stream at offset `from` whose session's fold stands at `head` sends, in one go, every
/// message changed after `from` as it stands at `head`, and the turn ends logged in between in
/// order (each after the messages changed up to it): the same changes its own fold would have
/// shown, perhaps newer, never fewer; snapshots are upserts, so a resumed client is never misled.
pub(crate) struct LiveFold {
    fold: Fold,
    /// Each message's last change, and the messages by it.
    changed_at: HashMap<String, u64>,
    by_change: BTreeMap<u64, Vec<String>>,
    /// The turns ended, by the offset of their `turn_ended` entry.
    turn_ends: BTreeMap<u64, TurnEnd>,
    /// The last entry that ended a turn or showed a new pending request (never coalesced).
    last_urgent: u64,
}

/// What a stream sends to move from one offset to the fold's head.
pub(crate) enum Jumped {
    /// A message changed, by id (resolved when the client takes it).
    Message(String),
    TurnEnded(u64, TurnEnd),
}

impl LiveFold {
    pub(crate) fn new(meta_key: &str) -> Self {
        Self {
            fold: Fold::new(meta_key),
            changed_at: HashMap::new(),
            by_change: BTreeMap::new(),
            turn_ends: BTreeMap::new(),
            last_urgent: 0,
        }
    }

    pub(crate) fn head(&self) -> u64 {
        self.fold.head()
    }

    /// The last offset that ended a turn or showed a new pending request.
    pub(crate) fn last_urgent(&self) -> u64 {
        self.last_urgent
    }

    /// Folds `entry` if it is the next one; whether the fold now stands at or past it.
    pub(crate) fn offer(&mut self, entry: &LogEntry) -> bool {
        if entry.offset <= self.fold.head() {
            return true;
        }
        if entry.offset != self.fold.head() + 1 {
            return false;
        }
        for id in self.fold.apply(entry) {
            if let Some(before) = self.changed_at.insert(id.clone(), entry.offset)
                && let Some(ids) = self.by_change.get_mut(&before)
            {
                ids.retain(|other| *other != id);
                if ids.is_empty() {
                    self.by_change.remove(&before);
                }
            }
            self.by_change.entry(entry.offset).or_default().push(id);
        }
        self.fold.take_turn_ends();
        if let Some(end) = TurnEnd::from_entry(entry) {
            self.turn_ends.insert(entry.offset, end);
        }
        if self.fold.take_urgent() {
            self.last_urgent = entry.offset;
        }
        true
    }

    /// What a stream that has sent everything up to `from` sends to stand at [`Self::head`]:
    /// the messages changed after `from` and the turns ended, in order.
    pub(crate) fn jump(&self, from: u64) -> Vec<Jumped> {
        let mut out = Vec::new();
        let mut changed = self.by_change.range(from + 1..).peekable();
        let mut batch: Vec<&String> = Vec::new();
        let flush = |batch: &mut Vec<&String>, out: &mut Vec<Jumped>| {
            // In transcript order, so a client upserting them sees turns grow in sequence.
            batch.sort_by_key(|id| self.fold.position(id));
            out.extend(batch.drain(..).map(|id| Jumped::Message(id.clone())));
        };
        for (&at, end) in self.turn_ends.range(from + 1..) {
            while let Some((_, ids)) = changed.next_if(|(offset, _)| **offset <= at) {
                batch.extend(ids);
            }
            flush(&mut batch, &mut out);
            out.push(Jumped::TurnEnded(at, end.clone()));
        }
        for (_, ids) in changed {
            batch.extend(ids);
        }
        flush(&mut batch, &mut out);
        out
    }

    /// The message `id` as it stands now.
    pub(crate) fn message(&self, id: &str) -> Option<Arc<Message>> {
        self.fold
            .position(id)
            .map(|at| self.fold.messages()[at].clone())
    }
}
