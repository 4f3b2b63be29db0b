//! Behaviour only the SQLite store has: the file, durability across reopening, the writer's
//! group commit, corrupt rows. The shared behaviour is in `store::conformance`.

use std::{
    future::Future,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use tempfile::TempDir;
use uuid::Uuid;

use super::{DB_FILE_NAME, SqliteStore};
use crate::{
    domain::{
        ActionId, ErrorCode,
        queue::QueuedEntry,
        session::{SessionRecord, SessionStatus},
    },
    store::SqliteSynchronous,
    store::{
        ActionRecord, ActionState, Batch, Direction, LogEntry, QueueOp, SessionQuery, Store,
        conformance::fixtures::*,
    },
};

const TIMEOUT: Duration = Duration::from_secs(120);

async fn within<F: Future>(test: F) -> F::Output {
    tokio::time::timeout(TIMEOUT, test)
        .await
        .expect("the test finished within its timeout")
}

fn db_path(dir: &TempDir) -> PathBuf {
    dir.path().join(DB_FILE_NAME)
}

fn open(path: &Path) -> SqliteStore {
    SqliteStore::open(path, SqliteSynchronous::Normal).expect("the store opens")
}

fn all() -> SessionQuery {
    SessionQuery {
        page_size: 1000,
        ..SessionQuery::default()
    }
}

/// Everything a store holds about some sessions, for before/after comparisons.
#[derive(Debug, PartialEq)]
struct Snapshot {
    listed: Vec<SessionRecord>,
    open: Vec<SessionRecord>,
    live_for_alice: u64,
    per_session: Vec<SessionSnapshot>,
}

#[derive(Debug, PartialEq)]
struct SessionSnapshot {
    id: Uuid,
    head: u64,
    log: Vec<LogEntry>,
    queue: Vec<QueuedEntry>,
    actions: Vec<Option<ActionRecord>>,
}

async fn snapshot(store: &dyn Store, sessions: &[Uuid], actions: &[ActionId]) -> Snapshot {
    let mut per_session = Vec::new();
    for &id in sessions {
        let mut found = Vec::new();
        for &action_id in actions {
            found.push(store.find_action(id, action_id).await.unwrap());
        }
        per_session.push(SessionSnapshot {
            id,
            head: store.head_offset(id).await.unwrap(),
            log: store.read_log(id, 0, usize::MAX).await.unwrap(),
            queue: store.load_queue(id).await.unwrap(),
            actions: found,
        });
    }
    Snapshot {
        listed: store.list_sessions(&all()).await.unwrap(),
        open: store.open_sessions().await.unwrap(),
        live_for_alice: store.count_live_sessions("user:alice").await.unwrap(),
        per_session,
    }
}

/// Builds varied state: three sessions (one deleted), logs with a large row, a reordered and
/// edited queue, action ids in every state, a replaced record with labels and editors.
async fn populate(store: &dyn Store) -> (Vec<Uuid>, Vec<ActionId>) {
    let mut first = session("user:alice", 1);
    first.editors = vec!["user:bob".to_owned()];
    let second = session("user:alice", 2);
    let doomed = session("user:carol", 3);
    for record in [&first, &second, &doomed] {
        store.create_session(record).await.unwrap();
    }
    let [a, b, c] = ["a", "b", "c"].map(prompt);
    let interrupt = rich_prompt();
    let mut log = frames(1, 3);
    log[2].json = format!(r#"{{"big":"{}"}}"#, "é".repeat(1 << 20));
    log[1].action_id = Some(a.action_id);
    log[1].direction = Direction::ToRuntime;
    store
        .commit(
            first.id,
            Batch {
                entries: log,
                queue: vec![
                    QueueOp::PushBack(a.clone()),
                    QueueOp::PushBack(b.clone()),
                    QueueOp::PushBack(c.clone()),
                    QueueOp::PushFront(interrupt.clone()),
                ],
                new_actions: vec![
                    action(a.action_id, ActionState::Queued),
                    action(b.action_id, ActionState::Queued),
                    action(c.action_id, ActionState::Queued),
                    action(interrupt.action_id, ActionState::Queued),
                ],
                ..Batch::default()
            },
        )
        .await
        .unwrap();
    let mut edited = b.clone();
    edited.actor = "user:bob".to_owned();
    let mut replaced = first.clone();
    replaced.status = SessionStatus::Running;
    replaced.labels.insert("env".to_owned(), "prod".to_owned());
    replaced.editors.push("user:dave".to_owned());
    store
        .commit(
            first.id,
            Batch {
                entries: frames(4, 4),
                queue: vec![
                    QueueOp::Remove(interrupt.action_id),
                    QueueOp::Update(edited),
                    QueueOp::Remove(c.action_id),
                ],
                action_states: vec![
                    (interrupt.action_id, ActionState::Sent),
                    (c.action_id, ActionState::Removed),
                ],
                session: Some(replaced),
                ..Batch::default()
            },
        )
        .await
        .unwrap();
    let mut closed = second.clone();
    closed.status = SessionStatus::Closed;
    store
        .commit(
            second.id,
            Batch {
                entries: frames(1, 2),
                session: Some(closed),
                ..Batch::default()
            },
        )
        .await
        .unwrap();
    store
        .commit(doomed.id, entries(frames(1, 5)))
        .await
        .unwrap();
    assert!(store.delete_session(doomed.id).await.unwrap());
    (
        vec![first.id, second.id, doomed.id],
        vec![a.action_id, b.action_id, c.action_id, interrupt.action_id],
    )
}

#[tokio::test]
async fn every_kind_of_state_survives_closing_and_reopening_the_file() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&db_path(&dir));
        let (sessions, actions) = populate(&store).await;
        let before = snapshot(&store, &sessions, &actions).await;
        assert_eq!(before.listed.len(), 2);
        store.close().await.unwrap();
        drop(store);

        let store = open(&db_path(&dir));
        assert_eq!(snapshot(&store, &sessions, &actions).await, before);

        // The reopened store carries on where the old one stopped.
        let first = sessions[0];
        store.commit(first, entries(frames(5, 6))).await.unwrap();
        let err = store
            .commit(first, entries(frames(5, 5)))
            .await
            .map_err(crate::domain::Error::from)
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Internal);
        let front = prompt("front");
        let back = prompt("back");
        store
            .commit(
                first,
                queue(vec![
                    QueueOp::PushFront(front.clone()),
                    QueueOp::PushBack(back.clone()),
                ]),
            )
            .await
            .unwrap();
        let queue = store.load_queue(first).await.unwrap();
        assert_eq!(queue.len(), 4);
        assert_eq!(queue[0], front);
        assert_eq!(queue[3], back);
        let err = store
            .commit(
                first,
                Batch {
                    new_actions: vec![action(actions[0], ActionState::Queued)],
                    ..Batch::default()
                },
            )
            .await
            .map_err(crate::domain::Error::from)
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::ActionIdConflict);
        store.close().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn dropping_the_store_without_closing_keeps_every_acknowledged_change() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&db_path(&dir));
        let (sessions, actions) = populate(&store).await;
        let before = snapshot(&store, &sessions, &actions).await;
        drop(store);
        let store = open(&db_path(&dir));
        assert_eq!(snapshot(&store, &sessions, &actions).await, before);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_commits_from_a_hundred_sessions_land_densely_in_fewer_transactions()
{
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(open(&db_path(&dir)));
        let mut sessions = Vec::new();
        for i in 0..100 {
            let record = session("user:alice", i);
            store.create_session(&record).await.unwrap();
            sessions.push(record.id);
        }
        let before = store.write_transactions();
        let tasks: Vec<_> = sessions
            .iter()
            .map(|&id| {
                let store = store.clone();
                tokio::spawn(async move {
                    for offset in 1..=10u64 {
                        let mut entry =
                            frame(offset, &format!(r#"{{"session":"{id}","n":{offset}}}"#));
                        let action_id = ActionId::mint();
                        entry.action_id = Some(action_id);
                        store
                            .commit(
                                id,
                                Batch {
                                    entries: vec![entry],
                                    new_actions: vec![action(action_id, ActionState::Sent)],
                                    ..Batch::default()
                                },
                            )
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let transactions = store.write_transactions() - before;
        for &id in &sessions {
            let log = store.read_log(id, 0, usize::MAX).await.unwrap();
            let offsets: Vec<u64> = log.iter().map(|e| e.offset).collect();
            assert_eq!(offsets, (1..=10).collect::<Vec<_>>());
            for entry in &log {
                assert_eq!(
                    entry.json,
                    format!(r#"{{"session":"{id}","n":{}}}"#, entry.offset)
                );
                let recorded = store
                    .find_action(id, entry.action_id.unwrap())
                    .await
                    .unwrap();
                assert!(recorded.is_some());
            }
        }
        println!("1000 commits from 100 sessions took {transactions} transactions");
        assert!(
            transactions < 1000,
            "group commit shared no transaction: {transactions} for 1000 commits"
        );
        store.close().await.unwrap();
    })
    .await;
}

/// A commit made while nothing waits for the writer is applied by its caller (no hand-off to
/// the writer thread and back), and is as durable as any: it is in the file after a reopen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_commit_on_a_free_writer_is_applied_in_place_and_survives_reopening() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let path = db_path(&dir);
        let store = open(&path);
        let record = session("user:alice", 1);
        store.create_session(&record).await.unwrap();
        let batch = Batch {
            entries: vec![frame(1, r#"{"n":1}"#)],
            ..Batch::default()
        };
        store.commit(record.id, batch).await.unwrap();
        assert_eq!(store.commits_applied_in_place(), 1);
        store.close().await.unwrap();
        drop(store);
        let reopened = open(&path);
        let log = reopened.read_log(record.id, 0, 10).await.unwrap();
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].json, r#"{"n":1}"#);
    })
    .await;
}

/// With `synchronous=FULL` a commit syncs the disk: it never runs on its caller's thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_synchronous_full_every_commit_goes_through_the_writer_thread() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(db_path(&dir), SqliteSynchronous::Full).unwrap();
        let record = session("user:alice", 1);
        store.create_session(&record).await.unwrap();
        for offset in 1..=3 {
            let batch = Batch {
                entries: vec![frame(offset, r#"{"n":1}"#)],
                ..Batch::default()
            };
            store.commit(record.id, batch).await.unwrap();
        }
        assert_eq!(store.commits_applied_in_place(), 0);
        assert_eq!(store.read_log(record.id, 0, 10).await.unwrap().len(), 3);
        store.close().await.unwrap();
    })
    .await;
}

/// A commit that finds others waiting joins their group instead of overtaking them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_made_while_others_wait_for_the_writer_joins_their_group() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(open(&db_path(&dir)));
        let a = session("user:alice", 1);
        let b = session("user:alice", 2);
        store.create_session(&a).await.unwrap();
        store.create_session(&b).await.unwrap();
        let resume = store.pause_writer().await;
        let before = store.write_transactions();
        // Each commits its session's first entry from a task of its own.
        let commit_first_entry = |id: Uuid| {
            let store = store.clone();
            tokio::spawn(async move {
                let batch = Batch {
                    entries: vec![frame(1, r#"{"n":1}"#)],
                    ..Batch::default()
                };
                store.commit(id, batch).await
            })
        };
        let first = commit_first_entry(a.id);
        until_queued(&store, 1).await;
        let second = commit_first_entry(b.id);
        until_queued(&store, 2).await;
        resume.send(()).unwrap();
        first.await.unwrap().unwrap();
        second.await.unwrap().unwrap();
        assert_eq!(store.write_transactions() - before, 1);
        assert_eq!(store.commits_applied_in_place(), 0);
        store.close().await.unwrap();
    })
    .await;
}

/// Waits until `count` operations are queued for the (paused) writer.
async fn until_queued(store: &SqliteStore, count: usize) {
    while store.queued_writes() < count {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_change_inside_a_group_is_rolled_back_alone_and_gets_its_own_error() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(open(&db_path(&dir)));
        let mut good = Vec::new();
        for i in 0..8 {
            let record = session("user:alice", i);
            store.create_session(&record).await.unwrap();
            good.push(record.id);
        }
        let gap = session("user:alice", 20);
        let conflict = session("user:alice", 21);
        let doomed = session("user:alice", 22);
        for record in [&gap, &conflict, &doomed] {
            store.create_session(record).await.unwrap();
        }
        let recorded = ActionId::mint();
        store
            .commit(
                conflict.id,
                Batch {
                    new_actions: vec![action(recorded, ActionState::Sent)],
                    ..Batch::default()
                },
            )
            .await
            .unwrap();
        let newcomer = session("user:bob", 30);

        let resume = store.pause_writer().await;
        let before = store.write_transactions();
        let mut ok = Vec::new();
        for &id in &good {
            let store = store.clone();
            ok.push(tokio::spawn(async move {
                let queued = prompt("good");
                store
                    .commit(
                        id,
                        Batch {
                            entries: frames(1, 2),
                            queue: vec![QueueOp::PushBack(queued.clone())],
                            new_actions: vec![action(queued.action_id, ActionState::Queued)],
                            ..Batch::default()
                        },
                    )
                    .await
            }));
        }
        let with_gap = {
            let store = store.clone();
            let id = gap.id;
            tokio::spawn(async move { store.commit(id, entries(frames(2, 3))).await })
        };
        let with_conflict = {
            let store = store.clone();
            let id = conflict.id;
            tokio::spawn(async move {
                store
                    .commit(
                        id,
                        Batch {
                            entries: frames(1, 1),
                            new_actions: vec![action(recorded, ActionState::Queued)],
                            ..Batch::default()
                        },
                    )
                    .await
            })
        };
        let to_nowhere = {
            let store = store.clone();
            tokio::spawn(async move { store.commit(Uuid::now_v7(), entries(frames(1, 1))).await })
        };
        let taken_id = {
            let store = store.clone();
            let mut again = session("user:bob", 40);
            again.id = good[0];
            tokio::spawn(async move { store.create_session(&again).await })
        };
        let created = {
            let store = store.clone();
            let record = newcomer.clone();
            tokio::spawn(async move { store.create_session(&record).await })
        };
        let deleted = {
            let store = store.clone();
            let id = doomed.id;
            tokio::spawn(async move { store.delete_session(id).await })
        };
        until_queued(&store, good.len() + 6).await;
        resume.send(()).unwrap();

        for task in ok {
            task.await.unwrap().unwrap();
        }
        let err = with_gap
            .await
            .unwrap()
            .map_err(crate::domain::Error::from)
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Internal);
        assert!(err.message.contains("densely"), "{}", err.message);
        let err = with_conflict
            .await
            .unwrap()
            .map_err(crate::domain::Error::from)
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::ActionIdConflict);
        let err = to_nowhere
            .await
            .unwrap()
            .map_err(crate::domain::Error::from)
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::SessionNotFound);
        let err = taken_id.await.unwrap().unwrap_err();
        assert_eq!(err.code, ErrorCode::SessionExists);
        created.await.unwrap().unwrap();
        assert!(deleted.await.unwrap().unwrap());

        assert_eq!(
            store.write_transactions() - before,
            1,
            "one group, one transaction"
        );
        for &id in &good {
            assert_eq!(store.read_log(id, 0, 10).await.unwrap(), frames(1, 2));
            assert_eq!(store.load_queue(id).await.unwrap().len(), 1);
        }
        assert_eq!(store.head_offset(gap.id).await.unwrap(), 0);
        assert_eq!(store.head_offset(conflict.id).await.unwrap(), 0);
        assert_eq!(
            store
                .find_action(conflict.id, recorded)
                .await
                .unwrap()
                .unwrap()
                .state,
            ActionState::Sent
        );
        assert_eq!(
            store.get_session(good[0]).await.unwrap().unwrap().owner,
            "user:alice"
        );
        assert_eq!(
            store.get_session(newcomer.id).await.unwrap(),
            Some(newcomer)
        );
        assert_eq!(store.get_session(doomed.id).await.unwrap(), None);
        store.close().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn synchronous_is_normal_by_default_and_full_when_configured() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(db_path(&dir), SqliteSynchronous::default()).unwrap();
        assert_eq!(
            store.synchronous().await.unwrap(),
            SqliteSynchronous::Normal
        );
        store.close().await.unwrap();
        drop(store);
        let store = SqliteStore::open(db_path(&dir), SqliteSynchronous::Full).unwrap();
        assert_eq!(store.synchronous().await.unwrap(), SqliteSynchronous::Full);
        store.close().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn the_file_is_in_wal_mode_at_the_current_schema_version_with_every_table() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&db_path(&dir));
        let raw = rusqlite::Connection::open(db_path(&dir)).unwrap();
        let mode: String = raw
            .query_row("PRAGMA journal_mode", [], |row| row.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let version: i64 = raw
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .unwrap();
        assert_eq!(version, super::schema::SCHEMA_VERSION);
        let mut tables: Vec<String> = raw
            .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        tables.retain(|name| !name.starts_with("sqlite_"));
        assert_eq!(
            tables,
            [
                "actions",
                "log",
                "queue",
                "session_editors",
                "session_labels",
                "sessions",
                "usage_records"
            ]
        );
        drop(raw);
        store.close().await.unwrap();
        drop(store);
        // Opening again at the current version migrates nothing and changes nothing.
        let store = open(&db_path(&dir));
        store.close().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_database_from_a_newer_schema_version_is_refused_with_a_clear_error() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let raw = rusqlite::Connection::open(db_path(&dir)).unwrap();
        raw.pragma_update(None, "user_version", 99).unwrap();
        drop(raw);
        let err = match SqliteStore::open(db_path(&dir), SqliteSynchronous::Normal) {
            Ok(_) => panic!("a newer schema must be refused"),
            Err(err) => err,
        };
        assert_eq!(err.code, ErrorCode::Internal);
        assert!(err.message.contains("schema version 99"), "{}", err.message);
    })
    .await;
}

#[tokio::test]
async fn opening_creates_the_file_and_missing_parent_directories() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data").join("nested").join(DB_FILE_NAME);
        let store = open(&path);
        assert!(path.is_file());
        assert_eq!(store.path(), path);
        store.close().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn closing_checkpoints_the_wal_and_later_writes_fail_while_reads_still_work() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&db_path(&dir));
        let record = session("user:alice", 1);
        store.create_session(&record).await.unwrap();
        store
            .commit(record.id, entries(frames(1, 50)))
            .await
            .unwrap();
        store.close().await.unwrap();
        let wal = dir.path().join(format!("{DB_FILE_NAME}-wal"));
        assert!(
            !wal.exists() || std::fs::metadata(&wal).unwrap().len() == 0,
            "the WAL is folded into the database file"
        );
        let err = store
            .commit(record.id, entries(frames(51, 51)))
            .await
            .map_err(crate::domain::Error::from)
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Internal);
        assert!(err.message.contains("closed"), "{}", err.message);
        assert_eq!(
            store
                .create_session(&session("user:bob", 2))
                .await
                .unwrap_err()
                .code,
            ErrorCode::Internal
        );
        assert_eq!(store.head_offset(record.id).await.unwrap(), 50);
        assert_eq!(store.get_session(record.id).await.unwrap(), Some(record));
        store.close().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn corrupt_stored_rows_surface_as_internal_errors_naming_what_is_wrong() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&db_path(&dir));
        let record = session("user:alice", 1);
        store.create_session(&record).await.unwrap();
        let queued = prompt("q");
        let recorded = action(ActionId::mint(), ActionState::Sent);
        store
            .commit(
                record.id,
                Batch {
                    entries: frames(1, 4),
                    queue: vec![QueueOp::PushBack(queued.clone())],
                    new_actions: vec![recorded.clone()],
                    ..Batch::default()
                },
            )
            .await
            .unwrap();
        store.close().await.unwrap();
        drop(store);

        let raw = rusqlite::Connection::open(db_path(&dir)).unwrap();
        raw.execute_batch(
            "UPDATE sessions SET status = 'exploded';
             UPDATE log SET direction = 9 WHERE offset = 2;
             UPDATE log SET json = x'ff00fe' WHERE offset = 3;
             UPDATE log SET epoch = -1 WHERE offset = 4;
             UPDATE queue SET work = 'not json';
             UPDATE actions SET state = 'weird';",
        )
        .unwrap();
        drop(raw);

        let store = open(&db_path(&dir));
        let internal = |result: crate::domain::Result<_>, needle: &str| {
            let err = result.map(|_: ()| ()).unwrap_err();
            assert_eq!(err.code, ErrorCode::Internal);
            assert!(
                err.message.contains(needle),
                "{needle:?} in {}",
                err.message
            );
        };
        internal(store.get_session(record.id).await.map(drop), "status");
        internal(store.list_sessions(&all()).await.map(drop), "exploded");
        internal(store.open_sessions().await.map(drop), "status");
        internal(
            store.read_log(record.id, 0, 10).await.map(drop),
            "direction",
        );
        internal(store.read_log(record.id, 2, 1).await.map(drop), "json");
        internal(store.read_log(record.id, 3, 1).await.map(drop), "epoch");
        assert_eq!(store.read_log(record.id, 0, 1).await.unwrap(), frames(1, 1));
        internal(store.load_queue(record.id).await.map(drop), "work");
        internal(
            store
                .find_action(record.id, recorded.action_id)
                .await
                .map(drop),
            "state",
        );
        // Counting needs no decoding, and the store keeps serving.
        assert_eq!(store.head_offset(record.id).await.unwrap(), 4);
        store.close().await.unwrap();
    })
    .await;
}

/// A frame like the ones a busy session appends: a 100-byte text chunk.
fn chunk(offset: u64) -> LogEntry {
    let text = "x".repeat(100);
    LogEntry {
        offset,
        direction: Direction::FromRuntime,
        json: format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"acp-1","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"{text}"}}}}}}}}"#
        ),
        actor: "runtime".to_owned(),
        action_id: None,
        epoch: 1,
        created_at: std::time::SystemTime::now(),
    }
}

async fn append_throughput(synchronous: SqliteSynchronous, sessions: usize, per_session: u64) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(db_path(&dir), synchronous).unwrap());
    let mut ids = Vec::new();
    for i in 0..sessions {
        let record = session("user:alice", i as u64);
        store.create_session(&record).await.unwrap();
        ids.push(record.id);
    }
    let transactions = store.write_transactions();
    let started = Instant::now();
    let tasks: Vec<_> = ids
        .iter()
        .map(|&id| {
            let store = store.clone();
            tokio::spawn(async move {
                for offset in 1..=per_session {
                    store
                        .commit(id, entries(vec![chunk(offset)]))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = started.elapsed();
    let frames = sessions as u64 * per_session;
    let transactions = store.write_transactions() - transactions;
    println!(
        "append, synchronous={synchronous:?}: {frames} frames (1 frame per commit) from {sessions} \
         concurrent sessions in {elapsed:.2?} = {:.0} frames/s; {transactions} transactions \
         ({:.1} commits per transaction)",
        frames as f64 / elapsed.as_secs_f64(),
        frames as f64 / transactions as f64,
    );
    store.close().await.unwrap();
}

/// A hand-run benchmark; build in release:
/// `cargo test --release --lib store::sqlite::tests::throughput -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by hand in release mode"]
async fn throughput_of_appends_from_a_hundred_sessions_and_of_reading_a_long_log() {
    append_throughput(SqliteSynchronous::Normal, 100, 500).await;
    append_throughput(SqliteSynchronous::Full, 100, 200).await;

    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    let record = session("user:alice", 1);
    store.create_session(&record).await.unwrap();
    const FRAMES: u64 = 100_000;
    for first in (1..=FRAMES).step_by(1000) {
        let batch: Vec<LogEntry> = (first..first + 1000).map(chunk).collect();
        store.commit(record.id, entries(batch)).await.unwrap();
    }
    for page in [1000usize, 10_000] {
        let started = Instant::now();
        let mut after = 0;
        let mut read = 0u64;
        loop {
            let entries = store.read_log(record.id, after, page).await.unwrap();
            let Some(last) = entries.last() else { break };
            after = last.offset;
            read += entries.len() as u64;
        }
        let elapsed = started.elapsed();
        assert_eq!(read, FRAMES);
        println!(
            "read_log: {read} frames of {} bytes in pages of {page} in {elapsed:.2?} = {:.0} frames/s",
            chunk(1).json.len(),
            read as f64 / elapsed.as_secs_f64()
        );
    }
    store.close().await.unwrap();
}

/// Set (to a database path) only in the child process of the kill -9 test.
const CRASH_CHILD_DB: &str = "AGENT_HARNESS_TEST_CRASH_CHILD_DB";

/// The child half of `acknowledged_commits_survive_kill_9`: appends to ten sessions as fast as
/// it can and prints every acknowledged offset, until it is killed. Does nothing on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of acknowledged_commits_survive_kill_9"]
async fn crash_child_appends_until_killed() {
    let Ok(path) = std::env::var(CRASH_CHILD_DB) else {
        return;
    };
    let store = Arc::new(open(Path::new(&path)));
    let mut tasks = Vec::new();
    for i in 0..10 {
        let record = session("user:alice", i);
        store.create_session(&record).await.unwrap();
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let id = record.id;
            for offset in 1.. {
                let entry = frame(offset, &format!(r#"{{"session":"{id}","n":{offset}}}"#));
                store.commit(id, entries(vec![entry])).await.unwrap();
                println!("acked {id} {offset}");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test]
async fn acknowledged_commits_survive_kill_9() {
    use std::{collections::HashMap, process::Stdio};
    use tokio::io::{AsyncBufReadExt, BufReader};

    within(async {
        let dir = tempfile::tempdir().unwrap();
        let path = db_path(&dir);
        let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "store::sqlite::tests::crash_child_appends_until_killed",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CRASH_CHILD_DB, &path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut acked: HashMap<Uuid, u64> = HashMap::new();
        let mut count = 0;
        while count < 3000 {
            let Some(line) = lines.next_line().await.unwrap() else {
                panic!("the child stopped after {count} acknowledgements");
            };
            let Some(rest) = line.strip_prefix("acked ") else {
                continue;
            };
            let (id, offset) = rest.split_once(' ').unwrap();
            let (id, offset): (Uuid, u64) = (id.parse().unwrap(), offset.parse().unwrap());
            let best = acked.entry(id).or_default();
            *best = (*best).max(offset);
            count += 1;
        }
        child.start_kill().unwrap(); // SIGKILL, mid-stream
        child.wait().await.unwrap();

        let store = open(&path);
        assert_eq!(acked.len(), 10);
        for (&id, &acked) in &acked {
            let log = store.read_log(id, 0, usize::MAX).await.unwrap();
            let head = store.head_offset(id).await.unwrap();
            assert!(
                head >= acked,
                "session {id}: acknowledged {acked}, found {head}"
            );
            assert_eq!(log.len() as u64, head);
            for (i, entry) in log.iter().enumerate() {
                assert_eq!(entry.offset, i as u64 + 1);
                assert_eq!(
                    entry.json,
                    format!(r#"{{"session":"{id}","n":{}}}"#, entry.offset)
                );
            }
        }
        store.close().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_statement_sqlite_refuses_is_reported_without_quoting_the_sql() {
    within(async {
        let dir = TempDir::new().unwrap();
        let store = open(&db_path(&dir));
        // More parameters than SQLite takes in one statement (the service bounds filters long
        // before this; the store must still never echo its SQL).
        let query = SessionQuery {
            labels: (0..30_000).map(|i| (format!("k{i}"), "v".into())).collect(),
            ..all()
        };
        let error = store.list_sessions(&query).await.unwrap_err();
        assert_eq!(error.code, crate::domain::ErrorCode::Internal);
        assert!(
            !error.message.contains("SELECT") && !error.message.contains("session_labels"),
            "{}",
            &error.message[..error.message.len().min(500)]
        );
        assert!(
            error
                .message
                .starts_with("sqlite store: listing sessions: "),
            "{}",
            error.message
        );
    })
    .await
}

/// A read that would never end on its own.
fn endless(conn: &rusqlite::Connection) -> crate::domain::Result<i64> {
    use super::rows::Context;
    conn.query_row(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
        [],
        |row| row.get(0),
    )
    .context("counting forever")
}

#[tokio::test]
async fn a_read_past_the_statement_timeout_is_interrupted_as_unavailable_and_the_pool_serves_on() {
    within(async {
        let dir = TempDir::new().unwrap();
        let store = open(&db_path(&dir)).with_statement_timeout(Duration::from_millis(100));
        let error = store.read(endless).await.unwrap_err();
        assert_eq!(error.code, crate::domain::ErrorCode::StoreUnavailable);
        assert!(error.message.contains("interrupted"), "{}", error.message);
        // Every read connection is back and works.
        for _ in 0..super::READERS + 1 {
            store.list_sessions(&all()).await.unwrap();
        }
        assert_eq!(store.readers.permits.available_permits(), super::READERS);
    })
    .await
}

#[tokio::test]
async fn a_read_whose_caller_goes_away_is_interrupted_and_frees_its_connection() {
    within(async {
        let dir = TempDir::new().unwrap();
        // The default timeout (10 s) is far away: only the caller leaving can end the read.
        let store = std::sync::Arc::new(open(&db_path(&dir)));
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let call = tokio::spawn({
            let store = store.clone();
            async move {
                store
                    .read(move |conn| {
                        let _ = started_tx.send(());
                        endless(conn)
                    })
                    .await
            }
        });
        started_rx.await.unwrap();
        call.abort();
        tokio::time::timeout(Duration::from_secs(5), async {
            while store.readers.permits.available_permits() < super::READERS {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the abandoned read was interrupted and gave its connection back");
        store.list_sessions(&all()).await.unwrap();
    })
    .await
}

/// The pages (WAL frames) that one transaction applying `batch` to `session_id` writes, on a raw
/// connection to the store's file configured as the writer's.
fn pages_written(conn: &mut rusqlite::Connection, session_id: Uuid, batch: Batch) -> i64 {
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    let tx = conn.transaction().unwrap();
    super::writer::commit(&tx, session_id, batch).unwrap();
    tx.commit().unwrap();
    // A passive checkpoint reports how many frames the WAL holds: this transaction's.
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| row.get(1))
        .unwrap()
}

/// A file with `count` sessions (so every index of `sessions` spans several pages), written
/// through the store and then opened raw, as the writer opens it.
async fn raw_file_with_sessions(
    dir: &TempDir,
    count: u64,
) -> (rusqlite::Connection, Vec<SessionRecord>) {
    let path = db_path(dir);
    let store = open(&path);
    let mut records = Vec::new();
    for i in 0..count {
        let owner = format!("user:{}", i % 7);
        let record = session(&owner, i);
        store.create_session(&record).await.unwrap();
        records.push(record);
    }
    store.close().await.unwrap();
    drop(store);
    let conn = rusqlite::Connection::open(&path).unwrap();
    super::schema::configure_writer(&conn, SqliteSynchronous::Normal).unwrap();
    (conn, records)
}

/// A turn changes its session's status twice; neither change may move an index entry, or every
/// turn pays for the index pages in its commits (four of them, before schema version 4).
#[tokio::test]
async fn a_turns_status_changes_write_the_sessions_row_and_no_index_page() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let (mut conn, records) = raw_file_with_sessions(&dir, 400).await;
        let mut record = records[200].clone();
        for status in [SessionStatus::Running, SessionStatus::Idle] {
            record.status = status;
            let batch = Batch {
                session: Some(record.clone()),
                ..Batch::default()
            };
            assert_eq!(
                pages_written(&mut conn, record.id, batch),
                1,
                "to {status:?}: the row's page alone"
            );
        }
        // Closing does move the session into the closed sessions' indexes.
        record.status = SessionStatus::Closed;
        let batch = Batch {
            session: Some(record.clone()),
            ..Batch::default()
        };
        assert_eq!(pages_written(&mut conn, record.id, batch), 3);
    })
    .await;
}

/// A prompt's acceptance records its action id: one page of `actions`, not the table's and its
/// key index's.
#[tokio::test]
async fn recording_an_action_id_writes_one_page() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let (mut conn, records) = raw_file_with_sessions(&dir, 3).await;
        let id = records[1].id;
        for _ in 0..3 {
            let batch = Batch {
                new_actions: vec![action(ActionId::mint(), ActionState::Sent)],
                ..Batch::default()
            };
            assert_eq!(pages_written(&mut conn, id, batch), 1);
        }
    })
    .await;
}

/// Counting an owner's live sessions and finding expired closed sessions read the partial
/// indexes of closed sessions (the status in their SQL must match the indexes' literal).
#[tokio::test]
async fn live_counts_and_retention_read_the_closed_sessions_indexes() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let (conn, _) = raw_file_with_sessions(&dir, 3).await;
        assert_eq!(SessionStatus::Closed.as_str(), "closed");
        for (sql, index) in [
            (super::COUNT_LIVE_SESSIONS, "sessions_closed_by_owner"),
            (super::writer::EXPIRED_SESSIONS, "sessions_closed_by_time"),
        ] {
            let mut explain = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let unbound = std::iter::repeat_n(0i64, explain.parameter_count());
            let plan: Vec<String> = explain
                .query_map(rusqlite::params_from_iter(unbound), |row| row.get(3))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            assert!(
                plan.iter().any(|step| step.contains(index)),
                "{sql}: {plan:?}"
            );
        }
    })
    .await;
}
