//! WAL checkpoints off the commit path.
//!
//! SQLite's automatic checkpoint runs inside the `COMMIT` that takes the WAL past its threshold:
//! that one commit also syncs the WAL, copies it into the database file and syncs that — at the
//! default 1,000 pages about 3 ms here, paid by whichever write crossed the line, and with a turn
//! writing a few pages that was one turn in a hundred: the 99th percentile of a turn. So a thread
//! of its own, woken after each committed group, runs a `PASSIVE` checkpoint on a connection of
//! its own at most once per [`MIN_INTERVAL`], concurrently with further commits (it never waits
//! for readers or writers).
//!
//! A checkpoint that runs beside a stream of commits never finds the WAL fully copied when the
//! next write starts, so SQLite can never rewind the WAL to its start: alone, the thread would let
//! the WAL grow without bound. The writer's automatic checkpoint therefore stays, as the bound of
//! the WAL, at [`schema::WAL_BOUND_PAGES`]: rarely, and with most of its copying already done.
//!
//! Durability is unchanged: a commit is as durable as before the moment it returns (checkpoints
//! only move pages from the WAL into the database file, with the connection's `synchronous`). The
//! final `TRUNCATE` checkpoint at close stays with the writer, after this thread has stopped.

use std::{
    path::Path,
    sync::{Arc, Condvar, Mutex},
    thread::JoinHandle,
    time::Duration,
};

use rusqlite::{Connection, OpenFlags};

use super::{rows::Context, schema};
use crate::{domain::Result, store::SqliteSynchronous};

/// The least time between two background checkpoints while writes keep coming.
pub(super) const MIN_INTERVAL: Duration = Duration::from_millis(200);

#[derive(Default)]
struct State {
    /// Something was committed since the last checkpoint.
    pending: bool,
    stop: bool,
}

type Shared = Arc<(Mutex<State>, Condvar)>;

/// The checkpoint thread; stopped (and joined) by [`Checkpointer::stop`] or on drop.
pub(super) struct Checkpointer {
    shared: Shared,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Opens a connection of its own to the database at `path` (syncing as `synchronous` says)
    /// and starts the thread.
    pub(super) fn start(path: &Path, synchronous: SqliteSynchronous) -> Result<Self> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .context("opening the checkpoint connection")?;
        conn.busy_timeout(schema::BUSY_TIMEOUT)
            .context("setting the busy timeout")?;
        // A checkpoint copies pages without the page cache: keep this connection's small.
        conn.execute_batch(&format!(
            "PRAGMA synchronous = {}; PRAGMA cache_size = 16;",
            schema::synchronous_name(synchronous)
        ))
        .context("configuring the checkpoint connection")?;
        let shared: Shared = Arc::default();
        let thread = std::thread::Builder::new()
            .name("sqlite-checkpoint".to_owned())
            .spawn({
                let shared = shared.clone();
                move || run(conn, shared)
            })
            .map_err(|e| crate::store::StoreError::Task {
                message: format!("sqlite store: starting the checkpointer: {e}"),
                source: Some(e.into()),
            })?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// A group was committed: a checkpoint is due (soon, not now).
    pub(super) fn committed(&self) {
        let (state, wake) = &*self.shared;
        let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
        if !state.pending {
            state.pending = true;
            wake.notify_one();
        }
    }

    /// Stops the thread after any checkpoint it is running, and waits for it.
    pub(super) fn stop(&mut self) {
        {
            let (state, wake) = &*self.shared;
            state.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
            wake.notify_one();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(conn: Connection, shared: Shared) {
    let (state, wake) = &*shared;
    loop {
        {
            let mut guard = wake
                .wait_while(state.lock().unwrap_or_else(|e| e.into_inner()), |s| {
                    !s.pending && !s.stop
                })
                .unwrap_or_else(|e| e.into_inner());
            if guard.stop {
                return;
            }
            guard.pending = false;
        }
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::warn!(error = %e, "sqlite store: a background checkpoint failed");
        }
        // At most one checkpoint per interval; a stop cuts the wait short.
        let (guard, _) = wake
            .wait_timeout_while(
                state.lock().unwrap_or_else(|e| e.into_inner()),
                MIN_INTERVAL,
                |s| !s.stop,
            )
            .unwrap_or_else(|e| e.into_inner());
        if guard.stop {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on a thread; fails the test if it has not finished within 30 s (a hang guard).
    fn within_test_timeout(f: impl FnOnce() + Send + 'static) {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            f();
            let _ = done.send(());
        });
        finished
            .recv_timeout(Duration::from_secs(30))
            .expect("finished within the test timeout");
    }

    fn wal_database() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite3");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0;
             CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1), (2), (3);",
        )
        .unwrap();
        (dir, path)
    }

    #[test]
    fn a_checkpointer_told_of_commits_stops_when_asked_and_the_data_stays_whole() {
        let (_dir, path) = wal_database();
        within_test_timeout(move || {
            let mut checkpointer = Checkpointer::start(&path, SqliteSynchronous::Normal).unwrap();
            checkpointer.committed();
            checkpointer.stop();
            checkpointer.stop(); // a second stop is a no-op
            let count: i64 = Connection::open(&path)
                .unwrap()
                .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
                .unwrap();
            assert_eq!(count, 3);
        });
    }

    #[test]
    fn a_checkpointer_waiting_out_its_interval_stops_when_dropped() {
        let (_dir, path) = wal_database();
        within_test_timeout(move || {
            let checkpointer = Checkpointer::start(&path, SqliteSynchronous::Full).unwrap();
            checkpointer.committed();
            checkpointer.committed();
            drop(checkpointer); // joins the thread, whatever it was doing
        });
    }
}
