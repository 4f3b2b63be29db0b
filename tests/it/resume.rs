//! The resume rule, as a property of real streams: for random sessions (prompts with
//! chunks, tool calls and plans, permissions, queued turns, stops, refusals), clients that drop
//! their stream after a random event and resubscribe from that event's `offset` — again and
//! again, while the session runs — end with exactly what a subscriber that never left has: the
//! same final message snapshots, the same TurnEnded events, every log entry, and the same final
//! queue and status, in all three views.

use std::collections::{BTreeMap, HashSet};

use agent_harness::pb::v1::{
    self as pb, agent_session_service_client::AgentSessionServiceClient, subscribe_response::Event,
};
use proptest::prelude::*;
use tokio::sync::watch;
use tonic::transport::Channel;

use crate::{
    harness::{Harness, bounded},
    support::{Session, answer_request, mock_profile, stop},
};

/// One step of a random session; each ends with the session idle and its queue empty.
#[derive(Debug, Clone)]
enum Step {
    Chunks(u8),
    ToolAndPlan,
    Permission {
        allow: bool,
    },
    /// Two prompts back to back: the second waits in the queue.
    Queued(u8),
    /// A turn that waits for a cancel, then a stop.
    Stop,
    Refusal,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1u8..8).prop_map(Step::Chunks),
        Just(Step::ToolAndPlan),
        any::<bool>().prop_map(|allow| Step::Permission { allow }),
        (1u8..6).prop_map(Step::Queued),
        Just(Step::Stop),
        Just(Step::Refusal),
    ]
}

/// Runs the steps, waiting on the session's own log for each to finish.
async fn drive(session: &mut Session, steps: &[Step]) {
    let mut watch = session.watch().await;
    let mut answered: HashSet<String> = HashSet::new();
    for (i, step) in steps.iter().enumerate() {
        let last = match step {
            Step::Chunks(n) => session.prompt(&format!("s{i}\n@chunks {n} 40")).await,
            Step::ToolAndPlan => {
                session
                    .prompt(&format!("s{i}\n@tool t{i}\n@plan read|edit|test"))
                    .await
            }
            Step::Permission { allow } => {
                let sent = session.prompt(&format!("s{i}\n@permission")).await;
                let (_, request) = watch
                    .entry(|e, f| {
                        e.direction == pb::LogDirection::FromRuntime as i32
                            && f["method"] == "session/request_permission"
                            && !answered.contains(&f["id"].to_string())
                    })
                    .await;
                answered.insert(request["id"].to_string());
                let option = allow.then_some("allow-once");
                session
                    .act(answer_request(&request, option))
                    .await
                    .expect("the answer is taken");
                sent
            }
            Step::Queued(n) => {
                session.prompt(&format!("s{i}a\n@chunks {n} 40")).await;
                session.prompt(&format!("s{i}b")).await
            }
            Step::Stop => {
                let sent = session.prompt(&format!("s{i}\n@wait-cancel")).await;
                session.act(stop(false)).await.expect("the stop is taken");
                sent
            }
            Step::Refusal => session.prompt(&format!("s{i}\n@stop refusal")).await,
        };
        watch.response_to(&last.action_id).await;
    }
    watch.status(pb::SessionStatus::Idle).await;
}

/// Everything a client learned from one or more streams of one view.
#[derive(Debug, Default, PartialEq)]
struct Seen {
    messages: BTreeMap<String, pb::TranscriptMessage>,
    turn_ends: BTreeMap<u32, pb::TurnEnded>,
    entries: BTreeMap<u64, pb::LogEntry>,
    queue: Option<pb::QueueSnapshot>,
    status: Option<pb::SessionStatusChange>,
}

/// Per-stream bookkeeping: within one stream every offset arrives once, in order.
#[derive(Default)]
struct StreamCheck {
    last_entry: u64,
    last_cursor: u64,
    turns: HashSet<u32>,
}

impl Seen {
    /// Takes one event; panics on what no stream may do.
    fn take(&mut self, check: &mut StreamCheck, event: pb::SubscribeResponse) {
        assert!(
            event.offset >= check.last_cursor,
            "cursors never go back within a stream: {} after {}",
            event.offset,
            check.last_cursor
        );
        check.last_cursor = event.offset;
        match event.event.expect("every event has a body") {
            Event::Entry(entry) => {
                assert_eq!(
                    entry.offset,
                    check.last_entry + 1,
                    "entries arrive once, in order"
                );
                check.last_entry = entry.offset;
                self.entries.insert(entry.offset, entry);
            }
            Event::Message(message) => {
                self.messages.insert(message.id.clone(), message);
            }
            Event::TurnEnded(end) => {
                assert!(
                    check.turns.insert(end.turn),
                    "turn {} ended twice in one stream",
                    end.turn
                );
                if let Some(before) = self.turn_ends.get(&end.turn) {
                    assert_eq!(before, &end, "a resent TurnEnded is the same");
                }
                self.turn_ends.insert(end.turn, end);
            }
            Event::Queue(queue) => self.queue = Some(queue),
            Event::Status(status) => self.status = Some(status),
            Event::CaughtUp(_) | Event::Heartbeat(_) => {}
        }
    }
}

async fn open(
    client: &mut AgentSessionServiceClient<Channel>,
    id: &str,
    after: u64,
    view: pb::SubscribeView,
) -> tonic::Streaming<pb::SubscribeResponse> {
    client
        .subscribe(pb::SubscribeRequest {
            session_id: id.to_owned(),
            after_offset: after,
            view: view as i32,
        })
        .await
        .unwrap_or_else(|status| panic!("subscribed after {after} in {view:?}: {status:?}"))
        .into_inner()
}

/// Reads a new stream from `after` until `caught_up`.
async fn catch_up(
    client: &mut AgentSessionServiceClient<Channel>,
    id: &str,
    after: u64,
    view: pb::SubscribeView,
    seen: &mut Seen,
) {
    let mut stream = open(client, id, after, view).await;
    let mut check = StreamCheck {
        last_entry: after,
        last_cursor: after,
        ..Default::default()
    };
    loop {
        let event = stream.message().await.expect("no failure").expect("open");
        let caught_up = matches!(event.event, Some(Event::CaughtUp(_)));
        seen.take(&mut check, event);
        if caught_up {
            return;
        }
    }
}

/// A client that leaves after a random number of events and comes back from the last event's
/// offset, until the session is done; then it catches up one last time.
async fn resuming_client(
    mut client: AgentSessionServiceClient<Channel>,
    id: String,
    view: pb::SubscribeView,
    mut seed: u64,
    mut done: watch::Receiver<bool>,
) -> (Seen, usize) {
    let mut seen = Seen::default();
    let mut cursor = 0;
    let mut resumes = 0;
    while !*done.borrow() {
        let mut stream = open(&mut client, &id, cursor, view).await;
        let mut check = StreamCheck {
            last_entry: cursor,
            last_cursor: cursor,
            ..Default::default()
        };
        // xorshift: a cheap, reproducible stream of leave points.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let leave_after = 1 + (seed % 12) as usize;
        for _ in 0..leave_after {
            tokio::select! {
                event = stream.message() => {
                    let event = event.expect("no failure").expect("open");
                    cursor = event.offset;
                    seen.take(&mut check, event);
                }
                _ = done.changed() => break,
            }
        }
        resumes += 1;
    }
    catch_up(&mut client, &id, cursor, view, &mut seen).await;
    (seen, resumes)
}

async fn resumed_streams_end_like_an_uninterrupted_one(steps: Vec<Step>, seed: u64) {
    let h = Harness::start_with(|c| mock_profile(c, "m", &["--resume"])).await;
    let mut session = Session::create(&h, "m").await;
    let (done_tx, done_rx) = watch::channel(false);
    let views = [
        pb::SubscribeView::Log,
        pb::SubscribeView::Messages,
        pb::SubscribeView::All,
    ];
    let mut clients = Vec::new();
    for (v, view) in views.into_iter().enumerate() {
        for c in 0..2u64 {
            let client_seed =
                seed ^ (((v as u64) << 8) | c).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            clients.push((
                view,
                tokio::spawn(resuming_client(
                    h.sessions(),
                    session.id.clone(),
                    view,
                    client_seed,
                    done_rx.clone(),
                )),
            ));
        }
    }
    drive(&mut session, &steps).await;
    done_tx.send(true).expect("clients listen");
    let head = session.get().await.head_offset;

    for (view, client) in clients {
        let (resumed, resumes) = client.await.expect("the client did not panic");
        let mut never_left = Seen::default();
        let mut client = h.sessions();
        catch_up(&mut client, &session.id, 0, view, &mut never_left).await;
        assert!(resumes >= 1, "{view:?}: the client left and came back");
        assert_eq!(
            resumed.messages, never_left.messages,
            "{view:?}: final snapshots"
        );
        assert_eq!(
            resumed.turn_ends, never_left.turn_ends,
            "{view:?}: turn ends"
        );
        assert_eq!(resumed.entries, never_left.entries, "{view:?}: entries");
        assert_eq!(resumed.queue, never_left.queue, "{view:?}: queue");
        assert_eq!(resumed.status, never_left.status, "{view:?}: status");
        if view != pb::SubscribeView::Messages {
            assert_eq!(
                never_left.entries.len() as u64,
                head,
                "{view:?}: every offset"
            );
        }
        if view != pb::SubscribeView::Log {
            let agents = never_left
                .messages
                .values()
                .filter(|m| m.role == pb::MessageRole::Agent as i32);
            assert_eq!(
                agents.count(),
                never_left.turn_ends.len(),
                "{view:?}: one end per turn"
            );
        }
    }
    h.shutdown().await;
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 6,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_client_resuming_from_any_event_offset_ends_with_what_an_uninterrupted_subscriber_has(
        steps in prop::collection::vec(step(), 2..7),
        seed in any::<u64>(),
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(bounded(resumed_streams_end_like_an_uninterrupted_one(steps, seed)));
    }
}

#[tokio::test]
async fn a_stream_that_falls_behind_gets_the_queue_as_it_stands_once_it_caught_up() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        // Subscribed, then not read: its buffer fills and the live feed moves on without it.
        let mut stalled = open(&mut h.sessions(), &session.id, 0, pb::SubscribeView::Log).await;
        let mut watch = session.watch().await;
        let running = session
            .prompt("flood\n@chunks 2000 1000\n@sleep 200\n@chunks 2000 1000\n@wait-cancel")
            .await;
        // Queued once the stalled stream's buffer is full: its queue event is then overtaken
        // by the second burst and dropped from the feed before the stream reads again.
        let (first_burst_end, _) = watch.entry(|_, f| f.to_string().contains("#1999:")).await;
        let queued_at = first_burst_end.offset;
        let queued = session.prompt("next").await;
        assert_eq!(queued.status, pb::ControlStatus::Queued as i32);
        watch
            .entry(|e, _| e.offset > queued_at && e.json.contains("#1999:"))
            .await;

        loop {
            let event = stalled.message().await.expect("no failure").expect("open");
            match event.event {
                Some(Event::Queue(queue)) if !queue.entries.is_empty() => {
                    let ids: Vec<&str> =
                        queue.entries.iter().map(|e| e.action_id.as_str()).collect();
                    assert_eq!(ids, [queued.action_id.as_str()], "the queue as it stands");
                    break;
                }
                Some(Event::Heartbeat(_)) => {
                    panic!("the stream caught up and went idle without showing the queued prompt")
                }
                _ => {}
            }
        }

        session.act(stop(false)).await.expect("stopped");
        watch.response_to(&running.action_id).await;
        watch.response_to(&queued.action_id).await;
        h.shutdown().await;
    })
    .await
}
