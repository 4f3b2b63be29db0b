//! A replica cut off from PostgreSQL mid-turn fences itself off by the clock: three `serve`
//! replicas on one database, the owner reaching it through the test kit's fault proxy. With
//! the owner's traffic black-holed (sockets left open) or delayed 2 s a packet, the owner stops
//! its runtime before its lease can expire in the database, so no other replica may claim the
//! session while it still runs an agent; another replica then claims it, fails the cut turn
//! ("owner replica lost", never re-sent) and runs every queued prompt once.
//!
//! Sampled every 100 ms through `/proc` and the lease row (read directly, not through the
//! proxy): never two replicas running a runtime for the session, and never the owner running
//! one once its lease has expired or moved.
//!
//! Needs `AGENT_HARNESS_TEST_DATABASE_URL` like the other PostgreSQL tests (and fails without it
//! when `CI=true`); each test works in a schema of its own and drops it at the end.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use agent_harness::pb::v1 as pb;
use tokio::time::Instant;

use crate::{
    harness::within,
    postgres::{test_schema, url_in_schema},
    postgres_outage::through,
    proxy::FaultProxy,
    replica_ownership::{Replica, create_on, drop_schema, prompts_sent, watch_when_served},
    support::{Session, processes_with},
};

/// Bound of each test.
const TEST_BOUND: Duration = Duration::from_secs(60);
/// How often the sampler looks.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// A turn that streams a chunk every 100 ms for longer than any test runs.
fn streaming_turn() -> String {
    let mut text = String::from("stream until cut\n");
    for _ in 0..600 {
        text.push_str("@chunks 1 20\n@sleep 100\n");
    }
    text
}

/// The session's lease as the database has it now: holder, fence, and whether it has expired
/// (any replica may then claim it).
#[derive(Debug, Clone, PartialEq, Eq)]
struct LeaseRow {
    owner: String,
    fence: i64,
    expired: bool,
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("the test database");
    tokio::spawn(connection);
    client
}

async fn lease_row(client: &tokio_postgres::Client, schema: &str, session_id: &str) -> LeaseRow {
    let row = client
        .query_one(
            &format!(
                "SELECT owner_replica, fence, expires_at <= now() FROM {schema}.leases \
                 WHERE session_id = $1::text::uuid"
            ),
            &[&session_id],
        )
        .await
        .expect("the session's lease");
    LeaseRow {
        owner: row.get(0),
        fence: row.get(1),
        expired: row.get(2),
    }
}

/// One look: the lease first, then the processes, so a runtime seen alive was alive after the
/// lease was read.
#[derive(Debug)]
struct Sample {
    at: Duration,
    lease: LeaseRow,
    /// Whether replica a, b, c runs a runtime.
    running: [bool; 3],
}

/// Samples every [`SAMPLE_EVERY`] until `stop` is set.
fn sample(
    url: String,
    schema: String,
    session_id: String,
    markers: [String; 3],
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Sample>> {
    tokio::spawn(async move {
        let client = connect(&url).await;
        let started = Instant::now();
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        let mut samples = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            tick.tick().await;
            let lease = lease_row(&client, &schema, &session_id).await;
            let running = markers.clone().map(|m| !processes_with(&m).is_empty());
            samples.push(Sample {
                at: started.elapsed(),
                lease,
                running,
            });
        }
        samples
    })
}

/// Three replicas on a fresh schema, `a` reaching the database through a fault proxy.
async fn owner_behind_a_proxy()
-> Option<(tempfile::TempDir, String, String, FaultProxy, [Replica; 3])> {
    let (url, schema) = test_schema().await?;
    let (_, upstream) = through(&url, 0);
    let proxy = FaultProxy::start(upstream).await;
    let (proxied, _) = through(&url, proxy.port());
    let dir = tempfile::tempdir().unwrap();
    let a = Replica::start(dir.path(), "a", &url_in_schema(&proxied, &schema));
    let [b, c] =
        ["b", "c"].map(|name| Replica::start(dir.path(), name, &url_in_schema(&url, &schema)));
    Some((dir, url, schema, proxy, [a, b, c]))
}

/// The session's owner `a` is cut off from the database by `fault` while a turn streams and
/// two prompts wait behind it; see the module documentation for what must hold.
async fn cut_mid_turn(fault: impl FnOnce(&FaultProxy)) {
    let Some((dir, url, schema, proxy, [mut a, b, c])) = owner_behind_a_proxy().await else {
        return;
    };
    within(TEST_BOUND, async {
        let mut session = create_on(&a, &agent_harness_testkit::workspace_in(dir.path())).await;
        let id = session.id.clone();
        let mut watch = session.watch().await;
        let running = session.prompt(&streaming_turn()).await;
        watch.chunk("#0:").await;
        let first = session.prompt("queued one").await;
        let second = session.prompt("queued two").await;
        assert_eq!((first.queue_position, second.queue_position), (1, 2));
        drop(watch);
        let direct = connect(&url).await;
        let held = lease_row(&direct, &schema, &id).await;
        assert!(a.runs_a_runtime(), "the owner runs the turn");

        fault(&proxy);
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = sample(
            url.clone(),
            schema.clone(),
            id.clone(),
            [&a, &b, &c].map(|r| r.marker.clone()),
            stop.clone(),
        );

        // Another replica claims the session and runs the queued prompts.
        let mut watch = watch_when_served(b.client().await, &id).await;
        for action in [&first, &second] {
            assert_eq!(
                watch.response_to(&action.action_id).await["result"]["stopReason"],
                "end_turn"
            );
        }
        stop.store(true, Ordering::SeqCst);
        let samples = sampler.await.unwrap();

        for sample in &samples {
            let runners = sample.running.iter().filter(|r| **r).count();
            assert!(runners <= 1, "two replicas ran a runtime: {sample:?}");
            let claimable = sample.lease.expired || sample.lease != held;
            assert!(
                !(claimable && sample.running[0]),
                "the owner ran its runtime after its lease could be claimed: {sample:?}"
            );
        }
        let moved = samples
            .iter()
            .find(|s| s.lease.owner != held.owner)
            .expect("the lease moved while sampled");
        let gone = samples.iter().find(|s| !s.running[0]).map(|s| s.at);
        let expired = samples.iter().find(|s| s.lease.expired).map(|s| s.at);
        eprintln!(
            "after the cut: the owner's runtime gone by {gone:?}, its lease seen expired at \
             {expired:?}, claimed by another replica at {:?}",
            moved.at
        );

        // The owner stopped the session because its lease ran out of time, not for any other
        // reason.
        a.process
            .next_logged("lease not renewed in time; stopping the session")
            .await
            .expect("the owner logged its self-fencing");

        let mut via_c = Session::attach(c.client().await, &id);
        let log = via_c.log().await;
        for (i, entry) in log.iter().enumerate() {
            assert_eq!(entry.offset, i as u64 + 1, "offsets are dense");
        }
        assert_eq!(
            prompts_sent(&log),
            [
                running.action_id.clone(),
                first.action_id.clone(),
                second.action_id.clone()
            ],
            "the cut turn is never re-sent; each queued prompt is sent once, in order"
        );
        let transcript = via_c.transcript().await;
        let cut_turn = transcript
            .messages
            .iter()
            .find(|m| m.request_id.as_deref() == Some(running.action_id.as_str()))
            .expect("the cut turn's prompt")
            .turn;
        let cut = transcript
            .messages
            .iter()
            .find(|m| m.turn == cut_turn && m.role == pb::MessageRole::Agent as i32)
            .expect("the cut turn's answer");
        assert_eq!(cut.stop_reason, Some(pb::StopReason::Failed as i32));
        assert_eq!(cut.error.as_deref(), Some("owner replica lost"));
        assert!(
            processes_with(&a.marker).is_empty(),
            "the owner runs nothing"
        );
    })
    .await;
    drop((a, b, c, proxy));
    drop_schema(&url, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_black_holed_from_the_database_mid_turn_stops_its_runtime_before_another_replica_may_claim()
 {
    cut_mid_turn(FaultProxy::black_hole).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_whose_database_packets_are_delayed_two_seconds_stops_its_runtime_before_another_replica_may_claim()
 {
    cut_mid_turn(|proxy| proxy.delay(Duration::from_secs(2))).await;
}
