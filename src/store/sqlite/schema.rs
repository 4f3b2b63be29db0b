//! Connection settings and the versioned schema of the SQLite store.
//!
//! The schema version lives in `PRAGMA user_version`. [`MIGRATIONS`] holds one script per version:
//! entry `i` takes a database from version `i` to `i + 1`, each applied in its own transaction
//! together with the new `user_version`, so a later release appends a script and old files
//! upgrade in place.

use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};

use super::rows::Context;
use crate::{
    domain::Result,
    store::{SqliteSynchronous, StoreError},
};

/// How long a connection waits on a lock held by another connection before failing.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// The writer's automatic checkpoint threshold, the bound of the WAL (pages; about 40 MiB): the
/// checkpointer thread does the regular checkpoints (see `checkpointer.rs`).
pub(super) const WAL_BOUND_PAGES: u32 = 10_000;

/// Scripts taking the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6];

/// The schema version this build writes.
pub(super) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Version 1.
///
/// - Sessions have an integer key (`pk`) that the other tables reference, so the UUID is stored
///   once and the log index stays narrow. Labels and editors are side tables, so ListSessions
///   filters on them in SQL. Editors keep their order (`position`).
/// - The log is a rowid table: rows are appended in arrival order across sessions, and the JSON
///   text (possibly several MiB) is the last column, so it lives in overflow pages that only a
///   read of that row visits. `(session_pk, offset)` is unique and serves both reads and the
///   head lookup.
/// - The queue is ordered by an integer `position`: a push to the back takes the largest + 1, a
///   push to the front the smallest - 1, so no entry is ever renumbered.
/// - Deleting a session cascades to every other table (foreign keys are on).
const V1: &str = r#"
CREATE TABLE sessions (
    pk                  INTEGER PRIMARY KEY,
    id                  BLOB    NOT NULL UNIQUE,
    name                TEXT    NOT NULL,
    owner               TEXT    NOT NULL,
    profile             TEXT    NOT NULL,
    cwd                 TEXT    NOT NULL,
    model               TEXT    NOT NULL,
    acp_session_id      TEXT    NOT NULL,
    status              TEXT    NOT NULL,
    status_reason       TEXT    NOT NULL,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    profile_fingerprint TEXT    NOT NULL,
    request_fingerprint TEXT    NOT NULL,
    can_resume          INTEGER NOT NULL,
    can_load            INTEGER NOT NULL
);
CREATE INDEX sessions_newest_first ON sessions (created_at DESC, id DESC);
CREATE INDEX sessions_by_owner ON sessions (owner, status);
CREATE INDEX sessions_by_status ON sessions (status);

CREATE TABLE session_labels (
    session_pk INTEGER NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
    key        TEXT    NOT NULL,
    value      TEXT    NOT NULL,
    PRIMARY KEY (session_pk, key)
) WITHOUT ROWID;
CREATE INDEX session_labels_by_pair ON session_labels (key, value);

CREATE TABLE session_editors (
    session_pk INTEGER NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
    position   INTEGER NOT NULL,
    principal  TEXT    NOT NULL,
    PRIMARY KEY (session_pk, position)
) WITHOUT ROWID;
CREATE INDEX session_editors_by_principal ON session_editors (principal, session_pk);

CREATE TABLE log (
    session_pk INTEGER NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
    offset     INTEGER NOT NULL,
    direction  INTEGER NOT NULL,
    actor      TEXT    NOT NULL,
    action_id  BLOB,
    epoch      INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    json       TEXT    NOT NULL
);
CREATE UNIQUE INDEX log_by_offset ON log (session_pk, offset);

CREATE TABLE queue (
    session_pk  INTEGER NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
    action_id   BLOB    NOT NULL,
    position    INTEGER NOT NULL,
    actor       TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    traceparent TEXT,
    context     TEXT,
    work        TEXT    NOT NULL,
    PRIMARY KEY (session_pk, action_id)
);
CREATE UNIQUE INDEX queue_in_order ON queue (session_pk, position);

CREATE TABLE actions (
    session_pk  INTEGER NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
    action_id   BLOB    NOT NULL,
    state       TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    fingerprint TEXT    NOT NULL,
    PRIMARY KEY (session_pk, action_id)
);
"#;

/// Version 2: the action id of a session's first prompt (set at creation, never changed), so an
/// idempotent CreateSession retry finds it however long the log. Older sessions read NULL.
const V2: &str = "ALTER TABLE sessions ADD COLUMN first_action_id TEXT;";

/// Usage records: what agents reported, kept apart from sessions (no cascade) so that deleting a
/// session does not refund its owner's budget.
const V3: &str = r#"
CREATE TABLE usage_records (
    session_id    BLOB    NOT NULL,
    principal     TEXT    NOT NULL,
    profile       TEXT    NOT NULL,
    at            INTEGER NOT NULL,
    input_tokens  INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cost_micros   INTEGER NOT NULL,
    currency      TEXT    NOT NULL
);
CREATE INDEX usage_records_by_principal ON usage_records (principal, at);
CREATE INDEX usage_records_by_session ON usage_records (session_id);
"#;

/// Version 5: the HOME a sandboxed session's agent runs with (set at creation; older sessions
/// read NULL and find theirs from the configuration).
const V5: &str = "ALTER TABLE sessions ADD COLUMN home TEXT;";

/// Version 6: whose word a usage record is (`agent`, or `model_proxy` for what the model proxy
/// read from a provider's answer; older rows are the agents'), and the turn it was spent in.
const V6: &str = "
ALTER TABLE usage_records ADD COLUMN source TEXT NOT NULL DEFAULT 'agent';
ALTER TABLE usage_records ADD COLUMN action_id BLOB;
";

/// Version 4: a turn's commits dirty fewer pages. A turn changes its session's status twice
/// (idle → running → idle), and the two indexes on `status` moved an entry between their pages
/// each time: at least four index pages written per turn beside the row's own. Indexes now name `status`
/// only as the condition of partial indexes of closed sessions, which a live session is in
/// neither before nor after such a change, so SQLite leaves them alone:
///
/// - `sessions_by_owner` is on `owner` alone; live sessions per owner are counted as all of the
///   owner's minus the closed ones (`sessions_closed_by_owner`).
/// - `sessions_closed_by_time` serves retention (closed sessions, oldest first).
/// - Listing by status reads newest first and filters, as every other listing filter does.
///
/// `actions` becomes a `WITHOUT ROWID` table keyed by its primary key: recording an action id
/// writes one B-tree page instead of the table's and its key index's.
const V4: &str = r#"
DROP INDEX sessions_by_status;
DROP INDEX sessions_by_owner;
CREATE INDEX sessions_by_owner ON sessions (owner);
CREATE INDEX sessions_closed_by_owner ON sessions (owner) WHERE status = 'closed';
CREATE INDEX sessions_closed_by_time ON sessions (updated_at) WHERE status = 'closed';

CREATE TABLE actions_by_key (
    session_pk  INTEGER NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
    action_id   BLOB    NOT NULL,
    state       TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    fingerprint TEXT    NOT NULL,
    PRIMARY KEY (session_pk, action_id)
) WITHOUT ROWID;
INSERT INTO actions_by_key (session_pk, action_id, state, created_at, fingerprint)
    SELECT session_pk, action_id, state, created_at, fingerprint FROM actions NOT INDEXED
    ORDER BY session_pk, action_id;
DROP TABLE actions;
ALTER TABLE actions_by_key RENAME TO actions;
"#;

/// Settings of the one write connection: WAL, the configured `synchronous`, foreign keys, and an
/// automatic checkpoint only as the bound of the WAL (the checkpointer thread does the regular
/// ones, off the commit path).
pub(super) fn configure_writer(conn: &Connection, synchronous: SqliteSynchronous) -> Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)
        .context("setting the busy timeout")?;
    incremental_vacuum_if_new(conn)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .context("switching to WAL")?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::config(format!(
            "sqlite store: the database refused WAL mode (journal_mode is {mode})"
        ))
        .into());
    }
    let synchronous = synchronous_name(synchronous);
    conn.execute_batch(&format!(
        "PRAGMA synchronous = {synchronous};
         PRAGMA foreign_keys = ON;
         PRAGMA temp_store = MEMORY;
         PRAGMA cache_size = -32768;
         PRAGMA journal_size_limit = 67108864;
         PRAGMA wal_autocheckpoint = {};",
        WAL_BOUND_PAGES
    ))
    .context("configuring the write connection")?;
    conn.set_prepared_statement_cache_capacity(64);
    keep_plans(conn)
}

/// Turns on SQLite's query planner stability guarantee: a prepared statement keeps its plan
/// whatever values are bound to it. Without it SQLite may mark a parameter "re-prepare when the
/// value changes to or from 0 or 1", and since rusqlite clears the bindings of a cached statement
/// between uses, every use that binds 1 (the first session's key, say) re-prepared the statement:
/// a profile of turns on that session found 9 % of the server's CPU in `sqlite3Reprepare`. Every
/// statement here is a keyed lookup or write whose best plan does not depend on the values.
fn keep_plans(conn: &Connection) -> Result<()> {
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )
    .context("enabling the query planner stability guarantee")?;
    Ok(())
}

/// The `PRAGMA synchronous` value of a mode.
pub(super) fn synchronous_name(synchronous: SqliteSynchronous) -> &'static str {
    match synchronous {
        SqliteSynchronous::Normal => "NORMAL",
        SqliteSynchronous::Full => "FULL",
    }
}

/// Settings of a read connection (opened read-only).
pub(super) fn configure_reader(conn: &Connection) -> Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)
        .context("setting the busy timeout")?;
    conn.execute_batch("PRAGMA cache_size = -16384; PRAGMA query_only = ON;")
        .context("configuring a read connection")?;
    conn.set_prepared_statement_cache_capacity(64);
    keep_plans(conn)
}

/// Brings the schema to [`SCHEMA_VERSION`], one transaction per version.
pub(super) fn migrate(conn: &mut Connection) -> Result<()> {
    let current: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .context("reading the schema version")?;
    if current > SCHEMA_VERSION {
        return Err(StoreError::schema(format!(
            "sqlite store: the database has schema version {current}, newer than the {SCHEMA_VERSION} \
             this build understands; use a newer agent-harness"
        ))
        .into());
    }
    if current < 0 {
        return Err(StoreError::schema(format!(
            "sqlite store: the database has an invalid schema version {current}"
        ))
        .into());
    }
    for (from, script) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let to = from as i64 + 1;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .context("starting a schema migration")?;
        tx.execute_batch(script).map_err(|e| StoreError::Schema {
            message: format!(
                "sqlite store: migrating to version {to}: {}",
                super::rows::describe(&e)
            ),
            source: Some(e.into()),
        })?;
        tx.pragma_update(None, "user_version", to)
            .context("recording the schema version")?;
        tx.commit().context("committing a schema migration")?;
    }
    if current < SCHEMA_VERSION {
        tracing::info!(
            from = current,
            to = SCHEMA_VERSION,
            "sqlite store: schema migrated"
        );
    }
    Ok(())
}

/// A new file keeps track of its free pages (`auto_vacuum = INCREMENTAL`), so space that
/// retention frees can be given back in bounded steps. SQLite allows the switch only while the
/// file is still empty (before even the switch to WAL writes its first page); a file created earlier would need a whole `VACUUM` (a full rewrite, twice
/// the disk, the store locked meanwhile), which start-up does not impose: such a file reuses its
/// free pages instead of shrinking (docs/operations.md tells how to convert one offline).
fn incremental_vacuum_if_new(conn: &Connection) -> Result<()> {
    let pages: i64 = conn
        .pragma_query_value(None, "page_count", |row| row.get(0))
        .context("reading the page count")?;
    if pages == 0 {
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")
            .context("turning on incremental vacuum")?;
    }
    Ok(())
}

/// The file's `auto_vacuum` mode: 0 none, 1 full, 2 incremental.
pub(super) fn auto_vacuum(conn: &Connection) -> Result<i64> {
    conn.pragma_query_value(None, "auto_vacuum", |row| row.get(0))
        .context("reading auto_vacuum")
}

#[cfg(test)]
mod tests {
    use rusqlite::StatementStatus;

    use super::*;

    /// Runs `sql` with `key` bound, three times through the statement cache, and says how often
    /// SQLite re-prepared it.
    fn reprepares(conn: &Connection, sql: &str, key: i64) -> i32 {
        for _ in 0..3 {
            let mut stmt = conn.prepare_cached(sql).unwrap();
            let mut rows = stmt.query([key]).unwrap();
            while rows.next().unwrap().is_some() {}
        }
        conn.prepare_cached(sql)
            .unwrap()
            .get_status(StatementStatus::RePrepare)
    }

    #[test]
    fn a_new_file_tracks_free_pages_for_incremental_vacuum_and_an_older_file_keeps_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let mut new = Connection::open(dir.path().join("new.sqlite3")).unwrap();
        configure_writer(&new, SqliteSynchronous::Normal).unwrap();
        migrate(&mut new).unwrap();
        assert_eq!(auto_vacuum(&new).unwrap(), 2, "INCREMENTAL");

        // A file an earlier version wrote: its tables exist at version 1 already.
        let path = dir.path().join("old.sqlite3");
        let earlier = Connection::open(&path).unwrap();
        earlier.execute_batch(V1).unwrap();
        earlier.pragma_update(None, "user_version", 1).unwrap();
        drop(earlier);
        let mut old = Connection::open(&path).unwrap();
        configure_writer(&old, SqliteSynchronous::Normal).unwrap();
        migrate(&mut old).unwrap();
        assert_eq!(
            auto_vacuum(&old).unwrap(),
            0,
            "NONE: switching needs a VACUUM"
        );
    }

    #[test]
    fn version_4_rebuilds_actions_on_its_key_and_keeps_every_recorded_action_id() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = Connection::open(dir.path().join("db.sqlite3")).unwrap();
        configure_writer(&conn, SqliteSynchronous::Normal).unwrap();
        conn.execute_batch(&[V1, V2, V3].concat()).unwrap();
        conn.pragma_update(None, "user_version", 3).unwrap();
        conn.execute_batch(
            "INSERT INTO sessions (pk, id, name, owner, profile, cwd, model, acp_session_id, \
             status, status_reason, created_at, updated_at, profile_fingerprint, \
             request_fingerprint, can_resume, can_load) VALUES \
             (1, x'01', '', 'user:a', 'mock', '/', '', '', 'idle', '', 1, 1, '', '', 0, 0), \
             (2, x'02', '', 'user:a', 'mock', '/', '', '', 'closed', '', 2, 2, '', '', 0, 0); \
             INSERT INTO actions VALUES (2, x'bb', 'sent', 5, 'fp-b'), (1, x'aa', 'queued', 4, 'fp-a');",
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let actions: Vec<(i64, Vec<u8>, String, i64, String)> = conn
            .prepare("SELECT * FROM actions")
            .unwrap()
            .query_map([], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(
            actions,
            [
                (1, vec![0xaa], "queued".to_owned(), 4, "fp-a".to_owned()),
                (2, vec![0xbb], "sent".to_owned(), 5, "fp-b".to_owned()),
            ]
        );
        let without_rowid: i64 = conn
            .query_row("SELECT \"wr\" FROM pragma_table_list('actions')", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(without_rowid, 1);
        // Deleting a session still takes its action ids with it.
        conn.execute("DELETE FROM sessions WHERE pk = 2", [])
            .unwrap();
        let left: i64 = conn
            .query_row("SELECT count(*) FROM actions", [], |r| r.get(0))
            .unwrap();
        assert_eq!(left, 1);
    }

    #[test]
    fn a_cached_statement_keeps_its_plan_when_the_first_sessions_key_is_bound_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = Connection::open(dir.path().join("db.sqlite3")).unwrap();
        configure_writer(&conn, SqliteSynchronous::Normal).unwrap();
        migrate(&mut conn).unwrap();
        for sql in [
            "SELECT key, value FROM session_labels WHERE session_pk = ?1 ORDER BY key",
            "SELECT principal FROM session_editors WHERE session_pk = ?1 ORDER BY position",
        ] {
            assert_eq!(reprepares(&conn, sql, 1), 0, "{sql}");
        }
    }
}
