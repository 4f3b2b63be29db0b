//! Bridges with several replicas (SPEC §16, last rule; §15): real `serve` replicas on one
//! PostgreSQL database and a real `agent-harness bridge` dialling one of them. A remote session
//! is owned by the replica holding its bridge's stream, wherever it was created or is called;
//! when the bridge serves another replica, the session's lease moves there.
//!
//! Needs `AGENT_HARNESS_TEST_DATABASE_URL` like the other PostgreSQL tests (skipped without it,
//! except under `CI=true`); each test works in a schema of its own and drops it at the end.

use std::{path::Path, time::Duration};

use agent_harness::pb::v1 as pb;
use serde_json::Value;
use tonic::Code;

use crate::{
    bridge::{Bridge, mock_bridge_profile, url},
    harness::{assert_error, expect_err, within},
    postgres::{test_schema, url_in_schema},
    process::{Serve, ServeProcess},
    replica_ownership::{LEASE_TTL, drop_schema},
    support::Session,
};

const TEST_BOUND: Duration = Duration::from_secs(90);

/// A replica whose `far` profile runs on bridges labelled `pool = "far"` (and whose `nowhere`
/// profile asks for a pool no bridge serves).
fn replica(dir: &Path, name: &str, database_url: &str) -> ServeProcess {
    let config = dir.join(format!("config-{name}.toml"));
    std::fs::write(
        &config,
        r#"
[profiles.far]
kind = "remote"
bridge_profile = "mock"
bridge_labels = { pool = "far" }
startup_timeout = "20s"
reconnect_grace = "1s"

[profiles.nowhere]
kind = "remote"
bridge_profile = "mock"
bridge_labels = { pool = "nowhere" }
startup_timeout = "1500ms"
"#,
    )
    .unwrap();
    Serve::new()
        .args(["--lease-ttl", LEASE_TTL, "--database-url", database_url])
        .arg("--data-dir")
        .arg(dir.join(format!("data-{name}")))
        .arg("--config")
        .arg(&config)
        .start()
}

fn far_bridge(replica: &ServeProcess, id: &str) -> Bridge {
    Bridge::start(
        &url(replica.addr()),
        id,
        &[("pool", "far")],
        &mock_bridge_profile("mock"),
        None,
    )
}

fn create_request(profile: &str, cwd: &Path) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        profile: profile.into(),
        cwd: cwd.to_string_lossy().into_owned(),
        ..Default::default()
    }
}

/// The advertised address of the replica holding the session's lease.
async fn lease_holder(url: &str, schema: &str, session_id: &str) -> String {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("the test database is reachable");
    tokio::spawn(connection);
    let id: uuid::Uuid = session_id.parse().unwrap();
    let row = client
        .query_one(
            &format!("SELECT owner_replica FROM {schema}.leases WHERE session_id = $1"),
            &[&id],
        )
        .await
        .expect("the session has a lease");
    let holder: String = row.get(0);
    holder
        .split_once('@')
        .map(|(_, address)| address.to_owned())
        .expect("a holder names its address")
}

/// Waits until some replica published the bridge (the replicas' own wake-up is internal).
async fn published(url: &str, schema: &str, bridge_id: &str) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("the test database is reachable");
    tokio::spawn(connection);
    let sql = format!("SELECT count(*) FROM {schema}.bridges WHERE bridge_id = $1");
    loop {
        let row = client.query_one(&sql, &[&bridge_id]).await.unwrap();
        if row.get::<_, i64>(0) > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn frames(log: &[pb::LogEntry]) -> Vec<Value> {
    log.iter()
        .map(|e| serde_json::from_str(&e.json).expect("logged JSON"))
        .collect()
}

fn events<'a>(frames: &'a [Value], name: &str) -> Vec<&'a Value> {
    frames.iter().filter(|f| f["event"] == name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_session_created_on_a_replica_without_the_bridge_runs_on_the_replica_holding_it() {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    let dir = tempfile::tempdir().unwrap();
    let a = replica(dir.path(), "a", &database_url);
    let b = replica(dir.path(), "b", &database_url);
    within(TEST_BOUND, async {
        let _bridge = far_bridge(&b, "b1");
        // Created on a, which has no bridge: it waits until b publishes one, then hands over.
        let mut session =
            Session::create_with_client(a.client().await, create_request("far", dir.path())).await;
        assert_eq!(
            lease_holder(&url, &schema, &session.id).await,
            b.addr().to_string(),
            "owned by the replica holding the bridge's stream"
        );
        let mut watch = session.watch().await;
        let turn = session.prompt("through a, run on b").await;
        assert_eq!(
            watch.response_to(&turn.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        let log = frames(&session.log().await);
        let started = events(&log, "runtime_started");
        assert_eq!(started.len(), 1);
        assert_eq!(started[0]["bridge"], "b1", "{}", started[0]);
        assert!(b.logged("session created"), "created on b");
        assert!(!a.logged("session created"), "not on a");
    })
    .await;
    drop((a, b));
    drop_schema(&url, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_session_with_no_matching_bridge_on_any_replica_fails_naming_the_labels_and_stores_nothing()
 {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    let dir = tempfile::tempdir().unwrap();
    let a = replica(dir.path(), "a", &database_url);
    let b = replica(dir.path(), "b", &database_url);
    within(TEST_BOUND, async {
        let _bridge = far_bridge(&b, "b1");
        let mut client = a.client().await;
        let status = expect_err(
            client
                .create_session(create_request("nowhere", dir.path()))
                .await,
        );
        assert_error(&status, Code::Unavailable, "RUNTIME_START_FAILED");
        assert!(
            status.message().contains("pool=nowhere"),
            "{}",
            status.message()
        );
        let listed = client
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert!(listed.sessions.is_empty(), "{:?}", listed.sessions);
    })
    .await;
    drop((a, b));
    drop_schema(&url, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_session_whose_bridge_now_serves_another_replica_moves_there_and_reopens_by_resume()
 {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    let dir = tempfile::tempdir().unwrap();
    let mut a = replica(dir.path(), "a", &database_url);
    let b = replica(dir.path(), "b", &database_url);
    within(TEST_BOUND, async {
        let mut first = far_bridge(&a, "b1");
        let mut session =
            Session::create_with_client(a.client().await, create_request("far", dir.path())).await;
        let mut watch = session.watch().await;
        let turn = session.prompt("one").await;
        watch.response_to(&turn.action_id).await;
        // The bridge goes; another one (same pool) serves b only.
        first.kill().await;
        watch.status(pb::SessionStatus::Disconnected).await;
        let _second = far_bridge(&b, "b2");
        published(&url, &schema, "b2").await;
        // Asked through a, which no longer has a matching bridge: a gives the lease up and b,
        // which holds the bridge, claims the session and reopens it.
        let mut via_a = Session::attach(a.client().await, &session.id);
        let reply = via_a.prompt("two").await;
        let mut on_b = Session::attach(b.client().await, &session.id);
        let mut watch = on_b.watch().await;
        assert_eq!(
            watch.response_to(&reply.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        assert_eq!(
            lease_holder(&url, &schema, &session.id).await,
            b.addr().to_string()
        );
        let event = a
            .next_logged("lease moved: the session's bridge is connected to another replica")
            .await
            .expect("a logged the move");
        assert_eq!(event["session"], session.id.as_str(), "{event}");
        assert_eq!(event["bridge"], "b2", "{event}");
        assert_eq!(event["to"], b.addr().to_string(), "{event}");
        let log = frames(&on_b.log().await);
        let started = events(&log, "runtime_started");
        assert_eq!(started.last().unwrap()["bridge"], "b2");
        assert!(
            log.iter().any(|f| f["method"] == "session/resume"),
            "reopened through resume"
        );
    })
    .await;
    drop((a, b));
    drop_schema(&url, &schema).await;
}
