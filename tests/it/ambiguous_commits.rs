//! Commits whose answer is lost: the test kit's fault proxy, between a server (or a bare store)
//! and PostgreSQL, drops the connection at the one moment that matters — right after the client
//! sent the `COMMIT` of the transaction that carries a given prompt — with the `COMMIT` landing
//! (its answer lost) or not (the request lost), or black-holes everything from then on.
//!
//! What must hold: the writer reads back before it answers; the caller hears SENT/QUEUED when
//! the batch landed, STORE_UNAVAILABLE when it did not, or OUTCOME_UNKNOWN with the action id
//! when it cannot tell yet; a retry with that id converges; the agent receives the prompt
//! exactly once, and never one that was reported otherwise. Also: a forwarded Control whose
//! hop got no answer is OUTCOME_UNKNOWN with its (pre-minted) action id, and a database that
//! answers errors (disk full, read-only) is STORE_UNAVAILABLE with nothing half-stored.
//!
//! Needs `AGENT_HARNESS_TEST_DATABASE_URL` like the other PostgreSQL tests (and fails without it
//! when `CI=true`); each test works in a schema of its own and drops it at the end.

use std::{collections::BTreeMap, time::Duration};

use agent_harness::{
    domain::{
        ActionId,
        log::{Direction, LogEntry},
        session::{SessionRecord, SessionStatus},
    },
    pb::v1 as pb,
    store::{
        Batch, CommitError, Probe, Store, landed,
        postgres::{PostgresOptions, PostgresStore},
    },
};
use tonic::Code;
use tonic_types::StatusExt;

use crate::{
    harness::{Harness, assert_error, error_info, within},
    postgres::{execute, test_schema, url_in_schema},
    postgres_outage::through,
    proxy::{FaultProxy, Trip},
    replica_ownership::drop_schema,
    support::{Session, create_request, prompt},
};

/// PostgreSQL's simple-query message `COMMIT`, as a transaction's commit sends it.
const COMMIT: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";
/// Bound of each test.
const TEST_BOUND: Duration = Duration::from_secs(60);

/// A text no other traffic carries, to trip the proxy on its transaction only.
fn marked(what: &str) -> String {
    format!("{what} {}", uuid::Uuid::now_v7().simple())
}

/// A Control prompting `text` under the caller's own action id.
fn prompt_with_id(session: &Session, text: &str, action_id: &str) -> pb::ControlRequest {
    pb::ControlRequest {
        action_id: Some(action_id.to_owned()),
        ..session.control_request(prompt(text))
    }
}

/// How often the log shows the prompt sent to the agent, and answered by it.
fn sent_and_answered(log: &[pb::LogEntry], action_id: &str) -> (usize, usize) {
    let frames = |direction: pb::LogDirection| {
        log.iter()
            .filter(move |e| e.direction == direction as i32)
            .filter_map(|e| serde_json::from_str::<serde_json::Value>(&e.json).ok())
            .filter(|f| f["id"] == action_id)
    };
    let sent = frames(pb::LogDirection::ToRuntime)
        .filter(|f| f["method"] == "session/prompt")
        .count();
    let answered = frames(pb::LogDirection::FromRuntime)
        .filter(|f| f.get("result").is_some())
        .count();
    (sent, answered)
}

/// A proxy to the test database, and the URL that reaches it in plain text (so the proxy can
/// tell one statement from another).
async fn proxied(url: &str) -> (FaultProxy, String) {
    let (_, upstream) = through(url, 0);
    let proxy = FaultProxy::start(upstream).await;
    let (proxied, _) = through(url, proxy.port());
    (proxy, format!("{proxied}?sslmode=disable"))
}

/// A server on the test database through a proxy, with a session that has run a prompt; its
/// lease long enough that the self-fencing clock never stops the session while a test holds the
/// database away.
async fn served(url: &str, schema: &str) -> (FaultProxy, Harness, Session, tempfile::TempDir) {
    let (proxy, proxied) = proxied(url).await;
    let database_url = url_in_schema(&proxied, schema);
    let h = Harness::start_with(|c| {
        c.database_url = Some(database_url.into());
        c.statement_timeout = Duration::from_secs(1);
        c.lease_ttl = Duration::from_secs(120);
    })
    .await;
    let cwd = tempfile::TempDir::new().unwrap();
    let mut request = create_request(&h, "mock");
    request.cwd = cwd.path().to_string_lossy().into_owned();
    let mut session = Session::create_with(&h, request).await;
    let mut watch = session.watch().await;
    let reply = session.prompt("before the fault").await;
    watch.response_to(&reply.action_id).await;
    (proxy, h, session, cwd)
}

#[tokio::test]
async fn a_prompt_whose_commit_landed_but_whose_answer_was_lost_is_sent_once_and_reported_sent() {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    within(TEST_BOUND, async {
        let (proxy, h, mut session, _cwd) = served(&url, &schema).await;
        let text = marked("landing");
        let action_id = ActionId::mint().to_string();
        proxy.trip(text.as_bytes(), COMMIT, Trip::LoseAnswer);
        let mut watch = session.watch().await;

        let reply = session
            .control(prompt_with_id(&session, &text, &action_id))
            .await
            .expect("a commit that landed is read back and answered");
        proxy.tripped().await;
        assert_eq!(reply.action_id, action_id);
        assert_eq!(reply.status(), pb::ControlStatus::Sent);
        watch.response_to(&action_id).await;

        let again = session
            .control(prompt_with_id(&session, &text, &action_id))
            .await
            .expect("a retry is answered");
        assert_eq!(again.status(), pb::ControlStatus::Sent, "the same outcome");
        let log = session.log().await;
        assert_eq!(sent_and_answered(&log, &action_id), (1, 1), "once");
        h.shutdown().await;
    })
    .await;
    drop_schema(&url, &schema).await;
}

#[tokio::test]
async fn a_prompt_whose_commit_never_arrived_is_refused_unsent_and_a_retry_with_its_id_sends_it_once()
 {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    within(TEST_BOUND, async {
        let (proxy, h, mut session, _cwd) = served(&url, &schema).await;
        let text = marked("not landing");
        let action_id = ActionId::mint().to_string();
        proxy.trip(text.as_bytes(), COMMIT, Trip::LoseRequest);

        let refused = session
            .control(prompt_with_id(&session, &text, &action_id))
            .await
            .expect_err("a commit that did not land is refused");
        proxy.tripped().await;
        assert_error(&refused, Code::Unavailable, "STORE_UNAVAILABLE");
        assert!(refused.get_details_retry_info().is_some(), "retryable");
        let log = session.log().await;
        assert_eq!(sent_and_answered(&log, &action_id), (0, 0), "nothing sent");

        let mut watch = session.watch().await;
        let reply = session
            .control(prompt_with_id(&session, &text, &action_id))
            .await
            .expect("the retry is taken now");
        assert_eq!(reply.status(), pb::ControlStatus::Sent);
        watch.response_to(&action_id).await;
        let log = session.log().await;
        assert_eq!(sent_and_answered(&log, &action_id), (1, 1), "once");
        h.shutdown().await;
    })
    .await;
    drop_schema(&url, &schema).await;
}

#[tokio::test]
async fn a_prompt_whose_commit_outcome_cannot_be_read_back_is_outcome_unknown_and_sent_once_known()
{
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    within(TEST_BOUND, async {
        let (proxy, h, mut session, _cwd) = served(&url, &schema).await;
        let text = marked("in doubt");
        let action_id = ActionId::mint().to_string();
        // The COMMIT reaches the database, then nothing passes either way.
        proxy.trip(text.as_bytes(), COMMIT, Trip::BlackHoleAfter);

        let unknown = session
            .control(prompt_with_id(&session, &text, &action_id))
            .await
            .expect_err("the outcome cannot be told while the database is away");
        assert_error(&unknown, Code::Unavailable, "OUTCOME_UNKNOWN");
        assert!(unknown.get_details_retry_info().is_some(), "retryable");
        let info = error_info(&unknown);
        assert_eq!(info.metadata.get("action_id"), Some(&action_id));
        assert!(
            unknown.message().contains(&action_id),
            "{}",
            unknown.message()
        );

        // Still away: a retry learns the same, and nothing reached the agent.
        let still = session
            .control(prompt_with_id(&session, &text, &action_id))
            .await
            .expect_err("still unknown");
        assert_error(&still, Code::Unavailable, "OUTCOME_UNKNOWN");

        proxy.restore();
        let mut watch = session.watch().await;
        let reply = session
            .control(prompt_with_id(&session, &text, &action_id))
            .await
            .expect("once the database is back, the retry converges");
        assert_eq!(reply.action_id, action_id);
        assert_eq!(reply.status(), pb::ControlStatus::Sent, "it had landed");
        watch.response_to(&action_id).await;
        let log = session.log().await;
        assert_eq!(
            sent_and_answered(&log, &action_id),
            (1, 1),
            "sent once, once known"
        );
        h.shutdown().await;
    })
    .await;
    drop_schema(&url, &schema).await;
}

#[tokio::test]
async fn a_prompt_whose_commit_was_held_until_its_transaction_ended_is_outcome_unknown_then_taken_once()
 {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    within(TEST_BOUND, async {
        let (proxy, h, mut session, _cwd) = served(&url, &schema).await;
        let text = marked("held");
        let action_id = ActionId::mint().to_string();
        // The COMMIT is held on its way; the database ends the idle transaction meanwhile, so
        // when it finally arrives there is nothing left to commit.
        proxy.trip(text.as_bytes(), COMMIT, Trip::BlackHoleBefore);

        let unknown = session
            .control(prompt_with_id(&session, &text, &action_id))
            .await
            .expect_err("the outcome cannot be told while the database is away");
        assert_error(&unknown, Code::Unavailable, "OUTCOME_UNKNOWN");
        assert_eq!(
            error_info(&unknown).metadata.get("action_id"),
            Some(&action_id)
        );

        proxy.restore();
        let mut watch = session.watch().await;
        let reply = session
            .control(prompt_with_id(&session, &text, &action_id))
            .await
            .expect("once the database is back, the retry converges");
        assert_eq!(reply.status(), pb::ControlStatus::Sent);
        watch.response_to(&action_id).await;
        let log = session.log().await;
        assert_eq!(sent_and_answered(&log, &action_id), (1, 1), "once");
        h.shutdown().await;
    })
    .await;
    drop_schema(&url, &schema).await;
}

#[tokio::test]
async fn a_prompt_in_flight_when_the_replica_fences_itself_off_is_outcome_unknown_and_a_retry_never_sends_it_twice()
 {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    within(TEST_BOUND, async {
        let (proxy, proxied) = proxied(&url).await;
        let database_url = url_in_schema(&proxied, &schema);
        // A short lease: the replica stops the session by its own clock while the commit hangs.
        let h = Harness::start_with(|c| {
            c.database_url = Some(database_url.into());
            c.lease_ttl = Duration::from_secs(2);
        })
        .await;
        let cwd = tempfile::TempDir::new().unwrap();
        let mut request = create_request(&h, "mock");
        request.cwd = cwd.path().to_string_lossy().into_owned();
        let mut session = Session::create_with(&h, request).await;
        let mut watch = session.watch().await;
        let reply = session.prompt("before the fault").await;
        watch.response_to(&reply.action_id).await;
        // Idle, with nothing left to write: the Control below is the one write cut off.
        watch.status(pb::SessionStatus::Idle).await;
        let text = marked("in flight");
        proxy.black_hole();

        // No action id of the caller's: the server mints one and goes straight to the commit.
        let unknown = session
            .act(prompt(&text))
            .await
            .expect_err("the write cannot finish before the lease runs out");
        assert_error(&unknown, Code::Unavailable, "OUTCOME_UNKNOWN");
        let action_id = error_info(&unknown)
            .metadata
            .get("action_id")
            .cloned()
            .expect("the minted action id");

        proxy.restore();
        let reply = loop {
            match session
                .control(prompt_with_id(&session, &text, &action_id))
                .await
            {
                Ok(reply) => break reply,
                // The session comes back once the database answers again.
                Err(status) if status.code() == Code::Unavailable => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(status) => panic!("the retry failed: {status:?}"),
            }
        };
        assert_eq!(reply.action_id, action_id);
        let log = session.log().await;
        let (sent, answered) = sent_and_answered(&log, &action_id);
        assert!(sent <= 1 && answered <= 1, "never twice: {sent} {answered}");
        if sent > answered {
            // Logged but never reached an agent: its turn says so, it is not left running.
            let transcript = session.transcript().await;
            let turn = transcript
                .messages
                .iter()
                .find(|m| m.request_id.as_deref() == Some(action_id.as_str()))
                .expect("the prompt")
                .turn;
            let answer = transcript
                .messages
                .iter()
                .find(|m| m.turn == turn && m.role == pb::MessageRole::Agent as i32)
                .expect("the turn's end");
            assert_eq!(answer.stop_reason, Some(pb::StopReason::Failed as i32));
        }
        h.shutdown().await;
    })
    .await;
    drop_schema(&url, &schema).await;
}

/// A session record for the bare store.
fn record() -> SessionRecord {
    let now = agent_harness::domain::now();
    SessionRecord {
        id: uuid::Uuid::now_v7(),
        name: String::new(),
        owner: "local".into(),
        profile: "mock".into(),
        cwd: "/tmp".into(),
        model: String::new(),
        acp_session_id: "acp-1".into(),
        status: SessionStatus::Idle,
        status_reason: String::new(),
        created_at: now,
        updated_at: now,
        labels: BTreeMap::new(),
        profile_fingerprint: String::new(),
        editors: Vec::new(),
        request_fingerprint: String::new(),
        can_resume: false,
        can_load: false,
        first_action_id: None,
        home: None,
    }
}

fn one_entry(text: &str) -> Batch {
    Batch {
        entries: vec![LogEntry {
            offset: 1,
            direction: Direction::Event,
            json: serde_json::json!({"event": "note", "text": text}).to_string(),
            actor: "harness".into(),
            action_id: None,
            epoch: 1,
            created_at: agent_harness::domain::now(),
        }],
        ..Batch::default()
    }
}

#[tokio::test]
async fn the_store_reports_a_commit_whose_answer_was_lost_as_ambiguous_and_reads_back_the_truth() {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    within(TEST_BOUND, async {
        let (proxy, proxied) = proxied(&url).await;
        let store = PostgresStore::connect(PostgresOptions {
            schema: Some(schema.clone()),
            ..PostgresOptions::new(proxied)
        })
        .await
        .expect("the store opens");

        for (trip, stored) in [(Trip::LoseAnswer, true), (Trip::LoseRequest, false)] {
            let session = record();
            store.create_session(&session).await.unwrap();
            let text = marked("bare");
            let batch = one_entry(&text);
            let probe = Probe::of(&batch);
            proxy.trip(text.as_bytes(), COMMIT, trip);
            let error = store
                .commit(session.id, batch)
                .await
                .expect_err("the commit's answer is lost");
            assert!(
                matches!(error, CommitError::Ambiguous { .. }),
                "{trip:?}: {error:?}"
            );
            assert_eq!(
                landed(&store, session.id, &probe).await.unwrap(),
                stored,
                "{trip:?}"
            );
            assert_eq!(
                store.head_offset(session.id).await.unwrap(),
                u64::from(stored)
            );
        }
        // A failure before COMMIT was sent is no doubt: nothing was stored.
        let session = record();
        store.create_session(&session).await.unwrap();
        let text = marked("before commit");
        proxy.trip(b"", text.as_bytes(), Trip::LoseRequest);
        let error = store
            .commit(session.id, one_entry(&text))
            .await
            .expect_err("the connection drops before COMMIT");
        assert!(matches!(error, CommitError::Failed(_)), "{error:?}");
        assert_eq!(store.head_offset(session.id).await.unwrap(), 0);
        store.close().await.unwrap();
    })
    .await;
    drop_schema(&url, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_control_that_gets_no_answer_is_outcome_unknown_with_its_action_id_and_a_retry_is_idempotent()
 {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    within(TEST_BOUND, async {
        // The owner advertises a proxy in front of itself; the other replica forwards through it.
        let hop = FaultProxy::start("127.0.0.1:1").await;
        let owner = Harness::start_with(|c| {
            c.database_url = Some(database_url.clone().into());
            c.advertise_address = Some(hop.addr().to_string());
            c.lease_ttl = Duration::from_secs(120);
        })
        .await;
        hop.point_to(owner.addr());
        let other = Harness::start_with(|c| {
            c.database_url = Some(database_url.clone().into());
            c.lease_ttl = Duration::from_secs(120);
        })
        .await;
        let cwd = tempfile::TempDir::new().unwrap();
        let mut request = create_request(&owner, "mock");
        request.cwd = cwd.path().to_string_lossy().into_owned();
        let mut on_owner = Session::create_with(&owner, request).await;
        let mut via_other = Session::attach(other.sessions(), &on_owner.id);
        let mut watch = on_owner.watch().await;

        // The Control reaches the owner, which takes it; its answer never comes back.
        let text = marked("forwarded");
        hop.trip(b"", text.as_bytes(), Trip::BlackHoleAfter);
        let unknown = via_other
            .act(prompt(&text))
            .await
            .expect_err("the hop gets no answer");
        assert_error(&unknown, Code::Unavailable, "OUTCOME_UNKNOWN");
        assert!(unknown.get_details_retry_info().is_some(), "retryable");
        let action_id = error_info(&unknown)
            .metadata
            .get("action_id")
            .cloned()
            .expect("the action id minted before the hop");
        watch.response_to(&action_id).await;

        hop.restore();
        let again = via_other
            .control(prompt_with_id(&via_other, &text, &action_id))
            .await
            .expect("a retry with the id is answered");
        assert_eq!(again.action_id, action_id);
        assert_eq!(
            again.status(),
            pb::ControlStatus::Sent,
            "the owner had taken it"
        );
        let log = on_owner.log().await;
        assert_eq!(sent_and_answered(&log, &action_id), (1, 1), "once");
        other.shutdown().await;
        owner.shutdown().await;
    })
    .await;
    drop_schema(&url, &schema).await;
}

/// Makes every insert into `table` fail the way a database in trouble answers: `sqlstate`.
async fn refuse_inserts(url: &str, schema: &str, table: &str, sqlstate: &str) {
    execute(
        url,
        &format!(
            "CREATE OR REPLACE FUNCTION {schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN RAISE EXCEPTION 'refused by the test' USING ERRCODE = '{sqlstate}'; END $$; \
             CREATE TRIGGER refuse BEFORE INSERT ON {schema}.{table} \
             FOR EACH ROW EXECUTE FUNCTION {schema}.refuse()"
        ),
    )
    .await;
}

#[tokio::test]
async fn a_database_that_answers_disk_full_or_read_only_refuses_as_store_unavailable_and_stores_nothing()
 {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    within(TEST_BOUND, async {
        let (_proxy, h, mut session, _cwd) = served(&url, &schema).await;
        for (sqlstate, table) in [
            ("disk_full", "log"),
            ("read_only_sql_transaction", "actions"),
        ] {
            refuse_inserts(&url, &schema, table, sqlstate).await;
            let text = marked(sqlstate);
            let action_id = ActionId::mint().to_string();
            let refused = session
                .control(prompt_with_id(&session, &text, &action_id))
                .await
                .expect_err("the database refuses the write");
            assert_error(&refused, Code::Unavailable, "STORE_UNAVAILABLE");
            assert!(
                refused.get_details_retry_info().is_some(),
                "{sqlstate}: retryable"
            );
            let log = session.log().await;
            assert!(
                log.iter().all(|e| !e.json.contains(&text)),
                "{sqlstate}: nothing of it is in the log"
            );
            assert!(session.queue().await.is_empty(), "{sqlstate}: nor queued");

            execute(&url, &format!("DROP TRIGGER refuse ON {schema}.{table}")).await;
            let mut watch = session.watch().await;
            let reply = session
                .control(prompt_with_id(&session, &text, &action_id))
                .await
                .expect("the same request once the database is well again");
            assert_eq!(reply.status(), pb::ControlStatus::Sent);
            watch.response_to(&action_id).await;
            let log = session.log().await;
            assert_eq!(sent_and_answered(&log, &action_id), (1, 1), "{sqlstate}");
        }
        h.shutdown().await;
    })
    .await;
    drop_schema(&url, &schema).await;
}
