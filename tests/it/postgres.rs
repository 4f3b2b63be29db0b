//! The server on the PostgreSQL store: `--database-url` selects it, a session runs on
//! it, and a restarted server reads the same transcript from it.
//!
//! Needs `AGENT_HARNESS_TEST_DATABASE_URL` (scripts/test sets it). Without it the test skips with
//! a note — except with `CI=true`, where it fails. It works in a schema of its own, named in the
//! URL's `options`, and drops it at the end.

use tempfile::TempDir;

use tonic::Code;

use crate::{
    harness::{Harness, assert_error, bounded, expect_err},
    support::{Session, create_request},
};

/// A request the caller waits at most a second for (its `grpc-timeout`).
fn within_a_second<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(std::time::Duration::from_secs(1));
    request
}

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

// ---- bounded queries (docs/security.md) ------------------------------------------------------

/// The server's list statements, as `pg_stat_activity` shows them.
const LISTS: &str = "%ORDER BY s.created_at DESC%";

/// A database URL in `schema`, its connections named `app` (so a test finds them in
/// `pg_stat_activity` among other tests'), and acting as `role` when given.
fn url_for(url: &str, schema: &str, app: &str, role: Option<&str>) -> String {
    let role = role.map_or(String::new(), |role| format!("%20-c%20role%3D{role}"));
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}application_name={app}&options=-c%20search_path%3D{schema}{role}")
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("the test database is reachable");
    tokio::spawn(connection);
    client
}

/// Statements of the server's connections (`app`) running now, and of those how many wait on a
/// lock.
async fn running(watcher: &tokio_postgres::Client, app: &str, like: &str) -> (i64, i64) {
    let row = watcher
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE wait_event_type = 'Lock') \
             FROM pg_stat_activity WHERE application_name = $1 AND state = 'active' \
             AND query LIKE $2",
            &[&app, &like],
        )
        .await
        .expect("pg_stat_activity is readable");
    (row.get(0), row.get(1))
}

/// Waits until at least `wanted` of the server's statements like `like` run on the database.
async fn until_running(watcher: &tokio_postgres::Client, app: &str, like: &str, wanted: i64) {
    crate::harness::within(std::time::Duration::from_secs(20), async {
        loop {
            if running(watcher, app, like).await.0 >= wanted {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// Waits until none of the server's statements like `like` runs on the database any more.
async fn until_none_running(watcher: &tokio_postgres::Client, app: &str, like: &str) {
    crate::harness::within(std::time::Duration::from_secs(10), async {
        loop {
            if running(watcher, app, like).await.0 == 0 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn list_filters_beyond_their_limits_are_limit_exceeded_on_postgres_too() {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    bounded(async {
        let h = Harness::start_with(|c| c.database_url = Some(database_url.clone().into())).await;
        crate::sessions::list_filters_are_bounded(&mut h.sessions()).await;
        // Within the limits the filters still select exactly.
        let mut request = create_request(&h, "mock");
        request.labels = crate::sessions::label_filters(64);
        let tagged = Session::create_with(&h, request).await;
        Session::create(&h, "mock").await;
        let mut filters = crate::sessions::label_filters(64);
        let listed = h
            .sessions()
            .list_sessions(agent_harness::pb::v1::ListSessionsRequest {
                labels: filters.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .sessions;
        assert_eq!(
            listed.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            [tagged.id.as_str()]
        );
        filters.insert("k0".into(), "other".into());
        let listed = h
            .sessions()
            .list_sessions(agent_harness::pb::v1::ListSessionsRequest {
                labels: filters,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .sessions;
        assert!(listed.is_empty(), "{listed:?}");
        h.shutdown().await;
    })
    .await;
    execute(&url, &format!("DROP SCHEMA {schema} CASCADE")).await;
}

#[tokio::test]
async fn a_statement_running_past_the_statement_timeout_is_cancelled_on_the_server() {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let app = format!("ah_it_{}", uuid::Uuid::now_v7().simple());
    let database_url = url_for(&url, &schema, &app, None);
    bounded(async {
        let h = Harness::start_with(|c| {
            c.database_url = Some(database_url.clone().into());
            c.statement_timeout = std::time::Duration::from_millis(500);
        })
        .await;
        // Another client holds a lock every session read waits for.
        let mut locker = connect(&url).await;
        let lock = locker.transaction().await.unwrap();
        lock.batch_execute(&format!(
            "LOCK TABLE {schema}.session_labels IN ACCESS EXCLUSIVE MODE"
        ))
        .await
        .unwrap();
        let status = expect_err(
            h.sessions()
                .list_sessions(agent_harness::pb::v1::ListSessionsRequest::default())
                .await,
        );
        assert_error(&status, Code::Unavailable, "STORE_UNAVAILABLE");
        // Gone from the server while the lock is still held: cancelled there, not just
        // abandoned by the client.
        let watcher = connect(&url).await;
        assert_eq!(running(&watcher, &app, LISTS).await, (0, 0));
        lock.rollback().await.unwrap();
        h.sessions()
            .list_sessions(agent_harness::pb::v1::ListSessionsRequest::default())
            .await
            .expect("lists once the lock is gone");
        h.shutdown().await;
    })
    .await;
    execute(&url, &format!("DROP SCHEMA {schema} CASCADE")).await;
}

#[tokio::test]
async fn a_call_whose_deadline_passes_or_that_is_dropped_has_its_query_cancelled_on_the_server() {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let app = format!("ah_it_{}", uuid::Uuid::now_v7().simple());
    let database_url = url_for(&url, &schema, &app, None);
    bounded(async {
        let h = Harness::start_with(|c| {
            c.database_url = Some(database_url.clone().into());
            c.statement_timeout = std::time::Duration::from_secs(600);
        })
        .await;
        Session::create(&h, "mock").await;
        let mut locker = connect(&url).await;
        let lock = locker.transaction().await.unwrap();
        lock.batch_execute(&format!(
            "LOCK TABLE {schema}.session_labels IN ACCESS EXCLUSIVE MODE"
        ))
        .await
        .unwrap();
        let watcher = connect(&url).await;

        // A deadline (grpc-timeout).
        let mut request =
            tonic::Request::new(agent_harness::pb::v1::ListSessionsRequest::default());
        request.set_timeout(std::time::Duration::from_millis(300));
        let status = expect_err(h.sessions().list_sessions(request).await);
        assert!(
            matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
            "{status:?}"
        );
        until_none_running(&watcher, &app, LISTS).await;

        // A caller who goes away.
        let mut client = h.sessions();
        let call = tokio::spawn(async move {
            client
                .list_sessions(agent_harness::pb::v1::ListSessionsRequest::default())
                .await
        });
        until_running(&watcher, &app, LISTS, 1).await;
        call.abort();
        until_none_running(&watcher, &app, LISTS).await;

        lock.rollback().await.unwrap();
        h.sessions()
            .list_sessions(agent_harness::pb::v1::ListSessionsRequest::default())
            .await
            .expect("the pool's connections serve on after the cancels");
        h.shutdown().await;
    })
    .await;
    execute(&url, &format!("DROP SCHEMA {schema} CASCADE")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_slow_lists_of_one_user_leave_another_users_calls_answering_within_a_second() {
    use crate::auth::{ADA, BOB, as_user, with_tokens};
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    // The server acts as a role of its own, so row-level security applies to it (the test's
    // superuser connection bypasses it): that is how the test makes one kind of query slow.
    let role = format!("ah_it_role_{}", uuid::Uuid::now_v7().simple());
    execute(
        &url,
        &format!("CREATE ROLE {role} NOLOGIN; ALTER SCHEMA {schema} OWNER TO {role}"),
    )
    .await;
    let app = format!("ah_it_{}", uuid::Uuid::now_v7().simple());
    let database_url = url_for(&url, &schema, &app, Some(&role));
    let tokens = crate::auth::TokensFile::new(crate::auth::EVERYONE);
    bounded(async {
        let h = Harness::start_with(|c| {
            with_tokens(c, &tokens.path, None);
            c.database_url = Some(database_url.clone().into());
        })
        .await;
        let (mut ada, mut bob) = (as_user(&h, ADA), as_user(&h, BOB));
        let mut request = crate::auth::create_request(&h);
        request.labels = [("team".to_owned(), "x".to_owned())].into();
        crate::auth::create(&mut ada, request).await;
        let bobs = crate::auth::create(&mut bob, crate::auth::create_request(&h)).await;

        // From now on every statement filtering by label (whatever its SQL shape) sleeps a
        // minute on the database; nothing else is slowed.
        execute(
            &url,
            &format!(
                "ALTER TABLE {schema}.session_labels ENABLE ROW LEVEL SECURITY; \
                 ALTER TABLE {schema}.session_labels FORCE ROW LEVEL SECURITY; \
                 CREATE POLICY everything ON {schema}.session_labels USING (true) WITH CHECK (true); \
                 CREATE POLICY slow_label_filters ON {schema}.session_labels AS RESTRICTIVE \
                     FOR SELECT USING (current_query() NOT LIKE '%l.key = %' \
                                       OR (SELECT true FROM pg_sleep(60)))"
            ),
        )
        .await;
        let slow: Vec<_> = (0..20)
            .map(|_| {
                let mut ada = ada.clone();
                tokio::spawn(async move {
                    ada.list_sessions(agent_harness::pb::v1::ListSessionsRequest {
                        labels: [("team".to_owned(), "x".to_owned())].into(),
                        ..Default::default()
                    })
                    .await
                })
            })
            .collect();
        let watcher = connect(&url).await;
        until_running(&watcher, &app, "%l.key = %", 2).await;

        for _ in 0..3 {
            bob.get_session(within_a_second(agent_harness::pb::v1::GetSessionRequest {
                session_id: bobs.id.clone(),
            }))
            .await
            .expect("bob's GetSession answers");
            let listed = bob
                .list_sessions(within_a_second(
                    agent_harness::pb::v1::ListSessionsRequest::default(),
                ))
                .await
                .expect("bob's ListSessions answers")
                .into_inner();
            assert_eq!(listed.sessions.len(), 1);
            bob.control(within_a_second(agent_harness::pb::v1::ControlRequest {
                session_id: bobs.id.clone(),
                action: Some(crate::support::prompt("hello")),
                ..Default::default()
            }))
            .await
            .expect("bob's Control answers");
        }
        for call in &slow {
            call.abort();
        }
        until_none_running(&watcher, &app, "%l.key = %").await;
        h.shutdown().await;
    })
    .await;
    execute(
        &url,
        &format!("DROP SCHEMA {schema} CASCADE; DROP ROLE {role}"),
    )
    .await;
}
