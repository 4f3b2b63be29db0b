//! The durable log and Subscribe: dense offsets, exact resumption, many
//! subscribers seeing one sequence, a slow subscriber moved back to the log without a gap, and
//! log-before-act: nothing reaches a runtime or a subscriber before it is in the log.

use std::time::Duration;

use agent_harness::pb::v1::{self as pb, subscribe_response::Event};
use serde_json::{Value, json};
use tonic::Code;

use crate::{
    harness::{Harness, assert_error, bounded, expect_err, within},
    support::{Session, Watch, mock_profile_with},
};

/// Collects LOG-view entries until one with `offset` arrives; returns every entry offset seen.
async fn offsets_until(watch: &mut Watch, head: u64) -> Vec<u64> {
    let mut offsets = Vec::new();
    while offsets.last().is_none_or(|&last| last < head) {
        if let Some(Event::Entry(entry)) =
            watch.next().await.expect("open").expect("no failure").event
        {
            offsets.push(entry.offset);
        }
    }
    offsets
}

async fn session_with_turns(h: &Harness, turns: usize) -> Session {
    let mut session = Session::create(h, "mock").await;
    let mut watch = session.watch().await;
    for i in 0..turns {
        let reply = session.prompt(&format!("turn {i}\n@chunks 5")).await;
        watch.response_to(&reply.action_id).await;
    }
    watch.status(pb::SessionStatus::Idle).await;
    session
}

#[tokio::test]
async fn offsets_are_dense_from_one_and_resuming_after_n_delivers_n_plus_one_onward_once_each() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = session_with_turns(&h, 3).await;
        let log = session.log().await;
        let head = log.last().unwrap().offset;
        assert_eq!(
            log.iter().map(|e| e.offset).collect::<Vec<_>>(),
            (1..=head).collect::<Vec<_>>()
        );
        for after in [0, 1, head / 2, head - 1] {
            let mut watch = session.watch_from(after, pb::SubscribeView::Log).await;
            let mut seen = Vec::new();
            loop {
                let event = watch.next().await.unwrap().unwrap();
                match event.event {
                    Some(Event::Entry(entry)) => {
                        assert_eq!(
                            entry.json,
                            log[(entry.offset - 1) as usize].json,
                            "exact JSON"
                        );
                        seen.push(entry.offset)
                    }
                    Some(Event::CaughtUp(caught_up)) => {
                        assert_eq!(caught_up.head_offset, head);
                        break;
                    }
                    _ => {}
                }
            }
            assert_eq!(
                seen,
                (after + 1..=head).collect::<Vec<_>>(),
                "after {after}"
            );
        }
        // Live entries continue the same sequence.
        let mut watch = session.watch_from(head, pb::SubscribeView::Log).await;
        let reply = session.prompt("one more").await;
        let (entry, _) = watch
            .entry(|_, f| f["id"] == reply.action_id.as_str())
            .await;
        assert_eq!(entry.offset, head + 1);
    })
    .await
}

#[tokio::test]
async fn subscribing_beyond_the_head_is_offset_out_of_range() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let head = session.get().await.head_offset;
        let status = expect_err(
            session
                .client
                .subscribe(pb::SubscribeRequest {
                    session_id: session.id.clone(),
                    after_offset: head + 1,
                    view: 0,
                })
                .await,
        );
        assert_error(&status, Code::OutOfRange, "OFFSET_OUT_OF_RANGE");
        let status = expect_err(
            session
                .client
                .read_log(pb::ReadLogRequest {
                    session_id: session.id.clone(),
                    after_offset: head + 5,
                    limit: 0,
                })
                .await,
        );
        assert_error(&status, Code::OutOfRange, "OFFSET_OUT_OF_RANGE");
    })
    .await
}

#[tokio::test]
async fn fifty_subscribers_on_one_session_see_the_same_sequence() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watches = Vec::new();
        for _ in 0..50 {
            watches.push(session.watch().await);
        }
        let reply = session.prompt("@chunks 200").await;
        let mut control = session.watch().await;
        control.response_to(&reply.action_id).await;
        let head = control.entries.last().unwrap().offset;
        let sequences =
            futures::future::join_all(watches.iter_mut().map(|w| offsets_until(w, head))).await;
        let expected: Vec<u64> = (1..=head).collect();
        for sequence in sequences {
            assert_eq!(sequence, expected);
        }
    })
    .await
}

fn resident_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_subscriber_during_a_twenty_thousand_frame_burst_gets_every_offset_in_order_without_a_gap()
 {
    within(Duration::from_secs(120), async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut slow = session.watch().await;
        let before = resident_kib();
        let reply = session.prompt("@chunks 20000").await;
        // Wait for the turn's end without keeping what passes by.
        let mut fast = session.watch().await.stream;
        let head = loop {
            if let Some(Event::Entry(entry)) = fast.message().await.unwrap().unwrap().event
                && entry.json.contains(&reply.action_id)
                && entry.direction == pb::LogDirection::FromRuntime as i32
            {
                break entry.offset;
            }
        };
        drop(fast);
        assert!(head > 20_000);
        let during = resident_kib();
        // The slow reader: it pauses now and then, so the live feed outruns it.
        let mut offsets = Vec::with_capacity(head as usize);
        while offsets.last().is_none_or(|&last| last < head) {
            if let Some(Event::Entry(entry)) = slow.stream.message().await.unwrap().unwrap().event {
                offsets.push(entry.offset);
                if entry.offset % 2000 == 0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        assert_eq!(
            offsets,
            (1..=head).collect::<Vec<_>>(),
            "every offset once, in order"
        );
        println!(
            "slow subscriber over {head} entries: test process RSS {before} KiB before the burst, \
             {during} KiB after it, {} KiB at the end",
            resident_kib()
        );
    })
    .await;
}

/// A scripted ACP peer over TCP: the runtime process only relays its stdio to the test, which
/// plays the agent and checks each frame it receives against the log at that moment.
struct ScriptedPeer {
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>>,
    out: tokio::net::tcp::OwnedWriteHalf,
}

impl ScriptedPeer {
    async fn read(&mut self) -> Value {
        let line = self
            .lines
            .next_line()
            .await
            .unwrap()
            .expect("a line from the harness");
        serde_json::from_str(&line).expect("JSON from the harness")
    }
    async fn write(&mut self, frame: Value) {
        use tokio::io::AsyncWriteExt;
        self.out
            .write_all(format!("{frame}\n").as_bytes())
            .await
            .unwrap();
    }
}

/// Whether the log of `session_id` holds exactly this frame right now.
async fn in_log(h: &Harness, session_id: &str, frame: &Value) -> bool {
    let log = h
        .sessions()
        .read_log(pb::ReadLogRequest {
            session_id: session_id.to_owned(),
            after_offset: 0,
            limit: 5000,
        })
        .await
        .unwrap()
        .into_inner();
    log.entries
        .iter()
        .any(|e| serde_json::from_str::<Value>(&e.json).ok().as_ref() == Some(frame))
}

#[tokio::test]
async fn no_frame_reaches_a_runtime_or_a_subscriber_before_it_is_in_the_log() {
    bounded(async {
        use tokio::io::AsyncBufReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let relay = format!(
            "import socket,sys,threading\n\
             s=socket.create_connection(('127.0.0.1',{port}))\n\
             def up():\n  for l in sys.stdin.buffer: s.sendall(l)\n  s.shutdown(socket.SHUT_WR)\n\
             threading.Thread(target=up,daemon=True).start()\n\
             for l in s.makefile('rb'): sys.stdout.buffer.write(l); sys.stdout.buffer.flush()\n"
        );
        let h = Harness::start_with(|config| {
            mock_profile_with(config, "scripted", &[], |p| {
                p.command = "/usr/bin/env".into();
                p.args = vec!["python3".into(), "-c".into(), relay];
                // The relay reaches this test's port through its box's forward of it.
                if let Some(policy) = p.sandbox.as_mut() {
                    policy.egress = agent_harness::acp::sandbox::Egress::Allow(vec![
                        agent_harness::acp::sandbox::EgressRule::parse(&format!("127.0.0.1:{port}"))
                            .unwrap(),
                    ]);
                }
            })
        })
        .await;
        let mut client = h.sessions();
        let cwd = h.workspace().to_string_lossy().into_owned();
        let creating = tokio::spawn(async move {
            client.create_session(pb::CreateSessionRequest { profile: "scripted".into(), cwd, ..Default::default() }).await
        });
        let (stream, _) = listener.accept().await.unwrap();
        let (read, out) = stream.into_split();
        let mut peer = ScriptedPeer { lines: tokio::io::BufReader::new(read).lines(), out };

        let init = peer.read().await;
        assert_eq!(init["method"], "initialize");
        peer.write(json!({"jsonrpc": "2.0", "id": init["id"], "result": {"protocolVersion": 1, "agentCapabilities": {}}})).await;
        let new = peer.read().await;
        assert_eq!(new["method"], "session/new");
        peer.write(json!({"jsonrpc": "2.0", "id": new["id"], "result": {"sessionId": "peer-1"}})).await;
        let session_id = creating.await.unwrap().expect("created").into_inner().session.unwrap().id;
        // The handshake frames were logged before the peer got them.
        assert!(in_log(&h, &session_id, &init).await && in_log(&h, &session_id, &new).await);

        let mut session = Session { id: session_id.clone(), client: h.sessions(), created: Default::default() };
        let mut watch = session.watch().await;
        for text in ["hello peer", "again"] {
            let reply = session.prompt(text).await;
            let prompt = peer.read().await;
            assert_eq!(prompt["id"], reply.action_id.as_str());
            assert!(in_log(&h, &session_id, &prompt).await, "logged before it reached the runtime: {prompt}");
            peer.write(json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "peer-1",
                "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}}}))
                .await;
            peer.write(json!({"jsonrpc": "2.0", "id": reply.action_id, "result": {"stopReason": "end_turn"}})).await;
            watch.response_to(&reply.action_id).await;
        }
        // Every entry a subscriber received was readable from the log at that moment.
        let mut client = h.sessions();
        let head = session.get().await.head_offset;
        let mut live = session.watch_from(head, pb::SubscribeView::Log).await;
        let reply = session.prompt("last").await;
        let prompt = peer.read().await;
        peer.write(json!({"jsonrpc": "2.0", "id": prompt["id"], "result": {"stopReason": "end_turn"}})).await;
        loop {
            let event = live.next().await.unwrap().unwrap();
            let Some(Event::Entry(entry)) = event.event else { continue };
            let page = client
                .read_log(pb::ReadLogRequest { session_id: session_id.clone(), after_offset: entry.offset - 1, limit: 1 })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(page.entries.first().map(|e| &e.json), Some(&entry.json));
            if entry.json.contains(&reply.action_id) && entry.direction == pb::LogDirection::FromRuntime as i32 {
                break;
            }
        }
    })
    .await
}

#[tokio::test]
async fn queue_and_status_changes_are_streamed_as_snapshots_in_every_view() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        for view in [
            pb::SubscribeView::Log,
            pb::SubscribeView::Messages,
            pb::SubscribeView::All,
        ] {
            let mut watch = session.watch_from(0, view).await;
            let running = session.prompt("@wait-cancel").await;
            let queued = session.prompt("next").await;
            let snapshot = loop {
                if let Some(Event::Queue(queue)) = watch.next().await.unwrap().unwrap().event
                    && !queue.entries.is_empty()
                {
                    break queue;
                }
            };
            assert_eq!(snapshot.entries[0].action_id, queued.action_id, "{view:?}");
            watch.status(pb::SessionStatus::Running).await;
            session.act(crate::support::stop(true)).await.unwrap();
            loop {
                if let Some(Event::Queue(queue)) = watch.next().await.unwrap().unwrap().event
                    && queue.entries.is_empty()
                {
                    break;
                }
            }
            watch.status(pb::SessionStatus::Idle).await;
            let _ = running;
        }
    })
    .await
}

#[tokio::test]
async fn an_idle_stream_gets_a_heartbeat_with_the_head_offset() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let head = session.get().await.head_offset;
        let mut watch = session.watch_from(head, pb::SubscribeView::Log).await;
        loop {
            if let Some(Event::Heartbeat(beat)) = watch.next().await.unwrap().unwrap().event {
                assert_eq!(beat.head_offset, head);
                break;
            }
        }
    })
    .await
}

#[tokio::test]
async fn a_deleted_sessions_stream_ends_not_found_and_a_closed_ones_stays_open() {
    bounded(async {
        let h = Harness::start().await;
        let mut closed = Session::create(&h, "mock").await;
        let mut closed_watch = closed.watch().await;
        closed
            .client
            .close_session(pb::CloseSessionRequest {
                session_id: closed.id.clone(),
            })
            .await
            .unwrap();
        closed_watch.status(pb::SessionStatus::Closed).await;
        // Still open: the next event is a heartbeat, not an end.
        loop {
            match closed_watch
                .next()
                .await
                .expect("still open")
                .expect("no failure")
                .event
            {
                Some(Event::Heartbeat(_)) => break,
                _ => continue,
            }
        }

        let mut deleted = Session::create(&h, "mock").await;
        let mut watch = deleted.watch().await;
        deleted
            .client
            .delete_session(pb::DeleteSessionRequest {
                session_id: deleted.id.clone(),
            })
            .await
            .unwrap();
        assert_error(&watch.end().await, Code::NotFound, "SESSION_NOT_FOUND");
    })
    .await
}

#[tokio::test]
async fn subscribers_beyond_the_cap_are_too_many_subscribers() {
    bounded(async {
        let h = Harness::start_with(|config| config.limits.subscribers_per_session = 2).await;
        let mut session = Session::create(&h, "mock").await;
        let _first = session.watch().await;
        let second = session.watch().await;
        let status = expect_err(
            session
                .client
                .subscribe(pb::SubscribeRequest {
                    session_id: session.id.clone(),
                    after_offset: 0,
                    view: 0,
                })
                .await,
        );
        assert_error(&status, Code::ResourceExhausted, "TOO_MANY_SUBSCRIBERS");
        drop(second);
        // A freed place can be taken again (the server notices the stream is gone).
        let mut taken = false;
        for _ in 0..100 {
            if session
                .client
                .subscribe(pb::SubscribeRequest {
                    session_id: session.id.clone(),
                    after_offset: 0,
                    view: 0,
                })
                .await
                .is_ok()
            {
                taken = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(taken, "the place of a closed stream is freed");
    })
    .await
}

#[tokio::test]
async fn read_log_pages_stay_under_the_message_limit_and_an_entry_larger_than_it_comes_alone() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        // A client that accepts the largest entry a runtime may write.
        session.client = session
            .client
            .clone()
            .max_decoding_message_size(16 * 1024 * 1024);
        let mut watch = session.watch().await;
        let reply = session
            .prompt("@long 3000000\n@long 3000000\n@long 5000000")
            .await;
        watch.response_to(&reply.action_id).await;
        let mut client = session.client.clone();
        let mut after = 0;
        let mut pages = Vec::new();
        loop {
            let page = client
                .read_log(pb::ReadLogRequest {
                    session_id: session.id.clone(),
                    after_offset: after,
                    limit: 0,
                })
                .await
                .unwrap()
                .into_inner();
            let Some(last) = page.entries.last() else {
                break;
            };
            after = last.offset;
            let bytes: usize = page.entries.iter().map(|e| e.json.len()).sum();
            pages.push((page.entries.len(), bytes));
        }
        let limit = 4 * 1024 * 1024;
        for &(count, bytes) in &pages {
            assert!(
                bytes < limit || count == 1,
                "a page over the limit holds one entry: {pages:?}"
            );
        }
        assert!(
            pages
                .iter()
                .any(|&(count, bytes)| count == 1 && bytes > limit),
            "the 5 MB entry came alone: {pages:?}"
        );
        assert_eq!(
            after,
            session.get().await.head_offset,
            "every entry was read"
        );
    })
    .await
}

#[tokio::test]
async fn one_principals_streams_past_its_cap_are_refused_whatever_their_sessions_and_others_are_not()
 {
    use crate::auth::{ADA, BOB, EVERYONE, TokensFile, as_user, create, create_request};
    bounded(async {
        let file = TokensFile::new(EVERYONE);
        let h = Harness::start_with(|config| {
            crate::auth::with_tokens(config, &file.path, None);
            config.limits.subscribers_per_principal = 3;
        })
        .await;
        let mut ada = as_user(&h, ADA);
        let mut bob = as_user(&h, BOB);
        let first = create(&mut ada, create_request(&h)).await.id;
        let second = create(&mut ada, create_request(&h)).await.id;
        let bobs = create(&mut bob, create_request(&h)).await.id;
        let subscribe = |session: &str| pb::SubscribeRequest {
            session_id: session.to_owned(),
            after_offset: 0,
            view: pb::SubscribeView::Messages as i32,
        };
        // Three streams over two sessions: each session is far below its own cap.
        let mut open = Vec::new();
        for session in [&first, &first, &second] {
            open.push(
                ada.subscribe(subscribe(session))
                    .await
                    .expect("under the cap"),
            );
        }
        let refused = expect_err(ada.subscribe(subscribe(&second)).await);
        assert_error(&refused, Code::ResourceExhausted, "TOO_MANY_SUBSCRIBERS");
        let info = crate::harness::error_info(&refused);
        assert_eq!(info.metadata["limit"], "subscribers_per_principal");
        assert_eq!(info.metadata["max"], "3");
        // Another principal's streams are their own.
        let _bobs = bob
            .subscribe(subscribe(&bobs))
            .await
            .expect("bob is not ada");
        // The refused stream took no place: one closed frees exactly one.
        drop(open.pop());
        let mut taken = None;
        for _ in 0..100 {
            if let Ok(stream) = ada.subscribe(subscribe(&second)).await {
                taken = Some(stream);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(taken.is_some(), "the place of a closed stream is freed");
        assert_error(
            &expect_err(ada.subscribe(subscribe(&first)).await),
            Code::ResourceExhausted,
            "TOO_MANY_SUBSCRIBERS",
        );
        h.shutdown().await;
    })
    .await
}
