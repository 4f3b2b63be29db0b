//! Retention: closed sessions older than `retention` (since they closed) are deleted with their
//! log, queue, labels and action ids, in bounded batches, on both stores; recently closed and
//! open sessions stay; a subscriber of a deleted session ends with SESSION_NOT_FOUND; the
//! deletions are counted in the metrics; the SQLite file gives the space back.
//!
//! Close times are set by writing the stored close time (a closed session's `updated_at`)
//! directly in the real database, so nothing waits for hours.

use std::{
    path::PathBuf,
    time::{Duration, SystemTime},
};

use agent_harness::{pb::v1 as pb, store::RetentionReport};
use agent_harness_testkit::service_bin;
use tonic::Code;

use crate::{
    harness::{Harness, assert_error, bounded, expect_err},
    operations::{sample, scrape},
    postgres::{execute, test_schema, url_in_schema},
    support::{Session, create_request},
};

const HOUR: Duration = Duration::from_secs(3600);
/// The batch bound the tests run with: three expired sessions take two transactions.
const BATCH: usize = 2;

/// The real database under the server, reached directly.
enum Db {
    Sqlite(PathBuf),
    Postgres(String),
}

/// Row counts of a session (or of the whole store): log, labels, actions, queue.
type Rows = [i64; 4];

const TABLES: [&str; 4] = ["log", "session_labels", "actions", "queue"];

impl Db {
    /// Makes the stored close time of session `id` lie `age` in the past.
    async fn set_closed_ago(&self, id: &str, age: Duration) {
        let micros = SystemTime::now()
            .checked_sub(age)
            .unwrap()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_micros() as i64;
        let id = uuid::Uuid::parse_str(id).unwrap();
        match self {
            Db::Sqlite(path) => {
                let conn = sqlite(path);
                let changed = conn
                    .execute(
                        "UPDATE sessions SET updated_at = ?1 WHERE id = ?2",
                        (micros, &id.as_bytes()[..]),
                    )
                    .unwrap();
                assert_eq!(changed, 1);
            }
            Db::Postgres(url) => {
                let client = pg(url).await;
                let changed = client
                    .execute(
                        "UPDATE sessions SET updated_at = $1 WHERE id = $2",
                        &[&micros, &id],
                    )
                    .await
                    .unwrap();
                assert_eq!(changed, 1);
            }
        }
    }

    /// The rows `id` holds in each table, or every row with `None`.
    async fn rows(&self, id: Option<&str>) -> Rows {
        let mut rows = [0; 4];
        for (i, table) in TABLES.iter().enumerate() {
            let filter = match id {
                Some(_) => " WHERE session_pk = (SELECT pk FROM sessions WHERE id = $1)",
                None => "",
            };
            let sql = format!("SELECT count(*) FROM {table}{filter}");
            rows[i] = match self {
                Db::Sqlite(path) => {
                    let conn = sqlite(path);
                    let sql = sql.replace("$1", "?1");
                    match id {
                        Some(id) => {
                            let id = uuid::Uuid::parse_str(id).unwrap();
                            conn.query_row(&sql, [&id.as_bytes()[..]], |r| r.get(0))
                        }
                        None => conn.query_row(&sql, [], |r| r.get(0)),
                    }
                    .unwrap()
                }
                Db::Postgres(url) => {
                    let client = pg(url).await;
                    let row = match id {
                        Some(id) => {
                            let id = uuid::Uuid::parse_str(id).unwrap();
                            client.query_one(&sql, &[&id]).await
                        }
                        None => client.query_one(&sql, &[]).await,
                    };
                    row.unwrap().get(0)
                }
            };
        }
        rows
    }
}

fn sqlite(path: &PathBuf) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn
}

async fn pg(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// Folds the WAL into the database file (the server's checkpointer does it in its own time),
/// so the file's size says how many pages the database holds; the size.
async fn checkpointed_size(path: &PathBuf) -> u64 {
    loop {
        let busy: i64 = sqlite(path)
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
            .unwrap();
        if busy == 0 {
            return std::fs::metadata(path).unwrap().len();
        }
        // A read of the server's held the WAL: try again once it is done.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A session with a label and one finished turn, its prompt `padding` characters long.
async fn session_with_a_turn(h: &Harness, label: &str, padding: usize) -> Session {
    let mut request = create_request(h, "mock");
    request.labels.insert("kind".into(), label.into());
    let mut session = Session::create_with(h, request).await;
    let mut watch = session.watch().await;
    let reply = session
        .prompt(&format!("keep me {label}\n{}", "x".repeat(padding)))
        .await;
    watch.response_to(&reply.action_id).await;
    watch.status(pb::SessionStatus::Idle).await;
    session
}

async fn close(session: &mut Session) {
    session
        .client
        .close_session(pb::CloseSessionRequest {
            session_id: session.id.clone(),
        })
        .await
        .unwrap();
}

/// Three sessions closed two hours ago, one closed half an hour ago, one open (whose last
/// change is also two hours old): one pass deletes exactly the three, in batches of [`BATCH`].
async fn retention_scenario(h: &Harness, db: &Db, padding: usize) -> RetentionReport {
    let mut expired = Vec::new();
    for i in 0..3 {
        let mut session = session_with_a_turn(h, &format!("old-{i}"), padding).await;
        close(&mut session).await;
        db.set_closed_ago(&session.id, 2 * HOUR).await;
        expired.push(session);
    }
    let mut recent = session_with_a_turn(h, "recent", 0).await;
    close(&mut recent).await;
    db.set_closed_ago(&recent.id, HOUR / 2).await;
    let mut open = session_with_a_turn(h, "open", 0).await;
    db.set_closed_ago(&open.id, 2 * HOUR).await;

    let mut kept_rows = [0; 4];
    for session in [&recent, &open] {
        let rows = db.rows(Some(&session.id)).await;
        assert!(rows[0] > 0 && rows[1] == 1 && rows[2] > 0, "{rows:?}");
        for (sum, n) in kept_rows.iter_mut().zip(rows) {
            *sum += n;
        }
    }
    for session in &expired {
        let rows = db.rows(Some(&session.id)).await;
        assert!(rows[0] > 0 && rows[1] == 1 && rows[2] > 0, "{rows:?}");
    }
    let recent_transcript = recent.transcript().await;
    let open_transcript = open.transcript().await;
    // A subscriber of an expired session, attached before the pass.
    let mut watch = expired[0].watch().await;

    let report = h
        .server()
        .retention_pass()
        .await
        .expect("retention is configured")
        .expect("the pass succeeds");
    assert_eq!(report.deleted, 3, "{report:?}");
    assert_eq!(
        report.batches, 2,
        "three sessions in batches of {BATCH}: {report:?}"
    );
    assert_eq!(report.largest_batch, BATCH as u64, "{report:?}");

    assert_error(&watch.end().await, Code::NotFound, "SESSION_NOT_FOUND");
    for session in &mut expired {
        let status = expect_err(
            session
                .client
                .get_session(pb::GetSessionRequest {
                    session_id: session.id.clone(),
                })
                .await,
        );
        assert_error(&status, Code::NotFound, "SESSION_NOT_FOUND");
    }
    // Only the kept sessions' rows are left, untouched.
    assert_eq!(db.rows(None).await, kept_rows);
    assert_eq!(
        recent.transcript().await.messages,
        recent_transcript.messages
    );
    assert_eq!(open.transcript().await.messages, open_transcript.messages);
    assert_eq!(open.get().await.status(), pb::SessionStatus::Idle);
    // A second pass finds nothing more to do.
    let again = h.server().retention_pass().await.unwrap().unwrap();
    assert_eq!(again.deleted, 0, "{again:?}");
    report
}

fn with_retention(config: &mut agent_harness::config::ServeConfig) {
    config.retention = Some(HOUR);
    // The background passes stay out of the way: the test runs its own.
    config.retention_every = 24 * HOUR;
    config.retention_batch = BATCH;
    config.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
}

#[tokio::test]
async fn retention_deletes_only_sessions_closed_longer_ago_in_bounded_batches_and_the_sqlite_file_shrinks()
 {
    bounded(async {
        let h = Harness::start_with(with_retention).await;
        let db = Db::Sqlite(h.data_dir().join("agent-harness.sqlite3"));
        // Sessions worth some pages each, so there is space to give back.
        let report = retention_scenario(&h, &db, 100_000).await;
        assert!(report.pages_reclaimed > 0, "{report:?}");
        let metrics = scrape(h.metrics_addr().unwrap()).await;
        assert_eq!(
            sample(&metrics, "agent_harness_retention_deleted_sessions_total"),
            3.0,
            "{metrics}"
        );
        h.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn the_sqlite_file_is_smaller_after_a_retention_pass_than_before_it() {
    bounded(async {
        let h = Harness::start_with(with_retention).await;
        let path = h.data_dir().join("agent-harness.sqlite3");
        let db = Db::Sqlite(path.clone());
        let mut sessions = Vec::new();
        for i in 0..2 {
            let mut session = session_with_a_turn(&h, &format!("big-{i}"), 200_000).await;
            close(&mut session).await;
            db.set_closed_ago(&session.id, 2 * HOUR).await;
            sessions.push(session);
        }
        let before = checkpointed_size(&path).await;
        let report = h.server().retention_pass().await.unwrap().unwrap();
        assert_eq!(report.deleted, 2);
        let after = checkpointed_size(&path).await;
        eprintln!(
            "sqlite file: {before} bytes before the pass, {after} after ({} pages given back)",
            report.pages_reclaimed
        );
        assert!(after < before, "{after} < {before}");
        h.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn retention_on_postgres_deletes_only_sessions_closed_longer_ago_in_bounded_batches() {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    bounded(async {
        let h = Harness::start_with(|c| {
            with_retention(c);
            c.database_url = Some(database_url.clone().into());
        })
        .await;
        let db = Db::Postgres(database_url.clone());
        retention_scenario(&h, &db, 1000).await;
        let metrics = scrape(h.metrics_addr().unwrap()).await;
        assert_eq!(
            sample(&metrics, "agent_harness_retention_deleted_sessions_total"),
            3.0,
            "{metrics}"
        );
        h.shutdown().await;
    })
    .await;
    execute(&url, &format!("DROP SCHEMA {schema} CASCADE")).await;
}

#[tokio::test]
async fn a_retention_shorter_than_a_minute_is_refused_at_start_with_the_reason_in_one_line() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let output = tokio::process::Command::new(service_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--retention", "30s"])
            .arg("--data-dir")
            .arg(dir.path())
            .env("AGENT_HARNESS_LOG_FORMAT", "text")
            // A person's shell may have it set: it must not turn the refusal into a backtrace.
            .env("RUST_BACKTRACE", "1")
            .kill_on_drop(true)
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{stderr}");
        assert!(
            stderr.contains("retention must be at least 1m (got 30s)"),
            "{stderr}"
        );
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("error: "), "{stderr}");
        // Nothing was started: no store was created.
        assert!(!dir.path().join("agent-harness.sqlite3").exists());
    })
    .await;
}
