//! Sessions: creation with origins and models, idempotency, listing,
//! closing, deleting, and runtimes that fail to start leaving nothing behind.

use agent_harness::pb::v1::{self as pb, create_session_request::Origin};
use serde_json::Value;
use tonic::Code;

use crate::{
    harness::{Harness, assert_error, bounded, expect_err},
    support::session_count,
    support::{
        Session, create_request, mock_profile, mock_profile_with, processes_with, prompt, set_model,
    },
};

#[tokio::test]
async fn a_created_session_is_idle_with_its_acp_session_and_advertised_model() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let created = session.created.session.clone().unwrap();
        assert_eq!(created.status, pb::SessionStatus::Idle as i32);
        assert_eq!(created.acp_session_id, "mock-session-1");
        assert_eq!(created.model, "mock-fast");
        assert_eq!(created.owner, "local");
        assert_eq!(created.profile, "mock");
        assert_eq!(created.profile_fingerprint.len(), 64);
        assert_eq!(session.created.first_action_id, None);
        // The handshake is in the log, before any prompt.
        let methods: Vec<String> = session
            .sent_frames()
            .await
            .iter()
            .filter_map(|f| f["method"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(methods, ["initialize", "session/new"]);
        let first = &session.log().await[0];
        assert_eq!(first.direction, pb::LogDirection::Event as i32);
        assert!(first.json.contains("runtime_started"));
    })
    .await
}

#[tokio::test]
async fn a_prompt_is_sent_logged_and_answered_and_the_session_is_named_after_it() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let reply = session.prompt("fix the flaky test\nsecond line").await;
        assert_eq!(reply.status, pb::ControlStatus::Sent as i32);
        let response = watch.response_to(&reply.action_id).await;
        assert_eq!(response["result"]["stopReason"], "end_turn");
        let echoed = watch.chunk("echo: fix the flaky test").await;
        assert!(echoed.is_object());
        let got = session.get().await;
        assert_eq!(got.name, "fix the flaky test");
        // The SENT frame is in the log with the action id on it.
        let log = session.log().await;
        let sent = log
            .iter()
            .find(|e| {
                e.action_id.as_deref() == Some(reply.action_id.as_str())
                    && e.direction == pb::LogDirection::ToRuntime as i32
            })
            .expect("the prompt frame is logged");
        let frame: Value = serde_json::from_str(&sent.json).unwrap();
        assert_eq!(frame["id"], reply.action_id);
        assert_eq!(frame["method"], "session/prompt");
    })
    .await
}

#[tokio::test]
async fn a_mention_with_two_images_and_a_document_opens_with_exactly_two_resource_links_after_the_text()
 {
    bounded(async {
        let h = Harness::start().await;
        let mut request = create_request(&h, "mock");
        request.origin = Some(Origin::Mention(pb::ChannelMessage {
            message_id: "m1".into(),
            channel_id: "c1".into(),
            content: "what is wrong in these screenshots?".into(),
            attachments: vec![
                pb::ChannelAttachment {
                    entity_type: "static/image".into(),
                    entity_id: "img-1".into(),
                },
                pb::ChannelAttachment {
                    entity_type: "document".into(),
                    entity_id: "doc-1".into(),
                },
                pb::ChannelAttachment {
                    entity_type: "static/image".into(),
                    entity_id: "img-2".into(),
                },
            ],
            ..Default::default()
        }));
        let mut session = Session::create_with(&h, request).await;
        let first = session
            .created
            .first_action_id
            .clone()
            .expect("the mention sent a first prompt");
        let frames = session.sent_frames().await;
        let prompt = frames
            .iter()
            .find(|f| f["id"] == first.as_str())
            .expect("the first prompt frame");
        assert_eq!(prompt["method"], "session/prompt");
        let blocks = prompt["params"]["prompt"].as_array().unwrap();
        let visible: Vec<&Value> = blocks.iter().filter(|b| b.get("_meta").is_none()).collect();
        assert_eq!(visible.len(), 3);
        assert_eq!(visible[0]["text"], "what is wrong in these screenshots?");
        for (block, id) in visible[1..].iter().zip(["img-1", "img-2"]) {
            assert_eq!(block["type"], "resource_link");
            assert_eq!(block["uri"], format!("https://static.example/file/{id}"));
            assert_eq!(block["name"], "image");
            assert_eq!(block["mimeType"], "image/*");
        }
        assert_eq!(
            session.get().await.name,
            "what is wrong in these screenshots?"
        );
    })
    .await
}

#[tokio::test]
async fn a_task_assignment_opens_with_its_text_only() {
    bounded(async {
        let h = Harness::start().await;
        let mut request = create_request(&h, "mock");
        request.origin = Some(Origin::TaskAssignment(pb::TaskAssignment {
            prompt: "triage the open bugs".into(),
            assigned_by: "ada".into(),
        }));
        let mut session = Session::create_with(&h, request).await;
        let first = session
            .created
            .first_action_id
            .clone()
            .expect("a first prompt");
        let frames = session.sent_frames().await;
        let prompt = frames.iter().find(|f| f["id"] == first.as_str()).unwrap();
        let blocks = prompt["params"]["prompt"].as_array().unwrap();
        let visible: Vec<&Value> = blocks.iter().filter(|b| b.get("_meta").is_none()).collect();
        assert_eq!(visible.len(), 1);
        assert_eq!(
            visible[0],
            &serde_json::json!({"type": "text", "text": "triage the open bugs"})
        );
    })
    .await
}

#[tokio::test]
async fn a_requested_model_is_selected_at_creation_and_an_unadvertised_one_is_refused_naming_the_advertised()
 {
    bounded(async {
        let h = Harness::start().await;
        let mut request = create_request(&h, "mock");
        request.model = Some("mock-smart".into());
        let mut session = Session::create_with(&h, request).await;
        assert_eq!(
            session.created.session.as_ref().unwrap().model,
            "mock-smart"
        );

        let mut request = create_request(&h, "mock");
        request.model = Some("gpt-nonexistent".into());
        let status = expect_err(h.sessions().create_session(request).await);
        assert_error(&status, Code::InvalidArgument, "MODEL_NOT_ADVERTISED");
        assert!(
            status.message().contains("mock-fast") && status.message().contains("mock-smart"),
            "{}",
            status.message()
        );

        let status = expect_err(session.act(set_model("gpt-nonexistent")).await);
        assert_error(&status, Code::InvalidArgument, "MODEL_NOT_ADVERTISED");
        // Only the one session exists: the refused creation left nothing behind.
        assert_eq!(session_count(&h).await, 1);
    })
    .await
}

#[tokio::test]
async fn an_agent_that_wants_authentication_is_runtime_auth_required_naming_its_sign_in_methods() {
    bounded(async {
        let h = Harness::start_with(|config| {
            mock_profile(
                config,
                "auth",
                &[
                    "--auth-required",
                    "--auth-method",
                    "agent-login=Log in with the agent",
                    "--auth-method",
                    "api-key",
                ],
            );
        })
        .await;
        let status = expect_err(
            h.sessions()
                .create_session(create_request(&h, "auth"))
                .await,
        );
        assert_error(&status, Code::FailedPrecondition, "RUNTIME_AUTH_REQUIRED");
        let message = status.message();
        assert!(
            message.contains("session/new failed with error -32000: authentication required"),
            "{message}"
        );
        assert!(
            message.contains(
                "the agent's sign-in methods: Log in with the agent (agent-login): mock sign-in \
                 method agent-login; api-key: mock sign-in method api-key"
            ),
            "{message}"
        );
        assert!(
            message.contains("env_passthrough"),
            "says what to do: {message}"
        );
        assert_eq!(session_count(&h).await, 0, "no session is left");
    })
    .await
}

#[tokio::test]
async fn a_profiles_auth_method_signs_the_agent_in_before_each_session_and_an_unknown_one_is_auth_required()
 {
    bounded(async {
        let flags = ["--resume", "--auth-required", "--auth-method", "api-key"];
        let h = Harness::start_with(|config| {
            mock_profile_with(config, "signs-in", &flags, |p| {
                p.auth_method = Some("api-key".into());
            });
            mock_profile_with(config, "wrong-method", &flags, |p| {
                p.auth_method = Some("sso".into());
            });
        })
        .await;
        let mut session = Session::create(&h, "signs-in").await;
        let methods: Vec<(String, Value)> = session
            .sent_frames()
            .await
            .iter()
            .filter_map(|f| Some((f["method"].as_str()?.to_owned(), f["params"].clone())))
            .collect();
        assert_eq!(methods[0].0, "initialize");
        assert_eq!(methods[1].0, "authenticate");
        assert_eq!(methods[1].1["methodId"], "api-key");
        assert_eq!(methods[2].0, "session/new");
        let mut watch = session.watch().await;
        let turn = session.prompt("signed in").await;
        watch.response_to(&turn.action_id).await;

        let status = expect_err(
            h.sessions()
                .create_session(create_request(&h, "wrong-method"))
                .await,
        );
        assert_error(&status, Code::FailedPrecondition, "RUNTIME_AUTH_REQUIRED");
        assert!(
            status.message().contains(
                "the profile's auth_method \"sso\" is not a sign-in method of the agent; the \
                 agent's sign-in methods: api-key"
            ),
            "{}",
            status.message()
        );
    })
    .await
}

#[tokio::test]
async fn a_runtime_that_cannot_start_is_runtime_start_failed_and_leaves_nothing_behind() {
    bounded(async {
        let marker = uuid::Uuid::now_v7().to_string();
        let h = Harness::start_with(|config| {
            mock_profile(
                config,
                "exits",
                &[
                    "--stderr-at-start",
                    &format!("boom {marker}"),
                    "--exit-at-start",
                    "7",
                ],
            );
            mock_profile(
                config,
                "fails-init",
                &[
                    "--stderr-at-start",
                    &format!("init {marker}"),
                    "--fail-initialize",
                ],
            );
            mock_profile(
                config,
                "auth",
                &[
                    "--stderr-at-start",
                    &format!("auth {marker}"),
                    "--auth-required",
                ],
            );
            mock_profile(
                config,
                "hangs",
                &[
                    "--stderr-at-start",
                    &format!("hang {marker}"),
                    "--hang-initialize",
                ],
            );
            let mut missing = (*config.profiles["mock"]).clone();
            missing.name = "missing".into();
            missing.command = "/nonexistent/agent-binary".into();
            config
                .profiles
                .insert("missing".into(), std::sync::Arc::new(missing));
            // A hung handshake fails fast in this test.
            let mut hangs = (*config.profiles["hangs"]).clone();
            hangs.startup_timeout = std::time::Duration::from_millis(500);
            config
                .profiles
                .insert("hangs".into(), std::sync::Arc::new(hangs));
        })
        .await;
        for (profile, reason, tail) in [
            ("exits", "RUNTIME_START_FAILED", Some("boom")),
            ("fails-init", "RUNTIME_START_FAILED", Some("init")),
            ("auth", "RUNTIME_AUTH_REQUIRED", Some("auth")),
            ("hangs", "RUNTIME_START_FAILED", Some("hang")),
            ("missing", "RUNTIME_START_FAILED", None),
        ] {
            let status = expect_err(
                h.sessions()
                    .create_session(create_request(&h, profile))
                    .await,
            );
            let code = if reason == "RUNTIME_AUTH_REQUIRED" {
                Code::FailedPrecondition
            } else {
                Code::Unavailable
            };
            assert_error(&status, code, reason);
            if let Some(tail) = tail {
                assert!(
                    status.message().contains(&format!("{tail} {marker}")),
                    "{profile}: {}",
                    status.message()
                );
            }
        }
        let listed = h
            .sessions()
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert!(
            listed.sessions.is_empty(),
            "no session is left: {:?}",
            listed.sessions
        );
        assert_eq!(
            processes_with(&marker),
            Vec::<u32>::new(),
            "no runtime process is left"
        );
    })
    .await
}

#[tokio::test]
async fn an_unknown_profile_a_relative_cwd_and_a_bad_session_id_are_refused() {
    bounded(async {
        let h = Harness::start().await;
        let status = expect_err(
            h.sessions()
                .create_session(create_request(&h, "nope"))
                .await,
        );
        assert_error(&status, Code::NotFound, "PROFILE_NOT_FOUND");
        let mut request = create_request(&h, "mock");
        request.cwd = "relative/dir".into();
        assert_error(
            &expect_err(h.sessions().create_session(request).await),
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
        );
        let mut request = create_request(&h, "mock");
        request.session_id = Some("not-a-uuid".into());
        assert_error(
            &expect_err(h.sessions().create_session(request).await),
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
        );
        let mut request = create_request(&h, "mock");
        request.name = Some("   ".into());
        assert_error(
            &expect_err(h.sessions().create_session(request).await),
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
        );
        let status = expect_err(
            h.sessions()
                .get_session(pb::GetSessionRequest {
                    session_id: uuid::Uuid::now_v7().to_string(),
                })
                .await,
        );
        assert_error(&status, Code::NotFound, "SESSION_NOT_FOUND");
    })
    .await
}

#[tokio::test]
async fn a_caller_minted_session_id_makes_creation_idempotent() {
    bounded(async {
        let h = Harness::start().await;
        let id = uuid::Uuid::now_v7().to_string();
        let mut request = create_request(&h, "mock");
        request.session_id = Some(id.clone());
        request.origin = Some(Origin::TaskAssignment(pb::TaskAssignment {
            prompt: "hello".into(),
            assigned_by: "a".into(),
        }));
        let first = h
            .sessions()
            .create_session(request.clone())
            .await
            .unwrap()
            .into_inner();
        let again = h
            .sessions()
            .create_session(request.clone())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(first.session.as_ref().unwrap().id, id);
        assert_eq!(again.session.as_ref().unwrap().id, id);
        assert_eq!(again.first_action_id, first.first_action_id);
        request.name = Some("different".into());
        let status = expect_err(h.sessions().create_session(request).await);
        assert_error(&status, Code::AlreadyExists, "SESSION_EXISTS");
        assert_eq!(session_count(&h).await, 1);
    })
    .await
}

#[tokio::test]
async fn sessions_list_newest_first_in_pages_filtered_by_status_and_labels() {
    bounded(async {
        let h = Harness::start().await;
        let mut ids = Vec::new();
        for i in 0..3 {
            let mut request = create_request(&h, "mock");
            request
                .labels
                .insert("team".into(), if i == 1 { "b".into() } else { "a".into() });
            ids.push(Session::create_with(&h, request).await.id);
        }
        let mut client = h.sessions();
        let page = client
            .list_sessions(pb::ListSessionsRequest {
                page_size: 2,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            page.sessions
                .iter()
                .map(|s| s.id.clone())
                .collect::<Vec<_>>(),
            vec![ids[2].clone(), ids[1].clone()]
        );
        assert!(!page.next_page_token.is_empty());
        let rest = client
            .list_sessions(pb::ListSessionsRequest {
                page_size: 2,
                page_token: page.next_page_token,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(rest.sessions.len(), 1);
        assert_eq!(rest.sessions[0].id, ids[0]);
        assert!(rest.next_page_token.is_empty());

        let team_a = client
            .list_sessions(pb::ListSessionsRequest {
                labels: [("team".to_owned(), "a".to_owned())].into_iter().collect(),
                statuses: vec![pb::SessionStatus::Idle as i32],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(team_a.sessions.len(), 2);
        let closed = client
            .list_sessions(pb::ListSessionsRequest {
                statuses: vec![pb::SessionStatus::Closed as i32],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(closed.sessions.is_empty());
        let status = expect_err(
            client
                .list_sessions(pb::ListSessionsRequest {
                    page_token: "garbage".into(),
                    ..Default::default()
                })
                .await,
        );
        assert_error(&status, Code::InvalidArgument, "INVALID_ARGUMENT");
    })
    .await
}

#[tokio::test]
async fn a_closed_session_keeps_its_log_and_refuses_actions_and_a_deleted_one_is_gone() {
    bounded(async {
        let h = Harness::start().await;
        let mut session = Session::create(&h, "mock").await;
        let mut watch = session.watch().await;
        let reply = session.prompt("hello").await;
        watch.response_to(&reply.action_id).await;
        let closed = session
            .client
            .close_session(pb::CloseSessionRequest {
                session_id: session.id.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .session
            .unwrap();
        assert_eq!(closed.status, pb::SessionStatus::Closed as i32);
        assert!(!session.log().await.is_empty());
        let status = expect_err(session.act(prompt("more")).await);
        assert_error(&status, Code::FailedPrecondition, "SESSION_CLOSED");

        session
            .client
            .delete_session(pb::DeleteSessionRequest {
                session_id: session.id.clone(),
            })
            .await
            .unwrap();
        let status = expect_err(
            session
                .client
                .get_session(pb::GetSessionRequest {
                    session_id: session.id.clone(),
                })
                .await,
        );
        assert_error(&status, Code::NotFound, "SESSION_NOT_FOUND");
        let status = expect_err(
            session
                .client
                .read_log(pb::ReadLogRequest {
                    session_id: session.id.clone(),
                    after_offset: 0,
                    limit: 10,
                })
                .await,
        );
        assert_error(&status, Code::NotFound, "SESSION_NOT_FOUND");
    })
    .await
}

#[tokio::test]
async fn creation_beyond_the_live_runtime_cap_is_too_many_runtimes_and_a_closed_session_frees_its_slot()
 {
    bounded(async {
        let h = Harness::start_with(|config| config.limits.live_runtimes = 1).await;
        let mut first = Session::create(&h, "mock").await;
        let status = expect_err(
            h.sessions()
                .create_session(create_request(&h, "mock"))
                .await,
        );
        assert_error(&status, Code::ResourceExhausted, "TOO_MANY_RUNTIMES");
        first
            .client
            .close_session(pb::CloseSessionRequest {
                session_id: first.id.clone(),
            })
            .await
            .unwrap();
        Session::create(&h, "mock").await;
    })
    .await
}

#[tokio::test]
async fn a_principal_owning_its_maximum_of_live_sessions_gets_too_many_sessions() {
    bounded(async {
        let h = Harness::start_with(|config| config.limits.sessions_per_principal = 2).await;
        let mut first = Session::create(&h, "mock").await;
        Session::create(&h, "mock").await;
        let status = expect_err(
            h.sessions()
                .create_session(create_request(&h, "mock"))
                .await,
        );
        assert_error(&status, Code::ResourceExhausted, "TOO_MANY_SESSIONS");
        first
            .client
            .close_session(pb::CloseSessionRequest {
                session_id: first.id.clone(),
            })
            .await
            .unwrap();
        Session::create(&h, "mock").await;
    })
    .await
}

/// ListSessions label filters `k0=v … k{n-1}=v`.
pub(crate) fn label_filters(n: usize) -> std::collections::HashMap<String, String> {
    (0..n).map(|i| (format!("k{i}"), "v".to_owned())).collect()
}

/// The filter limits as any client meets them: 64 labels and 16 statuses list, one more of
/// either is LIMIT_EXCEEDED, and no refusal quotes SQL (checked on each store).
pub(crate) async fn list_filters_are_bounded(
    client: &mut pb::agent_session_service_client::AgentSessionServiceClient<
        tonic::transport::Channel,
    >,
) {
    let statuses = |n: usize| vec![pb::SessionStatus::Idle as i32; n];
    client
        .list_sessions(pb::ListSessionsRequest {
            labels: label_filters(64),
            statuses: statuses(16),
            ..Default::default()
        })
        .await
        .expect("64 label and 16 status filters are allowed");
    for (request, limit) in [
        (
            pb::ListSessionsRequest {
                labels: label_filters(65),
                ..Default::default()
            },
            "list_label_filters",
        ),
        (
            pb::ListSessionsRequest {
                statuses: statuses(17),
                ..Default::default()
            },
            "list_status_filters",
        ),
        (
            pb::ListSessionsRequest {
                labels: label_filters(30_000),
                ..Default::default()
            },
            "list_label_filters",
        ),
        (
            pb::ListSessionsRequest {
                labels: [("k".to_owned(), "v".repeat(100_000))].into(),
                ..Default::default()
            },
            "label_bytes",
        ),
    ] {
        let status = expect_err(client.list_sessions(request).await);
        assert_error(&status, Code::InvalidArgument, "LIMIT_EXCEEDED");
        assert_eq!(
            crate::harness::error_info(&status).metadata["limit"],
            limit,
            "{status:?}"
        );
        let message = status.message().to_lowercase();
        assert!(
            !message.contains("select") && !message.contains("session_labels"),
            "{status:?}"
        );
    }
}

#[tokio::test]
async fn list_filters_beyond_64_labels_or_16_statuses_are_limit_exceeded_and_never_quote_sql() {
    bounded(async {
        let h = Harness::start().await;
        list_filters_are_bounded(&mut h.sessions()).await;
        h.shutdown().await;
    })
    .await
}

#[tokio::test]
async fn another_principals_session_id_answers_exactly_as_the_callers_own_id_taken_by_another_request()
 {
    use crate::auth::{ADA, BOB, as_user, create, start};
    bounded(async {
        let (h, _file) = start().await;
        let (mut ada, mut bob) = (as_user(&h, ADA), as_user(&h, BOB));
        let request = |id: &str, name: &str| pb::CreateSessionRequest {
            session_id: Some(id.to_owned()),
            name: Some(name.to_owned()),
            ..crate::auth::create_request(&h)
        };
        let adas = uuid::Uuid::now_v7().to_string();
        let bobs = uuid::Uuid::now_v7().to_string();
        create(&mut ada, request(&adas, "ada's")).await;
        create(&mut bob, request(&bobs, "bob's")).await;

        // Bob re-sends his own id with a different request, then tries ada's id.
        let own = expect_err(bob.create_session(request(&bobs, "other")).await);
        let other = expect_err(bob.create_session(request(&adas, "other")).await);
        assert_error(&own, Code::AlreadyExists, "SESSION_EXISTS");
        assert_eq!(other.code(), own.code());
        // Byte for byte, once each message's own id (which the caller sent) is set aside.
        assert_eq!(
            other.message().replace(&adas, "<id>"),
            own.message().replace(&bobs, "<id>")
        );
        // The details (a google.rpc.Status with the ErrorInfo) repeat the message: the ids are
        // the same length, so set aside byte for byte too.
        let without_id = |details: &[u8], id: &str| {
            let mut bytes = details.to_vec();
            let at = bytes
                .windows(id.len())
                .position(|w| w == id.as_bytes())
                .expect("the id is in the details' message");
            bytes[at..at + id.len()].fill(b'*');
            bytes
        };
        assert_eq!(
            without_id(other.details(), &adas),
            without_id(own.details(), &bobs),
            "the same details, byte for byte"
        );
        let headers = |s: &tonic::Status| {
            let mut names: Vec<String> = s.metadata().keys().map(|k| format!("{k:?}")).collect();
            names.sort();
            names
        };
        assert_eq!(headers(&other), headers(&own));

        // Ada's session is untouched.
        let got = ada
            .get_session(pb::GetSessionRequest {
                session_id: adas.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .session
            .unwrap();
        assert_eq!((got.name.as_str(), got.owner.as_str()), ("ada's", "ada"));
        h.shutdown().await;
    })
    .await
}

/// A drain and a restart are the harness's doing, not the session's: a session they suspend
/// keeps its UPDATED time, so a list after a restart still says when each was last used.
#[tokio::test]
async fn a_drain_and_a_restart_leave_a_sessions_updated_time_as_it_was() {
    bounded(async {
        let data = tempfile::tempdir().unwrap();
        let configure = |config: &mut agent_harness::config::ServeConfig| {
            config.data_dir = data.path().join("data");
            crate::support::mock_profile(config, "resumable", &["--resume"]);
        };
        let h = Harness::start_with(configure).await;
        let mut session = Session::create_with(
            &h,
            pb::CreateSessionRequest {
                profile: "resumable".into(),
                cwd: agent_harness_testkit::workspace_in(data.path())
                    .to_string_lossy()
                    .into_owned(),
                ..Default::default()
            },
        )
        .await;
        let mut watch = session.watch().await;
        let reply = session.prompt("hello").await;
        watch.response_to(&reply.action_id).await;
        watch.status(pb::SessionStatus::Idle).await;
        let before = session.get().await;
        h.shutdown().await;
        let h = Harness::start_with(configure).await;
        let mut session = Session::attach(h.sessions(), &before.id);
        let after = session.get().await;
        assert_eq!(
            after.status,
            pb::SessionStatus::Suspended as i32,
            "{after:?}"
        );
        assert_eq!(after.updated_at, before.updated_at);
        h.shutdown().await;
    })
    .await;
}
