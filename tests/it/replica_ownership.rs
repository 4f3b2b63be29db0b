//! Several replicas on one PostgreSQL database, as real `serve` processes on loopback:
//! a call to a replica that does not own the session is served by the owner; a killed owner's
//! session is claimed by a survivor that fails the interrupted turn ("owner replica lost") and
//! drains the queue; a paused owner resumed after its lease moved stops its actor and runtime;
//! reads on another replica answer from the store while the owner is paused.
//!
//! Needs `AGENT_HARNESS_TEST_DATABASE_URL` like the other PostgreSQL tests (and fails without it
//! when `CI=true`); each test works in a schema of its own and drops it at the end.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use agent_harness::pb::v1::{self as pb, agent_session_service_client::AgentSessionServiceClient};
use tonic::{Code, transport::Channel};

use crate::{
    auth::{ADA, BOB, CI, EVERYONE, tokens_text},
    harness::within,
    postgres::{execute, test_schema, url_in_schema},
    process::{Serve, ServeProcess},
    support::{Session, Watch, processes_with, prompt},
};

/// The lease TTL of the test replicas: short, so failover happens within the test's bound.
pub(crate) const LEASE_TTL: &str = "2s";
/// Bound of each test.
const TEST_BOUND: Duration = Duration::from_secs(90);

/// A `serve` replica on a free loopback port, its runtimes marked with `marker`.
pub(crate) struct Replica {
    pub(crate) process: ServeProcess,
    pub(crate) marker: String,
}

impl Replica {
    pub(crate) fn start(dir: &Path, name: &str, database_url: &str) -> Self {
        Self::start_with(dir, name, database_url, &[])
    }

    pub(crate) fn start_with(dir: &Path, name: &str, database_url: &str, flags: &[&str]) -> Self {
        let marker = format!("replica-{name}-{}", uuid::Uuid::now_v7().simple());
        let config = config_file(dir, name, &marker);
        let process = Serve::on(dir.join(format!("data-{name}")), &config)
            .replica(database_url, LEASE_TTL)
            .args(flags)
            .start();
        Self { process, marker }
    }

    pub(crate) async fn client(&self) -> AgentSessionServiceClient<Channel> {
        self.process.client().await
    }

    /// Whether one of its runtimes is alive.
    pub(crate) fn runs_a_runtime(&self) -> bool {
        !processes_with(&self.marker).is_empty()
    }

    fn logged(&self, message: &str) -> bool {
        self.process.logged(message)
    }

    fn kill_9(mut self) {
        self.process.kill_9();
    }
}

pub(crate) fn config_file(dir: &Path, name: &str, marker: &str) -> PathBuf {
    let program = env!("CARGO_BIN_EXE_agent-harness");
    let path = dir.join(format!("config-{name}.toml"));
    std::fs::write(
        &path,
        format!(
            r#"
[profiles.resumable]
command = "{program}"
args = ["mock-agent", "--resume", "--stderr-at-start", "{marker}"]
allowed_cwd_roots = ["{root}"]
"#,
            root = dir.display()
        ),
    )
    .unwrap();
    path
}

/// Three replicas on a fresh schema, in a temporary directory the sessions use as cwd.
pub(crate) async fn three_replicas() -> Option<(tempfile::TempDir, String, String, [Replica; 3])> {
    let (url, schema) = test_schema().await?;
    let database_url = url_in_schema(&url, &schema);
    let dir = tempfile::tempdir().unwrap();
    let replicas = ["a", "b", "c"].map(|name| Replica::start(dir.path(), name, &database_url));
    Some((dir, url, schema, replicas))
}

pub(crate) async fn create_on(replica: &Replica, cwd: &Path) -> Session {
    Session::create_with_client(
        replica.client().await,
        pb::CreateSessionRequest {
            profile: "resumable".into(),
            cwd: cwd.to_string_lossy().into_owned(),
            ..Default::default()
        },
    )
    .await
}

/// Subscribes through `client`, retrying while the session's owner cannot be reached (its lease
/// has not expired yet): each retry follows an UNAVAILABLE answer.
pub(crate) async fn watch_when_served(
    client: AgentSessionServiceClient<Channel>,
    id: &str,
) -> Watch {
    let mut session = Session::attach(client, id);
    loop {
        match session
            .client
            .subscribe(pb::SubscribeRequest {
                session_id: id.to_owned(),
                ..Default::default()
            })
            .await
        {
            Ok(stream) => {
                return Watch {
                    stream: stream.into_inner(),
                    entries: Vec::new(),
                    statuses: Vec::new(),
                };
            }
            Err(status) if status.code() == Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(status) => panic!("subscribe failed: {status:?}"),
        }
    }
}

/// A request with this bearer token and these headers.
fn with<T>(token: &str, pairs: &[(&'static str, &str)], message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let metadata = request.metadata_mut();
    metadata.insert("authorization", format!("Bearer {token}").parse().unwrap());
    for (key, value) in pairs {
        metadata.insert(*key, value.parse().unwrap());
    }
    request
}

pub(crate) fn prompts_sent(log: &[pb::LogEntry]) -> Vec<String> {
    log.iter()
        .filter(|e| e.direction == pb::LogDirection::ToRuntime as i32)
        .filter_map(|e| serde_json::from_str::<serde_json::Value>(&e.json).ok())
        .filter(|f| f["method"] == "session/prompt")
        .filter_map(|f| f["id"].as_str().map(str::to_owned))
        .collect()
}

pub(crate) async fn drop_schema(url: &str, schema: &str) {
    execute(url, &format!("DROP SCHEMA {schema} CASCADE")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_sent_to_a_replica_that_does_not_own_the_session_is_served_by_the_owner() {
    let Some((dir, url, schema, [a, b, c])) = three_replicas().await else {
        return;
    };
    within(TEST_BOUND, async {
        let mut owner = create_on(&a, &agent_harness_testkit::workspace_in(dir.path())).await;
        let mut watch = owner.watch().await;
        let mut via_b = Session::attach(b.client().await, &owner.id);
        let reply = via_b.prompt("through b").await;
        assert_eq!(
            watch.response_to(&reply.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        let mut via_c = Session::attach(c.client().await, &owner.id);
        let queue = via_c.queue().await;
        assert!(queue.is_empty(), "read through c: {queue:?}");
        let log = via_c.log().await;
        let sent = prompts_sent(&log);
        assert_eq!(sent, [reply.action_id.as_str()], "dispatched once");
        assert!(a.runs_a_runtime(), "the owner runs the runtime");
        assert!(
            !b.runs_a_runtime() && !c.runs_a_runtime(),
            "no other replica runs one"
        );
    })
    .await;
    drop((a, b, c));
    drop_schema(&url, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_of_the_owner_another_replica_fails_the_turn_and_drains_the_queue_in_order() {
    let Some((dir, url, schema, [a, b, c])) = three_replicas().await else {
        return;
    };
    within(TEST_BOUND, async {
        let mut session = create_on(&a, &agent_harness_testkit::workspace_in(dir.path())).await;
        let mut watch = session.watch().await;
        let running = session.prompt("@wait-cancel").await;
        watch.chunk("echo: @wait-cancel").await;
        let first = session.prompt("queued one").await;
        let second = session.prompt("queued two").await;
        assert_eq!((first.queue_position, second.queue_position), (1, 2));
        let id = session.id.clone();
        drop(watch);
        let a_marker = a.marker.clone();
        a.kill_9();

        // A survivor claims the session once A's lease expires, and drains the queue.
        let mut watch = watch_when_served(b.client().await, &id).await;
        for action in [&first, &second] {
            assert_eq!(
                watch.response_to(&action.action_id).await["result"]["stopReason"],
                "end_turn"
            );
        }
        let mut via_c = Session::attach(c.client().await, &id);
        let log = via_c.log().await;
        assert_eq!(
            prompts_sent(&log),
            [
                running.action_id.clone(),
                first.action_id.clone(),
                second.action_id.clone()
            ],
            "the interrupted turn is never re-sent; the queued prompts run in order"
        );
        for (i, entry) in log.iter().enumerate() {
            assert_eq!(entry.offset, i as u64 + 1, "offsets are dense");
        }
        let transcript = via_c
            .client
            .get_transcript(pb::GetTranscriptRequest {
                session_id: id.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let interrupted_turn = transcript
            .messages
            .iter()
            .find(|m| m.request_id.as_deref() == Some(running.action_id.as_str()))
            .unwrap()
            .turn;
        let interrupted = transcript
            .messages
            .iter()
            .find(|m| m.turn == interrupted_turn && m.role == pb::MessageRole::Agent as i32)
            .unwrap();
        assert_eq!(interrupted.stop_reason, Some(pb::StopReason::Failed as i32));
        assert_eq!(interrupted.error.as_deref(), Some("owner replica lost"));
        assert!(
            processes_with(&a_marker).is_empty(),
            "A's runtime died with it"
        );
        assert!(
            b.runs_a_runtime() != c.runs_a_runtime(),
            "exactly one survivor runs the session's runtime"
        );
    })
    .await;
    drop((b, c));
    drop_schema(&url, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_resumed_after_its_lease_moved_is_fenced_off_and_stops_its_runtime() {
    let Some((dir, url, schema, [a, b, c])) = three_replicas().await else {
        return;
    };
    within(TEST_BOUND, async {
        let mut session = create_on(&a, &agent_harness_testkit::workspace_in(dir.path())).await;
        let mut watch = session.watch().await;
        let running = session.prompt("@wait-cancel").await;
        watch.chunk("echo: @wait-cancel").await;
        let queued = session.prompt("queued after the pause").await;
        let id = session.id.clone();
        drop(watch);
        a.process.pause();

        let mut watch = watch_when_served(b.client().await, &id).await;
        assert_eq!(
            watch.response_to(&queued.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        a.process.resume();
        // Resumed, A finds its lease gone: it stops the actor and kills its runtime.
        while a.runs_a_runtime() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        while !a.logged("no longer holds the session") {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut via_c = Session::attach(c.client().await, &id);
        let log = via_c.log().await;
        for (i, entry) in log.iter().enumerate() {
            assert_eq!(entry.offset, i as u64 + 1, "offsets are dense");
        }
        assert_eq!(
            prompts_sent(&log),
            [running.action_id.clone(), queued.action_id.clone()],
            "nothing was sent twice"
        );
        // A call through A now reaches the new owner.
        let mut via_a = Session::attach(a.client().await, &id);
        assert!(via_a.queue().await.is_empty());
    })
    .await;
    drop((a, b, c));
    drop_schema(&url, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_on_another_replica_answer_from_the_store_while_the_owner_is_paused() {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    let dir = tempfile::tempdir().unwrap();
    // A lease that outlives the test: the paused owner holds the session throughout, so a read
    // forwarded to it would wait and answer UNAVAILABLE.
    let [a, b] = ["a", "b"].map(|name| {
        let marker = format!("replica-{name}-{}", uuid::Uuid::now_v7().simple());
        let config = config_file(dir.path(), name, &marker);
        let process = Serve::on(dir.path().join(format!("data-{name}")), &config)
            .replica(&database_url, "600s")
            .start();
        Replica { process, marker }
    });
    within(TEST_BOUND, async {
        let mut session = create_on(&a, &agent_harness_testkit::workspace_in(dir.path())).await;
        let mut watch = session.watch().await;
        let done = session.prompt("before the pause").await;
        watch.response_to(&done.action_id).await;
        let running = session.prompt("@wait-cancel").await;
        watch.chunk("echo: @wait-cancel").await;
        let queued = session.prompt("queued behind it").await;
        drop(watch);
        a.process.pause();

        let mut via_b = Session::attach(b.client().await, &session.id);
        let record = via_b.get().await;
        assert_eq!(record.id, session.id);
        let log = via_b.log().await;
        assert_eq!(
            prompts_sent(&log),
            [done.action_id.clone(), running.action_id.clone()],
            "the stored log"
        );
        assert_eq!(record.head_offset, log.last().unwrap().offset);
        let transcript = via_b.transcript().await;
        assert_eq!(transcript.head_offset, record.head_offset);
        let said = format!("{:?}", transcript.messages);
        assert!(
            said.contains("before the pause") && said.contains("@wait-cancel"),
            "the transcript folded from the stored log: {said}"
        );
        let queue = via_b.queue().await;
        let waiting: Vec<&str> = queue.iter().map(|q| q.action_id.as_str()).collect();
        assert_eq!(waiting, [queued.action_id.as_str()], "the stored queue");
        assert!(!b.runs_a_runtime(), "a read starts no runtime on B");
        a.process.resume();
    })
    .await;
    drop((a, b));
    drop_schema(&url, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tokens_a_forwarded_call_acts_as_the_original_caller_and_only_replicas_may_forward() {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    let dir = tempfile::tempdir().unwrap();
    let peer_token = "peer-secret-token";
    let mut rows = EVERYONE.to_vec();
    rows.push((peer_token, "peers", "replica"));
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, tokens_text(&rows)).unwrap();
    let token_file = dir.path().join("replica-token");
    std::fs::write(&token_file, format!("{peer_token}\n")).unwrap();
    let flags = [
        "--tokens-file",
        tokens.to_str().unwrap(),
        "--replica-token-file",
        token_file.to_str().unwrap(),
    ];
    let a = Replica::start_with(dir.path(), "a", &database_url, &flags);
    let b = Replica::start_with(dir.path(), "b", &database_url, &flags);
    within(TEST_BOUND, async {
        // A service creates a session on A for ada.
        let created = a
            .client()
            .await
            .create_session(with(
                CI,
                &[("x-acting-user", "ada")],
                pb::CreateSessionRequest {
                    profile: "resumable".into(),
                    cwd: agent_harness_testkit::workspace_in(dir.path())
                        .to_string_lossy()
                        .into_owned(),
                    ..Default::default()
                },
            ))
            .await
            .expect("created")
            .into_inner();
        let id = created.session.unwrap().id;
        let control = |text: &str| pb::ControlRequest {
            session_id: id.clone(),
            action: Some(crate::support::prompt(text)),
            ..Default::default()
        };
        let mut via_b = b.client().await;
        // Ada, through B, reaches her session on A, as herself.
        let reply = via_b
            .control(with(ADA, &[], control("ada via b")))
            .await
            .expect("ada's prompt is forwarded to the owner")
            .into_inner();
        let log = via_b
            .read_log(with(
                ADA,
                &[],
                pb::ReadLogRequest {
                    session_id: id.clone(),
                    ..Default::default()
                },
            ))
            .await
            .unwrap()
            .into_inner()
            .entries;
        let prompt = log
            .iter()
            .find(|e| e.action_id.as_deref() == Some(reply.action_id.as_str()))
            .expect("the prompt is logged");
        assert_eq!(prompt.actor, "ada", "recorded as the original caller");
        assert!(!b.runs_a_runtime(), "B runs no runtime for A's session");
        // Bob, through B, does not see it: forwarded as bob.
        let hidden = via_b
            .control(with(BOB, &[], control("bob via b")))
            .await
            .unwrap_err();
        assert_eq!(hidden.code(), Code::NotFound);
        // A user cannot pose as a forwarding replica.
        let spoofed = via_b
            .control(with(
                BOB,
                &[
                    ("x-forwarded-principal", "ada"),
                    ("x-forwarded-principal-kind", "user"),
                ],
                control("bob as ada"),
            ))
            .await
            .unwrap_err();
        assert_eq!(spoofed.code(), Code::PermissionDenied);
    })
    .await;
    drop((a, b));
    drop_schema(&url, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_restarted_on_its_own_address_never_forwards_to_itself_nor_answers_unauthenticated()
 {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    let dir = tempfile::tempdir().unwrap();
    // Tokens, and no replica token: a hop to itself would arrive without credentials.
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, tokens_text(EVERYONE)).unwrap();
    let marker = format!("replica-self-{}", uuid::Uuid::now_v7().simple());
    let config = config_file(dir.path(), "self", &marker);
    // A lease long enough to outlive the restart: the restarted process finds the session
    // still held by the process it replaces.
    let mut replica = Serve::on(dir.path().join("data-self"), &config)
        .replica(&database_url, "8s")
        .args(["--tokens-file", tokens.to_str().unwrap()])
        .start();
    within(TEST_BOUND, async {
        let mut client = replica.client().await;
        let id = client
            .create_session(with(
                ADA,
                &[],
                pb::CreateSessionRequest {
                    profile: "resumable".into(),
                    // Apart from the tokens file and config the directory also holds.
                    cwd: agent_harness_testkit::workspace_in(dir.path())
                        .to_string_lossy()
                        .into_owned(),
                    ..Default::default()
                },
            ))
            .await
            .expect("created")
            .into_inner()
            .session
            .unwrap()
            .id;
        let control = |text: &str| pb::ControlRequest {
            session_id: id.clone(),
            action: Some(crate::support::prompt(text)),
            ..Default::default()
        };
        client
            .control(with(ADA, &[], control("before the kill")))
            .await
            .expect("the first prompt is taken");

        replica.restart_on_the_same_address();
        let mut client = replica.client().await;
        // Reads are served from the store at once.
        client
            .get_session(with(
                ADA,
                &[],
                pb::GetSessionRequest {
                    session_id: id.clone(),
                },
            ))
            .await
            .expect("ada reads her session right after the restart");
        // A write waits for the lease of the process that died: retryable answers only (each
        // followed by a retry, as RetryInfo asks), then it is served here.
        let mut retried = 0;
        let reply = loop {
            match client
                .control(with(ADA, &[], control("after the restart")))
                .await
            {
                Ok(reply) => break reply.into_inner(),
                Err(status) => {
                    crate::harness::assert_error(&status, Code::Unavailable, "REPLICA_UNAVAILABLE");
                    retried += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        assert!(retried > 0, "the call came while the old lease was held");
        assert!(!reply.action_id.is_empty(), "served here: {reply:?}");
    })
    .await;
    drop(replica);
    drop_schema(&url, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cwd_missing_on_the_claiming_replica_is_a_runtime_start_failure_that_says_so() {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    let dir = tempfile::tempdir().unwrap();
    let a = Replica::start(dir.path(), "a", &database_url);
    let b = Replica::start(dir.path(), "b", &database_url);
    within(TEST_BOUND, async {
        let workspace = dir.path().join("workspace-only-a-mounts");
        std::fs::create_dir(&workspace).unwrap();
        let mut session = create_on(&a, &workspace).await;
        let mut watch = session.watch().await;
        let running = session.prompt("@wait-cancel").await;
        watch.chunk("echo: @wait-cancel").await;
        let queued = session.prompt("queued for the claimant").await;
        drop(watch);
        // As if B did not mount the workspace: it is gone when B claims the session.
        std::fs::remove_dir_all(&workspace).unwrap();
        a.kill_9();

        let mut watch = watch_when_served(b.client().await, &session.id).await;
        let failed = watch.event("reopen_failed").await;
        assert_eq!(failed["code"], "RUNTIME_START_FAILED", "{failed}");
        let reason = failed["reason"].as_str().unwrap();
        assert!(
            reason.contains(&workspace.display().to_string())
                && reason.contains("does not exist on this replica"),
            "{reason}"
        );
        watch.status(pb::SessionStatus::Disconnected).await;
        let mut via_b = Session::attach(b.client().await, &session.id);
        let got = via_b.get().await;
        assert_eq!(got.status, pb::SessionStatus::Disconnected as i32);
        assert!(
            got.status_reason
                .starts_with("RUNTIME_START_FAILED: the session's cwd"),
            "{}",
            got.status_reason
        );
        // The interrupted turn was not re-sent and the queued prompt is kept, not lost.
        assert_eq!(
            prompts_sent(&via_b.log().await),
            std::slice::from_ref(&running.action_id)
        );
        let queue: Vec<String> = via_b
            .queue()
            .await
            .into_iter()
            .map(|q| q.action_id)
            .collect();
        assert_eq!(queue, std::slice::from_ref(&queued.action_id));
        assert!(!b.runs_a_runtime(), "nothing started on B");
    })
    .await;
    drop(b);
    drop_schema(&url, &schema).await;
}

/// The replica holding the session's lease and whether the lease has expired, read from the
/// database.
async fn lease_of(url: &str, schema: &str, session_id: &str) -> (String, bool) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("the test database");
    tokio::spawn(connection);
    let row = client
        .query_one(
            &format!(
                "SELECT owner_replica, expires_at < now() FROM {schema}.leases \
                 WHERE session_id = $1::text::uuid"
            ),
            &[&session_id],
        )
        .await
        .expect("the session's lease");
    (row.get(0), row.get(1))
}

/// A call is decoded before its session is located: a replica does not claim (and bring back)
/// a session nobody holds for a call it refuses anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_calls_about_a_session_nobody_holds_are_refused_without_claiming_it() {
    let Some((dir, url, schema, [a, b, c])) = three_replicas().await else {
        return;
    };
    within(TEST_BOUND, async {
        let session = create_on(&a, &agent_harness_testkit::workspace_in(dir.path())).await;
        let id = session.id.clone();
        let (holder, _) = lease_of(&url, &schema, &id).await;
        a.kill_9();
        // Nobody holds it now: a call that is served claims it.
        while !lease_of(&url, &schema, &id).await.1 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut client = b.client().await;
        let refusals = [
            client
                .control(pb::ControlRequest {
                    session_id: id.clone(),
                    ..Default::default()
                })
                .await
                .map(drop),
            client
                .edit_queued_prompt(pb::EditQueuedPromptRequest {
                    session_id: id.clone(),
                    action_id: "not-an-id".into(),
                    prompt: "x".into(),
                })
                .await
                .map(drop),
            client
                .remove_queued_action(pb::RemoveQueuedActionRequest {
                    session_id: id.clone(),
                    action_id: "not-an-id".into(),
                })
                .await
                .map(drop),
            client
                .fork_session(pb::ForkSessionRequest {
                    session_id: id.clone(),
                    name: Some("n".repeat(100_000)),
                })
                .await
                .map(drop),
        ];
        for refusal in refusals {
            let status = refusal.expect_err("a malformed call is refused");
            assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        }
        assert_eq!(
            lease_of(&url, &schema, &id).await.0,
            holder,
            "the dead owner's lease was not claimed"
        );
        assert!(!b.logged("claimed the session's lease"));

        // A well-formed call claims it and is served.
        let mut via_b = Session::attach(b.client().await, &id);
        let mut watch = watch_when_served(b.client().await, &id).await;
        let reply = via_b.prompt("after the refusals").await;
        assert_eq!(
            watch.response_to(&reply.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        assert_ne!(lease_of(&url, &schema, &id).await.0, holder);
    })
    .await;
    drop((b, c));
    drop_schema(&url, &schema).await;
}

/// Single flight: many calls racing the failover tick for one orphaned session (its owner
/// killed mid-turn with a prompt queued) bring back one actor and one runtime on the replica
/// that claims it; every prompt is sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_racing_the_failover_tick_for_an_orphaned_session_bring_back_one_actor() {
    let Some((dir, url, schema, [a, b, c])) = three_replicas().await else {
        return;
    };
    within(TEST_BOUND, async {
        let mut session = create_on(&a, &agent_harness_testkit::workspace_in(dir.path())).await;
        let mut watch = session.watch().await;
        let running = session.prompt("@wait-cancel").await;
        watch.chunk("echo: @wait-cancel").await;
        let queued = session.prompt("queued before the kill").await;
        let id = session.id.clone();
        drop(watch);
        a.kill_9();

        // Sampled throughout: B never runs two runtimes.
        let sampling = {
            let marker = b.marker.clone();
            tokio::spawn(async move {
                let mut most = 0;
                loop {
                    most = most.max(processes_with(&marker).len());
                    if most > 1 {
                        return most;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        };
        let mut racers = Vec::new();
        for i in 0..12 {
            let mut racer = Session::attach(b.client().await, &id);
            racers.push(tokio::spawn(async move {
                loop {
                    match racer.act(prompt(&format!("racer {i}"))).await {
                        Ok(reply) => return reply.action_id,
                        Err(status) if status.code() == Code::Unavailable => {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        Err(status) => panic!("racer {i}: {status:?}"),
                    }
                }
            }));
        }
        let mut action_ids = vec![running.action_id.clone(), queued.action_id.clone()];
        for racer in racers {
            action_ids.push(racer.await.unwrap());
        }
        let mut watch = watch_when_served(b.client().await, &id).await;
        for action_id in &action_ids[1..] {
            assert_eq!(
                watch.response_to(action_id).await["result"]["stopReason"],
                "end_turn"
            );
        }
        assert!(!sampling.is_finished(), "B ran two runtimes at once");
        sampling.abort();
        let log = Session::attach(c.client().await, &id).log().await;
        let mut sent = prompts_sent(&log);
        sent.sort();
        let mut expected = action_ids.clone();
        expected.sort();
        assert_eq!(sent, expected, "every prompt sent exactly once");
        let lost_events = log
            .iter()
            .filter(|e| e.json.contains("\"owner_replica_lost\""))
            .count();
        assert_eq!(lost_events, 1, "one actor recorded the lost owner");
        let reopenings = b
            .process
            .log_lines()
            .iter()
            .filter(|line| line.contains("reopening after the restart") && line.contains(&id))
            .count();
        assert_eq!(reopenings, 1, "one actor reopened the session");
    })
    .await;
    drop((b, c));
    drop_schema(&url, &schema).await;
}

/// A lost lease is not a silent stream: a stream on the replica that lost the session goes on
/// from the database, delivering what the new owner logs, with no offset missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_on_a_replica_that_lost_the_lease_goes_on_with_what_the_new_owner_logs() {
    let Some((dir, url, schema, [a, b, c])) = three_replicas().await else {
        return;
    };
    within(TEST_BOUND, async {
        let mut session = create_on(&a, &agent_harness_testkit::workspace_in(dir.path())).await;
        let id = session.id.clone();
        let mut on_a = session.watch().await;
        let first = session.prompt("before the move").await;
        assert_eq!(
            on_a.response_to(&first.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        a.process.pause();
        // B claims the session on the next call once A's lease has expired.
        let mut via_b = Session::attach(b.client().await, &id);
        let moved = loop {
            match via_b.act(prompt("after the move")).await {
                Ok(reply) => break reply,
                Err(status) if status.code() == Code::Unavailable => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(status) => panic!("{status:?}"),
            }
        };
        a.process.resume();
        assert_eq!(
            on_a.response_to(&moved.action_id).await["result"]["stopReason"],
            "end_turn",
            "A's stream delivers the turn B ran"
        );
        for (i, entry) in on_a.entries.iter().enumerate() {
            assert_eq!(entry.offset, i as u64 + 1, "no offset missed");
        }
    })
    .await;
    drop((a, b, c));
    drop_schema(&url, &schema).await;
}
