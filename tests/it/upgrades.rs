//! Upgrades across versions: the data a released version wrote (the fixtures under
//! `tests/fixtures/upgrade/<commit>/`, made by `scripts/make-upgrade-fixture` with that version's
//! binary) migrates when this build starts on it, reads as that version read it, and its sessions
//! reopen; a build refuses a store whose schema is newer than it knows; and two replicas on one
//! PostgreSQL database are rolled from the previous release to this build one at a time while a
//! client keeps a session's turns going.
//!
//! The previous release's binary comes from `scripts/test` (`.tools/previous-release/`, built
//! from the commit it names); without it these tests skip with a note, and fail with `CI=true`.
//! The PostgreSQL tests need `AGENT_HARNESS_TEST_DATABASE_URL` like `postgres.rs`.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use agent_harness::pb::v1::{
    self as pb, agent_session_service_client::AgentSessionServiceClient, control_request::Action,
    message_part::Kind, subscribe_response::Event,
};
use agent_harness_testkit::service_bin;
use serde_json::{Value, json};
use tokio::sync::watch;
use tonic::{Code, transport::Endpoint};

use crate::{
    harness::{Harness, assert_error, expect_err, within},
    postgres::{execute, test_schema, url_in_schema},
    process::{Serve, ServeProcess},
    support::{Session, Watch, attachment, permission_answer, prompt},
};

/// Where the fixtures live, one directory per released version that wrote one.
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/upgrade");
/// The schema the PostgreSQL dumps were taken of; a test restores it under a name of its own.
const FIXTURE_SCHEMA: &str = "upgrade_fixture_schema";
/// The SQLite store's file in a data directory.
const DB_FILE: &str = "agent-harness.sqlite3";
/// Bound of the fixture tests (a few sessions reopen, one at a time).
const FIXTURE_BOUND: Duration = Duration::from_secs(60);
/// Bound of the rolling upgrade (four replica starts, two drains, lease hand-overs).
const ROLL_BOUND: Duration = Duration::from_secs(150);

/// Every fixture directory, oldest commit name first (any order will do: each is checked alone).
fn fixtures() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(FIXTURES)
        .expect("tests/fixtures/upgrade is there")
        .map(|entry| entry.expect("a readable directory").path())
        .filter(|path| path.is_dir())
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "no upgrade fixture under {FIXTURES}");
    dirs
}

/// The previous release's binary, or `None` (with a note) outside CI when it was not built.
fn previous_release() -> Option<PathBuf> {
    let path = std::env::var_os("AGENT_HARNESS_PREVIOUS_BIN").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/previous-release/agent-harness"),
        PathBuf::from,
    );
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{} is missing, and CI=true: the upgrade tests must run in CI (scripts/test builds it)",
        path.display()
    );
    eprintln!(
        "note: skipping an upgrade test: {} is missing (`scripts/test tests` builds it)",
        path.display()
    );
    None
}

/// What the version that wrote a fixture read back from it before it stopped.
struct Expected {
    /// `sessions list --json`, one object per session.
    sessions: Vec<Value>,
    /// `log SESSION --json` per session name, one object per entry.
    logs: BTreeMap<String, Vec<Value>>,
    /// The action id of the prompt left queued in session `queued`.
    queued_action: String,
}

fn json_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

impl Expected {
    fn read(store_dir: &Path) -> Self {
        let dir = store_dir.join("expected");
        let logs = ["closed", "open", "queued"]
            .into_iter()
            .map(|name| {
                (
                    name.to_owned(),
                    json_lines(&dir.join(format!("{name}.log.jsonl"))),
                )
            })
            .collect();
        Self {
            sessions: json_lines(&dir.join("sessions.jsonl")),
            logs,
            queued_action: std::fs::read_to_string(dir.join("queued-action-id"))
                .expect("the queued action's id")
                .trim()
                .to_owned(),
        }
    }

    fn session(&self, name: &str) -> &Value {
        self.sessions
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no session {name} in the fixture"))
    }

    fn id(&self, name: &str) -> String {
        self.session(name)["id"].as_str().expect("an id").to_owned()
    }
}

/// `STOP_REASON_END_TURN` → `end_turn`, as the command line prints enum values.
fn lower(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix)
        .unwrap_or(name)
        .to_ascii_lowercase()
}

fn timestamp(ts: &Option<prost_types::Timestamp>) -> Value {
    ts.as_ref()
        .map_or(Value::Null, |ts| Value::String(ts.to_string()))
}

/// A session as `sessions list --json` shows it: the fields that must survive an upgrade.
fn session_as_listed(session: &pb::AgentSession) -> Value {
    json!({
        "id": session.id,
        "name": session.name,
        "owner": session.owner,
        "profile": session.profile,
        "cwd": session.cwd,
        "model": session.model,
        "labels": session.labels,
        "editors": session.editors,
        "created_at": timestamp(&session.created_at),
    })
}

/// A log entry as `log --json` shows it.
fn entry_as_listed(entry: &pb::LogEntry) -> Value {
    json!({
        "offset": entry.offset,
        "direction": lower(entry.direction().as_str_name(), "LOG_DIRECTION_"),
        "actor": entry.actor,
        "action_id": entry.action_id,
        "epoch": entry.epoch,
        "created_at": timestamp(&entry.created_at),
        "frame": serde_json::from_str::<Value>(&entry.json).expect("logged JSON"),
    })
}

/// `value` restricted to the keys of `like`.
fn restricted(value: &Value, like: &Value) -> Value {
    let keys = like.as_object().expect("an object");
    Value::Object(
        value
            .as_object()
            .expect("an object")
            .iter()
            .filter(|(k, _)| keys.contains_key(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    )
}

fn texts(message: &pb::TranscriptMessage) -> Vec<&str> {
    message
        .parts
        .iter()
        .filter_map(|p| match &p.kind {
            Some(Kind::Text(t)) => Some(t.text.as_str()),
            _ => None,
        })
        .collect()
}

fn stop_reason(message: &pb::TranscriptMessage) -> pb::StopReason {
    message
        .stop_reason
        .and_then(|r| pb::StopReason::try_from(r).ok())
        .unwrap_or(pb::StopReason::Unspecified)
}

/// The whole transcript, every page.
async fn transcript(session: &mut Session) -> Vec<pb::TranscriptMessage> {
    let mut messages = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = session
            .client
            .get_transcript(pb::GetTranscriptRequest {
                session_id: session.id.clone(),
                page_token: page_token.clone(),
                ..Default::default()
            })
            .await
            .expect("the transcript reads")
            .into_inner();
        messages.extend(page.messages);
        if page.next_page_token.is_empty() {
            return messages;
        }
        page_token = page.next_page_token;
    }
}

/// Waits for the end of the turn opened by `request_id`.
async fn turn_end(watch: &mut Watch, request_id: &str) -> pb::TurnEnded {
    loop {
        let event = watch
            .next()
            .await
            .expect("the stream stays open")
            .expect("the stream does not fail");
        if let Some(Event::TurnEnded(ended)) = event.event
            && ended.request_id == request_id
        {
            return ended;
        }
    }
}

/// What every fixture holds, checked on a server started on it: the sessions list and log as the
/// version that wrote it read them, the turns its transcript folds to, and sessions that reopen.
async fn reads_and_reopens(h: &Harness, expected: &Expected) {
    let mut client = h.sessions();
    let listed = client
        .list_sessions(pb::ListSessionsRequest {
            labels: [("fixture".to_owned(), "upgrade".to_owned())].into(),
            ..Default::default()
        })
        .await
        .expect("ListSessions answers")
        .into_inner()
        .sessions;
    assert_eq!(
        listed.iter().map(|s| s.id.clone()).collect::<Vec<_>>(),
        expected
            .sessions
            .iter()
            .map(|s| s["id"].as_str().expect("an id").to_owned())
            .collect::<Vec<_>>(),
        "the same sessions, newest first"
    );
    for (session, old) in listed.iter().zip(&expected.sessions) {
        let now = session_as_listed(session);
        assert_eq!(now, restricted(old, &now), "session {}", old["name"]);
        assert!(
            session.head_offset >= old["head_offset"].as_u64().expect("a head"),
            "session {} lost log entries",
            old["name"]
        );
    }

    // Every entry the old version logged reads the same, at the same offset.
    for (name, old_log) in &expected.logs {
        let mut session = Session::attach(client.clone(), &expected.id(name));
        let log = session.log().await;
        assert!(
            log.len() >= old_log.len(),
            "session {name} lost log entries"
        );
        for (entry, old) in log.iter().zip(old_log) {
            let now = entry_as_listed(entry);
            assert_eq!(now, restricted(old, &now), "session {name}");
        }
    }

    closed_session_reads_and_stays_closed(h, expected).await;
    open_session_reads_and_runs_a_new_turn(h, expected).await;
    queued_prompt_runs(h, expected).await;
}

async fn closed_session_reads_and_stays_closed(h: &Harness, expected: &Expected) {
    let mut closed = Session::attach(h.sessions(), &expected.id("closed"));
    assert_eq!(closed.get().await.status(), pb::SessionStatus::Closed);
    let messages = transcript(&mut closed).await;
    let roles: Vec<_> = messages.iter().map(|m| (m.turn, m.role())).collect();
    use pb::MessageRole::{Agent, User};
    assert_eq!(roles, [(1, User), (1, Agent), (2, User), (2, Agent)]);
    assert_eq!(texts(&messages[0]), ["run the tests\n@tool t1"]);
    assert_eq!(texts(&messages[1]), ["echo: run the tests\n@tool t1"]);
    let tools: Vec<_> = messages[1]
        .parts
        .iter()
        .filter_map(|p| match &p.kind {
            Some(Kind::Tool(tool)) => Some((tool.tool_call_id.as_str(), tool.status.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(tools, [("t1", "completed")]);
    assert_eq!(texts(&messages[3]), ["echo: thanks, that is all"]);
    for agent in [&messages[1], &messages[3]] {
        assert_eq!(stop_reason(agent), pb::StopReason::EndTurn);
    }
    let refused = expect_err(closed.act(prompt("anyone there?")).await);
    assert_error(&refused, Code::FailedPrecondition, "SESSION_CLOSED");
}

async fn open_session_reads_and_runs_a_new_turn(h: &Harness, expected: &Expected) {
    let mut open = Session::attach(h.sessions(), &expected.id("open"));
    let messages = transcript(&mut open).await;
    assert_eq!(messages.len(), 4, "{messages:?}");
    assert_eq!(texts(&messages[0]), ["may I?\n@permission"]);
    let permission = messages[1]
        .parts
        .iter()
        .find_map(|p| match &p.kind {
            Some(Kind::Permission(permission)) => Some(permission),
            _ => None,
        })
        .expect("the permission the agent asked");
    assert_eq!(permission.outcome(), pb::InteractionOutcome::Selected);
    assert_eq!(permission.selected_option_id.as_deref(), Some("allow-once"));
    assert_eq!(permission.options.len(), 4);
    assert!(
        texts(&messages[1]).contains(&"permission: selected allow-once"),
        "{:?}",
        messages[1]
    );
    let attachments: Vec<_> = messages[2]
        .parts
        .iter()
        .filter_map(|p| match &p.kind {
            Some(Kind::Attachment(a)) => Some((a.uri.as_str(), a.name.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        attachments,
        [
            ("https://example.com/notes.md", "notes.md"),
            ("https://example.com/spec.pdf", "spec.pdf")
        ]
    );
    assert_eq!(texts(&messages[2]), ["read these two"]);
    assert_eq!(stop_reason(&messages[3]), pb::StopReason::EndTurn);
    // An answer to the permission of the old runtime is refused: it is not held any more.
    let held_before = permission.request_id.clone().expect("its request id");
    let stale = expect_err(
        open.act(permission_answer(held_before, Some("allow-once")))
            .await,
    );
    assert_error(&stale, Code::FailedPrecondition, "PERMISSION_NOT_PENDING");

    // It reopens: a new prompt runs a turn with the agent.
    let head = open.get().await.head_offset;
    let mut watch = open.watch_from(head, pb::SubscribeView::All).await;
    let mut action = prompt("after the upgrade");
    if let Action::Prompt(p) = &mut action {
        p.attachments
            .push(attachment("https://example.com/later.md", "later.md"));
    }
    let reply = open.act(action).await.expect("the prompt is accepted");
    let ended = turn_end(&mut watch, &reply.action_id).await;
    assert_eq!(ended.stop_reason(), pb::StopReason::EndTurn, "{ended:?}");
    let messages = transcript(&mut open).await;
    let last = messages.last().expect("the new turn");
    assert_eq!(last.request_id.as_deref(), Some(reply.action_id.as_str()));
    assert_eq!(texts(last), ["echo: after the upgrade"]);
}

async fn queued_prompt_runs(h: &Harness, expected: &Expected) {
    let mut queued = Session::attach(h.sessions(), &expected.id("queued"));
    let mut watch = queued.watch_from(0, pb::SubscribeView::All).await;
    let ended = turn_end(&mut watch, &expected.queued_action).await;
    assert_eq!(ended.stop_reason(), pb::StopReason::EndTurn, "{ended:?}");
    let messages = transcript(&mut queued).await;
    assert_eq!(texts(&messages[0]), ["@wait-cancel"]);
    assert!(
        !matches!(stop_reason(&messages[1]), pb::StopReason::EndTurn),
        "the turn the drain interrupted did not end by itself: {:?}",
        messages[1]
    );
    let last = messages.last().expect("the queued turn");
    assert_eq!(
        last.request_id.as_deref(),
        Some(expected.queued_action.as_str())
    );
    assert_eq!(texts(last), ["echo: queued behind a running turn"]);
    assert!(queued.queue().await.is_empty());
}

/// A copy of a fixture's data directory, to start a server on.
/// A directory outside `/tmp`: the fixtures' sessions work in `/tmp`, and no session's cwd may
/// hold its server's data dir.
fn outside_tmp() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn copy_data_dir(fixture: &Path) -> tempfile::TempDir {
    let dir = outside_tmp();
    std::fs::copy(
        fixture.join("sqlite/data").join(DB_FILE),
        dir.path().join(DB_FILE),
    )
    .expect("the fixture's database copies");
    dir
}

/// The schema version of a SQLite store file.
fn sqlite_version(path: &Path) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap()
}

#[tokio::test]
async fn a_data_directory_of_each_released_version_migrates_at_start_reads_alike_and_reopens() {
    for fixture in fixtures() {
        within(FIXTURE_BOUND, async {
            let data = copy_data_dir(&fixture);
            let before = sqlite_version(&data.path().join(DB_FILE));
            let h = Harness::start_with(|c| c.data_dir = data.path().to_path_buf()).await;
            reads_and_reopens(&h, &Expected::read(&fixture.join("sqlite"))).await;
            h.shutdown().await;
            let after = sqlite_version(&data.path().join(DB_FILE));
            assert!(after >= before, "{}: {before} → {after}", fixture.display());
        })
        .await;
    }
}

/// The fixture's dump restored under `schema` (created by the dump itself).
async fn restore_dump(url: &str, fixture: &Path, schema: &str) {
    let dump = std::fs::read_to_string(fixture.join("postgres/dump.sql")).expect("the dump");
    assert!(dump.contains(&format!("CREATE SCHEMA {FIXTURE_SCHEMA};")));
    execute(url, &dump.replace(FIXTURE_SCHEMA, schema)).await;
}

/// A fresh schema name in the test database, or `None` when PostgreSQL tests skip.
async fn fresh_schema() -> Option<(String, String)> {
    let (url, schema) = test_schema().await?;
    execute(&url, &format!("DROP SCHEMA {schema}")).await;
    Some((url, schema))
}

#[tokio::test]
async fn a_postgres_dump_of_each_released_version_migrates_at_start_reads_alike_and_reopens() {
    for fixture in fixtures() {
        let Some((url, schema)) = fresh_schema().await else {
            return;
        };
        within(FIXTURE_BOUND, async {
            restore_dump(&url, &fixture, &schema).await;
            let database_url = url_in_schema(&url, &schema);
            let data = outside_tmp();
            let h = Harness::start_with(|c| {
                c.database_url = Some(database_url.clone().into());
                c.data_dir = data.path().to_path_buf();
            })
            .await;
            reads_and_reopens(&h, &Expected::read(&fixture.join("postgres"))).await;
            h.shutdown().await;
        })
        .await;
        execute(&url, &format!("DROP SCHEMA {schema} CASCADE")).await;
    }
}

/// Runs `program serve ARGS` and expects it to refuse to start: its exit code is not 0 and
/// its log says why. Returns the log.
async fn refused_start(program: &Path, args: &[&str]) -> String {
    let output = tokio::process::Command::new(program)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .expect("the binary runs");
    let log = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "it started: {log}");
    log
}

/// Asserts `log` tells the operator the database is newer than the binary, and what to do.
#[track_caller]
fn says_newer(log: &str, version: i64) {
    assert!(
        log.contains(&format!(
            "the database has schema version {version}, newer than"
        )) && log.contains("use a newer agent-harness"),
        "{log}"
    );
}

#[tokio::test]
async fn a_build_refuses_a_data_directory_whose_schema_is_newer_than_it_knows_and_leaves_it_as_is()
{
    let fixture = &fixtures()[0];
    let mut builds = vec![service_bin()];
    builds.extend(previous_release());
    for build in builds {
        within(FIXTURE_BOUND, async {
            let data = copy_data_dir(fixture);
            let file = data.path().join(DB_FILE);
            // The next schema change, as far as any build here knows.
            let newer = 1000;
            rusqlite::Connection::open(&file)
                .unwrap()
                .pragma_update(None, "user_version", newer)
                .unwrap();
            let log = refused_start(&build, &["--data-dir", &data.path().to_string_lossy()]).await;
            says_newer(&log, newer);
            assert_eq!(sqlite_version(&file), newer, "the file is left as it was");
        })
        .await;
    }
}

#[tokio::test]
async fn a_build_refuses_a_postgres_schema_newer_than_it_knows_and_leaves_it_as_is() {
    let fixture = &fixtures()[0];
    let Some((url, schema)) = fresh_schema().await else {
        return;
    };
    within(FIXTURE_BOUND, async {
        restore_dump(&url, fixture, &schema).await;
        let state = async || {
            query_i64(
                &url,
                &format!(
                    "SELECT (SELECT count(*) FROM {schema}.schema_migrations), \
                            (SELECT count(*) FROM {schema}.sessions), \
                            (SELECT count(*) FROM {schema}.log)"
                ),
            )
            .await
        };
        let newer = 1000;
        execute(
            &url,
            &format!("INSERT INTO {schema}.schema_migrations (version) VALUES ({newer})"),
        )
        .await;
        let before = state().await;
        let database_url = url_in_schema(&url, &schema);
        let data = tempfile::tempdir().unwrap();
        let mut builds = vec![service_bin()];
        builds.extend(previous_release());
        for build in builds {
            let log = refused_start(
                &build,
                &[
                    "--database-url",
                    &database_url,
                    "--data-dir",
                    &data.path().to_string_lossy(),
                ],
            )
            .await;
            says_newer(&log, newer);
        }
        assert_eq!(state().await, before, "the schema is left as it was");
    })
    .await;
    execute(&url, &format!("DROP SCHEMA {schema} CASCADE")).await;
}

/// The first row of a query whose columns are all `bigint`.
async fn query_i64(url: &str, sql: &str) -> Vec<i64> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("the test database answers");
    tokio::spawn(connection);
    let row = client.query_one(sql, &[]).await.expect(sql);
    (0..row.len()).map(|i| row.get(i)).collect()
}

// ---------------------------------------------------------------------------------------------
// The rolling upgrade

/// The replicas a client may call, as a load balancer in front of them knows them.
#[derive(Clone, Default)]
struct Replicas(Arc<Mutex<Vec<SocketAddr>>>);

impl Replicas {
    fn set(&self, addrs: Vec<SocketAddr>) {
        *self.0.lock().unwrap() = addrs;
    }

    /// The `n`th replica, round robin.
    fn pick(&self, n: usize) -> SocketAddr {
        let addrs = self.0.lock().unwrap();
        addrs[n % addrs.len()]
    }
}

/// Whether a client retries a call that failed so, with the same action id: the replica is
/// draining or gone, or forwarding to the owner failed. Everything else is a real failure.
fn retryable(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled
    )
}

async fn client_of(
    addr: SocketAddr,
) -> Result<AgentSessionServiceClient<tonic::transport::Channel>, tonic::Status> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("a valid endpoint")
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    Ok(AgentSessionServiceClient::new(channel))
}

/// A client keeping a session busy: one prompt after another, each sent (and re-sent with its
/// action id on a retryable failure) to the next replica, then followed to its turn's end on
/// whichever replica answers. Counts the turns that ended; returns the acknowledged action ids.
async fn keep_serving(
    replicas: Replicas,
    session_id: String,
    ended: watch::Sender<usize>,
    stop: watch::Receiver<bool>,
) -> Vec<String> {
    let mut acknowledged = Vec::new();
    let mut retries = 0;
    let mut n = 0;
    let mut cursor = 0;
    while !*stop.borrow() {
        let action_id = uuid::Uuid::now_v7().to_string();
        let request = pb::ControlRequest {
            session_id: session_id.clone(),
            action_id: Some(action_id.clone()),
            action: Some(prompt(&format!("turn {}", acknowledged.len() + 1))),
            ..Default::default()
        };
        loop {
            n += 1;
            let result = match client_of(replicas.pick(n)).await {
                Ok(mut client) => client
                    .control(request.clone())
                    .await
                    .map(|r| r.into_inner()),
                Err(status) => Err(status),
            };
            match result {
                Ok(reply) => {
                    assert_eq!(reply.action_id, action_id);
                    break;
                }
                Err(status) if retryable(&status) => {
                    eprintln!("retrying turn {action_id}: {}", status.message());
                    retries += 1;
                    backoff().await;
                }
                Err(status) => panic!("turn {action_id} refused: {status:?}"),
            }
        }
        acknowledged.push(action_id.clone());
        // Follow it to its end, resuming from the last cursor on another replica if a stream
        // ends (a replica drains).
        'follow: loop {
            n += 1;
            let stream = match client_of(replicas.pick(n)).await {
                Ok(mut client) => client
                    .subscribe(pb::SubscribeRequest {
                        session_id: session_id.clone(),
                        after_offset: cursor,
                        view: pb::SubscribeView::Messages as i32,
                    })
                    .await
                    .map(|r| r.into_inner()),
                Err(status) => Err(status),
            };
            let mut stream = match stream {
                Ok(stream) => stream,
                Err(status) if retryable(&status) => {
                    eprintln!("resubscribing: {}", status.message());
                    retries += 1;
                    backoff().await;
                    continue;
                }
                Err(status) => panic!("subscribing refused: {status:?}"),
            };
            loop {
                match stream.message().await {
                    Ok(Some(event)) => {
                        cursor = cursor.max(event.offset);
                        if let Some(Event::TurnEnded(end)) = event.event
                            && end.request_id == action_id
                        {
                            assert_eq!(end.stop_reason(), pb::StopReason::EndTurn, "{end:?}");
                            break 'follow;
                        }
                    }
                    Ok(None) => break,
                    Err(status) if retryable(&status) => {
                        eprintln!("resubscribing: {}", status.message());
                        break;
                    }
                    Err(status) => panic!("the stream failed: {status:?}"),
                }
            }
            backoff().await;
        }
        ended.send_modify(|count| *count += 1);
    }
    eprintln!("{} turns, {retries} calls retried", acknowledged.len());
    acknowledged
}

/// The pause before a retry: what a client honouring the servers' RetryInfo does, shortened.
async fn backoff() {
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// A replica on the shared database: `program` (None: this build) on its own data directory.
fn replica(program: Option<&Path>, dir: &Path, name: &str, database_url: &str) -> ServeProcess {
    let mut serve = Serve::new()
        .arg("--data-dir")
        .arg(dir.join(name))
        .replica(database_url, "2s");
    if let Some(program) = program {
        serve = serve.program(program);
    }
    serve.start()
}

/// Stops a replica as an orchestrator does (SIGTERM: it drains and gives up its leases) and
/// expects a clean exit.
async fn drain(replica: &mut ServeProcess) {
    replica.signal(libc::SIGTERM);
    let status = replica.wait().await;
    assert!(status.success(), "the replica exited with {status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn replicas_rolled_one_at_a_time_from_the_previous_release_keep_a_session_serving() {
    let Some(old) = previous_release() else {
        return;
    };
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    within(ROLL_BOUND, async {
        let dir = tempfile::tempdir().unwrap();
        let mut a = replica(Some(&old), dir.path(), "a", &database_url);
        let mut b = replica(Some(&old), dir.path(), "b", &database_url);
        let replicas = Replicas::default();
        replicas.set(vec![a.addr(), b.addr()]);
        let session = Session::create_with_client(
            a.client().await,
            pb::CreateSessionRequest {
                profile: "mock".into(),
                cwd: agent_harness_testkit::workspace_in(dir.path())
                    .to_string_lossy()
                    .into_owned(),
                ..Default::default()
            },
        )
        .await;

        let (ended_tx, mut ended) = watch::channel(0);
        let (stop_tx, stop) = watch::channel(false);
        let client = tokio::spawn(keep_serving(
            replicas.clone(),
            session.id.clone(),
            ended_tx,
            stop,
        ));
        // A few turns in each state of the roll: old+old, new+old, new+new.
        let mut wait_turns = async |more: usize| {
            let target = *ended.borrow() + more;
            ended
                .wait_for(|count| *count >= target)
                .await
                .expect("the client keeps going");
        };
        wait_turns(3).await;
        drain(&mut a).await;
        replicas.set(vec![b.addr()]);
        let a = replica(None, dir.path(), "a", &database_url);
        replicas.set(vec![a.addr(), b.addr()]);
        wait_turns(3).await;
        drain(&mut b).await;
        replicas.set(vec![a.addr()]);
        let b = replica(None, dir.path(), "b", &database_url);
        replicas.set(vec![a.addr(), b.addr()]);
        wait_turns(3).await;
        stop_tx.send(true).unwrap();
        let acknowledged = client.await.expect("the client finished");

        // Nothing acknowledged is lost: each turn is in the transcript once, answered.
        let mut on_new = Session::attach(b.client().await, &session.id);
        let messages = transcript(&mut on_new).await;
        let users: Vec<&str> = messages
            .iter()
            .filter(|m| m.role() == pb::MessageRole::User)
            .filter_map(|m| m.request_id.as_deref())
            .collect();
        assert_eq!(
            users, acknowledged,
            "every acknowledged turn, once, in order"
        );
        for (i, agent) in messages
            .iter()
            .filter(|m| m.role() == pb::MessageRole::Agent)
            .enumerate()
        {
            assert_eq!(stop_reason(agent), pb::StopReason::EndTurn, "{agent:?}");
            assert_eq!(texts(agent), [format!("echo: turn {}", i + 1).as_str()]);
        }
        drop((a, b));
    })
    .await;
    execute(&url, &format!("DROP SCHEMA {schema} CASCADE")).await;
}
