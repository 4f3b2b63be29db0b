//! The embedded default store on SQLite: one database file in the data
//! directory, WAL mode, `synchronous=NORMAL` by default (survives a process crash) or `FULL`
//! (also survives power loss).
//!
//! - **Writes** (`create_session`, `commit`, `delete_session`) go to a single writer thread that
//!   holds the only write connection and group-commits whatever is waiting: many batches, one
//!   transaction, one savepoint each, replies after `COMMIT`. A small commit that finds nothing
//!   waiting and the connection free is applied by its caller instead, under the same lock
//!   (see `sqlite/writer.rs`).
//! - **Reads** run on a small pool of read-only connections on tokio's blocking threads, so they
//!   never block the async runtime and never wait behind the writer (WAL readers see the last
//!   committed state).
//! - **Checkpoints** of the WAL into the database file run on a thread of their own, off the
//!   commit path (see `sqlite/checkpointer.rs`).
//! - **Schema**: versioned through `PRAGMA user_version` (see `sqlite/schema.rs`).

mod checkpointer;
mod rows;
mod schema;
mod writer;

#[cfg(test)]
mod tests;

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::UNIX_EPOCH,
};

use async_trait::async_trait;
use rusqlite::{Connection, OpenFlags, types::Value as SqlValue};
use tokio::sync::{Semaphore, mpsc, oneshot};
use uuid::Uuid;

use self::{
    rows::{Context, action_columns, log_columns, queue_columns, session_columns},
    writer::{Change, Reply, SharedWriter, WriteOp, Writer},
};
use super::{
    ActionRecord, Batch, CommitError, LogEntry, SessionQuery, Store, StoreError, UsageQuery,
    UsageRow, Wake, to_micros,
};
use crate::{
    domain::{
        ActionId, Error, Result,
        queue::QueuedEntry,
        session::{SessionRecord, SessionStatus},
    },
    store::SqliteSynchronous,
};

/// The file name the server uses inside its data directory.
pub const DB_FILE_NAME: &str = "agent-harness.sqlite3";

/// Whether SQLite failed for the state of its file or disk rather than for what was asked, so
/// the same request may succeed later: the disk is full, the file read-only, an I/O error, a
/// lock held too long.
pub(super) fn is_operational(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode::*;
    matches!(
        e.sqlite_error_code(),
        Some(DiskFull | ReadOnly | SystemIoFailure | DatabaseBusy | DatabaseLocked | CannotOpen)
    )
}

/// Read connections kept open (and reads running at once).
const READERS: usize = 4;
/// How many SQLite VM steps a read runs between looks at its deadline.
const READ_CHECK_STEPS: std::ffi::c_int = 1000;
/// Writes waiting for the writer before senders wait too.
const WRITE_QUEUE: usize = 4096;
/// The largest commit (payload bytes, roughly) applied in place rather than queued.
const COMMIT_IN_PLACE_BYTES: usize = 64 << 10;
/// Wake-ups buffered per stream fed by the store; one that lags is woken anyway.
const WAKES_BUFFER: usize = 1024;

/// The SQLite [`Store`].
pub struct SqliteStore {
    // Field order matters on drop: the sender goes first, so the writer drains what is queued,
    // checkpoints and stops; then `writer_thread` joins it.
    writes: mpsc::Sender<WriteOp>,
    readers: Arc<Readers>,
    transactions: Arc<AtomicU64>,
    closed: AtomicBool,
    path: PathBuf,
    /// How long one read may run before it is interrupted.
    statement_timeout: std::time::Duration,
    /// Tells the streams fed by the store what was committed (one process: no notification
    /// can be lost on the way, but a stream that lags is woken anyway).
    wakes: tokio::sync::broadcast::Sender<Wake>,
    /// The writer, for small commits applied in place when it is free (see `sqlite/writer.rs`).
    writer: SharedWriter,
    /// Commits never sync (`synchronous=NORMAL`), so applying one in place is short.
    commit_in_place: bool,
    /// Commits applied in place since open (for tests).
    applied_in_place: AtomicU64,
    writer_thread: WriterThread,
}

struct WriterThread(Mutex<Option<JoinHandle<()>>>);

impl WriterThread {
    fn take(&self) -> Option<JoinHandle<()>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

impl Drop for WriterThread {
    fn drop(&mut self) {
        if let Some(handle) = self.take() {
            let _ = handle.join();
        }
    }
}

/// Stops the read running on a connection, or about to: dropped (its caller went away), it
/// does so too. SQLite's progress handler asks it every [`READ_CHECK_STEPS`] VM steps.
#[derive(Default)]
struct Interrupter(Arc<AtomicBool>);

impl Drop for Interrupter {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The pool of read-only connections.
struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    permits: Arc<Semaphore>,
}

impl Readers {
    fn take(&self) -> Result<Connection> {
        if let Some(conn) = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(conn);
        }
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .context("opening a read connection")?;
        schema::configure_reader(&conn)?;
        Ok(conn)
    }

    fn give_back(&self, conn: Connection) {
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(conn);
    }
}

impl SqliteStore {
    /// Opens (creating it and its directory if needed) the database at `path`, brings its
    /// schema up to date and starts the writer thread. Blocking: call it at start-up.
    pub fn open(path: impl AsRef<Path>, synchronous: SqliteSynchronous) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            super::private::create_dir(dir).map_err(|e| StoreError::Task {
                message: format!(
                    "sqlite store: creating the directory {}: {e}",
                    dir.display()
                ),
                source: Some(e.into()),
            })?;
        }
        // Made before SQLite opens it, so it is 0600 whatever the umask; SQLite gives its WAL
        // and shared-memory files the same mode.
        super::private::create_file(&path).map_err(|e| StoreError::Task {
            message: format!("sqlite store: creating {}: {e}", path.display()),
            source: Some(e.into()),
        })?;
        let mut conn = Connection::open(&path).map_err(|e| StoreError::Sqlite {
            message: format!("sqlite store: opening {}: {e}", path.display()),
            source: e,
        })?;
        schema::configure_writer(&conn, synchronous)?;
        schema::migrate(&mut conn)?;
        if schema::auto_vacuum(&conn)? != 2 {
            tracing::info!(
                path = %path.display(),
                "sqlite store: the file predates incremental vacuum: space freed by deletes is reused, not given back (docs/operations.md)"
            );
        }

        let readers = Arc::new(Readers {
            path: path.clone(),
            idle: Mutex::new(Vec::with_capacity(READERS)),
            permits: Arc::new(Semaphore::new(READERS)),
        });
        // Fail now, not on the first read, if read connections cannot be opened.
        let reader = readers.take()?;
        readers.give_back(reader);

        let transactions = Arc::new(AtomicU64::new(0));
        let (writes, rx) = mpsc::channel(WRITE_QUEUE);
        let checkpointer = checkpointer::Checkpointer::start(&path, synchronous)?;
        let writer = SharedWriter::new(Writer::new(conn, transactions.clone(), checkpointer));
        let thread_writer = writer.clone();
        let handle = std::thread::Builder::new()
            .name("sqlite-writer".to_owned())
            .spawn(move || thread_writer.run(rx))
            .map_err(|e| StoreError::Task {
                message: format!("sqlite store: starting the writer: {e}"),
                source: Some(e.into()),
            })?;
        Ok(Self {
            writes,
            readers,
            transactions,
            closed: AtomicBool::new(false),
            path,
            statement_timeout: super::DEFAULT_STATEMENT_TIMEOUT,
            wakes: tokio::sync::broadcast::channel(WAKES_BUFFER).0,
            writer,
            commit_in_place: synchronous == SqliteSynchronous::Normal,
            applied_in_place: AtomicU64::new(0),
            writer_thread: WriterThread(Mutex::new(Some(handle))),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Interrupts any read running longer than `timeout` (default
    /// [`DEFAULT_STATEMENT_TIMEOUT`](super::DEFAULT_STATEMENT_TIMEOUT)).
    pub fn with_statement_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.statement_timeout = timeout;
        self
    }

    /// How many write transactions have committed since open. Group commit makes this smaller
    /// than the number of changes; exposed for tests and metrics.
    pub fn write_transactions(&self) -> u64 {
        self.transactions.load(Ordering::Relaxed)
    }

    /// The `synchronous` mode the write connection runs with.
    pub async fn synchronous(&self) -> Result<SqliteSynchronous> {
        let (tx, rx) = oneshot::channel();
        self.send(WriteOp::Synchronous(tx)).await?;
        match rx.await.map_err(|_| writer_stopped())?? {
            1 => Ok(SqliteSynchronous::Normal),
            2 => Ok(SqliteSynchronous::Full),
            other => Err(StoreError::corrupt(format!(
                "sqlite store: unexpected PRAGMA synchronous = {other}"
            ))
            .into()),
        }
    }

    /// Lets the writer finish every change sent before, checkpoints the WAL into the database
    /// file and stops the writer. Later writes fail; reads keep working. Dropping the store
    /// does the same, blocking the dropping thread until the writer is done.
    pub async fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let (tx, rx) = oneshot::channel();
        self.writes
            .send(WriteOp::Close(tx))
            .await
            .map_err(|_| writer_stopped())?;
        let checkpointed = rx.await.map_err(|_| writer_stopped())?;
        if let Some(handle) = self.writer_thread.take() {
            tokio::task::spawn_blocking(move || handle.join())
                .await
                .map_err(|e| StoreError::Task {
                    message: format!("sqlite store: joining the writer: {e}"),
                    source: Some(e.into()),
                })?
                .map_err(|_| StoreError::task("sqlite store: the writer thread panicked"))?;
        }
        checkpointed
    }

    async fn send(&self, op: WriteOp) -> Result<()> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(StoreError::closed("sqlite store: the store is closed").into());
        }
        self.writes.send(op).await.map_err(|_| writer_stopped())
    }

    async fn write(&self, change: Change) -> Result<()> {
        let change = match self.try_commit_now(change) {
            Ok(outcome) => return outcome,
            Err(change) => change,
        };
        let (tx, rx) = oneshot::channel();
        self.send(WriteOp::Change(change, Reply::Done(tx))).await?;
        rx.await.map_err(|_| writer_stopped())?
    }

    /// A small commit applied on this thread when nothing waits for the writer and it is free:
    /// a group of one without the hand-offs to the writer thread and back. Anything else
    /// (a sync per commit, a queue, a big batch, a deletion) goes through the queue.
    #[allow(clippy::result_large_err)] // as `SharedWriter::try_commit_now`
    fn try_commit_now(&self, change: Change) -> std::result::Result<Result<()>, Change> {
        let small =
            matches!(&change, Change::Commit(..)) && change.weight() <= COMMIT_IN_PLACE_BYTES;
        if !self.commit_in_place
            || !small
            || self.closed.load(Ordering::SeqCst)
            || self.writes.capacity() < self.writes.max_capacity()
        {
            return Err(change);
        }
        let outcome = self.writer.try_commit_now(change)?;
        self.applied_in_place.fetch_add(1, Ordering::Relaxed);
        Ok(outcome)
    }

    /// Runs `f` on a pooled read connection on a blocking thread.
    async fn read<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let permit = self
            .readers
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::closed("sqlite store: the read pool is closed"))?;
        let readers = self.readers.clone();
        // A read past the statement timeout is interrupted, as is one whose caller goes away
        // (this future is dropped), so no read holds a connection for nobody.
        let caller_gone = Interrupter::default();
        let stop = caller_gone.0.clone();
        let deadline = std::time::Instant::now() + self.statement_timeout;
        let done = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let mut conn = readers.take()?;
            let interrupted =
                move || stop.load(Ordering::Relaxed) || std::time::Instant::now() >= deadline;
            conn.progress_handler(READ_CHECK_STEPS, Some(interrupted))
                .context("setting the read deadline")?;
            let result = f(&conn);
            let cleared = conn
                .progress_handler(0, None::<fn() -> bool>)
                .context("clearing the read deadline");
            readers.give_back(conn);
            cleared.and(result)
        })
        .await;
        done.map_err(|e| StoreError::Task {
            message: format!("sqlite store: a read task failed: {e}"),
            source: Some(e.into()),
        })?
    }

    /// Tests: stops the writer until the returned sender fires (or drops), so that changes sent
    /// meanwhile are applied as one group.
    #[cfg(test)]
    pub(crate) async fn pause_writer(&self) -> oneshot::Sender<()> {
        let (paused_tx, paused_rx) = oneshot::channel();
        let (resume_tx, resume_rx) = oneshot::channel();
        self.send(WriteOp::Pause {
            paused: paused_tx,
            resume: resume_rx,
        })
        .await
        .expect("writer accepts a pause");
        paused_rx.await.expect("writer pauses");
        resume_tx
    }

    /// Tests: how many commits were applied in place rather than by the writer thread.
    #[cfg(test)]
    pub(crate) fn commits_applied_in_place(&self) -> u64 {
        self.applied_in_place.load(Ordering::Relaxed)
    }

    /// Tests: how many operations wait for the writer.
    #[cfg(test)]
    pub(crate) fn queued_writes(&self) -> usize {
        self.writes.max_capacity() - self.writes.capacity()
    }
}

/// A sum read as two: of the values' high bits (`x >> 31`) and of their low 31 bits. SQLite's
/// `sum()` fails the whole read with "integer overflow" past 2^63, and `total()` rounds past
/// 2^53; each half stays far from overflow for any number of rows SQLite can hold, and the
/// whole is put back together exactly, saturating at the bounds of `i64` (an agent's absurd
/// figures read as a huge sum, never as an error).
fn split_sum(high: i64, low: i64) -> i64 {
    let whole = i128::from(high) * (1 << 31) + i128::from(low);
    whole.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

fn writer_stopped() -> Error {
    StoreError::closed("sqlite store: the writer has stopped").into()
}

fn limit_of(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn get_session(conn: &Connection, session_id: Uuid) -> Result<Option<SessionRecord>> {
    let mut stmt = conn
        .prepare_cached(concat!(
            "SELECT ",
            session_columns!(),
            " FROM sessions s WHERE s.id = ?1"
        ))
        .context("reading a session")?;
    let mut rows = stmt
        .query([&session_id.as_bytes()[..]])
        .context("reading a session")?;
    let Some(row) = rows.next().context("reading a session")? else {
        return Ok(None);
    };
    let (pk, mut record) = rows::session(row)?;
    rows::session_side_rows(conn, pk, &mut record)?;
    Ok(Some(record))
}

/// Runs a session query and completes each record with its labels and editors.
fn query_sessions(conn: &Connection, sql: &str, params: &[SqlValue]) -> Result<Vec<SessionRecord>> {
    let mut stmt = conn.prepare_cached(sql).context("listing sessions")?;
    let mut rows = stmt
        .query(rusqlite::params_from_iter(params))
        .context("listing sessions")?;
    let mut found = Vec::new();
    while let Some(row) = rows.next().context("listing sessions")? {
        found.push(rows::session(row)?);
    }
    let mut records = Vec::with_capacity(found.len());
    for (pk, mut record) in found {
        rows::session_side_rows(conn, pk, &mut record)?;
        records.push(record);
    }
    Ok(records)
}

/// The SQL and parameters of a [`SessionQuery`]: every filter ANDed, newest first, keyset paged.
fn list_sql(query: &SessionQuery) -> (String, Vec<SqlValue>) {
    let mut sql = String::from(concat!(
        "SELECT ",
        session_columns!(),
        " FROM sessions s WHERE 1"
    ));
    let mut params = Vec::new();
    if let Some(principal) = &query.owner_or_editor {
        params.push(SqlValue::Text(principal.clone()));
        let p = params.len();
        sql.push_str(&format!(
            " AND (s.owner = ?{p} OR EXISTS (SELECT 1 FROM session_editors e \
             WHERE e.session_pk = s.pk AND e.principal = ?{p}))"
        ));
    }
    if !query.statuses.is_empty() {
        sql.push_str(" AND s.status IN (");
        for (i, status) in query.statuses.iter().enumerate() {
            params.push(SqlValue::Text(status.as_str().to_owned()));
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&format!("?{}", params.len()));
        }
        sql.push(')');
    }
    for (key, value) in &query.labels {
        params.push(SqlValue::Text(key.clone()));
        params.push(SqlValue::Text(value.clone()));
        let (k, v) = (params.len() - 1, params.len());
        sql.push_str(&format!(
            " AND EXISTS (SELECT 1 FROM session_labels l \
             WHERE l.session_pk = s.pk AND l.key = ?{k} AND l.value = ?{v})"
        ));
    }
    if let Some((created_at, id)) = &query.after {
        // Times are stored in whole microseconds. A position between two of them is the same
        // as "before the next microsecond, below every id".
        let whole = created_at
            .duration_since(UNIX_EPOCH)
            .is_ok_and(|since| since.subsec_nanos() % 1_000 == 0);
        let (micros, id) = if whole {
            (to_micros(*created_at), *id)
        } else {
            (to_micros(*created_at) + 1, Uuid::nil())
        };
        params.push(SqlValue::Integer(micros));
        params.push(SqlValue::Blob(id.as_bytes().to_vec()));
        let (t, i) = (params.len() - 1, params.len());
        sql.push_str(&format!(" AND (s.created_at, s.id) < (?{t}, ?{i})"));
    }
    params.push(SqlValue::Integer(limit_of(query.page_size)));
    sql.push_str(&format!(
        " ORDER BY s.created_at DESC, s.id DESC LIMIT ?{}",
        params.len()
    ));
    (sql, params)
}

/// An owner's live sessions, as all of them minus the closed ones: both counts read an index
/// only (see the schema's version 4). The status is a literal so the planner may use the
/// partial index (the connections keep their plans stable, so a bound value would not).
pub(super) const COUNT_LIVE_SESSIONS: &str = "SELECT (SELECT count(*) FROM sessions WHERE owner = ?1) \
     - (SELECT count(*) FROM sessions WHERE owner = ?1 AND status = 'closed')";

#[async_trait]
impl Store for SqliteStore {
    async fn create_session(&self, record: &SessionRecord) -> Result<()> {
        self.write(Change::Create(Box::new(record.clone()))).await
    }

    async fn commit(&self, session_id: Uuid, batch: Batch) -> Result<(), CommitError> {
        let head = batch.entries.last().map_or(0, |e| e.offset);
        self.write(Change::Commit(session_id, batch)).await?;
        let _ = self.wakes.send(Wake {
            session: session_id,
            head,
        });
        Ok(())
    }

    async fn get_session(&self, session_id: Uuid) -> Result<Option<SessionRecord>> {
        self.read(move |conn| get_session(conn, session_id)).await
    }

    async fn list_sessions(&self, query: &SessionQuery) -> Result<Vec<SessionRecord>> {
        if query.page_size == 0 {
            return Ok(Vec::new());
        }
        let (sql, params) = list_sql(query);
        self.read(move |conn| query_sessions(conn, &sql, &params))
            .await
    }

    async fn count_live_sessions(&self, owner: &str) -> Result<u64> {
        let owner = owner.to_owned();
        self.read(move |conn| {
            let count: i64 = conn
                .prepare_cached(COUNT_LIVE_SESSIONS)
                .and_then(|mut stmt| stmt.query_row([&owner], |row| row.get(0)))
                .context("counting live sessions")?;
            Ok(count as u64)
        })
        .await
    }

    async fn usage(&self, query: &UsageQuery) -> Result<Vec<UsageRow>> {
        let query = query.clone();
        self.read(move |conn| {
            let principal = query.principal.as_deref();
            let session = query.session_id.map(|id| id.as_bytes().to_vec());
            let since = query.since.map(to_micros);
            let mut stmt = conn
                .prepare_cached(
                    "SELECT session_id, principal, profile, currency, \
                     sum(input_tokens >> 31), sum(input_tokens & 2147483647), \
                     sum(output_tokens >> 31), sum(output_tokens & 2147483647), \
                     sum(cost_micros >> 31), sum(cost_micros & 2147483647), source \
                     FROM usage_records \
                     WHERE (?1 IS NULL OR principal = ?1) AND (?2 IS NULL OR session_id = ?2) \
                     AND (?3 IS NULL OR at >= ?3) \
                     GROUP BY session_id, principal, profile, source, currency",
                )
                .context("reading usage")?;
            let rows = stmt
                .query_map((principal, session, since), |row| {
                    let id: Vec<u8> = row.get(0)?;
                    let sum = |at: usize| -> rusqlite::Result<i64> {
                        Ok(split_sum(row.get(at)?, row.get(at + 1)?))
                    };
                    Ok(UsageRow {
                        session_id: Uuid::from_slice(&id).unwrap_or_default(),
                        principal: row.get(1)?,
                        profile: row.get(2)?,
                        currency: row.get(3)?,
                        source: crate::domain::usage::UsageSource::parse(
                            &row.get::<_, String>(10)?,
                        ),
                        input_tokens: sum(4)?.max(0) as u64,
                        output_tokens: sum(6)?.max(0) as u64,
                        cost_micros: sum(8)?,
                    })
                })
                .context("reading usage")?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
                .context("reading usage")
        })
        .await
    }

    async fn open_sessions(&self) -> Result<Vec<SessionRecord>> {
        self.read(|conn| {
            query_sessions(
                conn,
                concat!(
                    "SELECT ",
                    session_columns!(),
                    " FROM sessions s WHERE s.status <> ?1 ORDER BY s.created_at, s.id"
                ),
                &[SqlValue::Text(SessionStatus::Closed.as_str().to_owned())],
            )
        })
        .await
    }

    async fn delete_session(&self, session_id: Uuid) -> Result<bool> {
        let (tx, rx) = oneshot::channel();
        self.send(WriteOp::Change(
            Change::Delete(session_id),
            Reply::Existed(tx),
        ))
        .await?;
        let existed = rx.await.map_err(|_| writer_stopped())??;
        let _ = self.wakes.send(Wake {
            session: session_id,
            head: 0,
        });
        Ok(existed)
    }

    async fn delete_closed_before(
        &self,
        closed_before: std::time::SystemTime,
        limit: usize,
    ) -> Result<Vec<Uuid>> {
        let (tx, rx) = oneshot::channel();
        self.send(WriteOp::Expire {
            before: to_micros(closed_before),
            limit,
            reply: tx,
        })
        .await?;
        let deleted = rx.await.map_err(|_| writer_stopped())??;
        for &session in &deleted {
            let _ = self.wakes.send(Wake { session, head: 0 });
        }
        Ok(deleted)
    }

    async fn reclaim_space(&self, max_pages: u64) -> Result<u64> {
        let (tx, rx) = oneshot::channel();
        self.send(WriteOp::Reclaim {
            max_pages,
            reply: tx,
        })
        .await?;
        rx.await.map_err(|_| writer_stopped())?
    }

    fn wake_ups(&self) -> Option<tokio::sync::broadcast::Receiver<Wake>> {
        Some(self.wakes.subscribe())
    }

    async fn read_log(&self, session_id: Uuid, after: u64, limit: usize) -> Result<Vec<LogEntry>> {
        let Ok(after) = i64::try_from(after) else {
            return Ok(Vec::new());
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(concat!(
                    "SELECT ",
                    log_columns!(),
                    " FROM log WHERE session_pk = (SELECT pk FROM sessions WHERE id = ?1) \
                     AND offset > ?2 ORDER BY offset LIMIT ?3"
                ))
                .context("reading the log")?;
            let mut rows = stmt
                .query((&session_id.as_bytes()[..], after, limit_of(limit)))
                .context("reading the log")?;
            let mut entries = Vec::with_capacity(limit.min(1024));
            while let Some(row) = rows.next().context("reading the log")? {
                entries.push(rows::log_entry(row, session_id)?);
            }
            Ok(entries)
        })
        .await
    }

    async fn head_offset(&self, session_id: Uuid) -> Result<u64> {
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT offset FROM log \
                     WHERE session_pk = (SELECT pk FROM sessions WHERE id = ?1) \
                     ORDER BY offset DESC LIMIT 1",
                )
                .context("reading the log head")?;
            let mut rows = stmt
                .query([&session_id.as_bytes()[..]])
                .context("reading the log head")?;
            match rows.next().context("reading the log head")? {
                None => Ok(0),
                Some(row) => Ok(rows::log_entry_offset(row, session_id)?),
            }
        })
        .await
    }

    async fn load_queue(&self, session_id: Uuid) -> Result<Vec<QueuedEntry>> {
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(concat!(
                    "SELECT ",
                    queue_columns!(),
                    " FROM queue WHERE session_pk = (SELECT pk FROM sessions WHERE id = ?1) \
                     ORDER BY position"
                ))
                .context("reading the queue")?;
            let mut rows = stmt
                .query([&session_id.as_bytes()[..]])
                .context("reading the queue")?;
            let mut entries = Vec::new();
            while let Some(row) = rows.next().context("reading the queue")? {
                entries.push(rows::queued_entry(row, session_id)?);
            }
            Ok(entries)
        })
        .await
    }

    async fn find_action(
        &self,
        session_id: Uuid,
        action_id: ActionId,
    ) -> Result<Option<ActionRecord>> {
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(concat!(
                    "SELECT ",
                    action_columns!(),
                    " FROM actions WHERE session_pk = (SELECT pk FROM sessions WHERE id = ?1) \
                     AND action_id = ?2"
                ))
                .context("reading an action id")?;
            let mut rows = stmt
                .query((
                    &session_id.as_bytes()[..],
                    rows::action_id_bytes(&action_id),
                ))
                .context("reading an action id")?;
            match rows.next().context("reading an action id")? {
                None => Ok(None),
                Some(row) => Ok(Some(rows::action_record(row, session_id)?)),
            }
        })
        .await
    }

    async fn close(&self) -> Result<()> {
        SqliteStore::close(self).await
    }
}
