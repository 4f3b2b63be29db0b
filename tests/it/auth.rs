//! Authentication and authorization over a real connection: bearer tokens, owners and
//! editors, services acting for users, who may send `context` and who may answer, revocation of
//! open streams, reloads, and the no-token mode's listen rule.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use agent_harness::{
    app,
    config::ServeConfig,
    pb::v1::{
        self as pb, agent_session_service_client::AgentSessionServiceClient,
        channel_translator_service_client::ChannelTranslatorServiceClient, control_request::Action,
        subscribe_response::Event,
    },
};
use sha2::{Digest, Sha256};
use tempfile::TempDir;
use tonic::{
    Code, Request, Status,
    service::{Interceptor, interceptor::InterceptedService},
    transport::Channel,
};

use crate::{
    harness::{Harness, assert_error, bounded, expect_err},
    support::{Watch, mock_profile_with, permission_answer, prompt},
};

pub const ADA: &str = "ada-secret-token";
pub const BOB: &str = "bob-secret-token";
pub const EVE: &str = "eve-secret-token";
pub const CI: &str = "ci-secret-token";

/// A tokens file row: `(token, principal, kind)`.
pub type Row<'a> = (&'a str, &'a str, &'a str);

pub const EVERYONE: &[Row<'static>] = &[
    (ADA, "ada", "user"),
    (BOB, "bob", "user"),
    (EVE, "eve", "user"),
    (CI, "ci", "service"),
];

/// The text of a tokens file listing these tokens (as digests).
pub fn tokens_text(rows: &[Row]) -> String {
    rows.iter()
        .map(|(token, principal, kind)| {
            format!(
                "[[tokens]]\nsha256 = \"{}\"\nprincipal = \"{principal}\"\nkind = \"{kind}\"\n\n",
                hex::encode(Sha256::digest(token.as_bytes()))
            )
        })
        .collect()
}

/// A tokens file in a directory of its own.
pub struct TokensFile {
    _dir: TempDir,
    pub path: PathBuf,
}

impl TokensFile {
    pub fn new(rows: &[Row]) -> Self {
        let dir = tempfile::tempdir().expect("a temporary dir");
        let path = dir.path().join("tokens.toml");
        std::fs::write(&path, tokens_text(rows)).expect("the tokens file is written");
        Self { _dir: dir, path }
    }

    /// Replaces the file atomically (write aside, rename), as a careful operator or Kubernetes
    /// does.
    pub fn replace(&self, text: &str) {
        let aside = self.path.with_extension("next");
        std::fs::write(&aside, text).expect("the new tokens file is written");
        std::fs::rename(&aside, &self.path).expect("the tokens file is replaced");
    }
}

/// Configures tokens, a fast file poll (`poll`), and a `mock` profile fenced into the data dir.
pub fn with_tokens(config: &mut ServeConfig, file: &Path, poll: Option<Duration>) {
    config.tokens_file = Some(file.to_owned());
    config.tokens_poll_interval = poll;
    let root = agent_harness_testkit::harness::workspace_for(config);
    mock_profile_with(config, "mock", &[], |profile| {
        profile.allowed_cwd_roots = Some(vec![root]);
    });
}

/// A server with tokens for ada, bob, eve (users) and ci (a service).
pub async fn start() -> (Harness, TokensFile) {
    let file = TokensFile::new(EVERYONE);
    let h = Harness::start_with(|config| {
        with_tokens(config, &file.path, Some(Duration::from_millis(50)))
    })
    .await;
    (h, file)
}

/// Adds `authorization` (and `x-acting-user`) to every call.
#[derive(Clone)]
pub struct Bearer {
    token: Option<String>,
    acting_user: Option<String>,
}

impl Bearer {
    pub fn new(token: Option<&str>, acting_user: Option<&str>) -> Self {
        Self {
            token: token.map(str::to_owned),
            acting_user: acting_user.map(str::to_owned),
        }
    }
}

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(token) = &self.token {
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("ASCII"),
            );
        }
        if let Some(user) = &self.acting_user {
            request
                .metadata_mut()
                .insert("x-acting-user", user.parse().expect("ASCII"));
        }
        Ok(request)
    }
}

pub type Client = AgentSessionServiceClient<InterceptedService<Channel, Bearer>>;

pub fn client(h: &Harness, token: Option<&str>, acting_user: Option<&str>) -> Client {
    AgentSessionServiceClient::with_interceptor(h.channel(), Bearer::new(token, acting_user))
}

pub fn as_user(h: &Harness, token: &str) -> Client {
    client(h, Some(token), None)
}

pub fn create_request(h: &Harness) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        profile: "mock".into(),
        cwd: h.workspace().to_string_lossy().into_owned(),
        ..Default::default()
    }
}

pub async fn create(client: &mut Client, request: pb::CreateSessionRequest) -> pb::AgentSession {
    client
        .create_session(request)
        .await
        .expect("the session is created")
        .into_inner()
        .session
        .expect("a session")
}

pub fn control(session_id: &str, action: Action) -> pb::ControlRequest {
    pb::ControlRequest {
        session_id: session_id.to_owned(),
        action: Some(action),
        ..Default::default()
    }
}

pub async fn watch(client: &mut Client, session_id: &str) -> Watch {
    let stream = client
        .subscribe(pb::SubscribeRequest {
            session_id: session_id.to_owned(),
            after_offset: 0,
            view: pb::SubscribeView::Log as i32,
        })
        .await
        .expect("the session can be subscribed to")
        .into_inner();
    Watch {
        stream,
        entries: Vec::new(),
        statuses: Vec::new(),
    }
}

/// Reads a stream until it has caught up with the log.
pub async fn caught_up(watch: &mut Watch) {
    loop {
        let event = watch
            .next()
            .await
            .expect("the stream stays open")
            .expect("no failure");
        if let Some(Event::CaughtUp(_)) = event.event {
            return;
        }
    }
}

pub async fn log_len(client: &mut Client, session_id: &str) -> usize {
    client
        .read_log(pb::ReadLogRequest {
            session_id: session_id.to_owned(),
            after_offset: 0,
            limit: 5000,
        })
        .await
        .expect("the log is readable")
        .into_inner()
        .entries
        .len()
}

/// Every RPC a bearer token guards, each with a way to call it (the table the authorization tests
/// run over, so a new RPC is covered by adding one row).
#[derive(Debug, Clone)]
enum Rpc {
    CreateSession,
    GetSession,
    ListSessions,
    CloseSession,
    DeleteSession,
    Control(Action),
    GetQueue,
    EditQueuedPrompt,
    RemoveQueuedAction,
    ReadLog,
    GetTranscript,
    Subscribe,
    TranslateChannelMessage,
}

impl Rpc {
    /// One row per RPC; `Control` twice, as a prompt and as a stop.
    fn every() -> Vec<Rpc> {
        vec![
            Rpc::CreateSession,
            Rpc::GetSession,
            Rpc::ListSessions,
            Rpc::CloseSession,
            Rpc::DeleteSession,
            Rpc::Control(prompt("hijack")),
            Rpc::Control(crate::support::stop(true)),
            Rpc::GetQueue,
            Rpc::EditQueuedPrompt,
            Rpc::RemoveQueuedAction,
            Rpc::ReadLog,
            Rpc::GetTranscript,
            Rpc::Subscribe,
            Rpc::TranslateChannelMessage,
        ]
    }

    /// The RPCs that name one session (and so must hide another user's).
    fn about_a_session() -> Vec<Rpc> {
        Self::every()
            .into_iter()
            .filter(|rpc| {
                !matches!(
                    rpc,
                    Rpc::CreateSession | Rpc::ListSessions | Rpc::TranslateChannelMessage
                )
            })
            .collect()
    }

    /// Calls the RPC through `bearer` about `session_id` (and its queued `action_id`); the
    /// reply's content is dropped.
    async fn call(
        &self,
        h: &Harness,
        bearer: &Bearer,
        session_id: &str,
        action_id: &str,
    ) -> Result<(), Status> {
        let mut sessions = AgentSessionServiceClient::with_interceptor(h.channel(), bearer.clone());
        let session_id = session_id.to_owned();
        let action_id = action_id.to_owned();
        match self.clone() {
            Rpc::CreateSession => sessions.create_session(create_request(h)).await.map(drop),
            Rpc::GetSession => sessions
                .get_session(pb::GetSessionRequest { session_id })
                .await
                .map(drop),
            Rpc::ListSessions => sessions
                .list_sessions(pb::ListSessionsRequest::default())
                .await
                .map(drop),
            Rpc::CloseSession => sessions
                .close_session(pb::CloseSessionRequest { session_id })
                .await
                .map(drop),
            Rpc::DeleteSession => sessions
                .delete_session(pb::DeleteSessionRequest { session_id })
                .await
                .map(drop),
            Rpc::Control(action) => sessions
                .control(control(&session_id, action))
                .await
                .map(drop),
            Rpc::GetQueue => sessions
                .get_queue(pb::GetQueueRequest { session_id })
                .await
                .map(drop),
            Rpc::EditQueuedPrompt => sessions
                .edit_queued_prompt(pb::EditQueuedPromptRequest {
                    session_id,
                    action_id,
                    prompt: "changed".into(),
                })
                .await
                .map(drop),
            Rpc::RemoveQueuedAction => sessions
                .remove_queued_action(pb::RemoveQueuedActionRequest {
                    session_id,
                    action_id,
                })
                .await
                .map(drop),
            Rpc::ReadLog => sessions
                .read_log(pb::ReadLogRequest {
                    session_id,
                    after_offset: 0,
                    limit: 10,
                })
                .await
                .map(drop),
            Rpc::GetTranscript => sessions
                .get_transcript(pb::GetTranscriptRequest {
                    session_id,
                    page_size: 0,
                    page_token: String::new(),
                })
                .await
                .map(drop),
            Rpc::Subscribe => sessions
                .subscribe(pb::SubscribeRequest {
                    session_id,
                    after_offset: 0,
                    view: 0,
                })
                .await
                .map(drop),
            Rpc::TranslateChannelMessage => {
                ChannelTranslatorServiceClient::with_interceptor(h.channel(), bearer.clone())
                    .translate_channel_message(pb::TranslateChannelMessageRequest::default())
                    .await
                    .map(drop)
            }
        }
    }
}

fn context() -> prost_types::Struct {
    prost_types::Struct {
        fields: [(
            "trigger".to_owned(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue("ci".into())),
            },
        )]
        .into(),
    }
}

#[tokio::test]
async fn a_call_without_a_token_or_with_an_unknown_one_is_unauthenticated_but_health_and_reflection_need_none()
 {
    bounded(async {
        let (h, _file) = start().await;
        let some_id = uuid::Uuid::now_v7().to_string();
        for token in [None, Some("not-a-listed-token")] {
            let bearer = Bearer::new(token, None);
            for rpc in Rpc::every() {
                let status = expect_err(rpc.call(&h, &bearer, &some_id, &some_id).await);
                assert_eq!(
                    status.code(),
                    Code::Unauthenticated,
                    "{token:?}: {rpc:?}: {status:?}"
                );
                assert_eq!(
                    crate::harness::error_reason(&status),
                    "UNAUTHENTICATED",
                    "{token:?}: {rpc:?}"
                );
            }
        }
        // The same message for a missing and a wrong token: a prober learns nothing.
        let missing = expect_err(
            client(&h, None, None)
                .list_sessions(pb::ListSessionsRequest::default())
                .await,
        );
        let wrong = expect_err(
            client(&h, Some("x"), None)
                .list_sessions(pb::ListSessionsRequest::default())
                .await,
        );
        assert_eq!(missing.message(), wrong.message());

        let health = h
            .health()
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("health needs no token")
            .into_inner();
        assert_eq!(
            health.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32
        );
        let listed = crate::reflection::list_services_v1(h.channel()).await;
        assert!(
            listed.iter().any(|s| s == crate::harness::SESSIONS_SERVICE),
            "{listed:?}"
        );

        let me = as_user(&h, ADA)
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .expect("a listed token is accepted");
        assert!(me.into_inner().sessions.is_empty());
    })
    .await
}

#[tokio::test]
async fn another_users_session_reads_as_not_found_through_every_rpc_and_is_left_untouched() {
    bounded(async {
        let (h, _file) = start().await;
        let mut ada = as_user(&h, ADA);
        let session = create(&mut ada, create_request(&h)).await;
        let id = session.id.clone();
        // A turn that waits, and one prompt queued behind it.
        let mut ada_watch = watch(&mut ada, &id).await;
        ada.control(control(&id, prompt("@wait-cancel")))
            .await
            .unwrap();
        let queued = ada
            .control(control(&id, prompt("queued")))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(queued.status, pb::ControlStatus::Queued as i32);
        ada_watch.chunk("echo: @wait-cancel").await;
        let log_before = log_len(&mut ada, &id).await;

        let outsiders = [
            ("another user", Bearer::new(Some(BOB), None)),
            ("a service acting for itself", Bearer::new(Some(CI), None)),
            (
                "a service acting for another user",
                Bearer::new(Some(CI), Some("bob")),
            ),
        ];
        let unknown_id = uuid::Uuid::now_v7().to_string();
        for (who, bearer) in outsiders {
            for rpc in Rpc::about_a_session() {
                let status = expect_err(rpc.call(&h, &bearer, &id, &queued.action_id).await);
                assert_eq!(status.code(), Code::NotFound, "{who}: {rpc:?}: {status:?}");
                assert_eq!(
                    crate::harness::error_reason(&status),
                    "SESSION_NOT_FOUND",
                    "{who}: {rpc:?}"
                );
            }
            let mut outsider = AgentSessionServiceClient::with_interceptor(h.channel(), bearer);
            let listed = outsider
                .list_sessions(pb::ListSessionsRequest::default())
                .await
                .unwrap()
                .into_inner();
            assert!(
                listed.sessions.iter().all(|s| s.id != id),
                "{who}: ListSessions"
            );
            // Someone else's session and no session at all are indistinguishable.
            let hidden = expect_err(
                outsider
                    .get_session(pb::GetSessionRequest {
                        session_id: id.clone(),
                    })
                    .await,
            );
            let absent = expect_err(
                outsider
                    .get_session(pb::GetSessionRequest {
                        session_id: unknown_id.clone(),
                    })
                    .await,
            );
            assert_eq!(hidden.code(), absent.code());
            assert_eq!(
                hidden.message().replace(&id, "ID"),
                absent.message().replace(&unknown_id, "ID"),
                "{who}"
            );
        }

        // Nothing changed for the owner.
        let now = ada
            .get_session(pb::GetSessionRequest {
                session_id: id.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .session
            .unwrap();
        assert_eq!(now.status, pb::SessionStatus::Running as i32);
        let queue = ada
            .get_queue(pb::GetQueueRequest {
                session_id: id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(queue.entries.len(), 1);
        assert_eq!(queue.entries[0].prompt.as_deref(), Some("queued"));
        assert_eq!(
            log_len(&mut ada, &id).await,
            log_before,
            "nothing was logged"
        );

        // A closed session (no longer held in memory) stays hidden too.
        ada.control(control(&id, crate::support::stop(true)))
            .await
            .unwrap();
        ada.close_session(pb::CloseSessionRequest {
            session_id: id.clone(),
        })
        .await
        .unwrap();
        let status = expect_err(
            as_user(&h, BOB)
                .get_session(pb::GetSessionRequest {
                    session_id: id.clone(),
                })
                .await,
        );
        assert_error(&status, Code::NotFound, "SESSION_NOT_FOUND");
    })
    .await
}

#[tokio::test]
async fn an_editor_sees_and_drives_a_session_as_themselves() {
    bounded(async {
        let (h, _file) = start().await;
        let mut ada = as_user(&h, ADA);
        let mut request = create_request(&h);
        request.editors = vec!["eve".into()];
        let session = create(&mut ada, request).await;
        let mut eve = as_user(&h, EVE);
        let listed = eve
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            listed
                .sessions
                .iter()
                .map(|s| s.id.as_str())
                .collect::<Vec<_>>(),
            [session.id.as_str()]
        );
        let mut watch = watch(&mut eve, &session.id).await;
        let reply = eve
            .control(control(&session.id, prompt("from the editor")))
            .await
            .expect("an editor may prompt")
            .into_inner();
        assert_eq!(reply.status, pb::ControlStatus::Sent as i32);
        let (entry, _) = watch
            .entry(|e, f| {
                e.direction == pb::LogDirection::ToRuntime as i32 && f["method"] == "session/prompt"
            })
            .await;
        assert_eq!(entry.actor, "eve", "the editor is recorded as the actor");
        watch.chunk("echo: from the editor").await;
        let transcript = eve
            .get_transcript(pb::GetTranscriptRequest {
                session_id: session.id.clone(),
                page_size: 0,
                page_token: String::new(),
            })
            .await
            .expect("an editor reads the transcript")
            .into_inner();
        assert!(!transcript.messages.is_empty());
        // The editor's own sessions are not the owner's.
        let status = expect_err(
            as_user(&h, BOB)
                .get_session(pb::GetSessionRequest {
                    session_id: session.id.clone(),
                })
                .await,
        );
        assert_error(&status, Code::NotFound, "SESSION_NOT_FOUND");
    })
    .await
}

#[tokio::test]
async fn a_users_context_is_context_not_allowed_and_stores_nothing_while_a_services_is_taken() {
    bounded(async {
        let (h, _file) = start().await;
        let mut ada = as_user(&h, ADA);
        let session = create(&mut ada, create_request(&h)).await;
        let before = log_len(&mut ada, &session.id).await;
        let mut request = control(&session.id, prompt("with a trigger"));
        request.context = Some(context());
        let status = expect_err(ada.control(request.clone()).await);
        assert_error(&status, Code::PermissionDenied, "CONTEXT_NOT_ALLOWED");
        assert_eq!(
            log_len(&mut ada, &session.id).await,
            before,
            "nothing was logged"
        );

        let mut ci = client(&h, Some(CI), Some("ada"));
        let reply = ci
            .control(request)
            .await
            .expect("a service may send context")
            .into_inner();
        assert_eq!(reply.status, pb::ControlStatus::Sent as i32);
    })
    .await
}

#[tokio::test]
async fn a_services_permission_answer_is_forbidden_and_the_user_answers_it() {
    bounded(async {
        let (h, _file) = start().await;
        let mut ada = as_user(&h, ADA);
        let session = create(&mut ada, create_request(&h)).await;
        let mut watch = watch(&mut ada, &session.id).await;
        ada.control(control(&session.id, prompt("@permission")))
            .await
            .unwrap();
        let request = watch.agent_request("session/request_permission").await;
        let id = crate::support::number_id(request["id"].as_i64().expect("a numeric id"));

        let mut ci = client(&h, Some(CI), Some("ada"));
        let status = expect_err(
            ci.control(control(
                &session.id,
                permission_answer(id.clone(), Some("allow-once")),
            ))
            .await,
        );
        assert_error(&status, Code::PermissionDenied, "FORBIDDEN");

        let reply = ada
            .control(control(
                &session.id,
                permission_answer(id, Some("allow-once")),
            ))
            .await
            .expect("the user may answer")
            .into_inner();
        assert_eq!(reply.status, pb::ControlStatus::Sent as i32);
        watch.chunk("permission: selected allow-once").await;
    })
    .await
}

#[tokio::test]
async fn a_service_acting_for_a_user_creates_and_drives_that_users_session() {
    bounded(async {
        let (h, _file) = start().await;
        let mut ci_for_ada = client(&h, Some(CI), Some("ada"));
        let session = create(&mut ci_for_ada, create_request(&h)).await;
        assert_eq!(session.owner, "ada", "the acting user owns the session");

        let mut watch = watch(&mut ci_for_ada, &session.id).await;
        ci_for_ada
            .control(control(&session.id, prompt("on ada's behalf")))
            .await
            .unwrap();
        let (entry, _) = watch
            .entry(|e, f| {
                e.direction == pb::LogDirection::ToRuntime as i32 && f["method"] == "session/prompt"
            })
            .await;
        assert_eq!(entry.actor, "ada");

        let mut ada = as_user(&h, ADA);
        let listed = ada
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert!(
            listed.sessions.iter().any(|s| s.id == session.id),
            "ada sees her session"
        );
        for mut other in [
            client(&h, Some(CI), Some("bob")),
            client(&h, Some(CI), None),
        ] {
            let status = expect_err(
                other
                    .get_session(pb::GetSessionRequest {
                        session_id: session.id.clone(),
                    })
                    .await,
            );
            assert_error(&status, Code::NotFound, "SESSION_NOT_FOUND");
        }
    })
    .await
}

#[tokio::test]
async fn a_user_naming_an_acting_user_is_forbidden() {
    bounded(async {
        let (h, _file) = start().await;
        for acting in ["bob", "ada"] {
            let status = expect_err(
                client(&h, Some(ADA), Some(acting))
                    .list_sessions(pb::ListSessionsRequest::default())
                    .await,
            );
            assert_error(&status, Code::PermissionDenied, "FORBIDDEN");
        }
    })
    .await
}

#[tokio::test]
async fn a_revoked_tokens_open_stream_ends_unauthenticated_and_its_calls_are_refused_while_others_go_on()
 {
    bounded(async {
        let (h, file) = start().await;
        let mut ada = as_user(&h, ADA);
        let mut bob = as_user(&h, BOB);
        let ada_session = create(&mut ada, create_request(&h)).await;
        let bob_session = create(&mut bob, create_request(&h)).await;
        let mut ada_watch = watch(&mut ada, &ada_session.id).await;
        let mut bob_watch = watch(&mut bob, &bob_session.id).await;
        caught_up(&mut ada_watch).await;
        caught_up(&mut bob_watch).await;

        // ada's token is removed from the file; the poll notices.
        file.replace(&tokens_text(&[(BOB, "bob", "user"), (CI, "ci", "service")]));
        let status = ada_watch.end().await;
        assert_error(&status, Code::Unauthenticated, "UNAUTHENTICATED");
        let status = expect_err(ada.list_sessions(pb::ListSessionsRequest::default()).await);
        assert_error(&status, Code::Unauthenticated, "UNAUTHENTICATED");

        // bob's stream is untouched and still live.
        bob.control(control(&bob_session.id, prompt("still here")))
            .await
            .unwrap();
        bob_watch.chunk("echo: still here").await;
    })
    .await
}

#[tokio::test]
async fn sighup_reloads_the_tokens_file_and_revokes_what_it_no_longer_lists() {
    bounded(async {
        let file = TokensFile::new(EVERYONE);
        // No polling: only the signal can make this server reread the file.
        let h = Harness::start_with(|config| with_tokens(config, &file.path, None)).await;
        let mut eve = as_user(&h, EVE);
        let session = create(&mut eve, create_request(&h)).await;
        let mut watch = watch(&mut eve, &session.id).await;
        caught_up(&mut watch).await;
        file.replace(&tokens_text(&[(ADA, "ada", "user")]));
        // SAFETY: kill(2) on our own pid; the server installed a SIGHUP handler at start.
        assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGHUP) }, 0);
        let status = watch.end().await;
        assert_error(&status, Code::Unauthenticated, "UNAUTHENTICATED");
    })
    .await
}

#[tokio::test]
async fn a_malformed_tokens_file_on_reload_keeps_the_previous_tokens() {
    bounded(async {
        let file = TokensFile::new(EVERYONE);
        let h = Harness::start_with(|config| with_tokens(config, &file.path, None)).await;
        file.replace(
            "[[tokens]]\nsha256 = \"not a digest\"\nprincipal = \"mallory\"\nkind = \"user\"\n",
        );
        let err = h
            .server()
            .reload_tokens()
            .expect("tokens are configured")
            .unwrap_err();
        assert!(format!("{err:#}").contains("sha256"), "{err:#}");
        as_user(&h, ADA)
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .expect("the previous tokens stay in force");

        file.replace(&tokens_text(&[
            (ADA, "ada", "user"),
            (BOB, "bob", "service"),
        ]));
        let reloaded = h
            .server()
            .reload_tokens()
            .unwrap()
            .expect("a valid file loads");
        assert_eq!(
            (reloaded.tokens, reloaded.revoked),
            (2, 3),
            "eve and ci removed, bob changed kind"
        );
        let status = expect_err(
            as_user(&h, EVE)
                .list_sessions(pb::ListSessionsRequest::default())
                .await,
        );
        assert_error(&status, Code::Unauthenticated, "UNAUTHENTICATED");
        // bob is a service now: a service may name an acting user.
        client(&h, Some(BOB), Some("ada"))
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .expect("bob's token now grants a service");
    })
    .await
}

fn base_config(data_dir: &Path) -> ServeConfig {
    crate::harness::test_config(
        data_dir.to_owned(),
        env!("CARGO_BIN_EXE_agent-harness").into(),
    )
}

#[tokio::test]
async fn a_malformed_or_missing_tokens_file_stops_startup_naming_the_file_and_the_problem() {
    bounded(async {
        let data = tempfile::tempdir().unwrap();
        let file = TokensFile::new(&[]);
        file.replace("[[tokens]]\nsha256 = \"ab\"\nprincipal = \"ada\"\nkind = \"user\"\n");
        let mut config = base_config(data.path());
        config.tokens_file = Some(file.path.clone());
        let err = format!(
            "{:#}",
            app::start(config.clone())
                .await
                .err()
                .expect("startup fails")
        );
        assert!(
            err.contains("tokens.toml") && err.contains("tokens[0].sha256"),
            "{err}"
        );

        config.tokens_file = Some(data.path().join("nowhere.toml"));
        let err = format!(
            "{:#}",
            app::start(config).await.err().expect("startup fails")
        );
        assert!(err.contains("nowhere.toml"), "{err}");
    })
    .await
}

#[tokio::test]
async fn without_tokens_a_non_loopback_listen_needs_the_insecure_flag_and_with_tokens_it_does_not()
{
    bounded(async {
        let data = tempfile::tempdir().unwrap();
        let mut config = base_config(data.path());
        config.listen = "0.0.0.0:0".parse().unwrap();
        let err = format!(
            "{:#}",
            app::start(config.clone()).await.err().expect("refused")
        );
        assert!(
            err.contains("non-loopback") && err.contains("--insecure-allow-non-loopback"),
            "{err}"
        );

        config.insecure_allow_non_loopback = true;
        app::start(config.clone())
            .await
            .expect("allowed when asked for")
            .shutdown()
            .await
            .unwrap();

        let file = TokensFile::new(EVERYONE);
        config.insecure_allow_non_loopback = false;
        with_tokens(&mut config, &file.path, None);
        app::start(config)
            .await
            .expect("tokens make it safe")
            .shutdown()
            .await
            .unwrap();
    })
    .await
}

#[tokio::test]
async fn with_tokens_a_profile_without_allowed_cwd_roots_accepts_no_cwd() {
    bounded(async {
        let file = TokensFile::new(EVERYONE);
        let h = Harness::start_with(|config| {
            config.tokens_file = Some(file.path.clone());
            // The built-in mock profile has no allowed_cwd_roots.
        })
        .await;
        let status = expect_err(as_user(&h, ADA).create_session(create_request(&h)).await);
        assert_error(&status, Code::InvalidArgument, "INVALID_ARGUMENT");
        assert!(status.message().contains("allowed_cwd_roots"), "{status:?}");
    })
    .await
}

#[tokio::test]
async fn in_no_token_mode_every_caller_is_local_with_both_rights() {
    bounded(async {
        let h = Harness::start().await;
        let mut local = client(&h, None, Some("ada"));
        let session = create(&mut local, create_request(&h)).await;
        assert_eq!(session.owner, "ada");
        let mut watch = watch(&mut local, &session.id).await;
        let mut request = control(&session.id, prompt("@permission"));
        request.context = Some(context());
        local
            .control(request)
            .await
            .expect("local may send context");
        let asked = watch.agent_request("session/request_permission").await;
        let id = crate::support::number_id(asked["id"].as_i64().unwrap());
        local
            .control(control(
                &session.id,
                permission_answer(id, Some("allow-once")),
            ))
            .await
            .expect("local may answer");
        watch.chunk("permission: selected allow-once").await;
        // Without x-acting-user, local sees everything.
        let listed = client(&h, None, None)
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert!(listed.sessions.iter().any(|s| s.id == session.id));
    })
    .await
}
