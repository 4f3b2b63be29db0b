//! Permissions and elicitations: held for a person, answered on the agent's own id,
//! refused when not pending or not offered, released by `$/cancel_request`, turn end and epoch
//! end, answered `cancelled` by a stop before `session/cancel`, and auto-accepted by policy.

use agent_harness::{
    config::PermissionPolicy,
    pb::v1::{self as pb, control_request::Action},
};
use tonic::Code;

use crate::{
    harness::{Harness, assert_error, bounded, expect_err},
    support::answer_request,
    support::{
        Session, Watch, mock_profile, mock_profile_with, number_id, permission_answer,
        processes_with, stop,
    },
};

/// Starts a turn that asks for permission and waits until the request is held.
async fn held_permission(
    session: &mut Session,
    watch: &mut Watch,
    script: &str,
) -> (pb::ControlResponse, i64) {
    let turn = session.prompt(script).await;
    let request = watch.agent_request("session/request_permission").await;
    watch.status(pb::SessionStatus::AwaitingInput).await;
    (
        turn,
        request["id"]
            .as_i64()
            .expect("the mock agent uses numeric ids"),
    )
}

fn elicitation_answer(id: pb::JsonRpcId, answer: pb::respond_elicitation_action::Answer) -> Action {
    Action::RespondElicitation(pb::RespondElicitationAction {
        request_id: Some(id),
        answer: Some(answer),
    })
}

#[tokio::test]
async fn a_held_permission_is_answered_on_the_agents_own_id_and_the_turn_completes() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let (turn, id) = held_permission(&mut session, &mut watch, "@permission").await;
        assert_eq!(
            session.get().await.status,
            pb::SessionStatus::AwaitingInput as i32
        );
        let answer = session
            .act(permission_answer(number_id(id), Some("allow-once")))
            .await
            .unwrap();
        assert_eq!(answer.status, pb::ControlStatus::Sent as i32);
        watch.chunk("permission: selected allow-once").await;
        assert_eq!(
            watch.response_to(&turn.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        let (entry, frame) = watch
            .entry(|e, f| e.direction == pb::LogDirection::ToRuntime as i32 && f["id"] == id)
            .await;
        assert_eq!(entry.action_id.as_deref(), Some(answer.action_id.as_str()));
        assert_eq!(
            frame["result"]["outcome"],
            serde_json::json!({"outcome": "selected", "optionId": "allow-once"})
        );
    })
    .await
}

#[tokio::test]
async fn an_answer_to_an_unknown_permission_or_of_another_id_shape_is_permission_not_pending() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let (_, id) = held_permission(&mut session, &mut watch, "@permission").await;
        let unknown = expect_err(
            session
                .act(permission_answer(number_id(id + 100), Some("allow-once")))
                .await,
        );
        assert_error(&unknown, Code::FailedPrecondition, "PERMISSION_NOT_PENDING");
        let as_text = pb::JsonRpcId {
            id: Some(pb::json_rpc_id::Id::Text(id.to_string())),
        };
        let wrong_shape = expect_err(
            session
                .act(permission_answer(as_text, Some("allow-once")))
                .await,
        );
        assert_error(
            &wrong_shape,
            Code::FailedPrecondition,
            "PERMISSION_NOT_PENDING",
        );
    })
    .await
}

#[tokio::test]
async fn an_option_that_was_not_offered_is_permission_option_unknown_and_the_request_stays_held() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let (_, id) = held_permission(&mut session, &mut watch, "@permission").await;
        let status = expect_err(
            session
                .act(permission_answer(number_id(id), Some("allow-forever")))
                .await,
        );
        assert_error(&status, Code::InvalidArgument, "PERMISSION_OPTION_UNKNOWN");
        assert!(
            status.message().contains("allow-once"),
            "{}",
            status.message()
        );
        session
            .act(permission_answer(number_id(id), Some("reject-once")))
            .await
            .unwrap();
        watch.chunk("permission: selected reject-once").await;
    })
    .await
}

#[tokio::test]
async fn a_stop_answers_a_held_permission_cancelled_before_it_sends_session_cancel() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let (turn, id) = held_permission(&mut session, &mut watch, "@permission").await;
        let stopped = session.act(stop(false)).await.unwrap();
        assert_eq!(
            watch.response_to(&turn.action_id).await["result"]["stopReason"],
            "cancelled"
        );
        let log = session.log().await;
        let answer = log
            .iter()
            .position(|e| {
                e.direction == pb::LogDirection::ToRuntime as i32
                    && e.json.contains("\"cancelled\"")
                    && e.json.contains(&format!("\"id\":{id}"))
            })
            .expect("the held permission was answered");
        let cancel = log
            .iter()
            .position(|e| e.json.contains("session/cancel"))
            .expect("session/cancel was sent");
        assert!(
            answer < cancel,
            "the answer (offset {}) precedes the cancel (offset {})",
            log[answer].offset,
            log[cancel].offset
        );
        assert_eq!(
            log[answer].action_id.as_deref(),
            Some(stopped.action_id.as_str())
        );
        let late = expect_err(
            session
                .act(permission_answer(number_id(id), Some("allow-once")))
                .await,
        );
        assert_error(&late, Code::FailedPrecondition, "PERMISSION_NOT_PENDING");
    })
    .await
}

#[tokio::test]
async fn an_auto_accept_profile_picks_allow_always_itself() {
    bounded(async {
        let h = Harness::start_with(|config| {
            mock_profile_with(config, "trusting", &[], |p| {
                p.permission_policy = PermissionPolicy::AutoAccept
            });
        })
        .await;
        let mut session = Session::create(&h, "trusting").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("@permission").await;
        watch.chunk("permission: selected allow-always").await;
        watch.response_to(&turn.action_id).await;
        let (entry, _) = watch
            .entry(|e, f| {
                e.direction == pb::LogDirection::ToRuntime as i32
                    && f["result"]["outcome"]["optionId"] == "allow-always"
            })
            .await;
        assert_eq!(entry.actor, "harness");
        assert!(
            !watch
                .statuses
                .contains(&(pb::SessionStatus::AwaitingInput as i32)),
            "nothing was held"
        );
    })
    .await
}

#[tokio::test]
async fn a_held_permission_is_released_when_the_agent_cancels_its_request() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("@cancel-permission").await;
        let request = watch.agent_request("session/request_permission").await;
        watch.chunk("cancel-permission: cancelled").await;
        watch.response_to(&turn.action_id).await;
        let late = expect_err(
            session
                .act(answer_request(&request, Some("allow-once")))
                .await,
        );
        assert_error(&late, Code::FailedPrecondition, "PERMISSION_NOT_PENDING");
    })
    .await
}

#[tokio::test]
async fn a_held_permission_is_released_when_its_turn_ends() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("@permission-nowait").await;
        let request = watch.agent_request("session/request_permission").await;
        watch.response_to(&turn.action_id).await;
        watch.status(pb::SessionStatus::Idle).await;
        let late = expect_err(
            session
                .act(answer_request(&request, Some("allow-once")))
                .await,
        );
        assert_error(&late, Code::FailedPrecondition, "PERMISSION_NOT_PENDING");
    })
    .await
}

#[tokio::test]
async fn a_held_permission_is_released_when_its_runtime_dies() {
    bounded(async {
        let marker = uuid::Uuid::now_v7().to_string();
        let h = Harness::start_with(|config| {
            mock_profile(config, "marked", &["--stderr-at-start", &marker])
        })
        .await;
        let mut session = Session::create(&h, "marked").await;
        let mut watch = session.watch().await;
        let (_, id) = held_permission(&mut session, &mut watch, "@permission").await;
        for pid in processes_with(&marker) {
            // SAFETY: plain kill of a process this test's server started.
            unsafe { libc_kill(pid) };
        }
        watch.status(pb::SessionStatus::Disconnected).await;
        let late = expect_err(
            session
                .act(permission_answer(number_id(id), Some("allow-once")))
                .await,
        );
        assert_error(&late, Code::FailedPrecondition, "PERMISSION_NOT_PENDING");
    })
    .await
}

unsafe fn libc_kill(pid: u32) {
    unsafe extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }
    unsafe { kill(pid as i32, 9) };
}

#[tokio::test]
async fn a_form_elicitation_is_held_and_answered_with_its_content() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("@elicit form").await;
        let request = watch.agent_request("elicitation/create").await;
        watch.status(pb::SessionStatus::AwaitingInput).await;
        let content = [(
            "name".to_owned(),
            pb::ElicitationValue {
                kind: Some(pb::elicitation_value::Kind::Text("Ada".into())),
            },
        )]
        .into_iter()
        .collect();
        let id = number_id(request["id"].as_i64().unwrap());
        let decline_wrong = elicitation_answer(
            number_id(12345),
            pb::respond_elicitation_action::Answer::Decline(pb::ElicitationDecline {}),
        );
        assert_error(
            &expect_err(session.act(decline_wrong).await),
            Code::FailedPrecondition,
            "ELICITATION_NOT_PENDING",
        );
        session
            .act(elicitation_answer(
                id,
                pb::respond_elicitation_action::Answer::Accept(pb::ElicitationAccept { content }),
            ))
            .await
            .unwrap();
        watch.chunk(r#"elicitation: accept {"name":"Ada"}"#).await;
        watch.response_to(&turn.action_id).await;
    })
    .await
}

#[tokio::test]
async fn a_second_elicitation_is_refused_with_invalid_params_while_one_is_held() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        session.prompt("@elicit twice").await;
        let refusal = watch.chunk("elicitation: error -32602").await;
        assert!(
            refusal["params"]["update"]["content"]["text"]
                .as_str()
                .unwrap()
                .contains("already pending")
        );
        let (_, frame) = watch
            .entry(|e, f| {
                e.direction == pb::LogDirection::ToRuntime as i32 && f["error"]["code"] == -32602
            })
            .await;
        assert!(frame["id"].is_i64());
    })
    .await
}

#[tokio::test]
async fn a_request_scoped_elicitation_is_refused_at_once() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("@elicit request").await;
        let refusal = watch.chunk("elicitation: error -32602").await;
        assert!(
            refusal["params"]["update"]["content"]["text"]
                .as_str()
                .unwrap()
                .contains("request-scoped")
        );
        watch.response_to(&turn.action_id).await;
    })
    .await
}

#[tokio::test]
async fn a_url_elicitation_accepted_is_completed_by_the_agent() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("@elicit url").await;
        let request = watch.agent_request("elicitation/create").await;
        assert_eq!(request["params"]["mode"], "url");
        let id = number_id(request["id"].as_i64().unwrap());
        session
            .act(elicitation_answer(
                id,
                pb::respond_elicitation_action::Answer::Accept(pb::ElicitationAccept::default()),
            ))
            .await
            .unwrap();
        watch
            .entry(|_, f| f["method"] == "elicitation/complete")
            .await;
        watch.response_to(&turn.action_id).await;
    })
    .await
}

#[tokio::test]
async fn a_stop_answers_a_held_elicitation_with_cancel() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("@elicit form").await;
        watch.agent_request("elicitation/create").await;
        session.act(stop(false)).await.unwrap();
        assert_eq!(
            watch.response_to(&turn.action_id).await["result"]["stopReason"],
            "cancelled"
        );
        let log = session.log().await;
        let answer = log
            .iter()
            .position(|e| e.json.contains(r#""action":"cancel""#))
            .expect("answered cancel");
        let cancel = log
            .iter()
            .position(|e| e.json.contains("session/cancel"))
            .unwrap();
        assert!(answer < cancel);
    })
    .await
}

#[tokio::test]
async fn an_agent_request_the_harness_does_not_serve_is_answered_method_not_found_at_once() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let turn = session.prompt("@unknown-request").await;
        watch.chunk("unknown-request: error -32601").await;
        watch.response_to(&turn.action_id).await;
    })
    .await
}
