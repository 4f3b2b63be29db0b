//! Interrupts: an interrupt goes to the front of the queue whatever the state of
//! the runtime, and what it sends to stop the running turn is done by the caller.

use agent_harness::pb::v1 as pb;
use serde_json::Value;

use crate::{
    auth::{self, ADA, EVE, as_user, control},
    harness::{Harness, bounded},
    support::{Session, mock_profile, processes_with, prompt},
};

fn prompt_ids(frames: &[Value]) -> Vec<String> {
    frames
        .iter()
        .filter(|f| f["method"] == "session/prompt")
        .map(|f| f["id"].as_str().unwrap().to_owned())
        .collect()
}

fn interrupt(session: &Session, text: &str) -> pb::ControlRequest {
    let mut request = session.control_request(prompt(text));
    request.delivery = pb::Delivery::Interrupt as i32;
    request
}

#[tokio::test]
async fn an_interrupt_on_a_disconnected_session_goes_to_the_front_of_the_queue_and_runs_first() {
    bounded(async {
        let marker = uuid::Uuid::now_v7().to_string();
        let h = Harness::start_with(|config| {
            mock_profile(
                config,
                "resumable",
                &["--resume", "--stderr-at-start", &marker],
            )
        })
        .await;
        let mut session = Session::create(&h, "resumable").await;
        let mut watch = session.watch().await;
        let running = session.prompt("@wait-cancel").await;
        watch.chunk("echo: @wait-cancel").await;
        let first = session.prompt("queued one").await;
        let second = session.prompt("queued two").await;
        // The runtime crashes with the two prompts queued.
        for pid in processes_with(&marker) {
            // SAFETY: only sends a signal to the runtime this test started.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        watch.status(pb::SessionStatus::Disconnected).await;
        assert_eq!(
            session
                .queue()
                .await
                .into_iter()
                .map(|e| e.action_id)
                .collect::<Vec<_>>(),
            vec![first.action_id.clone(), second.action_id.clone()],
            "the queue outlives the fault"
        );

        let urgent = session
            .control(interrupt(&session, "urgent"))
            .await
            .unwrap();
        assert_eq!(
            (urgent.status, urgent.queue_position),
            (pb::ControlStatus::Queued as i32, 1),
            "the interrupt is first in the queue"
        );
        watch.response_to(&second.action_id).await;
        assert_eq!(
            prompt_ids(&session.sent_frames().await),
            vec![
                running.action_id,
                urgent.action_id,
                first.action_id,
                second.action_id
            ],
            "after the reopen the interrupt runs before what was queued"
        );
    })
    .await
}

#[tokio::test]
async fn the_answers_and_session_cancel_an_editors_interrupt_sends_are_logged_with_the_editor_as_actor()
 {
    bounded(async {
        let (h, _file) = auth::start().await;
        let mut ada = as_user(&h, ADA);
        let mut request = auth::create_request(&h);
        request.editors = vec!["eve".into()];
        let session = auth::create(&mut ada, request).await;
        let mut eve = as_user(&h, EVE);
        let mut watch = auth::watch(&mut eve, &session.id).await;
        ada.control(control(&session.id, prompt("@permission")))
            .await
            .expect("the owner prompts");
        watch.agent_request("session/request_permission").await;

        let mut request = control(&session.id, prompt("urgent"));
        request.delivery = pb::Delivery::Interrupt as i32;
        let reply = eve
            .control(request)
            .await
            .expect("an editor may interrupt")
            .into_inner();
        let to_runtime = pb::LogDirection::ToRuntime as i32;
        let (answer, _) = watch
            .entry(|e, f| {
                e.direction == to_runtime && f["result"]["outcome"]["outcome"] == "cancelled"
            })
            .await;
        let (cancel, _) = watch
            .entry(|e, f| e.direction == to_runtime && f["method"] == "session/cancel")
            .await;
        for entry in [&answer, &cancel] {
            assert_eq!(entry.action_id.as_deref(), Some(reply.action_id.as_str()));
            assert_eq!(entry.actor, "eve", "the caller, not the owner: {entry:?}");
        }
        h.shutdown().await;
    })
    .await
}
