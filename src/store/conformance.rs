//! The storage conformance suite: written once against `Arc<dyn Store>`, run against every
//! backend. Each case is an async function in `cases`; `conformance_suite!` turns the whole
//! list into one `#[tokio::test]` per case and backend, so a failure names both, e.g.
//! `store::conformance::sqlite::a_batch_whose_offsets_leave_a_gap_changes_nothing`.
//!
//! A new backend adds a constructor in `backends` and one `conformance_suite!` line. Everything
//! here is compiled for tests only. The PostgreSQL cases need `AGENT_HARNESS_TEST_DATABASE_URL`
//! (see `postgres/tests.rs`): without it they skip with a note, except in CI, where they fail.

#[cfg(test)]
use std::{future::Future, sync::Arc, time::Duration};

/// Every case gets this long; a hang fails the test instead of stalling the run.
#[cfg(test)]
const CASE_TIMEOUT: Duration = Duration::from_secs(120);

#[cfg(test)]
async fn within(case: impl Future<Output = ()>) {
    tokio::time::timeout(CASE_TIMEOUT, case)
        .await
        .expect("the conformance case finished within its timeout");
}

/// A store under test and whatever keeps it alive.
#[cfg(test)]
pub(crate) mod backends {
    use super::*;
    use crate::store::{
        SqliteSynchronous, Store,
        memory::MemoryStore,
        postgres::{PostgresStore, tests::TestSchema},
        sqlite::SqliteStore,
    };

    pub(crate) struct Backend {
        pub(crate) store: Arc<dyn Store>,
        sqlite: Option<Arc<SqliteStore>>,
        postgres: Option<(Arc<PostgresStore>, TestSchema)>,
        _dir: Option<tempfile::TempDir>,
    }

    impl Backend {
        /// Stops the backend cleanly (the SQLite writer checkpoints and exits; a PostgreSQL
        /// test schema is dropped).
        pub(crate) async fn finish(self) {
            if let Some(sqlite) = &self.sqlite {
                sqlite.close().await.expect("the store closes cleanly");
            }
            if let Some((store, schema)) = self.postgres {
                store.close().await.expect("the store closes cleanly");
                schema.drop_schema().await;
            }
        }
    }

    pub(crate) async fn memory() -> Option<Backend> {
        Some(Backend {
            store: Arc::new(MemoryStore::new()),
            sqlite: None,
            postgres: None,
            _dir: None,
        })
    }

    pub(crate) async fn sqlite() -> Option<Backend> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = Arc::new(
            SqliteStore::open(
                dir.path().join("agent-harness.sqlite3"),
                SqliteSynchronous::Normal,
            )
            .expect("the SQLite store opens"),
        );
        Some(Backend {
            store: store.clone(),
            sqlite: Some(store),
            postgres: None,
            _dir: Some(dir),
        })
    }

    /// A store in a fresh schema of the test database; `None` (the case skips, with a note)
    /// only outside CI with no test database configured.
    pub(crate) async fn postgres() -> Option<Backend> {
        let schema = TestSchema::create().await?;
        let store = Arc::new(schema.open().await);
        Some(Backend {
            store: store.clone(),
            sqlite: None,
            postgres: Some((store, schema)),
            _dir: None,
        })
    }

    /// The same over TLS (`sslmode=require`; the test server has `ssl = on`).
    pub(crate) async fn postgres_tls() -> Option<Backend> {
        let schema = TestSchema::create().await?;
        let store = Arc::new(
            PostgresStore::connect(schema.options_with("sslmode=require"))
                .await
                .expect("the PostgreSQL store opens over TLS"),
        );
        Some(Backend {
            store: store.clone(),
            sqlite: None,
            postgres: Some((store, schema)),
            _dir: None,
        })
    }
}

/// Values the cases (and the backend-specific tests) build on.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::{
        collections::BTreeMap,
        time::{Duration, SystemTime},
    };

    use serde_json::{Map, Value, json};
    use uuid::Uuid;

    use crate::{
        domain::{
            ActionId, PromptAction, PromptAttachment,
            queue::{QueuedEntry, QueuedWork},
            session::{SessionRecord, SessionStatus},
        },
        store::{ActionRecord, ActionState, Batch, Direction, LogEntry, QueueOp},
    };

    /// A point in time `ms` milliseconds into the test epoch, with a sub-millisecond part so
    /// microsecond precision is exercised (stores keep times to the microsecond).
    pub(crate) fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_micros((1_700_000_000_000 + ms) * 1_000 + 321)
    }

    pub(crate) fn session(owner: &str, created_ms: u64) -> SessionRecord {
        SessionRecord {
            id: Uuid::now_v7(),
            name: format!("work of {owner} — ünïcødé ✓"),
            owner: owner.to_owned(),
            profile: "mock".to_owned(),
            cwd: "/srv/checkout".to_owned(),
            model: "default".to_owned(),
            acp_session_id: "acp-session-1".to_owned(),
            status: SessionStatus::Idle,
            status_reason: String::new(),
            created_at: at(created_ms),
            updated_at: at(created_ms + 5),
            labels: BTreeMap::from([("team".to_owned(), "core".to_owned())]),
            profile_fingerprint: "profile-fp".to_owned(),
            editors: Vec::new(),
            request_fingerprint: "request-fp".to_owned(),
            can_resume: true,
            can_load: false,
            first_action_id: Some(ActionId::mint()),
            home: Some(format!("/srv/homes/mock/{owner}")),
        }
    }

    pub(crate) fn frame(offset: u64, json: &str) -> LogEntry {
        LogEntry {
            offset,
            direction: Direction::FromRuntime,
            json: json.to_owned(),
            actor: "runtime".to_owned(),
            action_id: None,
            epoch: 1,
            created_at: at(offset),
        }
    }

    /// Entries `from..=to` with distinct small JSON bodies.
    pub(crate) fn frames(from: u64, to: u64) -> Vec<LogEntry> {
        (from..=to)
            .map(|offset| {
                frame(
                    offset,
                    &format!(r#"{{"jsonrpc":"2.0","method":"session/update","n":{offset}}}"#),
                )
            })
            .collect()
    }

    pub(crate) fn entries(entries: Vec<LogEntry>) -> Batch {
        Batch {
            entries,
            ..Batch::default()
        }
    }

    pub(crate) fn prompt(text: &str) -> QueuedEntry {
        QueuedEntry {
            action_id: ActionId::mint(),
            work: QueuedWork::Prompt(PromptAction::text(text)),
            context: None,
            actor: "user:alice".to_owned(),
            created_at: at(42),
            traceparent: None,
        }
    }

    pub(crate) fn rich_prompt() -> QueuedEntry {
        let mut context = Map::new();
        context.insert("trigger".to_owned(), json!({"kind": "review", "pr": 17}));
        context.insert("zeta".to_owned(), Value::from("kept in order"));
        context.insert("alpha".to_owned(), json!([1, 2.5, null, true]));
        QueuedEntry {
            action_id: ActionId::mint(),
            work: QueuedWork::Prompt(PromptAction::with_attachments(
                "look at these — 日本語 🚀",
                vec![
                    PromptAttachment::new("https://files.example/a.png", "a.png")
                        .mime_type("image/png")
                        .size(1234),
                    PromptAttachment::new("https://files.example/notes.txt", "notes.txt"),
                ],
            )),
            context: Some(context),
            actor: "service:reviewer".to_owned(),
            created_at: at(43),
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned()),
        }
    }

    pub(crate) fn compact() -> QueuedEntry {
        QueuedEntry {
            work: QueuedWork::Compact,
            ..prompt("")
        }
    }

    pub(crate) fn queue(ops: Vec<QueueOp>) -> Batch {
        Batch {
            queue: ops,
            ..Batch::default()
        }
    }

    pub(crate) fn action(action_id: ActionId, state: ActionState) -> ActionRecord {
        ActionRecord {
            action_id,
            fingerprint: format!(r#"{{"action":{{"type":"prompt"}},"id":"{action_id}"}}"#),
            state,
            created_at: at(7),
        }
    }
}

/// The cases, each a behaviour every backend must have.
#[cfg(test)]
pub(crate) mod cases {
    use std::{collections::BTreeMap, time::Duration};

    use uuid::Uuid;

    use super::fixtures::*;
    use super::*;
    use crate::{
        domain::{
            ActionId, ErrorCode, PromptAction,
            queue::{QueuedEntry, QueuedWork},
            session::SessionStatus,
        },
        store::{ActionState, Batch, Direction, LogEntry, QueueOp, SessionQuery, Store},
    };

    type S = Arc<dyn Store>;

    async fn created(store: &S, owner: &str, created_ms: u64) -> Uuid {
        let record = session(owner, created_ms);
        store.create_session(&record).await.unwrap();
        record.id
    }

    async fn whole_log(store: &S, session_id: Uuid) -> Vec<LogEntry> {
        store.read_log(session_id, 0, usize::MAX).await.unwrap()
    }

    fn all() -> SessionQuery {
        SessionQuery {
            page_size: 1000,
            ..SessionQuery::default()
        }
    }

    fn ids_of(records: &[crate::domain::session::SessionRecord]) -> Vec<Uuid> {
        records.iter().map(|r| r.id).collect()
    }

    pub(crate) async fn a_created_session_reads_back_exactly(store: S) {
        let mut record = session("user:alice", 1);
        record.labels.insert("env".to_owned(), "prod ✓".to_owned());
        record.labels.insert("".to_owned(), "empty key".to_owned());
        record.editors = vec!["user:zed".to_owned(), "user:bob".to_owned()];
        record.status = SessionStatus::Starting;
        record.status_reason = "spawning".to_owned();
        record.can_load = true;
        store.create_session(&record).await.unwrap();
        assert_eq!(
            store.get_session(record.id).await.unwrap(),
            Some(record.clone())
        );
        assert_eq!(store.head_offset(record.id).await.unwrap(), 0);
        assert!(whole_log(&store, record.id).await.is_empty());
        assert!(store.load_queue(record.id).await.unwrap().is_empty());
    }

    pub(crate) async fn creating_a_session_with_a_taken_id_fails_with_session_exists(store: S) {
        let first = session("user:alice", 1);
        store.create_session(&first).await.unwrap();
        let mut second = session("user:bob", 2);
        second.id = first.id;
        let err = store.create_session(&second).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::SessionExists);
        assert_eq!(store.get_session(first.id).await.unwrap(), Some(first));
    }

    pub(crate) async fn an_unknown_session_reads_as_absent_and_empty(store: S) {
        let unknown = Uuid::now_v7();
        assert_eq!(store.get_session(unknown).await.unwrap(), None);
        assert!(store.read_log(unknown, 0, 10).await.unwrap().is_empty());
        assert_eq!(store.head_offset(unknown).await.unwrap(), 0);
        assert!(store.load_queue(unknown).await.unwrap().is_empty());
        assert_eq!(
            store.find_action(unknown, ActionId::mint()).await.unwrap(),
            None
        );
        assert!(store.list_sessions(&all()).await.unwrap().is_empty());
    }

    pub(crate) async fn a_batch_continuing_densely_from_the_head_is_appended(store: S) {
        let id = created(&store, "user:alice", 1).await;
        store.commit(id, entries(frames(1, 2))).await.unwrap();
        store.commit(id, entries(frames(3, 3))).await.unwrap();
        store.commit(id, entries(frames(4, 9))).await.unwrap();
        assert_eq!(whole_log(&store, id).await, frames(1, 9));
        assert_eq!(store.head_offset(id).await.unwrap(), 9);
    }

    pub(crate) async fn a_batch_whose_offsets_leave_a_gap_changes_nothing(store: S) {
        let id = created(&store, "user:alice", 1).await;
        let before = store.get_session(id).await.unwrap().unwrap();
        store.commit(id, entries(frames(1, 1))).await.unwrap();
        let queued = prompt("never queued");
        let mut changed = before.clone();
        changed.status = SessionStatus::Running;
        let batch = Batch {
            entries: frames(3, 4),
            queue: vec![QueueOp::PushBack(queued.clone())],
            new_actions: vec![action(queued.action_id, ActionState::Queued)],
            action_states: Vec::new(),
            usage: Vec::new(),
            session: Some(changed),
            fence: None,
        };
        let err = store
            .commit(id, batch)
            .await
            .map_err(crate::domain::Error::from)
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Internal);
        assert_eq!(whole_log(&store, id).await, frames(1, 1));
        assert_eq!(store.head_offset(id).await.unwrap(), 1);
        assert!(store.load_queue(id).await.unwrap().is_empty());
        assert_eq!(store.find_action(id, queued.action_id).await.unwrap(), None);
        assert_eq!(store.get_session(id).await.unwrap(), Some(before));
    }

    pub(crate) async fn a_batch_that_overlaps_the_log_changes_nothing(store: S) {
        let id = created(&store, "user:alice", 1).await;
        store.commit(id, entries(frames(1, 2))).await.unwrap();
        let mut overlapping = frames(2, 3);
        overlapping[0].json = r#"{"rewritten":true}"#.to_owned();
        let err = store
            .commit(id, entries(overlapping))
            .await
            .map_err(crate::domain::Error::from)
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Internal);
        let err = store
            .commit(id, entries(frames(1, 1)))
            .await
            .map_err(crate::domain::Error::from)
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Internal);
        assert_eq!(whole_log(&store, id).await, frames(1, 2));
        assert_eq!(store.head_offset(id).await.unwrap(), 2);
    }

    pub(crate) async fn a_batch_whose_offsets_are_not_dense_inside_it_changes_nothing(store: S) {
        let id = created(&store, "user:alice", 1).await;
        let repeated = vec![frame(1, "{}"), frame(1, "{}")];
        let skipping = vec![frame(1, "{}"), frame(3, "{}")];
        let backwards = vec![frame(2, "{}"), frame(1, "{}")];
        let from_zero = vec![frame(0, "{}"), frame(1, "{}")];
        for bad in [repeated, skipping, backwards, from_zero] {
            let err = store
                .commit(id, entries(bad))
                .await
                .map_err(crate::domain::Error::from)
                .unwrap_err();
            assert_eq!(err.code, ErrorCode::Internal);
        }
        assert!(whole_log(&store, id).await.is_empty());
        assert_eq!(store.head_offset(id).await.unwrap(), 0);
        store.commit(id, entries(frames(1, 2))).await.unwrap();
        assert_eq!(whole_log(&store, id).await, frames(1, 2));
    }

    pub(crate) async fn read_log_pages_by_after_and_limit_in_offset_order(store: S) {
        let id = created(&store, "user:alice", 1).await;
        store.commit(id, entries(frames(1, 7))).await.unwrap();
        store.commit(id, entries(frames(8, 8))).await.unwrap();
        store.commit(id, entries(frames(9, 25))).await.unwrap();
        let all = frames(1, 25);
        assert_eq!(store.read_log(id, 0, 10).await.unwrap(), all[0..10]);
        assert_eq!(store.read_log(id, 10, 10).await.unwrap(), all[10..20]);
        assert_eq!(store.read_log(id, 20, 10).await.unwrap(), all[20..25]);
        assert_eq!(store.read_log(id, 7, 1).await.unwrap(), all[7..8]);
        assert!(store.read_log(id, 25, 10).await.unwrap().is_empty());
        assert!(store.read_log(id, 1000, 10).await.unwrap().is_empty());
        assert!(store.read_log(id, u64::MAX, 10).await.unwrap().is_empty());
        assert!(store.read_log(id, 3, 0).await.unwrap().is_empty());
        assert_eq!(store.read_log(id, 0, usize::MAX).await.unwrap(), all);
        // Paging with the last offset seen walks the whole log exactly once.
        let mut seen = Vec::new();
        let mut after = 0;
        loop {
            let page = store.read_log(id, after, 4).await.unwrap();
            let Some(last) = page.last() else { break };
            after = last.offset;
            seen.extend(page);
        }
        assert_eq!(seen, all);
    }

    pub(crate) async fn read_log_keeps_the_exact_json_text_and_every_field(store: S) {
        let id = created(&store, "user:alice", 1).await;
        let action_id = ActionId::mint();
        let large = format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"text":"{}"}}}}"#,
            "large ✓ row ".repeat(350_000)
        );
        assert!(large.len() > 4 << 20);
        let written = vec![
            LogEntry {
                offset: 1,
                direction: Direction::ToRuntime,
                json: r#"{"jsonrpc":"2.0","id":"x","method":"session/prompt"}"#.to_owned(),
                actor: "user:alice".to_owned(),
                action_id: Some(action_id),
                epoch: 0,
                created_at: at(1),
            },
            LogEntry {
                offset: 2,
                direction: Direction::FromRuntime,
                // Spacing, key order, number spelling and escapes are kept as written.
                json: "{ \"b\" : 1.50e+2 ,\"a\":\"h\\u00e9llo 🌍 \\\"q\\\" \\n\",\n\t\"z\":[ ] }"
                    .to_owned(),
                actor: "runtime".to_owned(),
                action_id: None,
                epoch: u32::MAX,
                created_at: at(2),
            },
            LogEntry {
                offset: 3,
                direction: Direction::Event,
                json: "{\"raw\":\"日本語 — emoji 👩‍💻 — ünïcødé\"}".to_owned(),
                actor: "".to_owned(),
                action_id: Some(action_id),
                epoch: 7,
                created_at: at(3),
            },
            LogEntry {
                offset: 4,
                direction: Direction::FromRuntime,
                json: large,
                actor: "runtime".to_owned(),
                action_id: None,
                epoch: 7,
                created_at: at(4),
            },
            LogEntry {
                offset: 5,
                direction: Direction::Event,
                json: String::new(),
                actor: "harness".to_owned(),
                action_id: None,
                epoch: 7,
                created_at: at(5),
            },
        ];
        store.commit(id, entries(written.clone())).await.unwrap();
        let read = whole_log(&store, id).await;
        assert_eq!(read.len(), written.len());
        for (read, written) in read.iter().zip(&written) {
            assert_eq!(read.json.as_bytes(), written.json.as_bytes());
            assert_eq!(read, written);
        }
    }

    pub(crate) async fn sessions_never_see_each_others_logs_queues_or_action_ids(store: S) {
        let a = created(&store, "user:alice", 1).await;
        let b = created(&store, "user:bob", 2).await;
        let queued = prompt("for a");
        store
            .commit(
                a,
                Batch {
                    entries: frames(1, 3),
                    queue: vec![QueueOp::PushBack(queued.clone())],
                    new_actions: vec![action(queued.action_id, ActionState::Queued)],
                    ..Batch::default()
                },
            )
            .await
            .unwrap();
        let mut for_b = frames(1, 1);
        for_b[0].json = r#"{"session":"b"}"#.to_owned();
        store.commit(b, entries(for_b.clone())).await.unwrap();
        assert_eq!(whole_log(&store, a).await, frames(1, 3));
        assert_eq!(whole_log(&store, b).await, for_b);
        assert_eq!(store.head_offset(b).await.unwrap(), 1);
        assert!(store.load_queue(b).await.unwrap().is_empty());
        assert_eq!(store.find_action(b, queued.action_id).await.unwrap(), None);
        assert_eq!(store.load_queue(a).await.unwrap(), vec![queued]);
    }

    pub(crate) async fn head_offset_is_zero_for_an_empty_log_then_the_newest_offset(store: S) {
        let id = created(&store, "user:alice", 1).await;
        assert_eq!(store.head_offset(id).await.unwrap(), 0);
        store.commit(id, entries(frames(1, 1))).await.unwrap();
        assert_eq!(store.head_offset(id).await.unwrap(), 1);
        store.commit(id, entries(frames(2, 40))).await.unwrap();
        assert_eq!(store.head_offset(id).await.unwrap(), 40);
        store.commit(id, queue(vec![QueueOp::Clear])).await.unwrap();
        assert_eq!(store.head_offset(id).await.unwrap(), 40);
    }

    pub(crate) async fn push_back_appends_and_push_front_puts_the_newest_interrupt_first(store: S) {
        let id = created(&store, "user:alice", 1).await;
        let [a, b, c, i1, i2] = ["a", "b", "c", "interrupt 1", "interrupt 2"].map(prompt);
        store
            .commit(
                id,
                queue(vec![
                    QueueOp::PushBack(a.clone()),
                    QueueOp::PushBack(b.clone()),
                ]),
            )
            .await
            .unwrap();
        store
            .commit(id, queue(vec![QueueOp::PushFront(i1.clone())]))
            .await
            .unwrap();
        store
            .commit(
                id,
                queue(vec![
                    QueueOp::PushFront(i2.clone()),
                    QueueOp::PushBack(c.clone()),
                ]),
            )
            .await
            .unwrap();
        assert_eq!(store.load_queue(id).await.unwrap(), vec![i2, i1, a, b, c]);
        let d = prompt("front of an empty queue");
        let other = created(&store, "user:alice", 2).await;
        store
            .commit(other, queue(vec![QueueOp::PushFront(d.clone())]))
            .await
            .unwrap();
        assert_eq!(store.load_queue(other).await.unwrap(), vec![d]);
    }

    pub(crate) async fn an_update_replaces_the_content_but_keeps_the_position(store: S) {
        let id = created(&store, "user:alice", 1).await;
        let [a, b, c] = ["a", "b", "c"].map(prompt);
        let mut b = QueuedEntry {
            context: rich_prompt().context,
            ..b
        };
        b.traceparent = Some("00-aa-bb-01".to_owned());
        store
            .commit(
                id,
                queue(vec![
                    QueueOp::PushBack(a.clone()),
                    QueueOp::PushBack(b.clone()),
                    QueueOp::PushBack(c.clone()),
                ]),
            )
            .await
            .unwrap();
        let edited = QueuedEntry {
            work: QueuedWork::Prompt(PromptAction::text("b, edited ✎")),
            context: None,
            actor: "user:bob".to_owned(),
            ..b.clone()
        };
        store
            .commit(id, queue(vec![QueueOp::Update(edited.clone())]))
            .await
            .unwrap();
        assert_eq!(
            store.load_queue(id).await.unwrap(),
            vec![a.clone(), edited.clone(), c.clone()]
        );
        // Editing an entry that is gone changes nothing.
        store
            .commit(id, queue(vec![QueueOp::Update(prompt("not queued"))]))
            .await
            .unwrap();
        assert_eq!(store.load_queue(id).await.unwrap(), vec![a, edited, c]);
    }

    pub(crate) async fn remove_takes_out_one_entry_and_clear_empties_the_queue(store: S) {
        let id = created(&store, "user:alice", 1).await;
        let [a, b, c, d] = ["a", "b", "c", "d"].map(prompt);
        store
            .commit(
                id,
                queue(vec![
                    QueueOp::PushBack(a.clone()),
                    QueueOp::PushBack(b.clone()),
                    QueueOp::PushBack(c.clone()),
                ]),
            )
            .await
            .unwrap();
        store
            .commit(id, queue(vec![QueueOp::Remove(b.action_id)]))
            .await
            .unwrap();
        assert_eq!(
            store.load_queue(id).await.unwrap(),
            vec![a.clone(), c.clone()]
        );
        store
            .commit(id, queue(vec![QueueOp::Remove(ActionId::mint())]))
            .await
            .unwrap();
        assert_eq!(store.load_queue(id).await.unwrap(), vec![a, c]);
        store.commit(id, queue(vec![QueueOp::Clear])).await.unwrap();
        assert!(store.load_queue(id).await.unwrap().is_empty());
        store
            .commit(
                id,
                queue(vec![QueueOp::PushBack(d.clone()), QueueOp::Clear]),
            )
            .await
            .unwrap();
        assert!(store.load_queue(id).await.unwrap().is_empty());
        store
            .commit(id, queue(vec![QueueOp::PushBack(d.clone())]))
            .await
            .unwrap();
        assert_eq!(store.load_queue(id).await.unwrap(), vec![d]);
    }

    pub(crate) async fn queued_entries_keep_their_work_context_attachments_and_traceparent(
        store: S,
    ) {
        let id = created(&store, "user:alice", 1).await;
        let rich = rich_prompt();
        let compact = compact();
        store
            .commit(
                id,
                queue(vec![
                    QueueOp::PushBack(rich.clone()),
                    QueueOp::PushBack(compact.clone()),
                ]),
            )
            .await
            .unwrap();
        let loaded = store.load_queue(id).await.unwrap();
        assert_eq!(loaded, vec![rich.clone(), compact]);
        let keys: Vec<&String> = loaded[0].context.as_ref().unwrap().keys().collect();
        assert_eq!(keys, ["trigger", "zeta", "alpha"]);
    }

    pub(crate) async fn taking_the_head_of_the_queue_and_appending_its_frame_is_one_change(
        store: S,
    ) {
        let id = created(&store, "user:alice", 1).await;
        let [a, b] = ["a", "b"].map(prompt);
        store
            .commit(
                id,
                Batch {
                    entries: frames(1, 1),
                    queue: vec![QueueOp::PushBack(a.clone()), QueueOp::PushBack(b.clone())],
                    new_actions: vec![
                        action(a.action_id, ActionState::Queued),
                        action(b.action_id, ActionState::Queued),
                    ],
                    ..Batch::default()
                },
            )
            .await
            .unwrap();
        let mut dispatched = frame(2, r#"{"jsonrpc":"2.0","method":"session/prompt"}"#);
        dispatched.direction = Direction::ToRuntime;
        dispatched.action_id = Some(a.action_id);
        let take = |offset: u64| Batch {
            entries: vec![LogEntry {
                offset,
                ..dispatched.clone()
            }],
            queue: vec![QueueOp::Remove(a.action_id)],
            action_states: vec![(a.action_id, ActionState::Sent)],
            ..Batch::default()
        };
        // With a stale offset nothing happens: the entry stays queued.
        store.commit(id, take(5)).await.unwrap_err();
        assert_eq!(
            store.load_queue(id).await.unwrap(),
            vec![a.clone(), b.clone()]
        );
        let record = store.find_action(id, a.action_id).await.unwrap().unwrap();
        assert_eq!(record.state, ActionState::Queued);
        // With the right one, both happen.
        store.commit(id, take(2)).await.unwrap();
        assert_eq!(store.load_queue(id).await.unwrap(), vec![b]);
        assert_eq!(whole_log(&store, id).await[1], dispatched);
        let record = store.find_action(id, a.action_id).await.unwrap().unwrap();
        assert_eq!(record.state, ActionState::Sent);
    }

    pub(crate) async fn a_new_action_id_is_recorded_and_found_by_id(store: S) {
        let id = created(&store, "user:alice", 1).await;
        let first = action(ActionId::mint(), ActionState::Sent);
        let mut second = action(ActionId::mint(), ActionState::Queued);
        second.fingerprint = format!("{{\"prompt\":\"{}\"}}", "ü".repeat(10_000));
        store
            .commit(
                id,
                Batch {
                    new_actions: vec![first.clone(), second.clone()],
                    ..Batch::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(
            store.find_action(id, first.action_id).await.unwrap(),
            Some(first)
        );
        assert_eq!(
            store.find_action(id, second.action_id).await.unwrap(),
            Some(second)
        );
        assert_eq!(store.find_action(id, ActionId::mint()).await.unwrap(), None);
    }

    pub(crate) async fn an_action_id_already_recorded_fails_the_whole_batch_with_action_id_conflict(
        store: S,
    ) {
        let id = created(&store, "user:alice", 1).await;
        let before = store.get_session(id).await.unwrap().unwrap();
        let recorded = action(ActionId::mint(), ActionState::Sent);
        store
            .commit(
                id,
                Batch {
                    entries: frames(1, 1),
                    new_actions: vec![recorded.clone()],
                    ..Batch::default()
                },
            )
            .await
            .unwrap();
        let fresh = prompt("fresh");
        let mut again = action(recorded.action_id, ActionState::Queued);
        again.fingerprint = "a different request".to_owned();
        let mut changed = before.clone();
        changed.status = SessionStatus::Running;
        let err = store
            .commit(
                id,
                Batch {
                    entries: frames(2, 3),
                    queue: vec![QueueOp::PushBack(fresh.clone())],
                    new_actions: vec![action(fresh.action_id, ActionState::Queued), again],
                    action_states: vec![(recorded.action_id, ActionState::Removed)],
                    usage: Vec::new(),
                    session: Some(changed),
                    fence: None,
                },
            )
            .await
            .map_err(crate::domain::Error::from)
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::ActionIdConflict);
        assert_eq!(whole_log(&store, id).await, frames(1, 1));
        assert!(store.load_queue(id).await.unwrap().is_empty());
        assert_eq!(store.find_action(id, fresh.action_id).await.unwrap(), None);
        assert_eq!(
            store.find_action(id, recorded.action_id).await.unwrap(),
            Some(recorded)
        );
        assert_eq!(store.get_session(id).await.unwrap(), Some(before));
        // The offsets the failed batch tried are still free.
        store.commit(id, entries(frames(2, 3))).await.unwrap();
        assert_eq!(store.head_offset(id).await.unwrap(), 3);
    }

    pub(crate) async fn the_same_action_id_in_another_session_is_fine(store: S) {
        let a = created(&store, "user:alice", 1).await;
        let b = created(&store, "user:alice", 2).await;
        let shared = ActionId::mint();
        let in_a = action(shared, ActionState::Sent);
        let mut in_b = action(shared, ActionState::Queued);
        in_b.fingerprint = "b's request".to_owned();
        for (session_id, record) in [(a, in_a.clone()), (b, in_b.clone())] {
            store
                .commit(
                    session_id,
                    Batch {
                        new_actions: vec![record],
                        ..Batch::default()
                    },
                )
                .await
                .unwrap();
        }
        assert_eq!(store.find_action(a, shared).await.unwrap(), Some(in_a));
        assert_eq!(store.find_action(b, shared).await.unwrap(), Some(in_b));
    }

    pub(crate) async fn action_states_change_recorded_ids_and_ignore_unknown_ones(store: S) {
        let id = created(&store, "user:alice", 1).await;
        let to_send = action(ActionId::mint(), ActionState::Queued);
        let to_remove = action(ActionId::mint(), ActionState::Queued);
        let unknown = ActionId::mint();
        store
            .commit(
                id,
                Batch {
                    new_actions: vec![to_send.clone(), to_remove.clone()],
                    ..Batch::default()
                },
            )
            .await
            .unwrap();
        store
            .commit(
                id,
                Batch {
                    action_states: vec![
                        (to_send.action_id, ActionState::Sent),
                        (to_remove.action_id, ActionState::Removed),
                        (unknown, ActionState::Sent),
                    ],
                    ..Batch::default()
                },
            )
            .await
            .unwrap();
        let sent = store.find_action(id, to_send.action_id).await.unwrap();
        assert_eq!(
            sent,
            Some(crate::store::ActionRecord {
                state: ActionState::Sent,
                ..to_send
            })
        );
        let removed = store.find_action(id, to_remove.action_id).await.unwrap();
        assert_eq!(removed.unwrap().state, ActionState::Removed);
        assert_eq!(store.find_action(id, unknown).await.unwrap(), None);
        // A new id and its state change in one batch: the change applies to the new id.
        let fresh = action(ActionId::mint(), ActionState::Queued);
        store
            .commit(
                id,
                Batch {
                    new_actions: vec![fresh.clone()],
                    action_states: vec![(fresh.action_id, ActionState::Sent)],
                    ..Batch::default()
                },
            )
            .await
            .unwrap();
        let fresh = store.find_action(id, fresh.action_id).await.unwrap();
        assert_eq!(fresh.unwrap().state, ActionState::Sent);
    }

    pub(crate) async fn a_batch_with_a_session_record_replaces_it_including_labels_and_editors(
        store: S,
    ) {
        let mut record = session("user:alice", 1);
        record.labels = BTreeMap::from([
            ("team".to_owned(), "core".to_owned()),
            ("env".to_owned(), "dev".to_owned()),
        ]);
        record.editors = vec!["user:bob".to_owned()];
        store.create_session(&record).await.unwrap();

        let mut replaced = record.clone();
        replaced.name = "renamed".to_owned();
        replaced.model = "large".to_owned();
        replaced.acp_session_id = "acp-2".to_owned();
        replaced.status = SessionStatus::AwaitingInput;
        replaced.status_reason = "permission requested".to_owned();
        replaced.updated_at = at(99);
        replaced.labels = BTreeMap::from([
            ("team".to_owned(), "platform".to_owned()),
            ("tier".to_owned(), "gold".to_owned()),
        ]);
        replaced.editors = vec!["user:carol".to_owned(), "user:bob".to_owned()];
        replaced.can_resume = false;
        replaced.can_load = true;
        store
            .commit(
                record.id,
                Batch {
                    entries: frames(1, 1),
                    session: Some(replaced.clone()),
                    ..Batch::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(
            store.get_session(record.id).await.unwrap(),
            Some(replaced.clone())
        );
        let listed = store.list_sessions(&all()).await.unwrap();
        assert_eq!(listed, vec![replaced.clone()]);

        let query = |labels: &[(&str, &str)], who: Option<&str>| SessionQuery {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            owner_or_editor: who.map(str::to_owned),
            page_size: 10,
            ..SessionQuery::default()
        };
        let hits = |q: SessionQuery| {
            let store = store.clone();
            async move { store.list_sessions(&q).await.unwrap().len() }
        };
        assert_eq!(hits(query(&[("team", "core")], None)).await, 0);
        assert_eq!(hits(query(&[("env", "dev")], None)).await, 0);
        assert_eq!(hits(query(&[("team", "platform")], None)).await, 1);
        assert_eq!(hits(query(&[("tier", "gold")], None)).await, 1);
        assert_eq!(hits(query(&[], Some("user:carol"))).await, 1);

        let mut emptied = replaced.clone();
        emptied.labels.clear();
        emptied.editors.clear();
        store
            .commit(
                record.id,
                Batch {
                    session: Some(emptied.clone()),
                    ..Batch::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(store.get_session(record.id).await.unwrap(), Some(emptied));
        assert_eq!(hits(query(&[], Some("user:carol"))).await, 0);
        assert_eq!(hits(query(&[("tier", "gold")], None)).await, 0);
        assert_eq!(hits(query(&[], Some("user:alice"))).await, 1);
    }

    pub(crate) async fn an_empty_batch_for_a_known_session_succeeds_and_changes_nothing(store: S) {
        let id = created(&store, "user:alice", 1).await;
        let before = store.get_session(id).await.unwrap();
        store.commit(id, entries(frames(1, 2))).await.unwrap();
        store.commit(id, Batch::default()).await.unwrap();
        assert_eq!(store.get_session(id).await.unwrap(), before);
        assert_eq!(whole_log(&store, id).await, frames(1, 2));
    }

    pub(crate) async fn a_commit_to_an_unknown_session_fails_with_session_not_found(store: S) {
        let unknown = Uuid::now_v7();
        for batch in [Batch::default(), entries(frames(1, 3))] {
            let err = store
                .commit(unknown, batch)
                .await
                .map_err(crate::domain::Error::from)
                .unwrap_err();
            assert_eq!(err.code, ErrorCode::SessionNotFound);
        }
        assert_eq!(store.get_session(unknown).await.unwrap(), None);
        assert!(store.read_log(unknown, 0, 10).await.unwrap().is_empty());
        assert!(store.list_sessions(&all()).await.unwrap().is_empty());
    }

    /// Sessions with controlled `(created_at, id)` so order and ties are known.
    async fn ordered_sessions(store: &S, specs: &[(u64, u128)]) -> Vec<Uuid> {
        let mut ids = Vec::new();
        for &(created_ms, id) in specs {
            let mut record = session("user:alice", created_ms);
            record.id = Uuid::from_u128(id);
            store.create_session(&record).await.unwrap();
            ids.push(record.id);
        }
        ids
    }

    pub(crate) async fn list_sessions_is_newest_first_with_ties_broken_by_id_descending(store: S) {
        let ids = ordered_sessions(
            &store,
            &[(10, 5), (30, 1), (20, 9), (30, 7), (20, 2), (30, u128::MAX)],
        )
        .await;
        let listed = store.list_sessions(&all()).await.unwrap();
        let expected = [5, 3, 1, 2, 4, 0].map(|i| ids[i]);
        assert_eq!(ids_of(&listed), expected);
        // Same answer for a page that holds them exactly.
        let exact = SessionQuery {
            page_size: 6,
            ..SessionQuery::default()
        };
        assert_eq!(
            ids_of(&store.list_sessions(&exact).await.unwrap()),
            expected
        );
    }

    pub(crate) async fn list_sessions_pages_with_an_exclusive_after_and_at_most_page_size(
        store: S,
    ) {
        let ids = ordered_sessions(
            &store,
            &[(1, 1), (2, 2), (2, 3), (2, 4), (3, 5), (4, 6), (4, 7)],
        )
        .await;
        let newest_first: Vec<Uuid> = ids.iter().rev().copied().collect();
        let mut query = SessionQuery {
            page_size: 3,
            ..SessionQuery::default()
        };
        let mut pages = Vec::new();
        loop {
            let page = store.list_sessions(&query).await.unwrap();
            assert!(page.len() <= 3);
            let Some(last) = page.last() else { break };
            query.after = Some((last.created_at, last.id));
            pages.push(ids_of(&page));
        }
        assert_eq!(pages.len(), 3);
        assert_eq!(pages.concat(), newest_first);
        // `after` is exclusive and needs no stored session at that position.
        let record = store.get_session(ids[2]).await.unwrap().unwrap();
        let after = SessionQuery {
            page_size: 10,
            after: Some((record.created_at, record.id)),
            ..SessionQuery::default()
        };
        assert_eq!(
            ids_of(&store.list_sessions(&after).await.unwrap()),
            [ids[1], ids[0]]
        );
        let between = SessionQuery {
            page_size: 10,
            after: Some((record.created_at + Duration::from_micros(1), Uuid::nil())),
            ..SessionQuery::default()
        };
        assert_eq!(
            ids_of(&store.list_sessions(&between).await.unwrap()),
            [ids[3], ids[2], ids[1], ids[0]]
        );
        // A position between two stored microseconds (finer than stores keep times).
        let finer = SessionQuery {
            page_size: 10,
            after: Some((record.created_at + Duration::from_nanos(500), Uuid::nil())),
            ..SessionQuery::default()
        };
        assert_eq!(
            ids_of(&store.list_sessions(&finer).await.unwrap()),
            [ids[3], ids[2], ids[1], ids[0]]
        );
        let just_before = SessionQuery {
            page_size: 10,
            after: Some((record.created_at - Duration::from_nanos(500), Uuid::max())),
            ..SessionQuery::default()
        };
        assert_eq!(
            ids_of(&store.list_sessions(&just_before).await.unwrap()),
            [ids[0]]
        );
        let zero = SessionQuery {
            page_size: 0,
            ..SessionQuery::default()
        };
        assert!(store.list_sessions(&zero).await.unwrap().is_empty());
    }

    pub(crate) async fn list_sessions_filters_by_status(store: S) {
        let mut by_status = Vec::new();
        for (i, status) in SessionStatus::ALL.into_iter().enumerate() {
            let mut record = session("user:alice", i as u64);
            record.status = status;
            store.create_session(&record).await.unwrap();
            by_status.push((status, record.id));
        }
        let query = |statuses: Vec<SessionStatus>| SessionQuery {
            statuses,
            page_size: 100,
            ..SessionQuery::default()
        };
        let idle = store
            .list_sessions(&query(vec![SessionStatus::Idle]))
            .await
            .unwrap();
        assert_eq!(ids_of(&idle), [by_status[1].1]);
        let some = store
            .list_sessions(&query(vec![SessionStatus::Closed, SessionStatus::Starting]))
            .await
            .unwrap();
        assert_eq!(ids_of(&some), [by_status[6].1, by_status[0].1]);
        let every = store
            .list_sessions(&query(SessionStatus::ALL.to_vec()))
            .await
            .unwrap();
        assert_eq!(every.len(), 7);
        assert_eq!(store.list_sessions(&query(vec![])).await.unwrap().len(), 7);
    }

    pub(crate) async fn list_sessions_requires_every_label_pair_to_match_exactly(store: S) {
        let labelled = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        let mut ids_by_name = BTreeMap::new();
        for (i, (name, labels)) in [
            ("both", labelled(&[("team", "core"), ("env", "prod")])),
            ("team only", labelled(&[("team", "core")])),
            ("other env", labelled(&[("team", "core"), ("env", "dev")])),
            ("near miss", labelled(&[("team", "Core"), ("env", "prod ")])),
            ("none", labelled(&[])),
        ]
        .into_iter()
        .enumerate()
        {
            let mut record = session("user:alice", i as u64);
            record.labels = labels;
            store.create_session(&record).await.unwrap();
            ids_by_name.insert(name, record.id);
        }
        let matching = |pairs: &[(&str, &str)]| {
            let store = store.clone();
            let query = SessionQuery {
                labels: labelled(pairs),
                page_size: 100,
                ..SessionQuery::default()
            };
            async move {
                let mut found = ids_of(&store.list_sessions(&query).await.unwrap());
                found.sort();
                found
            }
        };
        let sorted = |names: &[&str]| {
            let mut found: Vec<Uuid> = names.iter().map(|n| ids_by_name[n]).collect();
            found.sort();
            found
        };
        assert_eq!(
            matching(&[("team", "core")]).await,
            sorted(&["both", "team only", "other env"])
        );
        assert_eq!(
            matching(&[("team", "core"), ("env", "prod")]).await,
            sorted(&["both"])
        );
        assert_eq!(matching(&[("env", "prod")]).await, sorted(&["both"]));
        assert_eq!(matching(&[("env", "staging")]).await, sorted(&[]));
        assert_eq!(matching(&[]).await.len(), 5);
    }

    pub(crate) async fn list_sessions_filters_by_owner_or_editor(store: S) {
        let mut owned = session("user:alice", 1);
        owned.editors = vec!["user:bob".to_owned()];
        let mut edited = session("user:carol", 2);
        edited.editors = vec!["user:dave".to_owned(), "user:alice".to_owned()];
        let unrelated = session("user:carol", 3);
        let prefix = session("user:alice2", 4);
        for record in [&owned, &edited, &unrelated, &prefix] {
            store.create_session(record).await.unwrap();
        }
        let of = |who: &str| {
            let store = store.clone();
            let query = SessionQuery {
                owner_or_editor: Some(who.to_owned()),
                page_size: 100,
                ..SessionQuery::default()
            };
            async move { ids_of(&store.list_sessions(&query).await.unwrap()) }
        };
        assert_eq!(of("user:alice").await, [edited.id, owned.id]);
        assert_eq!(of("user:bob").await, [owned.id]);
        assert_eq!(of("user:carol").await, [unrelated.id, edited.id]);
        assert_eq!(of("user:dave").await, [edited.id]);
        assert!(of("user:nobody").await.is_empty());
        assert_eq!(store.list_sessions(&all()).await.unwrap().len(), 4);
    }

    pub(crate) async fn list_sessions_ands_every_filter_together(store: S) {
        let mut expected = Vec::new();
        for i in 0..16u64 {
            let mut record = session(if i % 2 == 0 { "user:alice" } else { "user:bob" }, i);
            record.status = if i % 4 < 2 {
                SessionStatus::Idle
            } else {
                SessionStatus::Closed
            };
            if i % 8 < 4 {
                record.labels.insert("env".to_owned(), "prod".to_owned());
            }
            if i == 13 {
                record.editors.push("user:alice".to_owned());
            }
            let matches = (record.owner == "user:alice"
                || record.editors.iter().any(|e| e == "user:alice"))
                && record.status == SessionStatus::Idle
                && record.labels.get("env").map(String::as_str) == Some("prod");
            store.create_session(&record).await.unwrap();
            if matches {
                expected.push(record);
            }
        }
        expected.reverse();
        assert_eq!(expected.len(), 2);
        let mut query = SessionQuery {
            owner_or_editor: Some("user:alice".to_owned()),
            statuses: vec![SessionStatus::Idle],
            labels: BTreeMap::from([("env".to_owned(), "prod".to_owned())]),
            page_size: 100,
            after: None,
        };
        assert_eq!(store.list_sessions(&query).await.unwrap(), expected);
        query.page_size = 1;
        let first = store.list_sessions(&query).await.unwrap();
        assert_eq!(first, expected[..1]);
        query.after = Some((first[0].created_at, first[0].id));
        assert_eq!(store.list_sessions(&query).await.unwrap(), expected[1..]);
    }

    pub(crate) async fn count_live_sessions_and_open_sessions_ignore_closed_sessions(store: S) {
        let mut open_ids = Vec::new();
        for (i, status) in SessionStatus::ALL.into_iter().enumerate() {
            let mut record = session("user:alice", i as u64);
            record.status = status;
            store.create_session(&record).await.unwrap();
            if status != SessionStatus::Closed {
                open_ids.push(record.id);
            }
        }
        let mut bobs = session("user:bob", 50);
        store.create_session(&bobs).await.unwrap();
        open_ids.push(bobs.id);
        assert_eq!(store.count_live_sessions("user:alice").await.unwrap(), 6);
        assert_eq!(store.count_live_sessions("user:bob").await.unwrap(), 1);
        assert_eq!(store.count_live_sessions("user:nobody").await.unwrap(), 0);
        let mut open = ids_of(&store.open_sessions().await.unwrap());
        open.sort();
        open_ids.sort();
        assert_eq!(open, open_ids);

        // Closing through a batch takes the session out of both.
        bobs.status = SessionStatus::Closed;
        store
            .commit(
                bobs.id,
                Batch {
                    session: Some(bobs.clone()),
                    ..Batch::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(store.count_live_sessions("user:bob").await.unwrap(), 0);
        let open = store.open_sessions().await.unwrap();
        assert_eq!(open.len(), 6);
        assert!(open.iter().all(|r| r.status != SessionStatus::Closed));
        assert!(open.iter().all(|r| r.labels.contains_key("team")));
    }

    pub(crate) async fn usage_is_recorded_with_a_batch_summed_per_group_and_outlives_its_session(
        store: S,
    ) {
        use crate::domain::usage::{UsageQuery, UsageRecord, UsageReport};
        let alices = session("user:alice", 1);
        let bobs = session("user:bob", 2);
        store.create_session(&alices).await.unwrap();
        store.create_session(&bobs).await.unwrap();
        let start = crate::domain::now();
        let record =
            |s: &crate::domain::session::SessionRecord, input, output, cost, currency: &str| {
                UsageRecord {
                    session_id: s.id,
                    principal: s.owner.clone(),
                    profile: s.profile.clone(),
                    at: start,
                    input_tokens: input,
                    output_tokens: output,
                    cost_micros: cost,
                    currency: currency.to_owned(),
                    source: crate::domain::usage::UsageSource::Agent,
                    action_id: None,
                }
            };
        // One of the model proxy's, in a turn: its own group, summed with the rest.
        let proxied = UsageRecord {
            source: crate::domain::usage::UsageSource::ModelProxy,
            action_id: Some(crate::domain::ActionId::mint()),
            ..record(&alices, 1000, 100, 0, "")
        };
        for (s, usage) in [
            (&alices, record(&alices, 100, 10, 0, "")),
            (&alices, record(&alices, 0, 0, 50_000, "USD")),
            (&alices, record(&alices, 200, 20, 25_000, "USD")),
            (&bobs, record(&bobs, 7, 3, 1, "EUR")),
            (&alices, proxied),
        ] {
            store
                .commit(
                    s.id,
                    Batch {
                        usage: vec![usage],
                        ..Batch::default()
                    },
                )
                .await
                .unwrap();
        }
        let all = UsageReport::of(&store.usage(&UsageQuery::default()).await.unwrap());
        let alice = &all.by_principal["user:alice"];
        assert_eq!((alice.input_tokens, alice.output_tokens), (1300, 130));
        {
            use crate::domain::usage::UsageSource::{Agent, ModelProxy};
            let split = &all.by_session[&alices.id].by_source;
            assert_eq!(split[&Agent].tokens(), 330);
            assert_eq!(split[&ModelProxy].tokens(), 1100);
            assert_eq!(all.by_source[&Agent].tokens(), 340);
            assert_eq!(all.by_source[&ModelProxy].tokens(), 1100);
        }
        assert_eq!(alice.costs.get("USD"), Some(&75_000));
        assert_eq!(all.by_principal["user:bob"].costs.get("EUR"), Some(&1));
        assert_eq!(all.by_session.len(), 2);
        let only_bob = UsageQuery {
            principal: Some("user:bob".into()),
            ..UsageQuery::default()
        };
        assert_eq!(store.usage(&only_bob).await.unwrap().len(), 1);
        let later = UsageQuery {
            since: Some(start + std::time::Duration::from_secs(1)),
            ..UsageQuery::default()
        };
        assert!(store.usage(&later).await.unwrap().is_empty());
        let one_session = UsageQuery {
            session_id: Some(alices.id),
            ..UsageQuery::default()
        };
        assert_eq!(
            store.usage(&one_session).await.unwrap().len(),
            3,
            "per source and currency"
        );
        assert!(store.delete_session(alices.id).await.unwrap());
        let after = UsageReport::of(&store.usage(&UsageQuery::default()).await.unwrap());
        assert_eq!(after, all, "a deleted session's usage still counts");
    }

    /// Figures no agent could use (stored before they were clamped, or many clamped ones)
    /// saturate the sums at the bounds of `i64`; the read never fails.
    pub(crate) async fn usage_sums_past_the_integer_range_saturate_instead_of_failing(store: S) {
        use crate::domain::usage::{UsageQuery, UsageRecord, UsageReport};
        let owned = session("user:mallory", 1);
        store.create_session(&owned).await.unwrap();
        let huge = 6_000_000_000_000_000_000;
        for _ in 0..2 {
            let record = UsageRecord {
                session_id: owned.id,
                principal: owned.owner.clone(),
                profile: owned.profile.clone(),
                at: crate::domain::now(),
                input_tokens: huge,
                output_tokens: huge + 7,
                cost_micros: huge as i64,
                currency: "USD".to_owned(),
                source: crate::domain::usage::UsageSource::Agent,
                action_id: None,
            };
            store
                .commit(
                    owned.id,
                    Batch {
                        usage: vec![record],
                        ..Batch::default()
                    },
                )
                .await
                .unwrap();
        }
        let rows = store
            .usage(&UsageQuery::default())
            .await
            .expect("the sums read, saturated");
        assert_eq!(rows.len(), 1);
        let max = i64::MAX as u64;
        assert_eq!((rows[0].input_tokens, rows[0].output_tokens), (max, max));
        assert_eq!(rows[0].cost_micros, i64::MAX);
        let report = UsageReport::of(&rows);
        assert_eq!(report.by_principal["user:mallory"].tokens(), 2 * max);
        // Below the bound, sums stay exact, odd figures included.
        let exact = session("user:ada", 2);
        store.create_session(&exact).await.unwrap();
        for input in [(1 << 62) + 3, (1 << 61) + 5] {
            let record = UsageRecord {
                session_id: exact.id,
                principal: exact.owner.clone(),
                profile: exact.profile.clone(),
                at: crate::domain::now(),
                input_tokens: input,
                output_tokens: 1,
                cost_micros: 0,
                currency: String::new(),
                source: crate::domain::usage::UsageSource::Agent,
                action_id: None,
            };
            store
                .commit(
                    exact.id,
                    Batch {
                        usage: vec![record],
                        ..Batch::default()
                    },
                )
                .await
                .unwrap();
        }
        let only_ada = UsageQuery {
            principal: Some("user:ada".into()),
            ..UsageQuery::default()
        };
        let rows = store.usage(&only_ada).await.unwrap();
        assert_eq!(rows[0].input_tokens, (1 << 62) + (1 << 61) + 8);
        assert_eq!(rows[0].output_tokens, 2);
    }

    pub(crate) async fn a_capped_create_stores_only_while_the_owner_has_fewer_live_sessions(
        store: S,
    ) {
        use crate::store::CappedCreate;
        let mut first = session("user:alice", 1);
        let second = session("user:alice", 2);
        assert_eq!(
            store.create_session_capped(&first, 2).await.unwrap(),
            CappedCreate::Created
        );
        assert_eq!(
            store.create_session_capped(&second, 2).await.unwrap(),
            CappedCreate::Created
        );
        let third = session("user:alice", 3);
        assert_eq!(
            store.create_session_capped(&third, 2).await.unwrap(),
            CappedCreate::AtCap
        );
        assert_eq!(store.get_session(third.id).await.unwrap(), None);
        // Another owner has a cap of its own.
        assert_eq!(
            store
                .create_session_capped(&session("user:bob", 4), 2)
                .await
                .unwrap(),
            CappedCreate::Created
        );
        // A closed session no longer counts.
        first.status = SessionStatus::Closed;
        store
            .commit(
                first.id,
                Batch {
                    session: Some(first.clone()),
                    ..Batch::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(
            store.create_session_capped(&third, 2).await.unwrap(),
            CappedCreate::Created
        );
        assert_eq!(store.get_session(third.id).await.unwrap(), Some(third));
        let taken = store
            .create_session_capped(&first, 5)
            .await
            .expect_err("the id is taken");
        assert_eq!(taken.code, ErrorCode::SessionExists);
    }

    pub(crate) async fn a_change_mark_moves_with_the_log_the_record_and_the_queue_and_only_then(
        store: S,
    ) {
        let mut record = session("user:alice", 1);
        store.create_session(&record).await.unwrap();
        let other = created(&store, "user:alice", 2).await;
        let unknown = Uuid::now_v7();
        let id = record.id;
        let mark = async |store: &S| {
            let marks = store.change_marks(&[id, other, unknown]).await.unwrap();
            let ids: Vec<Uuid> = marks.iter().map(|(id, _)| *id).collect();
            assert!(!ids.contains(&unknown), "an unknown session has no mark");
            marks
                .into_iter()
                .find(|(found, _)| *found == id)
                .map(|(_, mark)| mark)
                .expect("a mark for the session")
        };
        let start = mark(&store).await;
        assert_eq!(
            mark(&store).await,
            start,
            "nothing changed, nor does the mark"
        );
        // Another session's changes are not this one's.
        store.commit(other, entries(frames(1, 2))).await.unwrap();
        assert_eq!(mark(&store).await, start);

        store
            .commit(record.id, entries(frames(1, 3)))
            .await
            .unwrap();
        let logged = mark(&store).await;
        assert_eq!(logged.head, 3);
        assert_ne!(logged, start);

        let queued = prompt("queued");
        store
            .commit(record.id, queue(vec![QueueOp::PushBack(queued.clone())]))
            .await
            .unwrap();
        let pushed = mark(&store).await;
        assert_ne!(pushed, logged, "a queue push moves the mark");
        let mut edited = queued.clone();
        edited.work = QueuedWork::Prompt(PromptAction::text("edited"));
        store
            .commit(record.id, queue(vec![QueueOp::Update(edited)]))
            .await
            .unwrap();
        let updated = mark(&store).await;
        assert_ne!(updated, pushed, "an edit in place moves the mark");

        record.status = SessionStatus::Suspended;
        record.status_reason = "idle timeout".to_owned();
        store
            .commit(
                record.id,
                Batch {
                    session: Some(record.clone()),
                    ..Batch::default()
                },
            )
            .await
            .unwrap();
        let suspended = mark(&store).await;
        assert_ne!(suspended, updated, "a status change moves the mark");
        assert_eq!(suspended.head, 3);

        store.delete_session(record.id).await.unwrap();
        let marks = store.change_marks(&[record.id]).await.unwrap();
        assert!(marks.is_empty(), "a deleted session has no mark");
        assert!(store.change_marks(&[]).await.unwrap().is_empty());
    }

    pub(crate) async fn deleting_a_session_removes_its_log_queue_and_actions_and_reports_whether_it_existed(
        store: S,
    ) {
        let mut record = session("user:alice", 1);
        record.editors = vec!["user:bob".to_owned()];
        store.create_session(&record).await.unwrap();
        let id = record.id;
        let kept = created(&store, "user:alice", 2).await;
        let queued = prompt("queued");
        let batch = || Batch {
            entries: frames(1, 3),
            queue: vec![QueueOp::PushBack(queued.clone())],
            new_actions: vec![action(queued.action_id, ActionState::Queued)],
            ..Batch::default()
        };
        store.commit(id, batch()).await.unwrap();
        store.commit(kept, batch()).await.unwrap();

        assert!(store.delete_session(id).await.unwrap());
        assert_eq!(store.get_session(id).await.unwrap(), None);
        assert!(whole_log(&store, id).await.is_empty());
        assert_eq!(store.head_offset(id).await.unwrap(), 0);
        assert!(store.load_queue(id).await.unwrap().is_empty());
        assert_eq!(store.find_action(id, queued.action_id).await.unwrap(), None);
        assert_eq!(ids_of(&store.list_sessions(&all()).await.unwrap()), [kept]);
        let bobs = SessionQuery {
            owner_or_editor: Some("user:bob".to_owned()),
            page_size: 10,
            ..SessionQuery::default()
        };
        assert!(store.list_sessions(&bobs).await.unwrap().is_empty());
        assert!(!store.delete_session(id).await.unwrap());
        assert!(!store.delete_session(Uuid::now_v7()).await.unwrap());
        let err = store
            .commit(id, entries(frames(4, 4)))
            .await
            .map_err(crate::domain::Error::from)
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::SessionNotFound);

        // The other session is untouched.
        assert_eq!(whole_log(&store, kept).await, frames(1, 3));
        assert_eq!(store.load_queue(kept).await.unwrap(), vec![queued.clone()]);
        assert!(
            store
                .find_action(kept, queued.action_id)
                .await
                .unwrap()
                .is_some()
        );

        // The id can be used again, starting empty.
        store.create_session(&record).await.unwrap();
        assert_eq!(store.head_offset(id).await.unwrap(), 0);
        assert!(store.load_queue(id).await.unwrap().is_empty());
        assert_eq!(store.find_action(id, queued.action_id).await.unwrap(), None);
        store.commit(id, batch()).await.unwrap();
        assert_eq!(whole_log(&store, id).await, frames(1, 3));
    }

    pub(crate) async fn retention_deletes_closed_sessions_closed_before_the_cutoff_longest_closed_first_in_batches(
        store: S,
    ) {
        // Closed at 10, 20, 30 and 40 ms; open since 1 ms; the cutoff is 35 ms.
        let mut closed = Vec::new();
        for ms in [30, 10, 40, 20] {
            let mut record = session("user:alice", ms);
            record.status = SessionStatus::Closed;
            record.updated_at = at(ms);
            store.create_session(&record).await.unwrap();
            let queued = prompt("left behind");
            store
                .commit(
                    record.id,
                    Batch {
                        entries: frames(1, 2),
                        queue: vec![QueueOp::PushBack(queued.clone())],
                        new_actions: vec![action(queued.action_id, ActionState::Queued)],
                        ..Batch::default()
                    },
                )
                .await
                .unwrap();
            closed.push((ms, record.id));
        }
        let mut open = session("user:alice", 0);
        open.updated_at = at(1);
        store.create_session(&open).await.unwrap();
        store.commit(open.id, entries(frames(1, 2))).await.unwrap();
        let by_ms = |ms| closed.iter().find(|(m, _)| *m == ms).unwrap().1;

        let first = store.delete_closed_before(at(35), 2).await.unwrap();
        assert_eq!(first, [by_ms(10), by_ms(20)], "the longest closed first");
        let second = store.delete_closed_before(at(35), 2).await.unwrap();
        assert_eq!(second, [by_ms(30)]);
        assert!(
            store
                .delete_closed_before(at(35), 2)
                .await
                .unwrap()
                .is_empty()
        );
        for ms in [10, 20, 30] {
            let id = by_ms(ms);
            assert_eq!(store.get_session(id).await.unwrap(), None);
            assert!(whole_log(&store, id).await.is_empty());
            assert!(store.load_queue(id).await.unwrap().is_empty());
        }
        let mut left = ids_of(&store.list_sessions(&all()).await.unwrap());
        left.sort();
        let mut expected = vec![by_ms(40), open.id];
        expected.sort();
        assert_eq!(left, expected);
        assert_eq!(whole_log(&store, by_ms(40)).await, frames(1, 2));
        assert_eq!(whole_log(&store, open.id).await, frames(1, 2));
        // Giving space back never fails, whether the store can or not.
        store.reclaim_space(16).await.unwrap();
    }

    /// What a writer does after a commit whose answer was lost: each kind of batch is read back
    /// as not stored before its commit and as stored after it.
    pub(crate) async fn a_read_back_tells_a_stored_batch_from_one_never_committed(store: S) {
        use crate::store::{Probe, landed};
        let mut record = session("user:alice", 1);
        store.create_session(&record).await.unwrap();
        let id = record.id;
        let queued = prompt("read back");
        let mut edited = queued.clone();
        edited.actor = "user:bob".to_owned();
        record.updated_at = at(99);
        let batches = [
            entries(frames(1, 2)),
            Batch {
                queue: vec![QueueOp::PushBack(queued.clone())],
                new_actions: vec![action(queued.action_id, ActionState::Queued)],
                ..Batch::default()
            },
            Batch {
                queue: vec![QueueOp::Update(edited)],
                ..Batch::default()
            },
            Batch {
                queue: vec![QueueOp::Remove(queued.action_id)],
                action_states: vec![(queued.action_id, ActionState::Removed)],
                ..Batch::default()
            },
            Batch {
                session: Some(record),
                ..Batch::default()
            },
        ];
        for batch in batches {
            let probe = Probe::of(&batch);
            assert_ne!(probe, Probe::Nothing);
            assert!(
                !landed(store.as_ref(), id, &probe).await.unwrap(),
                "{probe:?} before its commit"
            );
            store.commit(id, batch).await.unwrap();
            assert!(
                landed(store.as_ref(), id, &probe).await.unwrap(),
                "{probe:?} after its commit"
            );
        }
    }
}

/// One `#[tokio::test]` per case for the backend `$backend`, opened by the async fn `$open`.
#[cfg(test)]
macro_rules! conformance_suite {
    ($backend:ident, $open:path) => {
        conformance_suite!(@cases $backend, $open;
            a_created_session_reads_back_exactly,
            creating_a_session_with_a_taken_id_fails_with_session_exists,
            an_unknown_session_reads_as_absent_and_empty,
            a_batch_continuing_densely_from_the_head_is_appended,
            a_batch_whose_offsets_leave_a_gap_changes_nothing,
            a_batch_that_overlaps_the_log_changes_nothing,
            a_batch_whose_offsets_are_not_dense_inside_it_changes_nothing,
            read_log_pages_by_after_and_limit_in_offset_order,
            read_log_keeps_the_exact_json_text_and_every_field,
            sessions_never_see_each_others_logs_queues_or_action_ids,
            head_offset_is_zero_for_an_empty_log_then_the_newest_offset,
            push_back_appends_and_push_front_puts_the_newest_interrupt_first,
            an_update_replaces_the_content_but_keeps_the_position,
            remove_takes_out_one_entry_and_clear_empties_the_queue,
            queued_entries_keep_their_work_context_attachments_and_traceparent,
            taking_the_head_of_the_queue_and_appending_its_frame_is_one_change,
            a_new_action_id_is_recorded_and_found_by_id,
            an_action_id_already_recorded_fails_the_whole_batch_with_action_id_conflict,
            the_same_action_id_in_another_session_is_fine,
            action_states_change_recorded_ids_and_ignore_unknown_ones,
            a_batch_with_a_session_record_replaces_it_including_labels_and_editors,
            an_empty_batch_for_a_known_session_succeeds_and_changes_nothing,
            a_commit_to_an_unknown_session_fails_with_session_not_found,
            list_sessions_is_newest_first_with_ties_broken_by_id_descending,
            list_sessions_pages_with_an_exclusive_after_and_at_most_page_size,
            list_sessions_filters_by_status,
            list_sessions_requires_every_label_pair_to_match_exactly,
            list_sessions_filters_by_owner_or_editor,
            list_sessions_ands_every_filter_together,
            count_live_sessions_and_open_sessions_ignore_closed_sessions,
            usage_is_recorded_with_a_batch_summed_per_group_and_outlives_its_session,
            usage_sums_past_the_integer_range_saturate_instead_of_failing,
            a_capped_create_stores_only_while_the_owner_has_fewer_live_sessions,
            a_change_mark_moves_with_the_log_the_record_and_the_queue_and_only_then,
            deleting_a_session_removes_its_log_queue_and_actions_and_reports_whether_it_existed,
            a_read_back_tells_a_stored_batch_from_one_never_committed,
            retention_deletes_closed_sessions_closed_before_the_cutoff_longest_closed_first_in_batches,
        );
    };
    (@cases $backend:ident, $open:path; $($case:ident),+ $(,)?) => {
        mod $backend {
            $(
                #[tokio::test]
                async fn $case() {
                    let Some(backend) = $open().await else {
                        return;
                    };
                    super::within(super::cases::$case(backend.store.clone())).await;
                    backend.finish().await;
                }
            )+
        }
    };
}

#[cfg(test)]
conformance_suite!(memory, super::backends::memory);
#[cfg(test)]
conformance_suite!(sqlite, super::backends::sqlite);
#[cfg(test)]
conformance_suite!(postgres, super::backends::postgres);
#[cfg(test)]
conformance_suite!(postgres_tls, super::backends::postgres_tls);
