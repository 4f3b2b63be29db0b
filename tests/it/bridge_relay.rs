//! The relay's flow control (docs/bridges.md, "Several replicas"): a bridge
//! that redialled replica b reaches the sessions other replicas own through b's relay, one route
//! per owner. One owner made slow or unreachable — its peers reach it only through the test
//! kit's fault proxy, which delays every packet 1 s or black-holes them — holds up its own route
//! only: on the same bridge, a session b owns and one a third replica c owns finish their turns
//! meanwhile, and the slow owner's route is not cut to let them through.
//!
//! Needs `AGENT_HARNESS_TEST_DATABASE_URL` like the other PostgreSQL tests (skipped without it,
//! except under `CI=true`); each test works in a schema of its own and drops it at the end.

use std::time::Duration;

use agent_harness::pb::v1 as pb;
use serde_json::Value;

use crate::{
    bridge::{Bridge, mock_bridge_profile, url},
    bridge_replicas::{create_request, events, frames, replica, replica_with},
    harness::within,
    postgres::{test_schema, url_in_schema},
    process::ServeProcess,
    proxy::FaultProxy,
    replica_ownership::drop_schema,
    support::{Session, Watch, answer_request},
};

const TEST_BOUND: Duration = Duration::from_secs(90);
/// What the slow owner's agent streams, half a second after the marker chunk the test waits for
/// (so after the fault): more than the bridge sends before it waits for acknowledgements, and far
/// more than the slowed link carries while the other sessions take their turns.
const FLOOD_CHUNKS: usize = 1200;
const FLOOD_CHUNK_BYTES: usize = 16_000;
/// The other sessions' agents answer three seconds into their turns, the flood on by then.
const OTHERS_SCRIPT: &str = "@chunks 1 10\n@sleep 3000\n@chunks 3 30";
/// A relay that waited for the owner would hold the other sessions' lines behind every flood
/// line the bridge sent before them (some 600: its own queue, the relay's and the HTTP/2
/// windows between), so they could not finish before the owner had taken in some 300.
/// Delayed 1 s a packet, the owner takes in about 64 a round trip (2 s, its HTTP/2 window): 250
/// leaves the others some 8 s for their 3.5 s turns on a loaded machine.
const FLOOD_TAKEN_IN_BEFORE_THE_OTHERS_FINISH: usize = 250;
/// The message a replica logs when it starts relaying a redialled bridge's runtimes.
const RELAYING: &str =
    "bridge redialled here: relaying its runtimes to the replica owning their sessions";
/// What a relaying replica logs when it gives up a route (the owner ended it, or it was cut) and
/// stops its runtimes.
const ROUTE_GIVEN_UP: [&str; 2] = [
    "the owner replica ended a relayed stream: stopping its runtime",
    "a relayed route was cut: stopping its runtime",
];

#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Every packet to and from the owner passes 1 s late.
    Delay,
    /// Nothing passes either way; no socket is closed.
    BlackHole,
}

/// The Service sends the bridge to `replica`: its stream is cut and it redials there.
fn send_bridge_to(service: &FaultProxy, replica: &ServeProcess) {
    service.point_to(replica.addr());
    service.close_connections();
}

/// Creates a remote session on `replica` and starts a turn held on a permission request: the
/// session stays with its owner while the turn is in flight. Its watch, turn and request.
async fn held_turn(
    replica: &ServeProcess,
    cwd: &std::path::Path,
    text: &str,
) -> (Session, Watch, pb::ControlResponse, Value) {
    let mut session =
        Session::create_with_client(replica.client().await, create_request("far", cwd)).await;
    let mut watch = session.watch().await;
    let turn = session.prompt(text).await;
    let request = watch.agent_request("session/request_permission").await;
    (session, watch, turn, request)
}

/// The numbers of the mock agent's numbered chunks in a log, in order.
fn flood_numbers(log: &[pb::LogEntry]) -> Vec<usize> {
    frames(log)
        .iter()
        .filter_map(|f| f["params"]["update"]["content"]["text"].as_str())
        .filter(|t| t.starts_with('#'))
        .map(|t| t[1..t.find(':').unwrap()].parse().unwrap())
        .collect()
}

async fn a_slow_owner(fault: Fault) {
    let Some((database, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&database, &schema);
    let dir = tempfile::tempdir().unwrap();
    // a advertises the proxy's address, so its peers (the relay among them) reach it through
    // the proxy; the test's own calls go to a directly.
    let to_a = FaultProxy::start("127.0.0.1:9").await;
    let a = replica_with(
        dir.path(),
        "a",
        &database_url,
        &["--advertise-address", &to_a.addr().to_string()],
    );
    to_a.point_to(a.addr());
    let mut b = replica(dir.path(), "b", &database_url);
    let mut c = replica(dir.path(), "c", &database_url);
    within(TEST_BOUND, async {
        let service = FaultProxy::start(a.addr()).await;
        let _bridge = Bridge::start(
            &url(service.addr()),
            "b1",
            &[("pool", "far")],
            &mock_bridge_profile("mock"),
            None,
        );
        // a's session: its flood waits behind a permission request.
        let flood_text = format!(
            "flood\n@permission\n@chunks 1 10\n@sleep 500\n@chunks {FLOOD_CHUNKS} {FLOOD_CHUNK_BYTES}"
        );
        let (mut on_a, mut a_watch, flood, flood_request) =
            held_turn(&a, dir.path(), &flood_text).await;

        // The bridge moves to c, which relays a's runtime; c's own session starts there.
        send_bridge_to(&service, &c);
        c.next_logged(RELAYING).await.expect("c relays a's runtime");
        let (mut on_c, mut c_watch, c_turn, c_request) =
            held_turn(&c, dir.path(), &format!("held on c\n@permission\n{OTHERS_SCRIPT}")).await;

        // Then to b, which relays a's runtime to a and c's to c; b's own session starts there.
        send_bridge_to(&service, &b);
        let mut owners = Vec::new();
        for _ in 0..2 {
            let relayed = b.next_logged(RELAYING).await.expect("b relays");
            owners.push(relayed["owner"].as_str().unwrap().to_owned());
        }
        owners.sort();
        let mut expected = vec![to_a.addr().to_string(), c.addr().to_string()];
        expected.sort();
        assert_eq!(owners, expected, "one route per owner");
        let mut on_b =
            Session::create_with_client(b.client().await, create_request("far", dir.path())).await;
        let mut b_watch = on_b.watch().await;

        // a's agent is about to flood its route when a's link goes bad.
        on_a.act(answer_request(&flood_request, Some("allow-once")))
            .await
            .expect("a takes the answer");
        a_watch.chunk("#0:").await;
        match fault {
            // 1 s each way: a 2 s round trip, well inside the relay's HTTP/2 keepalive (a ping
            // unanswered for 5 s ends the route), even on a loaded machine — slow, not dead.
            Fault::Delay => to_a.delay(Duration::from_secs(1)),
            Fault::BlackHole => to_a.black_hole(),
        }

        // The sessions b and c own finish their turns meanwhile, a's route still up.
        let b_turn = on_b
            .prompt(&format!("on b while a is slow\n{OTHERS_SCRIPT}"))
            .await;
        on_c.act(answer_request(&c_request, Some("allow-once")))
            .await
            .expect("c takes the answer");
        for (watch, turn) in [(&mut b_watch, &b_turn), (&mut c_watch, &c_turn)] {
            assert_eq!(
                watch.response_to(&turn.action_id).await["result"]["stopReason"],
                "end_turn"
            );
        }
        for given_up in ROUTE_GIVEN_UP {
            assert!(!b.logged(given_up), "b gave a's route up: {given_up}");
        }
        let taken_in = flood_numbers(&on_a.log().await).len() - 1;
        assert!(
            taken_in < FLOOD_TAKEN_IN_BEFORE_THE_OTHERS_FINISH,
            "the others finished only after a took in {taken_in} flood lines"
        );
        to_a.restore();

        if let Fault::Delay = fault {
            // Slow, not cut: a's turn goes on to its end with every chunk once, in order.
            assert_eq!(
                a_watch.response_to(&flood.action_id).await["result"]["stopReason"],
                "end_turn"
            );
            let frames = frames(&a_watch.entries);
            let want: Vec<usize> = [0].into_iter().chain(0..FLOOD_CHUNKS).collect();
            assert_eq!(
                flood_numbers(&a_watch.entries),
                want,
                "the marker, then every chunk exactly once, in order"
            );
            assert!(events(&frames, "fault").is_empty(), "no fault");
            assert_eq!(
                events(&frames, "runtime_started").len(),
                1,
                "never restarted"
            );
        }
    })
    .await;
    drop((a, b, c, to_a));
    drop_schema(&database, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_owner_does_not_stall_another_session_on_the_same_bridge() {
    a_slow_owner(Fault::Delay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_owner_does_not_stall_another_session_on_the_same_bridge() {
    a_slow_owner(Fault::BlackHole).await;
}
