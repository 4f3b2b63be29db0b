//! Control and the queue: SENT and QUEUED, FIFO, the cap, interrupts, stops that
//! keep the queue draining, idempotent action ids, edits and removals.

use agent_harness::pb::v1::{self as pb, control_request::Action};
use serde_json::Value;
use tonic::Code;

use crate::{
    harness::{Harness, assert_error, bounded, expect_err},
    support::{Session, attachment, prompt, set_model, stop},
};

fn v7() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// A session whose first turn runs until it is cancelled.
async fn busy_session(h: &Harness) -> (Session, crate::support::Watch, pb::ControlResponse) {
    let mut session = Session::create(h, "mock").await;
    let mut watch = session.watch().await;
    let running = session.prompt("@wait-cancel").await;
    assert_eq!(running.status, pb::ControlStatus::Sent as i32);
    watch.chunk("echo: @wait-cancel").await;
    (session, watch, running)
}

fn prompt_ids(frames: &[Value]) -> Vec<String> {
    frames
        .iter()
        .filter(|f| f["method"] == "session/prompt")
        .map(|f| f["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_prompt_during_a_running_turn_is_queued_and_dispatched_when_it_ends() {
    bounded(async {
        let h = Harness::start().await;
        let (mut session, mut watch, running) = busy_session(&h).await;
        let second = session.prompt("second").await;
        assert_eq!(second.status, pb::ControlStatus::Queued as i32);
        assert_eq!(second.queue_position, 1);
        let third = session.prompt("third").await;
        assert_eq!(third.queue_position, 2);
        assert_eq!(
            session.get().await.status,
            pb::SessionStatus::Running as i32
        );

        session.act(stop(false)).await.unwrap();
        assert_eq!(
            watch.response_to(&running.action_id).await["result"]["stopReason"],
            "cancelled"
        );
        watch.response_to(&second.action_id).await;
        watch.response_to(&third.action_id).await;
        assert_eq!(
            prompt_ids(&session.sent_frames().await),
            vec![running.action_id, second.action_id, third.action_id],
            "FIFO"
        );
        assert!(session.queue().await.is_empty());
    })
    .await
}

#[tokio::test]
async fn resending_a_waiting_action_id_changes_nothing_and_reports_its_position() {
    bounded(async {
        let h = Harness::start().await;
        let (mut session, _watch, _) = busy_session(&h).await;
        let id = v7();
        let mut request = session.control_request(prompt("queued once"));
        request.action_id = Some(id.clone());
        let first = session.control(request.clone()).await.unwrap();
        assert_eq!(
            (first.status, first.queue_position),
            (pb::ControlStatus::Queued as i32, 1)
        );
        session.prompt("behind it").await;
        let again = session.control(request).await.unwrap();
        assert_eq!(again.action_id, id);
        assert_eq!(
            (again.status, again.queue_position),
            (pb::ControlStatus::Queued as i32, 1)
        );
        assert_eq!(session.queue().await.len(), 2, "nothing was queued twice");
    })
    .await
}

#[tokio::test]
async fn resending_a_finished_action_id_reports_sent_and_changes_nothing() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let id = v7();
        let mut request = session.control_request(prompt("once"));
        request.action_id = Some(id.clone());
        assert_eq!(
            session.control(request.clone()).await.unwrap().status,
            pb::ControlStatus::Sent as i32
        );
        watch.response_to(&id).await;
        let log_before = session.log().await.len();
        let again = session.control(request).await.unwrap();
        assert_eq!(
            (again.action_id.as_str(), again.status),
            (id.as_str(), pb::ControlStatus::Sent as i32)
        );
        assert_eq!(
            session.log().await.len(),
            log_before,
            "nothing was sent again"
        );
    })
    .await
}

#[tokio::test]
async fn the_same_action_id_with_another_action_is_action_id_conflict() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let id = v7();
        let mut request = session.control_request(prompt("first"));
        request.action_id = Some(id.clone());
        session.control(request.clone()).await.unwrap();
        for other in [
            prompt("different text"),
            Action::Compact(pb::CompactAction {}),
            stop(false),
        ] {
            let mut conflicting = session.control_request(other);
            conflicting.action_id = Some(id.clone());
            let status = expect_err(session.control(conflicting).await);
            assert_error(&status, Code::AlreadyExists, "ACTION_ID_CONFLICT");
        }
    })
    .await
}

#[tokio::test]
async fn a_stop_cancels_the_turn_and_the_queue_keeps_draining() {
    bounded(async {
        let h = Harness::start().await;
        let (mut session, mut watch, running) = busy_session(&h).await;
        let queued = session.prompt("next").await;
        let stopped = session.act(stop(false)).await.unwrap();
        assert_eq!(stopped.status, pb::ControlStatus::Sent as i32);
        let (cancel, _) = watch.entry(|_, f| f["method"] == "session/cancel").await;
        assert_eq!(
            cancel.action_id.as_deref(),
            Some(stopped.action_id.as_str())
        );
        assert_eq!(
            watch.response_to(&running.action_id).await["result"]["stopReason"],
            "cancelled"
        );
        assert_eq!(
            watch.response_to(&queued.action_id).await["result"]["stopReason"],
            "end_turn"
        );
    })
    .await
}

#[tokio::test]
async fn a_stop_with_clear_queue_empties_it_and_nothing_queued_runs() {
    bounded(async {
        let h = Harness::start().await;
        let (mut session, mut watch, running) = busy_session(&h).await;
        let first = session.prompt("dropped one").await;
        let second = session.prompt("dropped two").await;
        session.act(stop(true)).await.unwrap();
        assert!(session.queue().await.is_empty());
        watch.response_to(&running.action_id).await;
        watch.status(pb::SessionStatus::Idle).await;
        let sent = prompt_ids(&session.sent_frames().await);
        assert_eq!(sent, vec![running.action_id]);
        // The removed actions report that they are gone.
        for dropped in [first, second] {
            let mut resend = session.control_request(prompt(if dropped.queue_position == 1 {
                "dropped one"
            } else {
                "dropped two"
            }));
            resend.action_id = Some(dropped.action_id);
            assert_error(
                &expect_err(session.control(resend).await),
                Code::NotFound,
                "QUEUED_ACTION_NOT_FOUND",
            );
        }
    })
    .await
}

#[tokio::test]
async fn a_stop_on_an_idle_session_still_sends_session_cancel_and_answers_sent() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let reply = session.act(stop(false)).await.unwrap();
        assert_eq!(reply.status, pb::ControlStatus::Sent as i32);
        let frames = session.sent_frames().await;
        assert_eq!(frames.last().unwrap()["method"], "session/cancel");
        assert!(frames.last().unwrap().get("id").is_none());
    })
    .await
}

#[tokio::test]
async fn an_interrupt_runs_next_and_cancels_the_running_turn() {
    bounded(async {
        let h = Harness::start().await;
        let (mut session, mut watch, running) = busy_session(&h).await;
        let queued = session.prompt("was next").await;
        let mut request = session.control_request(prompt("urgent"));
        request.delivery = pb::Delivery::Interrupt as i32;
        let interrupt = session.control(request).await.unwrap();
        assert_eq!(
            (interrupt.status, interrupt.queue_position),
            (pb::ControlStatus::Queued as i32, 1)
        );
        assert_eq!(
            watch.response_to(&running.action_id).await["result"]["stopReason"],
            "cancelled"
        );
        watch.response_to(&interrupt.action_id).await;
        watch.response_to(&queued.action_id).await;
        assert_eq!(
            prompt_ids(&session.sent_frames().await),
            vec![running.action_id, interrupt.action_id, queued.action_id]
        );
    })
    .await
}

#[tokio::test]
async fn an_interrupt_on_an_idle_session_is_sent_at_once_and_only_prompts_may_interrupt() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut request = session.control_request(prompt("now"));
        request.delivery = pb::Delivery::Interrupt as i32;
        assert_eq!(
            session.control(request).await.unwrap().status,
            pb::ControlStatus::Sent as i32
        );
        let mut compact = session.control_request(Action::Compact(pb::CompactAction {}));
        compact.delivery = pb::Delivery::Interrupt as i32;
        assert_error(
            &expect_err(session.control(compact).await),
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
        );
    })
    .await
}

#[tokio::test]
async fn queued_prompts_are_editable_and_removable_until_dispatch_and_an_edit_keeps_attachments_and_position()
 {
    bounded(async {
        let h = Harness::start().await;
        let (mut session, mut watch, running) = busy_session(&h).await;
        let first = session.prompt("first").await;
        let with_files = session
            .act(Action::Prompt(pb::PromptAction {
                prompt: "look at this".into(),
                attachments: vec![attachment("https://x.example/a.png", "a.png")],
            }))
            .await
            .unwrap();
        let compact = session
            .act(Action::Compact(pb::CompactAction {}))
            .await
            .unwrap();
        let edited = session
            .client
            .edit_queued_prompt(pb::EditQueuedPromptRequest {
                session_id: session.id.clone(),
                action_id: with_files.action_id.clone(),
                prompt: "look at this instead".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .entry
            .unwrap();
        assert_eq!(edited.prompt.as_deref(), Some("look at this instead"));
        assert_eq!(edited.attachments.len(), 1);
        assert_eq!(edited.action_id, with_files.action_id);
        let queue = session.queue().await;
        assert_eq!(
            queue
                .iter()
                .map(|e| e.action_id.clone())
                .collect::<Vec<_>>(),
            vec![
                first.action_id.clone(),
                with_files.action_id.clone(),
                compact.action_id.clone()
            ]
        );
        assert_eq!(queue[2].kind, pb::QueuedActionKind::Compact as i32);

        let session_id = session.id.clone();
        let edit = |action_id: &str, text: &str| pb::EditQueuedPromptRequest {
            session_id: session_id.clone(),
            action_id: action_id.to_owned(),
            prompt: text.to_owned(),
        };
        let not_editable = expect_err(
            session
                .client
                .clone()
                .edit_queued_prompt(edit(&compact.action_id, "x"))
                .await,
        );
        assert_error(&not_editable, Code::FailedPrecondition, "NOT_EDITABLE");
        let blank = expect_err(
            session
                .client
                .clone()
                .edit_queued_prompt(edit(&first.action_id, "  "))
                .await,
        );
        assert_error(&blank, Code::InvalidArgument, "EMPTY_PROMPT");

        session
            .client
            .remove_queued_action(pb::RemoveQueuedActionRequest {
                session_id: session.id.clone(),
                action_id: first.action_id.clone(),
            })
            .await
            .unwrap();
        assert_eq!(session.queue().await.len(), 2);

        session.act(stop(false)).await.unwrap();
        watch.response_to(&running.action_id).await;
        watch.response_to(&with_files.action_id).await;
        // Dispatched: no longer editable or removable.
        let gone = expect_err(
            session
                .client
                .clone()
                .edit_queued_prompt(edit(&with_files.action_id, "late"))
                .await,
        );
        assert_error(&gone, Code::NotFound, "QUEUED_ACTION_NOT_FOUND");
        let frames = session.sent_frames().await;
        let sent = frames
            .iter()
            .find(|f| f["id"] == with_files.action_id.as_str())
            .unwrap();
        let blocks = sent["params"]["prompt"].as_array().unwrap();
        assert_eq!(blocks[0]["text"], "look at this instead");
        assert_eq!(blocks[1]["type"], "resource_link");
        assert!(
            !prompt_ids(&frames).contains(&first.action_id),
            "the removed prompt never ran"
        );
    })
    .await
}

#[tokio::test]
async fn a_model_change_bypasses_the_running_turn() {
    bounded(async {
        let h = Harness::start().await;
        let (mut session, mut watch, _running) = busy_session(&h).await;
        let change = session.act(set_model("mock-smart")).await.unwrap();
        assert_eq!(change.status, pb::ControlStatus::Sent as i32);
        let response = watch.response_to(&change.action_id).await;
        assert!(response.get("result").is_some(), "{response}");
        // The harness reacts to the reply after logging it; the record change follows.
        watch.next_status().await;
        // The turn is still running, and the session now uses the new model.
        assert_eq!(
            session.get().await.status,
            pb::SessionStatus::Running as i32
        );
        assert_eq!(session.get().await.model, "mock-smart");
        let frame = session
            .sent_frames()
            .await
            .into_iter()
            .find(|f| f["id"] == change.action_id.as_str())
            .unwrap();
        assert_eq!(frame["method"], "session/set_config_option");
        assert_eq!(frame["params"]["configId"], "model");
    })
    .await
}

#[tokio::test]
async fn the_queue_holds_at_most_fifty_actions() {
    bounded(async {
        let h = Harness::start().await;
        let (mut session, _watch, _) = busy_session(&h).await;
        for i in 0..50 {
            let reply = session.prompt(&format!("queued {i}")).await;
            assert_eq!(reply.queue_position, i + 1);
        }
        let status = expect_err(session.act(prompt("one too many")).await);
        assert_error(&status, Code::ResourceExhausted, "QUEUE_FULL");
        let mut interrupt = session.control_request(prompt("urgent"));
        interrupt.delivery = pb::Delivery::Interrupt as i32;
        assert_error(
            &expect_err(session.control(interrupt).await),
            Code::ResourceExhausted,
            "QUEUE_FULL",
        );
        assert_eq!(session.queue().await.len(), 50);
    })
    .await
}

#[tokio::test]
async fn bad_actions_are_refused_and_change_nothing() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let before = session.log().await.len();
        let mut non_v7 = session.control_request(prompt("x"));
        non_v7.action_id = Some("6f1c1c1e-8d3b-4d51-9a47-2f7bb8c1a0d2".into());
        assert_error(
            &expect_err(session.control(non_v7).await),
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
        );
        let bad_uri = Action::Prompt(pb::PromptAction {
            prompt: "x".into(),
            attachments: vec![attachment("file:///etc/passwd", "passwd")],
        });
        assert_error(
            &expect_err(session.act(bad_uri).await),
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
        );
        let big = prompt(&"x".repeat(256 * 1024 + 1));
        assert_error(
            &expect_err(session.act(big).await),
            Code::InvalidArgument,
            "LIMIT_EXCEEDED",
        );
        assert_error(
            &expect_err(session.act(prompt("")).await),
            Code::InvalidArgument,
            "EMPTY_PROMPT",
        );
        let unknown_option = Action::SetConfigOption(pb::SetConfigOptionAction {
            config_id: "nope".into(),
            value: "x".into(),
        });
        assert_error(
            &expect_err(session.act(unknown_option).await),
            Code::InvalidArgument,
            "CONFIG_OPTION_UNKNOWN",
        );
        let no_permission =
            crate::support::permission_answer(crate::support::number_id(99), Some("allow-once"));
        assert_error(
            &expect_err(session.act(no_permission).await),
            Code::FailedPrecondition,
            "PERMISSION_NOT_PENDING",
        );
        assert_eq!(session.log().await.len(), before, "nothing was logged");
    })
    .await
}

#[tokio::test]
async fn sessions_never_share_a_queue() {
    bounded(async {
        let h = Harness::start().await;
        let (mut busy, _watch, _) = busy_session(&h).await;
        let queued = busy.prompt("waits behind the running turn").await;
        assert_eq!(queued.status, pb::ControlStatus::Queued as i32);
        let mut other = Session::create(&h, "mock").await;
        let reply = other.prompt("runs at once").await;
        assert_eq!(
            reply.status,
            pb::ControlStatus::Sent as i32,
            "another session's queue does not hold it back"
        );
        assert!(other.queue().await.is_empty());
        assert_eq!(busy.queue().await.len(), 1);
    })
    .await
}

#[tokio::test]
async fn a_turn_that_ends_with_an_error_response_still_lets_the_queue_drain() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        // The turn waits on a permission until the next prompt is queued, then fails.
        let failing = session
            .prompt("@permission\n@error -32603 the model is down")
            .await;
        let request = watch.agent_request("session/request_permission").await;
        let next = session.prompt("after the failure").await;
        assert_eq!(next.status, pb::ControlStatus::Queued as i32);
        session
            .act(crate::support::permission_answer(
                crate::support::number_id(request["id"].as_i64().unwrap()),
                Some("allow-once"),
            ))
            .await
            .unwrap();
        let error = watch.response_to(&failing.action_id).await;
        assert_eq!(error["error"]["message"], "the model is down");
        assert_eq!(
            watch.response_to(&next.action_id).await["result"]["stopReason"],
            "end_turn"
        );
    })
    .await
}
