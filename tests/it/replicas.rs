//! Two replicas on one PostgreSQL database: a session driven on one is read and
//! subscribed to on the other, which has no actor for it — the store is its source, woken by
//! NOTIFY. Needs `AGENT_HARNESS_TEST_DATABASE_URL` like `postgres.rs` (fails with `CI=true`).

use std::collections::BTreeMap;

use agent_harness::pb::v1::{self as pb, subscribe_response::Event};
use tempfile::TempDir;

use tonic::Code;

use crate::{
    harness::{Harness, assert_error, bounded},
    operations::scrape,
    postgres::{execute, test_schema, url_in_schema},
    support::{Session, Watch, create_request},
};

/// Events of a stream until `turns` TurnEnded have arrived and the entries reach `head`
/// (LOG view) — with the cursor of each.
async fn events_until(watch: &mut Watch, turns: usize, head: Option<u64>) -> Vec<(u64, Event)> {
    let mut events = Vec::new();
    let mut ended = 0;
    let mut last_entry = 0;
    while ended < turns || head.is_some_and(|h| last_entry < h) {
        let response = watch
            .next()
            .await
            .expect("the stream stays open")
            .expect("the stream does not fail");
        let event = response.event.expect("an event");
        match &event {
            Event::TurnEnded(_) => ended += 1,
            Event::Entry(entry) => last_entry = entry.offset,
            _ => {}
        }
        events.push((response.offset, event));
    }
    events
}

fn entry_offsets(events: &[(u64, Event)]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Entry(entry) => Some(entry.offset),
            _ => None,
        })
        .collect()
}

fn assert_cursors_never_go_back(events: &[(u64, Event)]) {
    for pair in events.windows(2) {
        assert!(pair[0].0 <= pair[1].0, "cursors go back: {pair:?}");
    }
}

async fn started(database_url: &str) -> Harness {
    Harness::start_with(|c| {
        c.database_url = Some(database_url.to_owned().into());
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await
}

/// How many session actors a replica holds (its `agent_harness_sessions` gauges).
async fn actors_on(h: &Harness) -> f64 {
    let text = scrape(h.metrics_addr().expect("a metrics endpoint")).await;
    text.lines()
        .filter(|l| l.starts_with("agent_harness_sessions{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_subscriber_on_another_replica_sees_every_offset_in_order_with_turn_ends_and_reads_match()
{
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    bounded(async {
        let cwd = TempDir::new().unwrap();
        let a = started(&database_url).await;
        // Started before the session exists, so it holds no actor for it.
        let b = started(&database_url).await;
        let mut request = create_request(&a, "mock");
        request.cwd = cwd.path().to_string_lossy().into_owned();
        let mut on_a = Session::create_with(&a, request).await;
        let mut on_b = Session::attach(b.sessions(), &on_a.id);

        let mut log_view = on_b.watch_from(0, pb::SubscribeView::Log).await;
        let mut messages_view = on_b.watch_from(0, pb::SubscribeView::Messages).await;
        let mut on_a_watch = on_a.watch().await;
        on_a.prompt("first from A").await;
        on_a.prompt("second from A").await;
        events_until(&mut on_a_watch, 2, None).await;
        let log_a = on_a.log().await;
        let head = log_a.last().expect("a log").offset;

        let log_events = events_until(&mut log_view, 2, Some(head)).await;
        let offsets = entry_offsets(&log_events);
        assert_eq!(
            &offsets[..head as usize],
            &(1..=head).collect::<Vec<_>>()[..],
            "every offset once, in order"
        );
        assert_cursors_never_go_back(&log_events);
        let entries_b: Vec<pb::LogEntry> = log_events
            .iter()
            .filter_map(|(_, e)| match e {
                Event::Entry(entry) => Some(entry.clone()),
                _ => None,
            })
            .take(head as usize)
            .collect();
        assert_eq!(entries_b, log_a, "the stream on B carries A's log");
        let turn_ends: Vec<&pb::TurnEnded> = log_events
            .iter()
            .filter_map(|(_, e)| match e {
                Event::TurnEnded(t) => Some(t),
                _ => None,
            })
            .collect();
        assert_eq!(turn_ends.len(), 2);
        assert!(turn_ends[0].turn < turn_ends[1].turn);

        let message_events = events_until(&mut messages_view, 2, None).await;
        assert_cursors_never_go_back(&message_events);
        let mut upserted = BTreeMap::new();
        let mut order = Vec::new();
        for (_, event) in &message_events {
            if let Event::Message(message) = event {
                if !upserted.contains_key(&message.id) {
                    order.push(message.id.clone());
                }
                upserted.insert(message.id.clone(), message.clone());
            }
        }
        let folded: Vec<pb::TranscriptMessage> =
            order.iter().map(|id| upserted[id].clone()).collect();

        // Reads on B match A.
        let transcript_a = on_a.transcript().await;
        let transcript_b = on_b.transcript().await;
        assert_eq!(transcript_b.messages, transcript_a.messages);
        assert_eq!(
            folded, transcript_a.messages,
            "the MESSAGES view folds alike"
        );
        assert_eq!(on_b.log().await, log_a);
        assert_eq!(on_b.queue().await, on_a.queue().await);
        let (session_a, session_b) = (on_a.get().await, on_b.get().await);
        assert_eq!(session_b.id, session_a.id);
        assert_eq!(session_b.status, session_a.status);
        assert_eq!(session_b.head_offset, session_a.head_offset);
        assert_eq!(session_b.owner, session_a.owner);
        // B tells the status from the store, and serving all this started no actor there.
        log_view.status(pb::SessionStatus::Idle).await;
        assert_eq!(actors_on(&b).await, 0.0, "B runs no actor for A's session");

        // Resuming on B from the cursor of the first turn's end loses nothing, old or new.
        let cursor = log_events
            .iter()
            .find(|(_, e)| matches!(e, Event::TurnEnded(_)))
            .expect("a turn end")
            .0;
        let mut resumed = on_b.watch_from(cursor, pb::SubscribeView::Log).await;
        on_a.prompt("third from A").await;
        events_until(&mut on_a_watch, 1, None).await;
        let log_a = on_a.log().await;
        let head = log_a.last().expect("a log").offset;
        let resumed_events = events_until(&mut resumed, 1, Some(head)).await;
        let offsets = entry_offsets(&resumed_events);
        assert_eq!(
            &offsets[..(head - cursor) as usize],
            &(cursor + 1..=head).collect::<Vec<_>>()[..],
            "the resumed stream continues right after its cursor"
        );

        // Deleting it on A ends B's streams as a session that no longer exists.
        on_a.client
            .delete_session(pb::DeleteSessionRequest {
                session_id: on_a.id.clone(),
            })
            .await
            .expect("the session is deleted");
        assert_error(&resumed.end().await, Code::NotFound, "SESSION_NOT_FOUND");

        drop((log_view, messages_view, on_a_watch));
        b.shutdown().await;
        a.shutdown().await;
    })
    .await;
    execute(&url, &format!("DROP SCHEMA {schema} CASCADE")).await;
}

/// The store path without PostgreSQL: after a restart a closed session has no actor, and reading
/// or subscribing to it starts none; its stream (woken by the poll alone) ends when it is deleted.
#[tokio::test]
async fn a_closed_session_is_read_and_streamed_from_the_store_without_starting_its_actor() {
    bounded(async {
        let data_dir = TempDir::new().unwrap();
        let with_metrics = |c: &mut agent_harness::config::ServeConfig| {
            c.data_dir = data_dir.path().to_path_buf();
            c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        };
        let first = Harness::start_with(with_metrics).await;
        let mut session = Session::create(&first, "mock").await;
        let mut watch = session.watch().await;
        let reply = session.prompt("before the restart").await;
        watch.response_to(&reply.action_id).await;
        session
            .client
            .close_session(pb::CloseSessionRequest {
                session_id: session.id.clone(),
            })
            .await
            .expect("the session closes");
        watch.status(pb::SessionStatus::Closed).await;
        let log_before = session.log().await;
        let transcript_before = session.transcript().await;
        drop(watch);
        first.shutdown().await;

        let second = Harness::start_with(with_metrics).await;
        let mut again = Session::attach(second.sessions(), &session.id);
        let head = log_before.last().expect("a log").offset;
        assert_eq!(again.get().await.status, pb::SessionStatus::Closed as i32);
        assert_eq!(again.log().await, log_before);
        assert_eq!(
            again.transcript().await.messages,
            transcript_before.messages
        );
        assert!(again.queue().await.is_empty());
        let mut stream = again.watch_from(0, pb::SubscribeView::Log).await;
        let events = events_until(&mut stream, 1, Some(head)).await;
        assert_eq!(entry_offsets(&events), (1..=head).collect::<Vec<_>>());
        stream.status(pb::SessionStatus::Closed).await;
        assert_eq!(
            actors_on(&second).await,
            0.0,
            "no actor started to serve reads"
        );

        again
            .client
            .delete_session(pb::DeleteSessionRequest {
                session_id: again.id.clone(),
            })
            .await
            .expect("the session is deleted");
        assert_error(&stream.end().await, Code::NotFound, "SESSION_NOT_FOUND");
        second.shutdown().await;
    })
    .await
}

/// The subscriber cap holds for streams on a replica that does not own the session:
/// they are counted per session on that replica, like the owner's own.
#[tokio::test]
async fn subscribers_on_a_replica_that_does_not_own_the_session_are_held_to_the_per_session_cap() {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    bounded(async {
        let cwd = TempDir::new().unwrap();
        let capped = |c: &mut agent_harness::config::ServeConfig| {
            c.database_url = Some(database_url.clone().into());
            c.limits.subscribers_per_session = 2;
        };
        let a = Harness::start_with(capped).await;
        let b = Harness::start_with(capped).await;
        let mut request = create_request(&a, "mock");
        request.cwd = cwd.path().to_string_lossy().into_owned();
        let on_a = Session::create_with(&a, request).await;
        let mut on_b = Session::attach(b.sessions(), &on_a.id);

        let first = on_b.watch().await;
        let _second = on_b.watch().await;
        let refused = on_b
            .client
            .subscribe(pb::SubscribeRequest {
                session_id: on_b.id.clone(),
                ..Default::default()
            })
            .await
            .map(|_| ())
            .expect_err("a third stream on B is over the cap");
        assert_error(&refused, Code::ResourceExhausted, "TOO_MANY_SUBSCRIBERS");
        // A stream that ends frees its place.
        drop(first);
        let mut third = loop {
            match on_b
                .client
                .subscribe(pb::SubscribeRequest {
                    session_id: on_b.id.clone(),
                    ..Default::default()
                })
                .await
            {
                Ok(stream) => break stream.into_inner(),
                // The server learns over the connection that the client left; until then, retry.
                Err(status) if status.code() == Code::ResourceExhausted => {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Err(status) => panic!("subscribe failed: {status:?}"),
            }
        };
        assert!(
            third.message().await.unwrap().is_some(),
            "the new stream serves"
        );
        drop(third);
        b.shutdown().await;
        a.shutdown().await;
    })
    .await;
    execute(&url, &format!("DROP SCHEMA {schema} CASCADE")).await;
}

/// The cap on a principal's live sessions is counted in the database, so it holds across
/// replicas: sessions created on A count on B, and creates racing on both never pass it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sessions_per_principal_cap_counts_the_sessions_of_every_replica() {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    bounded(async {
        let cwd = TempDir::new().unwrap();
        let capped = |c: &mut agent_harness::config::ServeConfig| {
            c.database_url = Some(database_url.clone().into());
            c.limits.sessions_per_principal = 4;
        };
        let a = Harness::start_with(capped).await;
        let b = Harness::start_with(capped).await;
        let request = |h: &Harness| {
            let mut request = create_request(h, "mock");
            request.cwd = cwd.path().to_string_lossy().into_owned();
            request
        };
        let mut first = Session::create_with(&a, request(&a)).await;
        Session::create_with(&b, request(&b)).await;

        // Two left under the cap, eight creates racing on both replicas.
        let attempts: Vec<_> = (0..8)
            .map(|i| {
                let h = if i % 2 == 0 { &a } else { &b };
                let mut client = h.sessions();
                let request = request(h);
                tokio::spawn(async move { client.create_session(request).await })
            })
            .collect();
        let mut created = 0;
        for attempt in attempts {
            match attempt.await.expect("the task ran") {
                Ok(_) => created += 1,
                Err(status) => assert_error(&status, Code::ResourceExhausted, "TOO_MANY_SESSIONS"),
            }
        }
        assert_eq!(created, 2, "exactly the cap, counted across both replicas");
        for h in [&a, &b] {
            let refused = h
                .sessions()
                .create_session(request(h))
                .await
                .map(drop)
                .expect_err("the cap is reached on either replica");
            assert_error(&refused, Code::ResourceExhausted, "TOO_MANY_SESSIONS");
        }

        // Closing one on A makes room on B.
        first
            .client
            .close_session(pb::CloseSessionRequest {
                session_id: first.id.clone(),
            })
            .await
            .expect("the session closes");
        Session::create_with(&b, request(&b)).await;
        b.shutdown().await;
        a.shutdown().await;
    })
    .await;
    execute(&url, &format!("DROP SCHEMA {schema} CASCADE")).await;
}
