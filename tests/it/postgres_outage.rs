//! Losing PostgreSQL while serving: writes are refused as UNAVAILABLE
//! (STORE_UNAVAILABLE) and nothing refused is stored; readiness is NOT_SERVING while the
//! database cannot be reached and SERVING again once it can.
//!
//! The server reaches the test database through the test kit's fault proxy, which the test
//! resets (every connection dropped, new ones closed at once) and restores. The shared database
//! server itself is never touched.

use tonic::Code;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
use tonic_types::StatusExt;

use crate::{
    harness::{Harness, SESSIONS_SERVICE, assert_error, bounded},
    postgres::{execute, test_schema, url_in_schema},
    proxy::FaultProxy,
    support::{Session, prompt},
};

/// The test database's URL with its host and port replaced by the proxy's.
pub(crate) fn through(url: &str, port: u16) -> (String, String) {
    let config: tokio_postgres::Config = url.parse().expect("the test URL parses");
    let host = match &config.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(host) => host.clone(),
        #[cfg(unix)]
        tokio_postgres::config::Host::Unix(_) => panic!("the test database must be on TCP"),
    };
    let upstream_port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres");
    let database = config.get_dbname().unwrap_or(user);
    (
        format!("postgres://{user}@127.0.0.1:{port}/{database}"),
        format!("{host}:{upstream_port}"),
    )
}

/// Waits until the sessions service's readiness reads `wanted`.
async fn readiness_becomes(h: &Harness, wanted: ServingStatus) {
    let mut updates = h
        .health()
        .watch(HealthCheckRequest {
            service: SESSIONS_SERVICE.into(),
        })
        .await
        .expect("a health watch")
        .into_inner();
    loop {
        let update = updates
            .message()
            .await
            .expect("a health update")
            .expect("the watch stays open");
        if update.status() == wanted {
            return;
        }
    }
}

/// A server on the test database through a proxy, with one session that has run a prompt.
async fn serving_through_a_proxy(
    url: &str,
    schema: &str,
) -> (FaultProxy, Harness, Session, tempfile::TempDir) {
    serving_through_a_proxy_with(url, schema, |_| {}).await
}

/// [`serving_through_a_proxy`] with the server's configuration edited.
async fn serving_through_a_proxy_with(
    url: &str,
    schema: &str,
    edit: impl FnOnce(&mut agent_harness::config::ServeConfig),
) -> (FaultProxy, Harness, Session, tempfile::TempDir) {
    let (_, upstream) = through(url, 0);
    let proxy = FaultProxy::start(upstream).await;
    let (proxied_url, _) = through(url, proxy.port());
    let database_url = url_in_schema(&proxied_url, schema);
    let h = Harness::start_with(|c| {
        c.database_url = Some(database_url.into());
        edit(c);
    })
    .await;
    let cwd = tempfile::TempDir::new().unwrap();
    let mut request = crate::support::create_request(&h, "mock");
    request.cwd = cwd.path().to_string_lossy().into_owned();
    let mut session = Session::create_with(&h, request).await;
    let mut watch = session.watch().await;
    let reply = session.prompt("before the outage").await;
    watch.response_to(&reply.action_id).await;
    (proxy, h, session, cwd)
}

#[tokio::test]
async fn a_prompt_sent_while_the_database_is_unreachable_is_refused_as_unavailable_and_not_stored()
{
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    bounded(async {
        let (proxy, h, mut session, _cwd) = serving_through_a_proxy(&url, &schema).await;

        proxy.reset();
        let refused = session
            .act(prompt("sent during the outage"))
            .await
            .expect_err("a prompt while the database is unreachable is refused");
        assert_error(&refused, Code::Unavailable, "STORE_UNAVAILABLE");
        let retry = refused
            .get_details_retry_info()
            .expect("a RetryInfo detail");
        assert!(retry.retry_delay.is_some());

        proxy.restore();
        readiness_becomes(&h, ServingStatus::Serving).await;
        let log = session.log().await;
        assert!(
            log.iter()
                .all(|entry| !entry.json.contains("sent during the outage")),
            "the refused prompt is not in the log"
        );
        assert!(session.queue().await.is_empty(), "nor in the queue");

        // The session works again once the database is back.
        let mut watch = session.watch().await;
        let reply = session.prompt("after the outage").await;
        watch.response_to(&reply.action_id).await;
        h.shutdown().await;
    })
    .await;
    execute(&url, &format!("DROP SCHEMA {schema} CASCADE")).await;
}

#[tokio::test]
async fn readiness_is_not_serving_while_the_database_is_unreachable_and_serving_again_after() {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    bounded(async {
        let (proxy, h, _session, _cwd) = serving_through_a_proxy(&url, &schema).await;
        readiness_becomes(&h, ServingStatus::Serving).await;
        proxy.reset();
        readiness_becomes(&h, ServingStatus::NotServing).await;
        // Liveness is not readiness: the process itself stays SERVING.
        let liveness = h
            .health()
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("liveness answers")
            .into_inner();
        assert_eq!(liveness.status(), ServingStatus::Serving);
        proxy.restore();
        readiness_becomes(&h, ServingStatus::Serving).await;
        h.shutdown().await;
    })
    .await;
    execute(&url, &format!("DROP SCHEMA {schema} CASCADE")).await;
}

/// Every store call has a deadline: with the database's packets dropped and its connections
/// left open (a partition, not a refusal), a write is refused as UNAVAILABLE once the statement
/// timeout and a short grace have passed, instead of waiting for an answer that never comes.
#[tokio::test]
async fn a_prompt_sent_while_the_database_is_black_holed_is_refused_as_unavailable_not_left_hanging()
 {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    bounded(async {
        let (proxy, h, mut session, _cwd) = serving_through_a_proxy_with(&url, &schema, |c| {
            c.statement_timeout = std::time::Duration::from_secs(1);
            // Long enough that the session is not stopped by the self-fencing clock meanwhile.
            c.lease_ttl = std::time::Duration::from_secs(120);
        })
        .await;

        proxy.black_hole();
        let refused = session
            .act(prompt("sent into the black hole"))
            .await
            .expect_err("a prompt the database never answers is refused");
        assert_error(&refused, Code::Unavailable, "STORE_UNAVAILABLE");
        readiness_becomes(&h, ServingStatus::NotServing).await;

        proxy.restore();
        readiness_becomes(&h, ServingStatus::Serving).await;
        let log = session.log().await;
        assert!(
            log.iter()
                .all(|entry| !entry.json.contains("sent into the black hole")),
            "the refused prompt is not in the log"
        );
        assert!(session.queue().await.is_empty(), "nor in the queue");
        let mut watch = session.watch().await;
        let reply = session.prompt("after the black hole").await;
        watch.response_to(&reply.action_id).await;
        h.shutdown().await;
    })
    .await;
    execute(&url, &format!("DROP SCHEMA {schema} CASCADE")).await;
}
