//! The transcript: GetTranscript pages by turns, the MESSAGES view streams
//! message snapshots, and the fold is checked against logs captured with the harness itself from
//! the mock agent and the third-party TS example agent (`tests/fixtures/fold/*.jsonl`).

use std::{path::PathBuf, time::Duration};

use agent_harness::{
    acp::{
        fold::Fold,
        transcript::{ControlKind, Outcome, Part, Role, StopReason},
    },
    domain::{
        ActionId,
        invocation::DEFAULT_META_KEY,
        log::{Direction, LogEntry},
    },
    pb::v1::{self as pb, control_request::Action, subscribe_response::Event},
};
use serde_json::{Value, json};

use crate::{
    harness::{Harness, bounded, within},
    support::answer_request,
    support::{Session, attachment, mock_profile_with, number_id, set_model, stop},
};

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fold")
}

/// A log as captured: one JSON object per line.
fn load_fixture(name: &str) -> Vec<LogEntry> {
    let text = std::fs::read_to_string(fixtures_dir().join(name)).expect("the fixture exists");
    text.lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap();
            LogEntry {
                offset: v["offset"].as_u64().unwrap(),
                direction: match v["direction"].as_str().unwrap() {
                    "to_runtime" => Direction::ToRuntime,
                    "from_runtime" => Direction::FromRuntime,
                    _ => Direction::Event,
                },
                json: v["json"].as_str().unwrap().to_owned(),
                actor: v["actor"].as_str().unwrap().to_owned(),
                action_id: v["action_id"].as_str().and_then(ActionId::from_stored),
                epoch: v["epoch"].as_u64().unwrap() as u32,
                created_at: std::time::UNIX_EPOCH
                    + Duration::from_micros(v["created_micros"].as_u64().unwrap()),
            }
        })
        .collect()
}

fn fold(entries: &[LogEntry]) -> Fold {
    Fold::of(DEFAULT_META_KEY, entries)
}

fn texts(parts: &[Part]) -> String {
    parts
        .iter()
        .filter_map(|p| match p {
            Part::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn the_mock_agent_fixture_folds_into_the_expected_transcript() {
    let entries = load_fixture("mock-agent.jsonl");
    let fold = fold(&entries);
    let messages = fold.messages();
    let ids: Vec<&str> = messages.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "1:user",
            "1:agent",
            "1:control:1",
            "2:user",
            "2:agent",
            "3:user",
            "3:agent",
            "4:user",
            "4:agent",
            "4:control:2",
            "5:user",
            "5:agent"
        ]
    );
    // Turn 1: text, then the two attachments in order; the agent's thought, tool, plan,
    // chunks and an answered permission.
    let user = &messages[0];
    assert_eq!(user.role, Role::User);
    assert!(matches!(&user.parts[0], Part::Text(t) if t.starts_with("look at these")));
    let uris: Vec<&str> = user
        .parts
        .iter()
        .filter_map(|p| match p {
            Part::Attachment(a) => Some(a.uri.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        uris,
        [
            "https://static.example/file/one",
            "https://static.example/file/two"
        ]
    );
    assert!(!format!("{:?}", user.parts).contains("m-agent-context"));
    let agent = &messages[1];
    assert_eq!(agent.stop_reason, Some(StopReason::EndTurn));
    assert!(
        agent
            .parts
            .iter()
            .any(|p| matches!(p, Part::Thought(t) if t == "weighing it"))
    );
    assert!(
        agent.parts.iter().any(
            |p| matches!(p, Part::Tool(t) if t.tool_call_id == "t1" && t.status == "completed")
        )
    );
    assert!(
        agent
            .parts
            .iter()
            .any(|p| matches!(p, Part::Plan(e) if e.len() == 3))
    );
    assert!(agent.parts.iter().any(|p| matches!(p, Part::Permission(x) if x.outcome == Outcome::Selected && x.selected_option_id.as_deref() == Some("allow-once"))));
    assert!(texts(&agent.parts).contains("permission: selected allow-once"));
    // After turn 1, a model change, accepted: no turn of its own.
    assert!(
        matches!(&messages[2].parts[0], Part::Control(c) if c.kind == ControlKind::SetModel && c.value == "mock-smart" && c.outcome == Outcome::Accepted)
    );
    assert_eq!(fold.metadata().model, "mock-smart");
    // Turn 2: a form elicitation accepted.
    assert!(messages[4].parts.iter().any(|p| matches!(p, Part::Elicitation(e) if e.outcome == Outcome::Accepted && e.answer_json.contains("Ada"))));
    // Turn 3: a compact.
    assert!(
        matches!(&messages[5].parts[0], Part::Control(c) if c.kind == ControlKind::Compact && c.outcome == Outcome::Accepted)
    );
    assert_eq!(texts(&messages[6].parts), "compacted");
    // Turn 4 was stopped (a control message of that turn): cancelled.
    assert_eq!(messages[8].stop_reason, Some(StopReason::Cancelled));
    assert!(matches!(&messages[9].parts[0], Part::Control(c) if c.kind == ControlKind::Stop));
    // Turn 5 failed with the agent's error.
    assert_eq!(messages[11].stop_reason, Some(StopReason::Failed));
    assert_eq!(messages[11].error.as_deref(), Some("boom"));
    assert_eq!(fold.metadata().models.len(), 2);
    assert!(fold.metadata().pending_interactions.is_empty());
}

#[test]
fn the_ts_example_agent_fixture_folds_into_the_expected_transcript() {
    let fold = fold(&load_fixture("ts-example-agent.jsonl"));
    let messages = fold.messages();
    assert_eq!(
        messages.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(),
        ["1:user", "1:agent"]
    );
    assert_eq!(texts(&messages[0].parts), "please update the configuration");
    let agent = &messages[1];
    assert_eq!(agent.stop_reason, Some(StopReason::EndTurn));
    let tools: Vec<(&str, &str)> = agent
        .parts
        .iter()
        .filter_map(|p| match p {
            Part::Tool(t) => Some((t.tool_call_id.as_str(), t.status.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(tools, [("call_1", "completed"), ("call_2", "completed")]);
    assert!(agent.parts.iter().any(|p| matches!(p, Part::Permission(x) if x.selected_option_id.as_deref() == Some("allow") && x.options.len() == 2)));
    assert!(texts(&agent.parts).contains("successfully updated the configuration"));
}

#[test]
fn folding_the_same_captured_frames_twice_gives_identical_output() {
    for name in [
        "mock-agent.jsonl",
        "ts-example-agent.jsonl",
        "mock-agent-load-replay.jsonl",
    ] {
        let entries = load_fixture(name);
        let (a, b) = (fold(&entries), fold(&entries));
        assert_eq!(a.messages(), b.messages(), "{name}");
        assert_eq!(a.metadata(), b.metadata(), "{name}");
    }
}

#[test]
fn a_session_load_replay_in_a_captured_log_adds_nothing() {
    let entries = load_fixture("mock-agent-load-replay.jsonl");
    assert!(
        entries.iter().any(|e| e.json.contains("session/load")),
        "the fixture holds a reopen by session/load"
    );
    assert!(
        entries
            .iter()
            .any(|e| e.json.contains("(replayed) earlier answer")),
        "and its replay"
    );
    let fold = fold(&entries);
    let all = format!("{:?}", fold.messages());
    assert!(
        !all.contains("(replayed)"),
        "the replay is not in the transcript"
    );
    let ids: Vec<&str> = fold.messages().iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["1:user", "1:agent", "2:user", "2:agent"]);
}

// ---- over the wire ---------------------------------------------------------------------------

#[tokio::test]
async fn get_transcript_shows_the_user_text_and_attachments_in_order_with_the_action_id_and_no_hidden_block()
 {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let reply = session
            .act(Action::Prompt(pb::PromptAction {
                prompt: "compare <m-agent-context these".into(),
                attachments: vec![
                    attachment("https://static.example/file/a", "a.png"),
                    attachment("https://static.example/file/b", "b.png"),
                ],
            }))
            .await
            .unwrap();
        watch.response_to(&reply.action_id).await;
        // The session turns idle in the step after the response: wait for it, not for luck.
        watch.status(pb::SessionStatus::Idle).await;
        let transcript = session
            .client
            .get_transcript(pb::GetTranscriptRequest {
                session_id: session.id.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let user = &transcript.messages[0];
        assert_eq!(user.id, "1:user");
        assert_eq!(user.request_id.as_deref(), Some(reply.action_id.as_str()));
        let parts: Vec<String> = user
            .parts
            .iter()
            .map(|p| match p.kind.as_ref().unwrap() {
                pb::message_part::Kind::Text(t) => format!("text:{}", t.text),
                pb::message_part::Kind::Attachment(a) => format!("attachment:{}", a.uri),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            parts,
            [
                "text:compare <m-agent-context these",
                "attachment:https://static.example/file/a",
                "attachment:https://static.example/file/b"
            ]
        );
        let everything = format!("{:?}", transcript.messages);
        assert!(
            !everything.contains("invocation") && !everything.contains("turn_id"),
            "no trace of the hidden block"
        );
        let metadata = transcript.metadata.unwrap();
        assert_eq!(metadata.model, "mock-fast");
        assert_eq!(metadata.status, pb::SessionStatus::Idle as i32);
        assert!(transcript.head_offset > 0);
    })
    .await
}

#[tokio::test]
async fn get_transcript_pages_by_turns_oldest_first() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        for i in 0..5 {
            let reply = session.prompt(&format!("turn {i}")).await;
            watch.response_to(&reply.action_id).await;
        }
        let mut turns = Vec::new();
        let mut token = String::new();
        loop {
            let page = session
                .client
                .get_transcript(pb::GetTranscriptRequest {
                    session_id: session.id.clone(),
                    page_size: 2,
                    page_token: token,
                })
                .await
                .unwrap()
                .into_inner();
            turns.push(page.messages.iter().map(|m| m.turn).collect::<Vec<_>>());
            token = page.next_page_token;
            if token.is_empty() {
                break;
            }
        }
        assert_eq!(turns, vec![vec![1, 1, 2, 2], vec![3, 3, 4, 4], vec![5, 5]]);
    })
    .await
}

#[tokio::test]
async fn the_messages_view_streams_snapshots_that_upsert_by_message_id() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch_from(0, pb::SubscribeView::Messages).await;
        let reply = session.prompt("hello\n@chunks 50 10").await;
        let mut latest = std::collections::BTreeMap::new();
        loop {
            let event = watch.next().await.unwrap().unwrap();
            match event.event {
                Some(Event::Entry(_)) => panic!("the MESSAGES view carries no log entries"),
                Some(Event::Message(message)) => {
                    let done = message.id == "1:agent" && message.stop_reason.is_some();
                    latest.insert(message.id.clone(), message);
                    if done {
                        break;
                    }
                }
                _ => {}
            }
        }
        assert_eq!(
            latest["1:user"].request_id.as_deref(),
            Some(reply.action_id.as_str())
        );
        let agent = &latest["1:agent"];
        let text: String = agent
            .parts
            .iter()
            .filter_map(|p| match p.kind.as_ref().unwrap() {
                pb::message_part::Kind::Text(t) => Some(t.text.clone()),
                _ => None,
            })
            .collect();
        assert!(text.starts_with("echo: hello"));
        assert_eq!(text.len(), "echo: hello\n@chunks 50 10".len() + 500);
        // A late subscriber gets one snapshot per message at catch-up.
        let mut late = session.watch_from(0, pb::SubscribeView::Messages).await;
        let mut at_catch_up = Vec::new();
        loop {
            match late.next().await.unwrap().unwrap().event {
                Some(Event::Message(m)) => at_catch_up.push(m.id),
                Some(Event::CaughtUp(_)) => break,
                _ => {}
            }
        }
        assert_eq!(at_catch_up, ["1:user", "1:agent"]);
    })
    .await
}

// ---- capturing the fixtures --------------------------------------------------------------------

fn to_fixture_line(e: &pb::LogEntry) -> String {
    let direction = match pb::LogDirection::try_from(e.direction).unwrap() {
        pb::LogDirection::ToRuntime => "to_runtime",
        pb::LogDirection::FromRuntime => "from_runtime",
        _ => "event",
    };
    let at = e.created_at.unwrap();
    json!({"offset": e.offset, "direction": direction, "json": e.json, "actor": e.actor,
           "action_id": e.action_id, "epoch": e.epoch,
           "created_micros": at.seconds as u64 * 1_000_000 + at.nanos as u64 / 1000})
    .to_string()
}

async fn write_fixture(session: &mut Session, name: &str) {
    let lines: Vec<String> = session.log().await.iter().map(to_fixture_line).collect();
    std::fs::create_dir_all(fixtures_dir()).unwrap();
    std::fs::write(fixtures_dir().join(name), lines.join("\n") + "\n").unwrap();
}

/// Regenerates `tests/fixtures/fold/*.jsonl` by driving the harness for real:
/// `AGENT_HARNESS_TS_AGENT=… cargo test --test it capture_fold_fixtures -- --ignored`.
#[tokio::test]
#[ignore = "regenerates the committed fixtures; needs the TS example agent"]
async fn capture_fold_fixtures() {
    within(Duration::from_secs(120), async {
        let ts_agent = std::env::var("AGENT_HARNESS_TS_AGENT").expect("AGENT_HARNESS_TS_AGENT");
        let node = std::env::split_paths(&std::env::var_os("PATH").unwrap())
            .map(|d| d.join("node"))
            .find(|p| p.is_file())
            .expect("node on PATH");
        let h = Harness::start_with(|config| {
            mock_profile_with(config, "loader", &["--load"], |p| p.idle_timeout = Some(Duration::from_millis(300)));
            mock_profile_with(config, "ts", &[], |p| {
                p.command = node.clone();
                p.args = vec![ts_agent.clone()];
            });
        })
        .await;

        // The mock agent, covering every kind of part.
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let turn = session
            .act(Action::Prompt(pb::PromptAction {
                prompt: "look at these\n@thought weighing it\n@tool t1\n@plan read|think|answer\n@chunks 2 20\n@permission".into(),
                attachments: vec![
                    attachment("https://static.example/file/one", "one.png"),
                    attachment("https://static.example/file/two", "two.pdf"),
                ],
            }))
            .await
            .unwrap();
        let request = watch.agent_request("session/request_permission").await;
        session.act(answer_request(&request, Some("allow-once"))).await.unwrap();
        watch.response_to(&turn.action_id).await;
        let change = session.act(set_model("mock-smart")).await.unwrap();
        watch.response_to(&change.action_id).await;
        let turn = session.prompt("@elicit form").await;
        let request = watch.agent_request("elicitation/create").await;
        let content = [("name".to_owned(), pb::ElicitationValue { kind: Some(pb::elicitation_value::Kind::Text("Ada".into())) })]
            .into_iter()
            .collect();
        session
            .act(Action::RespondElicitation(pb::RespondElicitationAction {
                request_id: Some(number_id(request["id"].as_i64().unwrap())),
                answer: Some(pb::respond_elicitation_action::Answer::Accept(pb::ElicitationAccept { content })),
            }))
            .await
            .unwrap();
        watch.response_to(&turn.action_id).await;
        let compact = session.act(Action::Compact(pb::CompactAction {})).await.unwrap();
        watch.response_to(&compact.action_id).await;
        let turn = session.prompt("@wait-cancel").await;
        watch.chunk("echo: @wait-cancel").await;
        session.act(stop(false)).await.unwrap();
        watch.response_to(&turn.action_id).await;
        let turn = session.prompt("@error -32000 boom").await;
        watch.response_to(&turn.action_id).await;
        write_fixture(&mut session, "mock-agent.jsonl").await;

        // A reopen by session/load, whose replay must add nothing.
        let mut session = Session::create(&h, "loader").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("before the suspension").await;
        watch.response_to(&turn.action_id).await;
        watch.status(pb::SessionStatus::Suspended).await;
        let turn = session.prompt("after it").await;
        watch.response_to(&turn.action_id).await;
        write_fixture(&mut session, "mock-agent-load-replay.jsonl").await;

        // The third-party TS example agent: a turn with an allowed permission.
        let mut session = Session::create(&h, "ts").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("please update the configuration").await;
        let request = watch.agent_request("session/request_permission").await;
        session.act(answer_request(&request, Some("allow"))).await.unwrap();
        watch.response_to(&turn.action_id).await;
        write_fixture(&mut session, "ts-example-agent.jsonl").await;
    })
    .await
}
