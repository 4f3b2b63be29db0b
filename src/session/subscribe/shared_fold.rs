//! One fold per session per replica, shared by its MESSAGES and ALL streams.
//!
//! Each such stream folds the entries it delivers itself, because its snapshots must show each
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
    collections::HashMap,
    sync::{Arc, Mutex},
};

use uuid::Uuid;

use crate::acp::fold::Fold;

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
