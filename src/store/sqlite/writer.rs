//! The single writer: one thread owns the write connection and applies every change, grouping
//! whatever is waiting into one transaction (group commit).
//!
//! Callers send a [`Change`] with a oneshot reply. The thread takes the first waiting change,
//! drains more without blocking (bounded by [`MAX_GROUP_CHANGES`] and [`MAX_GROUP_BYTES`]) and
//! applies them in one `BEGIN IMMEDIATE … COMMIT`, each inside its own `SAVEPOINT`, so a change
//! that fails (a gap in offsets, an action id already recorded) is rolled back alone and gets its
//! own error while the others commit. Replies go out only after `COMMIT` has returned, so an
//! acknowledged change is as durable as the `synchronous` mode makes it; a burst of frames from
//! many sessions costs one transaction (and, with FULL, one sync).
//!
//! When nothing waits and the connection is free, a caller may instead apply its change itself
//! ([`SharedWriter::try_commit_now`]): a group of one, under the same lock, without the two
//! thread hand-offs of the queue. That is a turn's common case — one session writing at a
//! time — and the hand-offs were most of a commit's latency on a busy machine. It is used only
//! where a commit never syncs (`synchronous=NORMAL`), so it never blocks its caller's thread
//! for long; under load the queue fills and group commit takes over.

use std::sync::{
    Arc, Mutex, MutexGuard,
    atomic::{AtomicU64, Ordering},
};

use rusqlite::{Connection, ToSql};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::{
    checkpointer::Checkpointer,
    rows::{Context, action_id_bytes},
};
use crate::{
    domain::{Error, ErrorCode, Result, session::SessionRecord},
    store::{Batch, QueueOp, StoreError, context_to_json, to_micros, work_to_json},
};

/// At most this many changes share one transaction.
pub(super) const MAX_GROUP_CHANGES: usize = 512;
/// A group stops growing once its changes carry about this many bytes of payload.
pub(super) const MAX_GROUP_BYTES: usize = 32 << 20;

/// A change applied by the writer.
// Commits are nearly every change, so they stay unboxed: boxing the large variant would add an
// allocation per commit on the hot path to shrink the rare ones.
#[allow(clippy::large_enum_variant)]
pub(super) enum Change {
    Create(Box<SessionRecord>),
    Commit(Uuid, Batch),
    Delete(Uuid),
}

impl Change {
    /// A rough size of the payload, to bound a group's memory and transaction size.
    pub(super) fn weight(&self) -> usize {
        match self {
            Self::Create(_) | Self::Delete(_) => 256,
            Self::Commit(_, batch) => {
                256 + batch
                    .entries
                    .iter()
                    .map(|e| e.json.len() + e.actor.len() + 64)
                    .sum::<usize>()
                    + batch
                        .new_actions
                        .iter()
                        .map(|a| a.fingerprint.len() + 64)
                        .sum::<usize>()
                    + batch.queue.len() * 512
            }
        }
    }
}

/// Where a change's outcome goes.
pub(super) enum Reply {
    Done(oneshot::Sender<Result<()>>),
    Existed(oneshot::Sender<Result<bool>>),
}

impl Reply {
    fn send(self, outcome: Result<bool>) {
        // A caller that stopped waiting no longer cares; the change stands either way.
        match self {
            Self::Done(tx) => {
                let _ = tx.send(outcome.map(|_| ()));
            }
            Self::Existed(tx) => {
                let _ = tx.send(outcome);
            }
        }
    }
}

/// What the writer thread receives.
#[allow(clippy::large_enum_variant)] // as for `Change`
pub(super) enum WriteOp {
    Change(Change, Reply),
    /// Reports the connection's `PRAGMA synchronous` (1 = NORMAL, 2 = FULL).
    Synchronous(oneshot::Sender<Result<i64>>),
    /// Finishes everything sent before, checkpoints the WAL and stops.
    Close(oneshot::Sender<Result<()>>),
    /// Retention: deletes up to `limit` sessions closed before `before` (microseconds) in one
    /// transaction of its own, never grouped with commits; the ids deleted.
    Expire {
        before: i64,
        limit: usize,
        reply: oneshot::Sender<Result<Vec<Uuid>>>,
    },
    /// Gives up to `max_pages` free pages back to the file system (incremental vacuum, when the
    /// file was created with it); the pages given back.
    Reclaim {
        max_pages: u64,
        reply: oneshot::Sender<Result<u64>>,
    },
    /// Tests: holds the writer until `resume` fires, so changes pile up into one group.
    #[cfg(test)]
    Pause {
        paused: oneshot::Sender<()>,
        resume: oneshot::Receiver<()>,
    },
}

pub(super) struct Writer {
    conn: Connection,
    transactions: Arc<AtomicU64>,
    checkpointer: Checkpointer,
    group: Vec<(Change, Reply)>,
    outcomes: Vec<(Reply, Result<bool>)>,
    /// Outcomes of the last group, sent once the lock is let go: a caller woken by its answer
    /// then finds the writer free.
    answers: Vec<(Reply, Result<bool>)>,
    /// Closed: the final checkpoint ran; nothing is applied after it.
    stopped: bool,
}

/// Sends the answers of a group (after the writer's lock is let go).
fn answer(answers: Vec<(Reply, Result<bool>)>) {
    for (reply, outcome) in answers {
        reply.send(outcome);
    }
}

/// The writer, shared by its thread and by callers committing at once when it is free.
#[derive(Clone)]
pub(super) struct SharedWriter(Arc<Mutex<Writer>>);

impl SharedWriter {
    pub(super) fn new(writer: Writer) -> Self {
        Self(Arc::new(Mutex::new(writer)))
    }

    fn lock(&self) -> MutexGuard<'_, Writer> {
        // A panic while applying left at worst an open transaction, which the next group
        // rolls back before it begins.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `change` now, on the caller's thread, as a group of one — if the writer is free
    /// this instant. `Err(change)` gives it back to be queued instead.
    // The change comes back as it went in: boxing it would cost an allocation per commit.
    #[allow(clippy::result_large_err)]
    pub(super) fn try_commit_now(&self, change: Change) -> std::result::Result<Result<()>, Change> {
        let mut writer = match self.0.try_lock() {
            Ok(writer) => writer,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Err(change),
        };
        if writer.stopped {
            return Err(change);
        }
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        writer.group.push((change, Reply::Done(tx)));
        writer.run_group();
        let answers = std::mem::take(&mut writer.answers);
        drop(writer);
        answer(answers);
        Ok(rx.try_recv().unwrap_or_else(|_| {
            Err(StoreError::task("sqlite store: a commit applied in place gave no outcome").into())
        }))
    }

    /// The thread's loop: runs until [`WriteOp::Close`] or until every sender is gone. The lock
    /// is held per operation (a whole group), never while waiting for one.
    pub(super) fn run(self, mut rx: mpsc::Receiver<WriteOp>) {
        let mut carried: Option<WriteOp> = None;
        loop {
            let op = match carried.take() {
                Some(op) => op,
                None => match rx.blocking_recv() {
                    Some(op) => op,
                    None => break,
                },
            };
            let (next, answers, stopped) = {
                let mut writer = self.lock();
                let next = writer.handle(op, &mut rx);
                (next, std::mem::take(&mut writer.answers), writer.stopped)
            };
            answer(answers);
            carried = next;
            if stopped {
                return;
            }
        }
        let mut writer = self.lock();
        writer.stopped = true;
        if let Err(e) = writer.checkpoint() {
            tracing::warn!(error = %e, "sqlite store: final checkpoint failed");
        }
    }
}

impl Writer {
    pub(super) fn new(
        conn: Connection,
        transactions: Arc<AtomicU64>,
        checkpointer: Checkpointer,
    ) -> Self {
        Self {
            conn,
            transactions,
            checkpointer,
            group: Vec::with_capacity(MAX_GROUP_CHANGES),
            outcomes: Vec::with_capacity(MAX_GROUP_CHANGES),
            answers: Vec::new(),
            stopped: false,
        }
    }

    /// Handles one operation taken from the queue (a change drains more into its group); an
    /// operation taken while draining that is not a change is given back, to be handled next.
    fn handle(&mut self, op: WriteOp, rx: &mut mpsc::Receiver<WriteOp>) -> Option<WriteOp> {
        let mut carried = None;
        match op {
            WriteOp::Change(change, reply) => {
                let mut bytes = change.weight();
                self.group.push((change, reply));
                while self.group.len() < MAX_GROUP_CHANGES && bytes < MAX_GROUP_BYTES {
                    match rx.try_recv() {
                        Ok(WriteOp::Change(change, reply)) => {
                            bytes += change.weight();
                            self.group.push((change, reply));
                        }
                        Ok(other) => {
                            carried = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                self.run_group();
            }
            WriteOp::Synchronous(reply) => {
                let _ = reply.send(
                    self.conn
                        .pragma_query_value(None, "synchronous", |row| row.get(0))
                        .context("reading PRAGMA synchronous"),
                );
            }
            WriteOp::Close(reply) => {
                self.stopped = true;
                let _ = reply.send(self.checkpoint());
            }
            WriteOp::Expire {
                before,
                limit,
                reply,
            } => {
                let _ = reply.send(self.expire(before, limit));
            }
            WriteOp::Reclaim { max_pages, reply } => {
                let _ = reply.send(self.reclaim(max_pages));
            }
            #[cfg(test)]
            WriteOp::Pause { paused, resume } => {
                // Held with the lock, so nobody commits in place meanwhile either.
                let _ = paused.send(());
                let _ = resume.blocking_recv();
            }
        }
        carried
    }

    /// The final checkpoint, emptying the WAL, once the checkpointer thread has stopped.
    fn checkpoint(&mut self) -> Result<()> {
        self.checkpointer.stop();
        self.conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .context("checkpointing the WAL")
    }

    /// One retention batch, in a transaction of its own: the cascade deletes each session's
    /// log, queue, labels, editors and action ids with it.
    fn expire(&mut self, before: i64, limit: usize) -> Result<Vec<Uuid>> {
        if !self.conn.is_autocommit() {
            let _ = self.exec("ROLLBACK");
        }
        self.exec("BEGIN IMMEDIATE")
            .map_err(|e| internal("starting a retention batch", e))?;
        let deleted = expire_batch(&self.conn, before, limit);
        let finished = deleted.and_then(|ids| {
            self.exec("COMMIT")
                .map_err(|e| internal("committing a retention batch", e))?;
            Ok(ids)
        });
        match &finished {
            Ok(_) => {
                self.transactions.fetch_add(1, Ordering::Relaxed);
                self.checkpointer.committed();
            }
            Err(_) if !self.conn.is_autocommit() => {
                let _ = self.exec("ROLLBACK");
            }
            Err(_) => {}
        }
        finished
    }

    /// Incremental vacuum of at most `max_pages` free pages, when the file has it turned on
    /// (files created before it keep reusing their free pages instead; see docs/operations.md).
    fn reclaim(&mut self, max_pages: u64) -> Result<u64> {
        let pragma = |name: &str| -> Result<i64> {
            self.conn
                .pragma_query_value(None, name, |row| row.get(0))
                .context("reading the free pages")
        };
        const INCREMENTAL: i64 = 2;
        if pragma("auto_vacuum")? != INCREMENTAL {
            return Ok(0);
        }
        let free = pragma("freelist_count")?;
        let pages = u64::try_from(free).unwrap_or(0).min(max_pages);
        if pages == 0 {
            return Ok(0);
        }
        // The pragma frees pages as it is stepped: step it to the end.
        let mut stmt = self
            .conn
            .prepare(&format!("PRAGMA incremental_vacuum({pages})"))
            .context("reclaiming free pages")?;
        let mut rows = stmt.query([]).context("reclaiming free pages")?;
        while rows.next().context("reclaiming free pages")?.is_some() {}
        drop(rows);
        drop(stmt);
        self.checkpointer.committed();
        Ok(u64::try_from(free - pragma("freelist_count")?).unwrap_or(0))
    }

    fn exec(&self, sql: &str) -> rusqlite::Result<()> {
        self.conn.prepare_cached(sql)?.execute([]).map(|_| ())
    }

    /// Applies the waiting group in one transaction and answers every change once it is durable.
    fn run_group(&mut self) {
        let mut group = std::mem::take(&mut self.group);
        let mut outcomes = std::mem::take(&mut self.outcomes);
        if !self.conn.is_autocommit() {
            // Left over from a failure that could not even roll back: start clean.
            let _ = self.exec("ROLLBACK");
        }
        if let Err(e) = self.exec("BEGIN IMMEDIATE") {
            let error = internal("starting a transaction", e);
            for (_, reply) in group.drain(..) {
                self.answers.push((reply, Err(error.clone())));
            }
            self.group = group;
            return;
        }
        let mut aborted: Option<Error> = None;
        // A change alone in its group needs no savepoint: if it fails, rolling the transaction
        // back undoes exactly it. That is the common case (one session writing at a time) and
        // saves two statements per commit.
        let alone = group.len() == 1;
        for (change, reply) in group.drain(..) {
            if let Some(error) = &aborted {
                outcomes.push((reply, Err(error.clone())));
                continue;
            }
            if alone {
                let outcome = self.apply(change);
                if let Err(error) = &outcome {
                    aborted = Some(error.clone());
                }
                outcomes.push((reply, outcome));
                continue;
            }
            let (outcome, intact) = self.apply_alone(change);
            if !intact || self.conn.is_autocommit() {
                // A hard failure (I/O, disk full) rolled the whole transaction back, or left it
                // in a state that must not be committed.
                // Not these changes' fault: nothing of them was stored, and they may be retried.
                aborted = Some(
                    StoreError::Unavailable {
                        message: "sqlite store: the write transaction was abandoned after a \
                                  database failure"
                            .to_owned(),
                        source: None,
                    }
                    .into(),
                );
            }
            outcomes.push((reply, outcome));
        }
        let finished = match aborted {
            Some(error) => {
                if !self.conn.is_autocommit() {
                    let _ = self.exec("ROLLBACK");
                }
                Err(error)
            }
            None => match self.exec("COMMIT") {
                Ok(()) => {
                    self.transactions.fetch_add(1, Ordering::Relaxed);
                    self.checkpointer.committed();
                    Ok(())
                }
                Err(e) => {
                    if !self.conn.is_autocommit() {
                        let _ = self.exec("ROLLBACK");
                    }
                    Err(internal("committing a transaction", e))
                }
            },
        };
        for (reply, outcome) in outcomes.drain(..) {
            let answer = match (&finished, outcome) {
                (Ok(()), outcome) => outcome,
                // A change that failed on its own keeps its own error; the others were lost.
                (Err(_), Err(own)) => Err(own),
                (Err(error), Ok(_)) => Err(error.clone()),
            };
            self.answers.push((reply, answer));
        }
        self.group = group;
        self.outcomes = outcomes;
    }

    /// Applies one change within the open transaction.
    fn apply(&self, change: Change) -> Result<bool> {
        match change {
            Change::Create(record) => create(&self.conn, &record).map(|()| true),
            Change::Commit(session_id, batch) => {
                commit(&self.conn, session_id, batch).map(|()| true)
            }
            Change::Delete(session_id) => delete(&self.conn, session_id),
        }
    }

    /// Applies one change inside its own savepoint: all of it, or none of it. The flag says
    /// whether the surrounding transaction is still fit to commit.
    fn apply_alone(&self, change: Change) -> (Result<bool>, bool) {
        if let Err(e) = self.exec("SAVEPOINT change") {
            return (Err(internal("opening a savepoint", e)), false);
        }
        let outcome = self.apply(change);
        if self.conn.is_autocommit() {
            return (outcome, false);
        }
        if outcome.is_err()
            && let Err(e) = self.exec("ROLLBACK TO change")
        {
            return (Err(internal("rolling back a failed change", e)), false);
        }
        if let Err(e) = self.exec("RELEASE change") {
            return (Err(internal("releasing a savepoint", e)), false);
        }
        (outcome, true)
    }
}

fn internal(doing: &str, e: rusqlite::Error) -> Error {
    StoreError::Sqlite {
        message: format!("sqlite store: {doing}: {}", super::rows::describe(&e)),
        source: e,
    }
    .into()
}

fn session_pk(conn: &Connection, session_id: Uuid) -> Result<Option<i64>> {
    let mut stmt = conn
        .prepare_cached("SELECT pk FROM sessions WHERE id = ?1")
        .context("looking up a session")?;
    let mut rows = stmt
        .query([&session_id.as_bytes()[..]])
        .context("looking up a session")?;
    match rows.next().context("looking up a session")? {
        Some(row) => Ok(Some(row.get(0).context("looking up a session")?)),
        None => Ok(None),
    }
}

/// Runs `f` with the record's columns bound as `?2 … ?15` after `key` as `?1`.
fn with_record_params<R>(
    key: &dyn ToSql,
    record: &SessionRecord,
    f: impl FnOnce(&[&dyn ToSql]) -> R,
) -> R {
    let status = record.status.as_str();
    let created_at = to_micros(record.created_at);
    let updated_at = to_micros(record.updated_at);
    f(&[
        key,
        &record.name,
        &record.owner,
        &record.profile,
        &record.cwd,
        &record.model,
        &record.acp_session_id,
        &status,
        &record.status_reason,
        &created_at,
        &updated_at,
        &record.profile_fingerprint,
        &record.request_fingerprint,
        &record.can_resume,
        &record.can_load,
    ])
}

fn write_side_rows(conn: &Connection, pk: i64, record: &SessionRecord) -> Result<()> {
    let mut labels = conn
        .prepare_cached("INSERT INTO session_labels (session_pk, key, value) VALUES (?1, ?2, ?3)")
        .context("storing session labels")?;
    for (key, value) in &record.labels {
        labels
            .execute((pk, key, value))
            .context("storing session labels")?;
    }
    let mut editors = conn
        .prepare_cached(
            "INSERT INTO session_editors (session_pk, position, principal) VALUES (?1, ?2, ?3)",
        )
        .context("storing session editors")?;
    for (position, principal) in record.editors.iter().enumerate() {
        editors
            .execute((pk, position as i64, principal))
            .context("storing session editors")?;
    }
    Ok(())
}

fn create(conn: &Connection, record: &SessionRecord) -> Result<()> {
    let id = record.id.as_bytes();
    let inserted = with_record_params(&&id[..], record, |params| {
        conn.prepare_cached(
            "INSERT INTO sessions (id, name, owner, profile, cwd, model, acp_session_id, status, \
             status_reason, created_at, updated_at, profile_fingerprint, request_fingerprint, \
             can_resume, can_load) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15) \
             ON CONFLICT (id) DO NOTHING",
        )?
        .execute(params)
    })
    .context("storing a new session")?;
    if inserted == 0 {
        return Err(Error::new(
            ErrorCode::SessionExists,
            format!("session {} already exists", record.id),
        ));
    }
    let pk = conn.last_insert_rowid();
    if let Some(first) = record.first_action_id {
        conn.prepare_cached("UPDATE sessions SET first_action_id = ?2 WHERE pk = ?1")
            .and_then(|mut stmt| stmt.execute((pk, first.to_string())))
            .context("storing a new session")?;
    }
    if let Some(home) = &record.home {
        conn.prepare_cached("UPDATE sessions SET home = ?2 WHERE pk = ?1")
            .and_then(|mut stmt| stmt.execute((pk, home)))
            .context("storing a new session")?;
    }
    write_side_rows(conn, pk, record)
}

fn replace_record(
    conn: &Connection,
    pk: i64,
    session_id: Uuid,
    record: &SessionRecord,
) -> Result<()> {
    if record.id != session_id {
        return Err(StoreError::refused(format!(
            "sqlite store: a batch for session {session_id} carries the record of session {}",
            record.id
        ))
        .into());
    }
    // A status change is most of what a turn writes to the record. SQLite rewrites an index's
    // entry whenever an UPDATE assigns one of its columns, even to the same value, so the
    // indexed columns (owner, status, created_at) are assigned only when they changed, and the
    // labels and editors are rewritten only when they changed: a turn's commit then dirties the
    // pages it must, not every index of `sessions` and both side tables.
    let status = record.status.as_str();
    let updated_at = to_micros(record.updated_at);
    conn.prepare_cached(
        "UPDATE sessions SET name = ?2, profile = ?3, cwd = ?4, model = ?5, acp_session_id = ?6, \
         status_reason = ?7, updated_at = ?8, profile_fingerprint = ?9, \
         request_fingerprint = ?10, can_resume = ?11, can_load = ?12 WHERE pk = ?1",
    )
    .and_then(|mut stmt| {
        stmt.execute(rusqlite::params![
            pk,
            record.name,
            record.profile,
            record.cwd,
            record.model,
            record.acp_session_id,
            record.status_reason,
            updated_at,
            record.profile_fingerprint,
            record.request_fingerprint,
            record.can_resume,
            record.can_load,
        ])
    })
    .context("replacing a session record")?;
    conn.prepare_cached("UPDATE sessions SET status = ?2 WHERE pk = ?1 AND status IS NOT ?2")
        .and_then(|mut stmt| stmt.execute((pk, status)))
        .context("replacing a session record")?;
    conn.prepare_cached(
        "UPDATE sessions SET owner = ?2, created_at = ?3 \
         WHERE pk = ?1 AND (owner IS NOT ?2 OR created_at IS NOT ?3)",
    )
    .and_then(|mut stmt| stmt.execute((pk, &record.owner, to_micros(record.created_at))))
    .context("replacing a session record")?;
    if side_rows_differ(conn, pk, record)? {
        conn.prepare_cached("DELETE FROM session_labels WHERE session_pk = ?1")
            .and_then(|mut stmt| stmt.execute([pk]))
            .context("replacing session labels")?;
        conn.prepare_cached("DELETE FROM session_editors WHERE session_pk = ?1")
            .and_then(|mut stmt| stmt.execute([pk]))
            .context("replacing session editors")?;
        write_side_rows(conn, pk, record)?;
    }
    Ok(())
}

/// Whether the stored labels or editors differ from the record's (reads only: no page is
/// dirtied when they are the same).
fn side_rows_differ(conn: &Connection, pk: i64, record: &SessionRecord) -> Result<bool> {
    let (labels, editors) = super::rows::side_rows(conn, pk, record.id)?;
    Ok(labels != record.labels || editors != record.editors)
}

fn delete(conn: &Connection, session_id: Uuid) -> Result<bool> {
    let deleted = conn
        .prepare_cached("DELETE FROM sessions WHERE id = ?1")
        .and_then(|mut stmt| stmt.execute([&session_id.as_bytes()[..]]))
        .context("deleting a session")?;
    Ok(deleted > 0)
}

/// Closed sessions last changed before `?1`, oldest first, at most `?2`. The status is a literal
/// so the planner may use `sessions_closed_by_time`.
pub(super) const EXPIRED_SESSIONS: &str = "SELECT id FROM sessions WHERE status = 'closed' \
     AND updated_at < ?1 ORDER BY updated_at LIMIT ?2";

fn expire_batch(conn: &Connection, before: i64, limit: usize) -> Result<Vec<Uuid>> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut select = conn
        .prepare_cached(EXPIRED_SESSIONS)
        .context("finding expired sessions")?;
    let ids = select
        .query_map((before, limit), |row| row.get::<_, Vec<u8>>(0))
        .context("finding expired sessions")?
        .map(|id| {
            let id = id.context("finding expired sessions")?;
            Uuid::from_slice(&id)
                .map_err(|_| super::rows::corrupt("a stored session id is not a UUID"))
        })
        .collect::<Result<Vec<Uuid>>>()?;
    for id in &ids {
        delete(conn, *id)?;
    }
    Ok(ids)
}

fn head_offset(conn: &Connection, pk: i64) -> Result<u64> {
    let mut stmt = conn
        .prepare_cached("SELECT offset FROM log WHERE session_pk = ?1 ORDER BY offset DESC LIMIT 1")
        .context("reading the log head")?;
    let mut rows = stmt.query([pk]).context("reading the log head")?;
    match rows.next().context("reading the log head")? {
        None => Ok(0),
        Some(row) => {
            let head: i64 = row.get(0).context("reading the log head")?;
            u64::try_from(head)
                .map_err(|_| super::rows::corrupt(format!("log head offset {head} is negative")))
        }
    }
}

pub(super) fn commit(conn: &Connection, session_id: Uuid, batch: Batch) -> Result<()> {
    let pk = session_pk(conn, session_id)?
        .ok_or_else(|| Error::session_not_found(&session_id.to_string()))?;

    if let Some(first) = batch.entries.first() {
        let head = head_offset(conn, pk)?;
        for (i, entry) in batch.entries.iter().enumerate() {
            if entry.offset != head + 1 + i as u64 {
                return Err(StoreError::refused(format!(
                    "log offsets must continue densely from {head}: got {}",
                    entry.offset
                ))
                .into());
            }
        }
        if i64::try_from(first.offset + batch.entries.len() as u64).is_err() {
            return Err(StoreError::refused("log offsets exceed the stored range").into());
        }
        let mut insert = conn
            .prepare_cached(
                "INSERT INTO log (session_pk, offset, direction, actor, action_id, epoch, \
                 created_at, json) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .context("appending to the log")?;
        for entry in &batch.entries {
            let action_id = entry.action_id.as_ref().map(action_id_bytes);
            insert
                .execute((
                    pk,
                    entry.offset as i64,
                    entry.direction.as_i64(),
                    &entry.actor,
                    action_id,
                    i64::from(entry.epoch),
                    to_micros(entry.created_at),
                    &entry.json,
                ))
                .context("appending to the log")?;
        }
    }

    for op in &batch.queue {
        queue_op(conn, pk, op)?;
    }

    if !batch.new_actions.is_empty() {
        let mut insert = conn
            .prepare_cached(
                "INSERT INTO actions (session_pk, action_id, state, created_at, fingerprint) \
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (session_pk, action_id) DO NOTHING",
            )
            .context("recording an action id")?;
        for action in &batch.new_actions {
            let inserted = insert
                .execute((
                    pk,
                    action_id_bytes(&action.action_id),
                    action.state.as_str(),
                    to_micros(action.created_at),
                    &action.fingerprint,
                ))
                .context("recording an action id")?;
            if inserted == 0 {
                return Err(Error::new(
                    ErrorCode::ActionIdConflict,
                    format!("action id {} is already recorded", action.action_id),
                ));
            }
        }
    }

    if !batch.action_states.is_empty() {
        let mut update = conn
            .prepare_cached(
                "UPDATE actions SET state = ?3 WHERE session_pk = ?1 AND action_id = ?2",
            )
            .context("updating an action state")?;
        for (action_id, state) in &batch.action_states {
            update
                .execute((pk, action_id_bytes(action_id), state.as_str()))
                .context("updating an action state")?;
        }
    }

    if !batch.usage.is_empty() {
        let mut insert = conn
            .prepare_cached(
                "INSERT INTO usage_records (session_id, principal, profile, at, input_tokens, \
                 output_tokens, cost_micros, currency, source, action_id) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )
            .context("recording usage")?;
        for usage in &batch.usage {
            insert
                .execute((
                    &usage.session_id.as_bytes()[..],
                    &usage.principal,
                    &usage.profile,
                    to_micros(usage.at),
                    usage.input_tokens.min(i64::MAX as u64) as i64,
                    usage.output_tokens.min(i64::MAX as u64) as i64,
                    usage.cost_micros,
                    &usage.currency,
                    usage.source.as_str(),
                    usage
                        .action_id
                        .as_ref()
                        .map(|id| action_id_bytes(id).to_vec()),
                ))
                .context("recording usage")?;
        }
    }

    if let Some(record) = &batch.session {
        replace_record(conn, pk, session_id, record)?;
    }
    Ok(())
}

fn queue_op(conn: &Connection, pk: i64, op: &QueueOp) -> Result<()> {
    match op {
        QueueOp::PushBack(entry) | QueueOp::PushFront(entry) => {
            let sql = if matches!(op, QueueOp::PushBack(_)) {
                "INSERT INTO queue (session_pk, action_id, position, actor, created_at, \
                 traceparent, context, work) VALUES (?1, ?2, \
                 (SELECT COALESCE(MAX(position), 0) + 1 FROM queue WHERE session_pk = ?1), \
                 ?3, ?4, ?5, ?6, ?7)"
            } else {
                "INSERT INTO queue (session_pk, action_id, position, actor, created_at, \
                 traceparent, context, work) VALUES (?1, ?2, \
                 (SELECT COALESCE(MIN(position), 1) - 1 FROM queue WHERE session_pk = ?1), \
                 ?3, ?4, ?5, ?6, ?7)"
            };
            conn.prepare_cached(sql)
                .and_then(|mut stmt| {
                    stmt.execute((
                        pk,
                        action_id_bytes(&entry.action_id),
                        &entry.actor,
                        to_micros(entry.created_at),
                        &entry.traceparent,
                        context_to_json(&entry.context),
                        work_to_json(entry),
                    ))
                })
                .context("queueing an action")?;
        }
        QueueOp::Update(entry) => {
            conn.prepare_cached(
                "UPDATE queue SET actor = ?3, created_at = ?4, traceparent = ?5, context = ?6, \
                 work = ?7 WHERE session_pk = ?1 AND action_id = ?2",
            )
            .and_then(|mut stmt| {
                stmt.execute((
                    pk,
                    action_id_bytes(&entry.action_id),
                    &entry.actor,
                    to_micros(entry.created_at),
                    &entry.traceparent,
                    context_to_json(&entry.context),
                    work_to_json(entry),
                ))
            })
            .context("editing a queued action")?;
        }
        QueueOp::Remove(action_id) => {
            conn.prepare_cached("DELETE FROM queue WHERE session_pk = ?1 AND action_id = ?2")
                .and_then(|mut stmt| stmt.execute((pk, action_id_bytes(action_id))))
                .context("removing a queued action")?;
        }
        QueueOp::Clear => {
            conn.prepare_cached("DELETE FROM queue WHERE session_pk = ?1")
                .and_then(|mut stmt| stmt.execute([pk]))
                .context("clearing the queue")?;
        }
    }
    Ok(())
}
