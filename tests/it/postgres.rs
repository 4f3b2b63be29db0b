//! The server on the PostgreSQL store (SPEC §15): `--database-url` selects it, a session runs on
//! it, and a restarted server reads the same transcript from it.
//!
//! Needs `AGENT_HARNESS_TEST_DATABASE_URL` (scripts/test sets it). Without it the test skips with
//! a note — except with `CI=true`, where it fails. It works in a schema of its own, named in the
//! URL's `options`, and drops it at the end.

use tempfile::TempDir;

use crate::{
    harness::{Harness, bounded},
    support::{Session, create_request},
};

const TEST_DATABASE_ENV: &str = "AGENT_HARNESS_TEST_DATABASE_URL";

/// A fresh schema in the test database, or `None` (with a note) outside CI without one.
pub(crate) async fn test_schema() -> Option<(String, String)> {
    let Ok(url) = std::env::var(TEST_DATABASE_ENV) else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{TEST_DATABASE_ENV} is not set, and CI=true: the PostgreSQL tests must run in CI"
        );
        eprintln!("note: skipping a PostgreSQL test: set {TEST_DATABASE_ENV} to run it");
        return None;
    };
    let schema = format!("ah_it_{}", uuid::Uuid::now_v7().simple());
    execute(&url, &format!("CREATE SCHEMA {schema}")).await;
    Some((url, schema))
}

pub(crate) async fn execute(url: &str, sql: &str) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("the test database ({TEST_DATABASE_ENV}) is unreachable: {e}"));
    tokio::spawn(connection);
    client
        .batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// The URL with the tables placed in `schema` (the server's own URL parameters do it).
pub(crate) fn url_in_schema(url: &str, schema: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}options=-c%20search_path%3D{schema}")
}

#[tokio::test]
async fn a_session_on_postgres_runs_a_prompt_and_a_restarted_server_reads_the_same_transcript() {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    bounded(async {
        // The session's cwd outlives both servers' data directories.
        let cwd = TempDir::new().unwrap();
        let first =
            Harness::start_with(|c| c.database_url = Some(database_url.clone().into())).await;
        let mut request = create_request(&first, "mock");
        request.cwd = cwd.path().to_string_lossy().into_owned();
        let mut session = Session::create_with(&first, request).await;
        let mut watch = session.watch().await;
        let reply = session.prompt("hello from postgres").await;
        watch.response_to(&reply.action_id).await;
        let before = session.transcript().await;
        let log_before = session.log().await;
        assert_eq!(before.messages.len(), 2, "{:?}", before.messages);
        assert_eq!(
            before.messages[0].request_id.as_deref(),
            Some(reply.action_id.as_str())
        );
        drop(watch);
        first.shutdown().await;

        let second =
            Harness::start_with(|c| c.database_url = Some(database_url.clone().into())).await;
        let mut again = Session::attach(second.sessions(), &session.id);
        let after = again.transcript().await;
        assert_eq!(after.messages, before.messages);
        let log_after = again.log().await;
        assert_eq!(
            &log_after[..log_before.len()],
            &log_before[..],
            "the log is kept, unchanged"
        );
        second.shutdown().await;
    })
    .await;
    execute(&url, &format!("DROP SCHEMA {schema} CASCADE")).await;
}
