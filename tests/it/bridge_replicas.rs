//! Bridges with several replicas (docs/bridges.md, "Several replicas"): real `serve` replicas on one
//! PostgreSQL database and a real `agent-harness bridge` dialling one of them. A remote session
//! is owned by the replica holding its bridge's stream, wherever it was created or is called;
//! when the bridge serves another replica, the session's lease moves there.
//!
//! Needs `AGENT_HARNESS_TEST_DATABASE_URL` like the other PostgreSQL tests (skipped without it,
//! except under `CI=true`); each test works in a schema of its own and drops it at the end.

use std::{path::Path, time::Duration};

use agent_harness::pb::v1::{self as pb, agent_session_service_client::AgentSessionServiceClient};
use serde_json::Value;
use tonic::{Code, service::interceptor::InterceptedService};

use crate::{
    auth::{ADA, Bearer, tokens_text},
    bridge::{Bridge, mock_bridge_profile, url},
    harness::{assert_error, expect_err, within},
    postgres::{test_schema, url_in_schema},
    process::{Serve, ServeProcess},
    proxy::FaultProxy,
    replica_ownership::{LEASE_TTL, drop_schema},
    support::{Session, Watch, number_id, permission_answer, processes_with, prompt},
};

const TEST_BOUND: Duration = Duration::from_secs(90);

/// A replica whose `far` profile runs on bridges labelled `pool = "far"` (and whose `nowhere`
/// profile asks for a pool no bridge serves).
pub(crate) fn replica(dir: &Path, name: &str, database_url: &str) -> ServeProcess {
    replica_with(dir, name, database_url, &[])
}

/// [`replica`] with extra `serve` flags.
pub(crate) fn replica_with(
    dir: &Path,
    name: &str,
    database_url: &str,
    flags: &[&str],
) -> ServeProcess {
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
    Serve::on(dir.join(format!("data-{name}")), &config)
        .replica(database_url, LEASE_TTL)
        .args(flags)
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

pub(crate) fn create_request(profile: &str, cwd: &Path) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        profile: profile.into(),
        cwd: cwd.to_string_lossy().into_owned(),
        ..Default::default()
    }
}

/// The session's lease fence: it grows each time the lease changes hands, and a write carrying
/// an older one is refused.
async fn lease_fence(url: &str, schema: &str, session_id: &str) -> i64 {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("the test database is reachable");
    tokio::spawn(connection);
    let id: uuid::Uuid = session_id.parse().unwrap();
    client
        .query_one(
            &format!("SELECT fence FROM {schema}.leases WHERE session_id = $1"),
            &[&id],
        )
        .await
        .expect("the session has a lease")
        .get(0)
}

/// The advertised address of the replica holding the session's lease.
pub(crate) async fn lease_holder(url: &str, schema: &str, session_id: &str) -> String {
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
    published_where(url, schema, bridge_id, "true").await;
}

/// Waits until some replica published the bridge as held but not connected there.
async fn published_held(url: &str, schema: &str, bridge_id: &str) {
    published_where(url, schema, bridge_id, "NOT connected").await;
}

/// Takes the bridge's publications away (as if they were late).
async fn unpublish(url: &str, schema: &str, bridge_id: &str) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("the test database is reachable");
    tokio::spawn(connection);
    client
        .execute(
            &format!("DELETE FROM {schema}.bridges WHERE bridge_id = $1"),
            &[&bridge_id],
        )
        .await
        .unwrap();
}

async fn published_where(url: &str, schema: &str, bridge_id: &str, condition: &str) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("the test database is reachable");
    tokio::spawn(connection);
    let sql = format!("SELECT count(*) FROM {schema}.bridges WHERE bridge_id = $1 AND {condition}");
    loop {
        let row = client.query_one(&sql, &[&bridge_id]).await.unwrap();
        if row.get::<_, i64>(0) > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) fn frames(log: &[pb::LogEntry]) -> Vec<Value> {
    log.iter()
        .map(|e| serde_json::from_str(&e.json).expect("logged JSON"))
        .collect()
}

pub(crate) fn events<'a>(frames: &'a [Value], name: &str) -> Vec<&'a Value> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_redialing_another_replica_finishes_the_turn_in_flight_without_a_fault_then_the_session_moves_there()
 {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    let dir = tempfile::tempdir().unwrap();
    let mut b = replica(dir.path(), "b", &database_url);
    let mut c = replica(dir.path(), "c", &database_url);
    within(TEST_BOUND, async {
        let proxy = FaultProxy::start(b.addr()).await;
        let _bridge = Bridge::start(
            &format!("http://{}", proxy.addr()),
            "b1",
            &[("pool", "far")],
            &mock_bridge_profile("mock"),
            None,
        );
        let mut session =
            Session::create_with_client(b.client().await, create_request("far", dir.path())).await;
        let mut watch = session.watch().await;
        let turn = session
            .prompt("before and after\n@chunks 20 30\n@permission\n@chunks 2000 31")
            .await;
        let request = watch.agent_request("session/request_permission").await;
        let fence_on_b = lease_fence(&url, &schema, &session.id).await;
        // The Service now sends the bridge to c.
        proxy.point_to(c.addr());
        proxy.close_connections();
        let relayed = c
            .next_logged(
                "bridge redialled here: relaying its runtimes to the replica owning their sessions",
            )
            .await
            .expect("c relays the runtime");
        assert_eq!(relayed["owner"], b.addr().to_string(), "{relayed}");
        let id = request["id"]
            .as_i64()
            .expect("the mock numbers its requests");
        session
            .act(permission_answer(number_id(id), Some("allow-once")))
            .await
            .unwrap();
        assert_eq!(
            watch.response_to(&turn.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        // The turn in flight finished on b, through c's relay: same epoch, no fault, no gap.
        let log = session.log().await;
        let offsets: Vec<u64> = log.iter().map(|e| e.offset).collect();
        let expected: Vec<u64> = (1..=offsets.len() as u64).collect();
        assert_eq!(offsets, expected, "no gap in the log");
        let frames_then = frames(&log);
        let turn_end = frames_then
            .iter()
            .position(|f| f["id"] == turn.action_id.as_str() && f.get("result").is_some())
            .expect("the turn's response is logged");
        assert_eq!(
            events(&frames_then[..turn_end], "runtime_started").len(),
            1,
            "same runtime epoch during the turn: never restarted"
        );
        assert!(events(&frames_then, "fault").is_empty(), "no fault");
        let numbers: Vec<usize> = frames_then
            .iter()
            .filter_map(|f| f["params"]["update"]["content"]["text"].as_str())
            .filter(|t| t.starts_with('#'))
            .map(|t| t[1..t.find(':').unwrap()].parse().unwrap())
            .collect();
        let want: Vec<usize> = (0..20).chain(0..2000).collect();
        assert_eq!(numbers, want, "every chunk exactly once, in order");

        // Once idle, b gives the session up to c, which holds the bridge's stream.
        let moved = b
            .next_logged("lease moved: the session's bridge is connected to another replica")
            .await
            .expect("b moved the lease");
        assert_eq!(moved["session"], session.id.as_str(), "{moved}");
        assert_eq!(moved["bridge"], "b1", "{moved}");
        assert_eq!(moved["to"], c.addr().to_string(), "{moved}");
        // The next turn, asked of b, runs on c (reopened by resume on the same bridge).
        let next = session.prompt("again").await;
        let mut on_c = Session::attach(c.client().await, &session.id);
        let mut watch = on_c.watch().await;
        assert_eq!(
            watch.response_to(&next.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        assert_eq!(
            lease_holder(&url, &schema, &session.id).await,
            c.addr().to_string(),
            "the lease moved to the replica holding the bridge's stream"
        );
        assert!(
            lease_fence(&url, &schema, &session.id).await > fence_on_b,
            "b's writes for the session are fenced off"
        );
        let log = on_c.log().await;
        let offsets: Vec<u64> = log.iter().map(|e| e.offset).collect();
        let expected: Vec<u64> = (1..=offsets.len() as u64).collect();
        assert_eq!(offsets, expected, "no gap in the log");
        let frames = frames(&log);
        assert!(events(&frames, "fault").is_empty(), "no fault");
        let started = events(&frames, "runtime_started");
        assert_eq!(started.len(), 2, "reopened once, on c");
        assert_eq!(started[1]["bridge"], "b1");
        assert!(
            frames.iter().any(|f| f["method"] == "session/resume"),
            "reopened through resume"
        );
        let stopped = events(&frames, "runtime_stopped");
        assert_eq!(stopped.len(), 1, "b stopped its runtime once, idle");
    })
    .await;
    drop((b, c));
    drop_schema(&url, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_owner_dies_mid_turn_while_its_runtime_is_relayed_the_agent_is_stopped_and_the_session_reopens_where_the_bridge_is()
 {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    let dir = tempfile::tempdir().unwrap();
    let mut b = replica(dir.path(), "b", &database_url);
    let mut c = replica(dir.path(), "c", &database_url);
    within(TEST_BOUND, async {
        let marker = format!("agent-{}", uuid::Uuid::now_v7().simple());
        let profile = format!(
            "[profiles.mock]\ncommand = {:?}\nargs = [\"mock-agent\", \"--resume\", \"--stderr-at-start\", {marker:?}]\n",
            env!("CARGO_BIN_EXE_agent-harness")
        );
        let proxy = FaultProxy::start(b.addr()).await;
        let _bridge = Bridge::start(
            &format!("http://{}", proxy.addr()),
            "b1",
            &[("pool", "far")],
            &profile,
            None,
        );
        let mut session =
            Session::create_with_client(b.client().await, create_request("far", dir.path())).await;
        let mut watch = session.watch().await;
        // A turn in flight (held on a permission request) keeps b from handing the session over.
        session.prompt("one\n@permission").await;
        watch.agent_request("session/request_permission").await;
        proxy.point_to(c.addr());
        proxy.close_connections();
        c.next_logged(
            "bridge redialled here: relaying its runtimes to the replica owning their sessions",
        )
        .await
        .expect("c relays the runtime");
        assert!(!processes_with(&marker).is_empty(), "the agent runs");
        b.kill_9();
        c.next_logged("the owner replica ended a relayed stream: stopping its runtime")
            .await
            .expect("c stops the runtime nobody drives");
        while !processes_with(&marker).is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // b's lease expires and c, which holds the bridge, claims the session (the turn that was
        // in flight fails as "owner replica lost"); the next turn reopens it there.
        let mut via_c = Session::attach(c.client().await, &session.id);
        let reply = loop {
            match via_c.act(crate::support::prompt("two")).await {
                Ok(reply) => break reply,
                // b's lease has not expired yet.
                Err(status) if status.code() == Code::Unavailable => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(status) => panic!("{status:?}"),
            }
        };
        let mut watch = via_c.watch().await;
        assert_eq!(
            watch.response_to(&reply.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        assert_eq!(
            lease_holder(&url, &schema, &session.id).await,
            c.addr().to_string()
        );
        let log = frames(&via_c.log().await);
        assert!(
            log.iter().any(|f| f["method"] == "session/resume"),
            "reopened through resume"
        );
        assert_eq!(events(&log, "owner_replica_lost").len(), 1, "the turn in flight failed");
    })
    .await;
    drop((b, c));
    drop_schema(&url, &schema).await;
}

const PEER_TOKEN: &str = "peer-secret-token";
const BRIDGE_TOKEN: &str = "bridge-secret-token";

/// Ada's client of a replica: her token on every call.
async fn ada_on(
    replica: &ServeProcess,
) -> AgentSessionServiceClient<InterceptedService<tonic::transport::Channel, Bearer>> {
    AgentSessionServiceClient::with_interceptor(
        replica.channel().await,
        Bearer::new(Some(ADA), None),
    )
}

/// With tokens on every replica: the replica the bridge redials relays its
/// runtime to the owner with its replica token, acting as the bridge's `runtime` principal, and
/// the session moves there afterwards; Ada reaches it through either replica throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tokens_a_bridge_redialing_another_replica_is_relayed_as_itself_and_its_session_moves()
{
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        tokens_text(&[
            (ADA, "ada", "user"),
            (PEER_TOKEN, "peers", "replica"),
            (BRIDGE_TOKEN, "sandbox-7", "runtime"),
        ]),
    )
    .unwrap();
    let replica_token = dir.path().join("replica-token");
    std::fs::write(&replica_token, format!("{PEER_TOKEN}\n")).unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[profiles.far]\nkind = \"remote\"\nbridge_profile = \"mock\"\n\
             bridge_labels = {{ pool = \"far\" }}\nstartup_timeout = \"20s\"\n\
             reconnect_grace = \"1s\"\nallowed_cwd_roots = [{:?}]\n",
            dir.path().to_string_lossy()
        ),
    )
    .unwrap();
    let start = |name: &str| {
        Serve::on(dir.path().join(format!("data-{name}")), &config)
            .replica(&database_url, LEASE_TTL)
            .arg("--tokens-file")
            .arg(&tokens)
            .arg("--replica-token-file")
            .arg(&replica_token)
            .start()
    };
    let mut b = start("b");
    let mut c = start("c");
    within(TEST_BOUND, async {
        let proxy = FaultProxy::start(b.addr()).await;
        let _bridge = Bridge::start(
            &format!("http://{}", proxy.addr()),
            "b1",
            &[("pool", "far")],
            &mock_bridge_profile("mock"),
            Some(BRIDGE_TOKEN),
        );
        let mut via_b = ada_on(&b).await;
        let mut via_c = ada_on(&c).await;
        let created = via_b
            .create_session(create_request("far", dir.path()))
            .await
            .expect("Ada creates a remote session on b")
            .into_inner();
        let id = created.session.unwrap().id;
        let control = |action| pb::ControlRequest {
            session_id: id.clone(),
            action: Some(action),
            ..Default::default()
        };
        // Ada follows the session on c, which stays up throughout.
        let mut watch = Watch {
            stream: via_c
                .subscribe(pb::SubscribeRequest {
                    session_id: id.clone(),
                    after_offset: 0,
                    view: pb::SubscribeView::Log as i32,
                })
                .await
                .expect("Ada subscribes through c")
                .into_inner(),
            entries: Vec::new(),
            statuses: Vec::new(),
        };
        let turn = via_b
            .control(control(prompt(
                "held\n@chunks 5 30\n@permission\n@chunks 50 31",
            )))
            .await
            .expect("the prompt is accepted")
            .into_inner();
        let request = watch.agent_request("session/request_permission").await;
        let request_id = request["id"]
            .as_i64()
            .expect("the mock numbers its requests");

        // The Service sends the bridge to c, which relays it to b as the bridge itself.
        proxy.point_to(c.addr());
        proxy.close_connections();
        c.next_logged(
            "bridge redialled here: relaying its runtimes to the replica owning their sessions",
        )
        .await
        .expect("c relays the runtime");
        // Ada answers through c (forwarded to the owner b) and the turn ends well.
        via_c
            .control(control(permission_answer(
                number_id(request_id),
                Some("allow-once"),
            )))
            .await
            .expect("the answer is accepted through c");
        let response = watch.response_to(&turn.action_id).await;
        assert_eq!(response["result"]["stopReason"], "end_turn", "{response}");
        let offsets: Vec<u64> = watch.entries.iter().map(|e| e.offset).collect();
        assert_eq!(
            offsets,
            (1..=offsets.len() as u64).collect::<Vec<_>>(),
            "no gap"
        );
        let frames_then = frames(&watch.entries);
        assert!(events(&frames_then, "fault").is_empty(), "no fault");
        assert_eq!(
            events(&frames_then, "runtime_started").len(),
            1,
            "never restarted"
        );

        // Idle, the session moves to c, and Ada's next prompt runs there.
        let moved = b
            .next_logged("lease moved: the session's bridge is connected to another replica")
            .await
            .expect("b moved the lease");
        assert_eq!(moved["to"], c.addr().to_string(), "{moved}");
        let next = via_b
            .control(control(prompt("again")))
            .await
            .expect("the next prompt is accepted")
            .into_inner();
        watch.response_to(&next.action_id).await;
        let frames = frames(&watch.entries);
        assert!(events(&frames, "fault").is_empty(), "no fault");
        assert_eq!(
            lease_holder(&url, &schema, &id).await,
            c.addr().to_string(),
            "the lease is c's"
        );
    })
    .await;
    drop((b, c));
    drop_schema(&url, &schema).await;
}

const MALLORY_TOKEN: &str = "mallory-bridge-token";

/// A bridge is its token, across replicas: Mallory's runtime token names Ada's bridge id on
/// the replica that does not hold it. While Ada's bridge is connected, that replica refuses from
/// the published bridges; while her bridge's stream is broken (within its reconnect grace, so
/// not published), it relays Mallory's hello to the owner of the runtime she lists, as Mallory,
/// and the owner's refusal is Mallory's answer. Ada's bridge comes back and her turn completes
/// with no fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impostors_hello_through_another_replica_is_refused_and_the_victims_turn_completes() {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        tokens_text(&[
            (ADA, "ada", "user"),
            (PEER_TOKEN, "peers", "replica"),
            (BRIDGE_TOKEN, "sandbox-7", "runtime"),
            (MALLORY_TOKEN, "mallory", "runtime"),
        ]),
    )
    .unwrap();
    let replica_token = dir.path().join("replica-token");
    std::fs::write(&replica_token, format!("{PEER_TOKEN}\n")).unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[profiles.far]\nkind = \"remote\"\nbridge_profile = \"mock\"\n\
             bridge_labels = {{ pool = \"far\" }}\nstartup_timeout = \"20s\"\n\
             reconnect_grace = \"60s\"\nallowed_cwd_roots = [{:?}]\n",
            dir.path().to_string_lossy()
        ),
    )
    .unwrap();
    let start = |name: &str| {
        Serve::on(dir.path().join(format!("data-{name}")), &config)
            .replica(&database_url, LEASE_TTL)
            .arg("--tokens-file")
            .arg(&tokens)
            .arg("--replica-token-file")
            .arg(&replica_token)
            .start()
    };
    let b = start("b");
    let c = start("c");
    within(TEST_BOUND, async {
        let proxy = FaultProxy::start(b.addr()).await;
        let _bridge = Bridge::start(
            &format!("http://{}", proxy.addr()),
            "b1",
            &[("pool", "far")],
            &mock_bridge_profile("mock"),
            Some(BRIDGE_TOKEN),
        );
        let mut via_b = ada_on(&b).await;
        let id = via_b
            .create_session(create_request("far", dir.path()))
            .await
            .expect("Ada creates a remote session on b")
            .into_inner()
            .session
            .unwrap()
            .id;
        let control = |action| pb::ControlRequest {
            session_id: id.clone(),
            action: Some(action),
            ..Default::default()
        };
        let mut watch = Watch {
            stream: via_b
                .subscribe(pb::SubscribeRequest {
                    session_id: id.clone(),
                    after_offset: 0,
                    view: pb::SubscribeView::Log as i32,
                })
                .await
                .expect("Ada subscribes")
                .into_inner(),
            entries: Vec::new(),
            statuses: Vec::new(),
        };
        let turn = via_b
            .control(control(prompt("mine\n@permission\n@chunks 5 30")))
            .await
            .expect("the prompt is accepted")
            .into_inner();
        let request = watch.agent_request("session/request_permission").await;
        let started = frames(&watch.entries);
        let key = events(&started, "runtime_started")[0]["runtime_key"]
            .as_str()
            .expect("a runtime key")
            .to_owned();
        let hello = pb::BridgeHello {
            bridge_id: "b1".into(),
            labels: [("pool".to_owned(), "far".to_owned())].into(),
            profiles: vec!["mock".into()],
            running: vec![pb::BridgeRuntime {
                runtime_key: key,
                last_stdin_seq: 0,
                last_stdout_seq: 0,
                session_id: id.clone(),
            }],
            ..Default::default()
        };

        // Ada's bridge is connected to b and published: c refuses Mallory itself.
        published(&url, &schema, "b1").await;
        let status = expect_err(
            crate::bridge::hello_with(c.channel().await, Some(MALLORY_TOKEN), hello.clone()).await,
        );
        assert_error(&status, Code::PermissionDenied, "FORBIDDEN");

        // Ada's bridge loses its stream (its redials go nowhere for now): b waits for it and
        // publishes it as held, not connected. Mallory cannot take the id on c meanwhile.
        let nowhere = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let nowhere_addr = nowhere.local_addr().unwrap();
        drop(nowhere);
        proxy.point_to(nowhere_addr);
        proxy.close_connections();
        published_held(&url, &schema, "b1").await;
        let squat = pb::BridgeHello {
            running: Vec::new(),
            ..hello.clone()
        };
        let status = expect_err(
            crate::bridge::hello_with(c.channel().await, Some(MALLORY_TOKEN), squat).await,
        );
        assert_error(&status, Code::PermissionDenied, "FORBIDDEN");
        // Were b's publication missing (late, or lost), c relays Mallory's hello to b, the
        // owner of the runtime she lists, and b's refusal is her answer. (b publishes again
        // within a third of the lease TTL: the row is taken away right before each try.)
        let mut tries = 0;
        while !c.logged("the replica owning a bridge's runtimes refused its stream") {
            tries += 1;
            assert!(tries <= 20, "c never relayed the hello to b");
            unpublish(&url, &schema, "b1").await;
            let status = expect_err(
                crate::bridge::hello_with(c.channel().await, Some(MALLORY_TOKEN), hello.clone())
                    .await,
            );
            assert_error(&status, Code::PermissionDenied, "FORBIDDEN");
        }

        // Ada's bridge comes back to b; her turn completes there, as if nothing happened.
        proxy.point_to(b.addr());
        proxy.close_connections();
        let id_number = request["id"]
            .as_i64()
            .expect("the mock numbers its requests");
        via_b
            .control(control(permission_answer(
                number_id(id_number),
                Some("allow-once"),
            )))
            .await
            .expect("the answer is accepted");
        let response = watch.response_to(&turn.action_id).await;
        assert_eq!(response["result"]["stopReason"], "end_turn", "{response}");
        let frames = frames(&watch.entries);
        assert!(events(&frames, "fault").is_empty(), "no fault");
        assert_eq!(
            events(&frames, "runtime_started").len(),
            1,
            "never restarted"
        );
        assert!(
            !watch
                .statuses
                .contains(&(pb::SessionStatus::Disconnected as i32)),
            "{:?}",
            watch.statuses
        );
    })
    .await;
    drop((b, c));
    drop_schema(&url, &schema).await;
}
