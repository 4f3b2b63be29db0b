//! The end of a turn (`TurnEnded`): every view sends one `turn_ended` event per turn, after
//! the turn's final message snapshot (MESSAGES, ALL) or its response entry (LOG), carrying the
//! prompt's action id — also for a turn closed as failed by an error response or a runtime fault.
//! The agent message carries its user message's `request_id`.

use std::collections::HashMap;

use agent_harness::pb::v1::{self as pb, subscribe_response::Event};
use tonic::Streaming;

use crate::{
    harness::{Harness, bounded},
    support::{Session, mock_profile},
};

/// Subscribes from the beginning and returns every TurnEnded sent before `caught_up`.
pub async fn turn_ends_until_caught_up(
    session: &mut Session,
    view: pb::SubscribeView,
) -> Vec<pb::TurnEnded> {
    let mut stream = subscribe(session, 0, view).await;
    let mut ends = Vec::new();
    loop {
        let event = stream
            .message()
            .await
            .expect("the stream does not fail")
            .expect("the stream stays open");
        match event.event {
            Some(Event::TurnEnded(end)) => ends.push(end),
            Some(Event::CaughtUp(_)) => return ends,
            _ => {}
        }
    }
}

pub async fn subscribe(
    session: &mut Session,
    after: u64,
    view: pb::SubscribeView,
) -> Streaming<pb::SubscribeResponse> {
    session.watch_from(after, view).await.stream
}

/// Reads a stream until it has sent `turns` TurnEnded events; returns every event.
async fn read_until_turns_ended(
    stream: &mut Streaming<pb::SubscribeResponse>,
    turns: usize,
) -> Vec<pb::SubscribeResponse> {
    let mut events = Vec::new();
    let mut ended = 0;
    while ended < turns {
        let event = stream
            .message()
            .await
            .expect("the stream does not fail")
            .expect("the stream stays open");
        ended += usize::from(matches!(event.event, Some(Event::TurnEnded(_))));
        events.push(event);
    }
    events
}

/// What a stream showed of each turn's end, checked against the order rules of the view.
fn check_turn_ends(
    view: pb::SubscribeView,
    events: &[pb::SubscribeResponse],
) -> Vec<pb::TurnEnded> {
    let mut ends = Vec::new();
    // The last snapshot of each message, and the last response or fault entry, seen so far.
    let mut last_snapshot: HashMap<String, pb::TranscriptMessage> = HashMap::new();
    let mut closing_entries: Vec<serde_json::Value> = Vec::new();
    for event in events {
        match &event.event {
            Some(Event::Message(message)) => {
                if let Some(end) = ends
                    .iter()
                    .find(|e: &&pb::TurnEnded| format!("{}:agent", e.turn) == message.id)
                {
                    panic!(
                        "{view:?}: a snapshot of {} came after its TurnEnded {end:?}",
                        message.id
                    );
                }
                last_snapshot.insert(message.id.clone(), message.clone());
            }
            Some(Event::Entry(entry)) => {
                let frame: serde_json::Value = serde_json::from_str(&entry.json).unwrap();
                if frame.get("result").is_some()
                    || frame.get("error").is_some()
                    || frame["event"] == "fault"
                {
                    closing_entries.push(frame);
                }
            }
            Some(Event::TurnEnded(end)) => {
                assert!(
                    !ends.iter().any(|e: &pb::TurnEnded| e.turn == end.turn),
                    "{view:?}: turn {} ended twice",
                    end.turn
                );
                if view != pb::SubscribeView::Log {
                    let agent = last_snapshot
                        .get(&format!("{}:agent", end.turn))
                        .unwrap_or_else(|| panic!("{view:?}: no snapshot before {end:?}"));
                    assert_eq!(agent.stop_reason, Some(end.stop_reason), "{view:?}");
                    assert_eq!(agent.error, end.error, "{view:?}");
                    assert_eq!(
                        agent.request_id.as_deref(),
                        Some(end.request_id.as_str()),
                        "{view:?}: the agent message carries its turn's request id"
                    );
                }
                if view != pb::SubscribeView::Messages {
                    let closed_by = closing_entries
                        .iter()
                        .any(|f| f["id"] == end.request_id.as_str() || f["event"] == "fault");
                    assert!(closed_by, "{view:?}: {end:?} came before its closing entry");
                }
                ends.push(end.clone());
            }
            _ => {}
        }
    }
    ends
}

#[tokio::test]
async fn turn_ended_arrives_once_per_turn_after_its_final_snapshot_with_the_action_id_in_every_view()
 {
    bounded(async {
        let h = Harness::start_with(|c| mock_profile(c, "m", &["--resume"])).await;
        let mut session = Session::create(&h, "m").await;
        let views = [
            pb::SubscribeView::Log,
            pb::SubscribeView::Messages,
            pb::SubscribeView::All,
        ];
        let mut live = Vec::new();
        for view in views {
            live.push((view, subscribe(&mut session, 0, view).await));
        }
        let mut watch = session.watch().await;

        let mut expected = Vec::new();
        for (text, reason, error) in [
            ("one\n@chunks 3", pb::StopReason::EndTurn, None),
            (
                "two\n@tool t1\n@stop max_tokens",
                pb::StopReason::MaxTokens,
                None,
            ),
            (
                "three\n@error -32603 boom",
                pb::StopReason::Failed,
                Some("boom"),
            ),
        ] {
            let id = session.prompt(text).await.action_id;
            watch.response_to(&id).await;
            expected.push((id, reason as i32, error.map(str::to_owned)));
        }
        // A runtime fault closes the turn as failed; the next prompt reopens by resume.
        let crashed = session.prompt("four\n@crash 3").await.action_id;
        watch.status(pb::SessionStatus::Disconnected).await;
        let fault = watch.event("fault").await;
        expected.push((
            crashed,
            pb::StopReason::Failed as i32,
            fault["detail"].as_str().map(str::to_owned),
        ));
        let last = session.prompt("five").await.action_id;
        watch.response_to(&last).await;
        expected.push((last, pb::StopReason::EndTurn as i32, None));

        let summary = |ends: &[pb::TurnEnded]| -> Vec<(u32, String, i32, Option<String>)> {
            ends.iter()
                .map(|e| (e.turn, e.request_id.clone(), e.stop_reason, e.error.clone()))
                .collect()
        };
        let want: Vec<(u32, String, i32, Option<String>)> = expected
            .iter()
            .enumerate()
            .map(|(i, (id, reason, error))| (i as u32 + 1, id.clone(), *reason, error.clone()))
            .collect();
        for (view, mut stream) in live {
            let events = read_until_turns_ended(&mut stream, want.len()).await;
            assert_eq!(
                summary(&check_turn_ends(view, &events)),
                want,
                "live {view:?}"
            );
        }
        // Replayed from the log, the same ends in the same places, once each.
        for view in views {
            let mut stream = subscribe(&mut session, 0, view).await;
            let mut events = Vec::new();
            loop {
                let event = stream.message().await.unwrap().unwrap();
                let caught_up = matches!(event.event, Some(Event::CaughtUp(_)));
                events.push(event);
                if caught_up {
                    break;
                }
            }
            assert_eq!(
                summary(&check_turn_ends(view, &events)),
                want,
                "replayed {view:?}"
            );
        }
        h.shutdown().await;
    })
    .await
}

#[tokio::test]
async fn a_compact_turn_ends_like_a_prompt_and_control_actions_end_no_turn() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let set = session
            .act(crate::support::set_model("mock-smart"))
            .await
            .unwrap()
            .action_id;
        watch.response_to(&set).await;
        let compact = session
            .act(pb::control_request::Action::Compact(pb::CompactAction {}))
            .await
            .unwrap()
            .action_id;
        watch.response_to(&compact).await;
        let ends = turn_ends_until_caught_up(&mut session, pb::SubscribeView::Messages).await;
        assert_eq!(ends.len(), 1, "only the compact occupies a turn: {ends:?}");
        assert_eq!(ends[0].request_id, compact);
        assert_eq!(
            ends[0].turn, 1,
            "the model change is no turn: the compact is the first"
        );
        assert_eq!(ends[0].stop_reason, pb::StopReason::EndTurn as i32);
        h.shutdown().await;
    })
    .await
}
