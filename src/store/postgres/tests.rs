//! Tests of what only the PostgreSQL store has (migrations under a lock, leases, fencing, start-up
//! errors), and the test database every PostgreSQL test uses.
//!
//! The database comes from `AGENT_HARNESS_TEST_DATABASE_URL`. Without it the tests skip with a
//! note — unless `CI=true`, where a missing or unreachable database fails them: the suite must
//! never pass in CI without having run. Each test works in a schema of its own, created for it
//! and dropped after, so runs (and tests of one run) never see each other's rows.

use std::{sync::Arc, time::Duration};

use uuid::Uuid;

use super::{PostgresOptions, PostgresStore, schema::SCHEMA_VERSION};
use crate::{
    domain::{ActionId, Error, ErrorCode, session::SessionStatus},
    store::{
        ActionState, Batch, CommitError, LeaseClaim, QueueOp, Store,
        conformance::fixtures::{action, entries, frames, prompt, queue, session},
    },
};

/// Whether a commit was refused for its fence (and for nothing else).
fn is_fenced(error: &CommitError) -> bool {
    matches!(error, CommitError::Fenced { .. })
}

/// The environment variable naming the test database.
pub(crate) const TEST_DATABASE_ENV: &str = "AGENT_HARNESS_TEST_DATABASE_URL";

/// A schema of its own in the test database; dropped by [`TestSchema::drop_schema`].
pub(crate) struct TestSchema {
    pub(crate) url: String,
    pub(crate) name: String,
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

impl TestSchema {
    /// A fresh schema, or `None` (with a note) when no test database is configured outside CI.
    pub(crate) async fn create() -> Option<Self> {
        let url = match std::env::var(TEST_DATABASE_ENV) {
            Ok(url) if !url.is_empty() => url,
            _ => {
                assert!(
                    !in_ci(),
                    "{TEST_DATABASE_ENV} is not set, and CI=true: the PostgreSQL store tests must \
                     run in CI (set it to e.g. postgres://postgres@127.0.0.1:5432/test)"
                );
                eprintln!(
                    "note: skipping a PostgreSQL store test: set {TEST_DATABASE_ENV} to run it"
                );
                return None;
            }
        };
        let name = format!("ah_test_{}", Uuid::now_v7().simple());
        let client = connect_plain(&url).await;
        client
            .batch_execute(&format!("CREATE SCHEMA {name}"))
            .await
            .unwrap_or_else(|e| panic!("creating the test schema {name}: {e}"));
        Some(Self { url, name })
    }

    pub(crate) fn options(&self) -> PostgresOptions {
        PostgresOptions {
            schema: Some(self.name.clone()),
            pool_size: 4,
            ..PostgresOptions::new(self.url.clone())
        }
    }

    /// The options with one more URL parameter (`key=value`).
    pub(crate) fn options_with(&self, parameter: &str) -> PostgresOptions {
        let separator = if self.url.contains('?') { '&' } else { '?' };
        PostgresOptions {
            url: format!("{}{separator}{parameter}", self.url),
            ..self.options()
        }
    }

    pub(crate) async fn open(&self) -> PostgresStore {
        PostgresStore::connect(self.options())
            .await
            .expect("the PostgreSQL store opens")
    }

    pub(crate) async fn drop_schema(self) {
        let client = connect_plain(&self.url).await;
        client
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.name))
            .await
            .unwrap_or_else(|e| panic!("dropping the test schema {}: {e}", self.name));
    }
}

/// One connection outside any store, for creating and dropping schemas. A database that is
/// configured but unreachable fails the test, in CI or not.
async fn connect_plain(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the test database ({TEST_DATABASE_ENV}) is unreachable: {}",
                super::describe(&e)
            )
        });
    tokio::spawn(connection);
    client
}

/// Runs `test` against a fresh store in a fresh schema, then drops the schema.
async fn with_store<F, Fut>(test: F)
where
    F: FnOnce(Arc<PostgresStore>, Arc<TestSchema>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let Some(schema) = TestSchema::create().await else {
        return;
    };
    let schema = Arc::new(schema);
    let store = Arc::new(schema.open().await);
    tokio::time::timeout(Duration::from_secs(60), test(store.clone(), schema.clone()))
        .await
        .expect("the test finished within its timeout");
    store.close().await.expect("the store closes");
    drop(store);
    Arc::into_inner(schema)
        .expect("the test let go of its schema")
        .drop_schema()
        .await;
}

const TTL: Duration = Duration::from_secs(30);

#[tokio::test]
async fn two_stores_starting_together_on_one_schema_both_migrate_it_once() {
    let Some(schema) = TestSchema::create().await else {
        return;
    };
    let (a, b) = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(
            PostgresStore::connect(schema.options()),
            PostgresStore::connect(schema.options())
        )
    })
    .await
    .expect("both stores opened within the timeout");
    let (a, b) = (
        a.expect("the first store opens"),
        b.expect("the second store opens"),
    );
    let client = connect_plain(&schema.url).await;
    let versions: Vec<i64> = client
        .query(
            &format!(
                "SELECT version FROM {}.schema_migrations ORDER BY version",
                schema.name
            ),
            &[],
        )
        .await
        .expect("schema_migrations reads")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(versions, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    // Both stores work on the one schema.
    let record = session("user:alice", 1);
    a.create_session(&record).await.unwrap();
    assert_eq!(b.get_session(record.id).await.unwrap(), Some(record));
    a.close().await.unwrap();
    b.close().await.unwrap();
    drop((a, b));
    schema.drop_schema().await;
}

#[tokio::test]
async fn reopening_a_migrated_schema_keeps_its_rows() {
    with_store(|store, schema| async move {
        let record = session("user:alice", 1);
        store.create_session(&record).await.unwrap();
        store
            .commit(record.id, entries(frames(1, 3)))
            .await
            .unwrap();
        let again = schema.open().await;
        assert_eq!(
            again.get_session(record.id).await.unwrap(),
            Some(record.clone())
        );
        assert_eq!(again.head_offset(record.id).await.unwrap(), 3);
        again.close().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_first_claim_is_granted_with_fence_one_and_a_live_lease_is_refused_to_others() {
    with_store(|store, _| async move {
        let record = session("user:alice", 1);
        store.create_session(&record).await.unwrap();
        let LeaseClaim::Granted(lease) = store.claim_lease(record.id, "a", TTL).await.unwrap()
        else {
            panic!("a free lease is granted");
        };
        assert_eq!((lease.owner_replica.as_str(), lease.fence), ("a", 1));
        let LeaseClaim::HeldBy(held) = store.claim_lease(record.id, "b", TTL).await.unwrap() else {
            panic!("a live lease of another replica is refused");
        };
        assert_eq!((held.owner_replica.as_str(), held.fence), ("a", 1));
        // The holder claiming again renews, with the same fence.
        let LeaseClaim::Granted(renewed) = store.claim_lease(record.id, "a", TTL).await.unwrap()
        else {
            panic!("the holder's claim renews");
        };
        assert_eq!(renewed.fence, 1);
        assert!(renewed.expires_at >= lease.expires_at);
    })
    .await;
}

#[tokio::test]
async fn an_expired_lease_is_claimed_by_another_replica_with_a_bumped_fence() {
    with_store(|store, _| async move {
        let record = session("user:alice", 1);
        store.create_session(&record).await.unwrap();
        // A zero TTL is expired the moment it is written.
        store
            .claim_lease(record.id, "a", Duration::ZERO)
            .await
            .unwrap();
        let LeaseClaim::Granted(lease) = store.claim_lease(record.id, "b", TTL).await.unwrap()
        else {
            panic!("an expired lease is granted to another replica");
        };
        assert_eq!((lease.owner_replica.as_str(), lease.fence), ("b", 2));
        assert_eq!(store.get_lease(record.id).await.unwrap(), Some(lease));
    })
    .await;
}

#[tokio::test]
async fn a_released_lease_is_claimable_at_once_and_its_fence_keeps_growing() {
    with_store(|store, _| async move {
        let record = session("user:alice", 1);
        store.create_session(&record).await.unwrap();
        store.claim_lease(record.id, "a", TTL).await.unwrap();
        assert!(!store.release_lease(record.id, "a", 7).await.unwrap());
        assert!(!store.release_lease(record.id, "b", 1).await.unwrap());
        assert!(store.release_lease(record.id, "a", 1).await.unwrap());
        let LeaseClaim::Granted(lease) = store.claim_lease(record.id, "b", TTL).await.unwrap()
        else {
            panic!("a released lease is granted");
        };
        assert_eq!(lease.fence, 2);
        // Even the former holder taking it back gets a new fence.
        store.release_lease(record.id, "b", 2).await.unwrap();
        let LeaseClaim::Granted(lease) = store.claim_lease(record.id, "a", TTL).await.unwrap()
        else {
            panic!("a released lease is granted");
        };
        assert_eq!(lease.fence, 3);
    })
    .await;
}

#[tokio::test]
async fn renewing_extends_only_the_leases_the_replica_still_holds() {
    with_store(|store, _| async move {
        let (one, two) = (session("user:alice", 1), session("user:alice", 2));
        store.create_session(&one).await.unwrap();
        store.create_session(&two).await.unwrap();
        store.claim_lease(one.id, "a", TTL).await.unwrap();
        store
            .claim_lease(two.id, "a", Duration::ZERO)
            .await
            .unwrap();
        store.claim_lease(two.id, "b", TTL).await.unwrap();
        let renewed = store
            .renew_leases("a", &[(one.id, 1), (two.id, 1)], TTL)
            .await
            .unwrap();
        assert_eq!(
            renewed.iter().map(|l| l.session_id).collect::<Vec<_>>(),
            vec![one.id]
        );
    })
    .await;
}

#[tokio::test]
async fn renewing_extends_only_the_leases_listed_with_their_fences() {
    with_store(|store, _| async move {
        let (one, two, three) = (
            running("user:alice", 1),
            running("user:alice", 2),
            running("user:alice", 3),
        );
        for record in [&one, &two, &three] {
            store.create_session(record).await.unwrap();
        }
        // `two` was stopped here (its time ran out): not listed, it lapses.
        store.claim_lease(one.id, "a", TTL).await.unwrap();
        store
            .claim_lease(two.id, "a", Duration::ZERO)
            .await
            .unwrap();
        // `three` listed with a fence it no longer has.
        store
            .claim_lease(three.id, "a", Duration::ZERO)
            .await
            .unwrap();
        store.claim_lease(three.id, "a", TTL).await.unwrap();
        let renewed = store
            .renew_leases("a", &[(one.id, 1), (three.id, 1)], TTL)
            .await
            .unwrap();
        assert_eq!(
            renewed.iter().map(|l| l.session_id).collect::<Vec<_>>(),
            vec![one.id]
        );
        assert_eq!(store.orphans_with_work().await.unwrap(), vec![two.id]);
        assert!(
            store.renew_leases("a", &[], TTL).await.unwrap().is_empty(),
            "nothing listed, nothing renewed"
        );
    })
    .await;
}

#[tokio::test]
async fn a_released_lease_is_not_renewed_by_its_former_holder() {
    with_store(|store, _| async move {
        let record = running("user:alice", 1);
        store.create_session(&record).await.unwrap();
        store.claim_lease(record.id, "a", TTL).await.unwrap();
        assert!(store.release_lease(record.id, "a", 1).await.unwrap());
        assert!(
            store
                .renew_leases("a", &[(record.id, 1)], TTL)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(store.orphans_with_work().await.unwrap(), vec![record.id]);
        let LeaseClaim::Granted(lease) = store.claim_lease(record.id, "b", TTL).await.unwrap()
        else {
            panic!("the released lease stays claimable");
        };
        assert_eq!((lease.owner_replica.as_str(), lease.fence), ("b", 2));
    })
    .await;
}

/// A session with a turn in flight, as its owner left it.
fn running(owner: &str, created_ms: u64) -> crate::domain::session::SessionRecord {
    crate::domain::session::SessionRecord {
        status: SessionStatus::Running,
        ..session(owner, created_ms)
    }
}

fn with_status(status: SessionStatus, created_ms: u64) -> crate::domain::session::SessionRecord {
    crate::domain::session::SessionRecord {
        status,
        ..session("user:alice", created_ms)
    }
}

#[tokio::test]
async fn failover_lists_only_sessions_with_work_and_no_live_lease_never_idle_ones() {
    with_store(|store, _| async move {
        let idle_never_leased = with_status(SessionStatus::Idle, 1);
        let idle_expired = with_status(SessionStatus::Idle, 2);
        let suspended = with_status(SessionStatus::Suspended, 3);
        let running_expired = with_status(SessionStatus::Running, 4);
        let awaiting_never_leased = with_status(SessionStatus::AwaitingInput, 5);
        let queued_expired = with_status(SessionStatus::Idle, 6);
        let running_live = with_status(SessionStatus::Running, 7);
        let queued_live = with_status(SessionStatus::Idle, 8);
        let closed_queued = with_status(SessionStatus::Closed, 9);
        let drained = with_status(SessionStatus::Idle, 10);
        let all = [
            &idle_never_leased,
            &idle_expired,
            &suspended,
            &running_expired,
            &awaiting_never_leased,
            &queued_expired,
            &running_live,
            &queued_live,
            &closed_queued,
            &drained,
        ];
        for record in all {
            store.create_session(record).await.unwrap();
        }
        for record in [&idle_expired, &running_expired, &queued_expired] {
            store
                .claim_lease(record.id, "gone", Duration::ZERO)
                .await
                .unwrap();
        }
        for record in [&running_live, &queued_live] {
            store.claim_lease(record.id, "alive", TTL).await.unwrap();
        }
        for record in [&queued_expired, &queued_live, &closed_queued, &drained] {
            store
                .commit(record.id, queue(vec![QueueOp::PushBack(prompt("waiting"))]))
                .await
                .unwrap();
        }
        // The queue drained before the owner went: nothing left to take over.
        store
            .commit(drained.id, queue(vec![QueueOp::Clear]))
            .await
            .unwrap();
        assert_eq!(
            store.orphans_with_work().await.unwrap(),
            vec![
                running_expired.id,
                awaiting_never_leased.id,
                queued_expired.id
            ],
            "oldest first; idle, suspended, closed, drained and live sessions are not listed"
        );

        // The turn ends and the queue empties under a new owner: nothing is listed.
        let mut done = running_expired.clone();
        done.status = SessionStatus::Idle;
        store
            .commit(
                done.id,
                Batch {
                    session: Some(done),
                    ..Batch::default()
                },
            )
            .await
            .unwrap();
        store
            .claim_lease(awaiting_never_leased.id, "alive", TTL)
            .await
            .unwrap();
        store
            .commit(queued_expired.id, queue(vec![QueueOp::Clear]))
            .await
            .unwrap();
        assert!(store.orphans_with_work().await.unwrap().is_empty());
    })
    .await;
}

#[test]
fn the_failover_query_names_the_statuses_of_a_turn_in_flight_as_the_domain_spells_them() {
    // The queries spell the statuses as literals.
    for status in [SessionStatus::Running, SessionStatus::AwaitingInput] {
        let quoted = format!("'{}'", status.as_str());
        assert!(super::ORPHANS_WITH_WORK_SQL.contains(&quoted), "{quoted}");
    }
    let closed = format!("'{}'", SessionStatus::Closed.as_str());
    assert!(super::LIVE_SESSIONS_SQL.contains(&closed));
    assert!(super::ORPHANS_WITH_WORK_SQL.contains(&closed));
}

#[tokio::test]
async fn two_replicas_creating_at_once_never_pass_one_owners_cap_together() {
    with_store(|store, schema| async move {
        let other = Arc::new(schema.open().await);
        let creates = (0..16).map(|i| {
            let store: Arc<PostgresStore> = if i % 2 == 0 {
                store.clone()
            } else {
                other.clone()
            };
            async move {
                store
                    .create_session_capped(&session("user:alice", i), 5)
                    .await
                    .unwrap()
            }
        });
        let outcomes = futures::future::join_all(creates).await;
        let created = outcomes
            .iter()
            .filter(|o| **o == crate::store::CappedCreate::Created)
            .count();
        assert_eq!(created, 5, "{outcomes:?}");
        assert_eq!(store.count_live_sessions("user:alice").await.unwrap(), 5);
        other.close().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_reachable_database_passes_the_check() {
    with_store(|store, _| async move {
        store.check().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn claiming_the_lease_of_an_unknown_session_fails_with_session_not_found() {
    with_store(|store, _| async move {
        let error = store
            .claim_lease(Uuid::now_v7(), "a", TTL)
            .await
            .unwrap_err();
        assert_eq!(error.code, crate::domain::ErrorCode::SessionNotFound);
    })
    .await;
}

#[tokio::test]
async fn a_commit_with_the_current_fence_applies_and_one_with_a_stale_fence_fails_whole() {
    with_store(|store, _| async move {
        let record = session("user:alice", 1);
        store.create_session(&record).await.unwrap();
        store
            .claim_lease(record.id, "a", Duration::ZERO)
            .await
            .unwrap();
        store
            .commit(
                record.id,
                Batch {
                    fence: Some(1),
                    ..entries(frames(1, 2))
                },
            )
            .await
            .unwrap();
        store.claim_lease(record.id, "b", TTL).await.unwrap();
        let mut renamed = record.clone();
        renamed.name = "taken over".to_owned();
        let error = store
            .commit(
                record.id,
                Batch {
                    fence: Some(1),
                    session: Some(renamed),
                    ..entries(frames(3, 4))
                },
            )
            .await
            .unwrap_err();
        assert!(is_fenced(&error), "{error}");
        assert_eq!(store.head_offset(record.id).await.unwrap(), 2);
        assert_eq!(
            store.get_session(record.id).await.unwrap(),
            Some(record.clone())
        );
        // The new holder's fence passes, and a commit without a fence is not checked.
        store
            .commit(
                record.id,
                Batch {
                    fence: Some(2),
                    ..entries(frames(3, 3))
                },
            )
            .await
            .unwrap();
        store
            .commit(record.id, entries(frames(4, 4)))
            .await
            .unwrap();
        assert_eq!(store.head_offset(record.id).await.unwrap(), 4);
    })
    .await;
}

#[tokio::test]
async fn a_commit_with_a_fence_for_a_session_never_leased_is_fenced() {
    with_store(|store, _| async move {
        let record = session("user:alice", 1);
        store.create_session(&record).await.unwrap();
        let error = store
            .commit(
                record.id,
                Batch {
                    fence: Some(1),
                    ..entries(frames(1, 1))
                },
            )
            .await
            .unwrap_err();
        assert!(is_fenced(&error), "{error}");
        assert_eq!(store.head_offset(record.id).await.unwrap(), 0);
    })
    .await;
}

#[tokio::test]
async fn concurrent_commits_of_one_session_never_leave_a_gap_or_a_duplicate() {
    with_store(|store, _| async move {
        let record = session("user:alice", 1);
        store.create_session(&record).await.unwrap();
        // Every writer tries to append offsets 1..=3 at once: exactly one wins.
        let attempts = (0..8).map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.commit(record.id, entries(frames(1, 3))).await })
        });
        let mut won = 0;
        for attempt in attempts {
            if attempt.await.unwrap().is_ok() {
                won += 1;
            }
        }
        assert_eq!(won, 1);
        assert_eq!(
            store.read_log(record.id, 0, usize::MAX).await.unwrap(),
            frames(1, 3)
        );
    })
    .await;
}

/// A batch queued for [`super::group::commit_group`] and where its answer arrives.
fn queued(
    session_id: Uuid,
    batch: Batch,
) -> (
    super::group::Job,
    tokio::sync::oneshot::Receiver<Result<(), crate::store::CommitError>>,
) {
    let (reply, answer) = tokio::sync::oneshot::channel();
    let job = super::group::Job {
        session_id,
        batch,
        reply,
    };
    (job, answer)
}

#[tokio::test]
async fn one_group_commits_every_batch_it_can_and_answers_each_refused_one_with_its_own_error() {
    with_store(|store, _| async move {
        let mut records = Vec::new();
        for i in 0..10 {
            let record = session("user:alice", i);
            store.create_session(&record).await.unwrap();
            store.claim_lease(record.id, "a", TTL).await.unwrap();
            records.push(record);
        }
        // Replica b takes the first session over: a's fence 1 is stale there.
        let taken = records[0].id;
        assert!(store.release_lease(taken, "a", 1).await.unwrap());
        store.claim_lease(taken, "b", TTL).await.unwrap();
        // The second session has already recorded the action id its batch brings again.
        let replayed = records[1].id;
        let recorded = action(ActionId::mint(), ActionState::Sent);
        store
            .commit(
                replayed,
                Batch {
                    new_actions: vec![recorded.clone()],
                    fence: Some(1),
                    ..entries(frames(1, 1))
                },
            )
            .await
            .unwrap();
        // The third session's first batch leaves a gap; its second continues from the head.
        let gapped = records[2].id;
        // The fourth records an action id in one batch of the group and again in the next.
        let twice = records[3].id;
        let once = action(ActionId::mint(), ActionState::Queued);
        // No such session.
        let unknown = Uuid::now_v7();

        // Queued in an order the group sorts by session, each session's batches in order. The
        // others take a prompt into the queue and dispatch it, as a turn does.
        let mut batches = Vec::new();
        let mut prompts = Vec::new();
        for record in records[4..].iter().rev() {
            let ping = prompt("ping");
            prompts.push((record.id, ping.action_id));
            let mut first = record.clone();
            first.name = "queued".to_owned();
            let mut second = record.clone();
            second.name = "dispatched".to_owned();
            batches.push((
                record.id,
                Batch {
                    queue: vec![QueueOp::PushBack(ping.clone())],
                    new_actions: vec![action(ping.action_id, ActionState::Queued)],
                    session: Some(first),
                    ..entries(frames(1, 2))
                },
            ));
            batches.push((
                record.id,
                Batch {
                    queue: vec![QueueOp::Remove(ping.action_id)],
                    action_states: vec![(ping.action_id, ActionState::Sent)],
                    session: Some(second),
                    ..entries(frames(3, 3))
                },
            ));
        }
        batches.push((unknown, entries(frames(1, 1))));
        batches.push((gapped, entries(frames(5, 5))));
        batches.push((gapped, entries(frames(1, 3))));
        for offset in [1, 2] {
            batches.push((
                twice,
                Batch {
                    new_actions: vec![once.clone()],
                    ..entries(frames(offset, offset))
                },
            ));
        }
        batches.push((
            replayed,
            Batch {
                new_actions: vec![action(recorded.action_id, ActionState::Queued)],
                ..entries(frames(2, 2))
            },
        ));
        batches.push((taken, entries(frames(1, 2))));
        let (jobs, answers): (Vec<_>, Vec<_>) = batches
            .into_iter()
            .map(|(id, batch)| {
                let fence = (id != unknown).then_some(1);
                queued(id, Batch { fence, ..batch })
            })
            .unzip();
        super::group::commit_group(
            &store.pool,
            store.target(),
            super::group::Bounds {
                pool_wait: store.pool_wait,
                answer_within: store.answer_within,
            },
            jobs,
        )
        .await;

        let mut answers = futures::future::join_all(answers).await.into_iter();
        let mut answer = || answers.next().unwrap().expect("every batch is answered");
        for _ in &records[4..] {
            answer().unwrap();
            answer().unwrap();
        }
        let missing = Error::from(answer().unwrap_err());
        assert_eq!(missing.code, ErrorCode::SessionNotFound);
        let gap = Error::from(answer().unwrap_err());
        assert!(gap.message.contains("continue densely from 0"), "{gap}");
        answer().unwrap();
        answer().unwrap();
        let again = Error::from(answer().unwrap_err());
        assert_eq!(again.code, ErrorCode::ActionIdConflict);
        let conflict = Error::from(answer().unwrap_err());
        assert_eq!(conflict.code, ErrorCode::ActionIdConflict);
        let fenced = answer().unwrap_err();
        assert!(is_fenced(&fenced), "{fenced}");

        for record in &records[4..] {
            let id = record.id;
            assert_eq!(
                store.read_log(id, 0, usize::MAX).await.unwrap(),
                frames(1, 3)
            );
            assert!(store.load_queue(id).await.unwrap().is_empty());
            let stored = store.get_session(id).await.unwrap().unwrap();
            assert_eq!(stored.name, "dispatched");
            assert_eq!(stored.labels, record.labels);
        }
        for (id, action_id) in prompts {
            let dispatched = store.find_action(id, action_id).await.unwrap().unwrap();
            assert_eq!(dispatched.state, ActionState::Sent);
        }
        assert_eq!(
            store.read_log(gapped, 0, usize::MAX).await.unwrap(),
            frames(1, 3)
        );
        assert_eq!(
            store.read_log(twice, 0, usize::MAX).await.unwrap(),
            frames(1, 1)
        );
        assert_eq!(
            store.find_action(twice, once.action_id).await.unwrap(),
            Some(once)
        );
        assert_eq!(store.head_offset(replayed).await.unwrap(), 1);
        assert_eq!(
            store
                .find_action(replayed, recorded.action_id)
                .await
                .unwrap(),
            Some(recorded)
        );
        assert_eq!(store.head_offset(taken).await.unwrap(), 0);
    })
    .await;
}

#[tokio::test]
async fn a_statement_the_database_rejects_fails_only_the_batch_that_sent_it() {
    with_store(|store, _| async move {
        let mut records = Vec::new();
        for i in 0..4 {
            let record = session("user:alice", i);
            store.create_session(&record).await.unwrap();
            records.push(record);
        }
        // The first session's queue holds an entry its batch pushes again: the database refuses
        // the duplicate key, which no check of the store looks for.
        let doubled = records[0].id;
        let ping = prompt("ping");
        store
            .commit(doubled, queue(vec![QueueOp::PushBack(ping.clone())]))
            .await
            .unwrap();
        let (jobs, answers): (Vec<_>, Vec<_>) = records
            .iter()
            .map(|record| {
                let ops = if record.id == doubled {
                    vec![QueueOp::PushBack(ping.clone())]
                } else {
                    Vec::new()
                };
                queued(
                    record.id,
                    Batch {
                        queue: ops,
                        ..entries(frames(1, 2))
                    },
                )
            })
            .unzip();
        super::group::commit_group(
            &store.pool,
            store.target(),
            super::group::Bounds {
                pool_wait: store.pool_wait,
                answer_within: store.answer_within,
            },
            jobs,
        )
        .await;

        for (record, answer) in records.iter().zip(futures::future::join_all(answers).await) {
            let answer = answer.expect("every batch is answered");
            if record.id == doubled {
                let error = Error::from(answer.unwrap_err());
                assert!(error.message.contains("23505"), "{error}");
                assert_eq!(store.head_offset(record.id).await.unwrap(), 0);
                assert_eq!(
                    store.load_queue(record.id).await.unwrap(),
                    vec![ping.clone()]
                );
            } else {
                answer.unwrap();
                assert_eq!(
                    store.read_log(record.id, 0, usize::MAX).await.unwrap(),
                    frames(1, 2)
                );
            }
        }
    })
    .await;
}

#[tokio::test]
async fn concurrent_commits_of_many_sessions_all_apply_but_the_fenced_ones_which_report_fenced() {
    with_store(|store, _| async move {
        let mut records = Vec::new();
        for i in 0..60 {
            let record = session("user:alice", i);
            store.create_session(&record).await.unwrap();
            store.claim_lease(record.id, "a", TTL).await.unwrap();
            records.push(record);
        }
        // Replica b takes every tenth session over.
        let taken = |i: usize| i.is_multiple_of(10);
        for (i, record) in records.iter().enumerate().filter(|(i, _)| taken(*i)) {
            assert!(store.release_lease(record.id, "a", 1).await.unwrap(), "{i}");
            store.claim_lease(record.id, "b", TTL).await.unwrap();
        }
        // Two turns' worth each, all at once, so commits of many sessions share transactions.
        let commits = records.iter().map(|record| {
            let store = store.clone();
            let id = record.id;
            async move {
                for (from, to) in [(1, 2), (3, 5)] {
                    let batch = Batch {
                        fence: Some(1),
                        ..entries(frames(from, to))
                    };
                    store.commit(id, batch).await?;
                }
                Ok::<(), CommitError>(())
            }
        });
        let outcomes = futures::future::join_all(commits).await;
        for (i, (record, outcome)) in records.iter().zip(outcomes).enumerate() {
            if taken(i) {
                let error = outcome.unwrap_err();
                assert!(is_fenced(&error), "{error}");
                assert_eq!(store.head_offset(record.id).await.unwrap(), 0);
            } else {
                outcome.unwrap();
                assert_eq!(
                    store.read_log(record.id, 0, usize::MAX).await.unwrap(),
                    frames(1, 5)
                );
            }
        }
    })
    .await;
}

/// Whether the store's own connections are encrypted, as the server sees them.
async fn talks_tls(store: &PostgresStore) -> bool {
    let client = store.client().await.expect("a connection");
    client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_stat_ssl answers")
        .get(0)
}

#[tokio::test]
async fn sslmode_require_talks_tls_to_the_database_and_disable_does_not() {
    let Some(schema) = TestSchema::create().await else {
        return;
    };
    let secure = PostgresStore::connect(schema.options_with("sslmode=require"))
        .await
        .expect("the store opens with sslmode=require");
    assert!(talks_tls(&secure).await, "sslmode=require is encrypted");
    let plain = PostgresStore::connect(schema.options_with("sslmode=disable"))
        .await
        .expect("the store opens with sslmode=disable");
    assert!(!talks_tls(&plain).await, "sslmode=disable is plain text");
    secure.close().await.unwrap();
    plain.close().await.unwrap();
    schema.drop_schema().await;
}

/// The test server's certificate (Debian's snakeoil, `ssl = on`), when this machine has it.
const SNAKEOIL: &str = "/etc/ssl/certs/ssl-cert-snakeoil.pem";

#[tokio::test]
async fn verify_ca_accepts_a_server_whose_certificate_the_root_file_holds() {
    if !std::path::Path::new(SNAKEOIL).exists() {
        eprintln!("note: skipping: no {SNAKEOIL} on this machine");
        return;
    }
    let Some(schema) = TestSchema::create().await else {
        return;
    };
    let store = PostgresStore::connect(
        schema.options_with(&format!("sslmode=verify-ca&sslrootcert={SNAKEOIL}")),
    )
    .await
    .expect("the store opens with verify-ca against the server's own certificate");
    assert!(talks_tls(&store).await);
    store.close().await.unwrap();
    schema.drop_schema().await;
}

#[tokio::test]
async fn verify_full_with_a_wrong_root_certificate_is_refused_at_start_with_a_clear_message() {
    let Some(schema) = TestSchema::create().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let wrong = dir.path().join("wrong-root.pem");
    let other = rcgen::generate_simple_self_signed(vec!["elsewhere.example".to_owned()]).unwrap();
    std::fs::write(&wrong, other.cert.pem()).unwrap();
    let error = tokio::time::timeout(
        Duration::from_secs(60),
        PostgresStore::connect(schema.options_with(&format!(
            "sslmode=verify-full&sslrootcert={}",
            wrong.display()
        ))),
    )
    .await
    .expect("the attempt ends within the timeout")
    .err()
    .expect("a server the root does not vouch for is refused");
    assert!(error.message.contains("cannot connect to"), "{error}");
    assert!(error.message.contains("certificate"), "{error}");
    // Not a passing outage: retrying will not make the certificate verify.
    assert_eq!(error.code, crate::domain::ErrorCode::Internal, "{error}");
    eprintln!("refused as: {error}");
    schema.drop_schema().await;
}

#[tokio::test]
async fn verify_full_without_a_readable_root_certificate_is_refused_naming_the_file_and_database() {
    let error = PostgresStore::connect(PostgresOptions::new(
        "postgres://someone:secret@db.example:5433/prod?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
    ))
    .await
    .err()
    .expect("refused");
    assert!(error.message.contains("/nonexistent/ca.pem"), "{error}");
    assert!(error.message.contains("db.example:5433/prod"), "{error}");
    assert!(!error.message.contains("secret"), "{error}");
}

#[tokio::test]
async fn a_database_that_does_not_exist_fails_at_start_naming_it_but_not_the_password() {
    let Ok(url) = std::env::var(TEST_DATABASE_ENV) else {
        return;
    };
    let config: tokio_postgres::Config = url.parse().expect("the test URL parses");
    let host = match &config.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(host) => host.clone(),
        #[cfg(unix)]
        tokio_postgres::config::Host::Unix(_) => return,
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres").to_owned();
    let error = PostgresStore::connect(PostgresOptions::new(format!(
        "postgres://{user}:hunter2@{host}:{port}/ah_no_such_database"
    )))
    .await
    .err()
    .expect("a missing database fails");
    assert!(
        error
            .message
            .contains(&format!("{host}:{port}/ah_no_such_database")),
        "{error}"
    );
    assert!(error.message.contains("does not exist"), "{error}");
    assert!(!error.message.contains("hunter2"), "{error}");
}

#[tokio::test]
async fn an_unreachable_database_fails_at_start_naming_host_and_database_but_not_the_password() {
    // Port 1 on loopback: nothing listens, the connection is refused at once.
    let error = tokio::time::timeout(
        Duration::from_secs(60),
        PostgresStore::connect(PostgresOptions::new(
            "postgres://someone:secret@127.0.0.1:1/somedb",
        )),
    )
    .await
    .expect("the attempt ends within the timeout")
    .err()
    .expect("an unreachable database fails");
    assert!(error.message.contains("127.0.0.1:1/somedb"), "{error}");
    assert!(!error.message.contains("secret"), "{error}");
}

#[tokio::test]
async fn a_database_url_that_does_not_parse_is_refused_without_echoing_it() {
    let error = PostgresStore::connect(PostgresOptions::new(
        "postgres://someone:secret@host/db?sslmode=sometimes",
    ))
    .await
    .err()
    .expect("a bad URL is refused");
    assert!(error.message.contains("database URL is invalid"), "{error}");
    assert!(!error.message.contains("secret"), "{error}");
}

#[tokio::test]
async fn a_commit_on_one_replica_wakes_the_listeners_of_another_with_the_session_and_head() {
    with_store(|writer, schema| async move {
        let listener = schema.open().await;
        let mut wakes = listener
            .wake_ups()
            .expect("the PostgreSQL store can wake subscribers");
        // The first wake-up says the listening connection is up: nothing committed from now on
        // can pass unnoticed.
        let first = wakes.recv().await.expect("the listener runs");
        assert_eq!(first, crate::store::Wake::everyone());

        let record = session("user:alice", 1);
        writer.create_session(&record).await.unwrap();
        writer
            .commit(record.id, entries(frames(1, 3)))
            .await
            .unwrap();
        let wake = loop {
            let wake = wakes.recv().await.expect("the listener runs");
            if wake.session == record.id {
                break wake;
            }
        };
        assert_eq!(wake.head, 3);

        writer.delete_session(record.id).await.unwrap();
        let wake = loop {
            let wake = wakes.recv().await.expect("the listener runs");
            if wake.concerns(record.id) {
                break wake;
            }
        };
        assert_eq!(
            (wake.session, wake.head),
            (record.id, 0),
            "a delete wakes too"
        );
        listener.close().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn concurrent_commits_of_many_sessions_each_wake_another_replica_with_their_head() {
    with_store(|writer, schema| async move {
        let listener = schema.open().await;
        let mut wakes = listener
            .wake_ups()
            .expect("the PostgreSQL store can wake subscribers");
        let first = wakes.recv().await.expect("the listener runs");
        assert_eq!(first, crate::store::Wake::everyone());

        let mut records = Vec::new();
        for i in 0..40 {
            let record = session("user:alice", i);
            writer.create_session(&record).await.unwrap();
            records.push(record);
        }
        // Committed at once, so the notifier gathers several into one notification.
        let commits = records.iter().map(|record| {
            let writer = writer.clone();
            let id = record.id;
            async move { writer.commit(id, entries(frames(1, 2))).await }
        });
        for committed in futures::future::join_all(commits).await {
            committed.unwrap();
        }
        let mut waiting: std::collections::HashSet<Uuid> = records.iter().map(|r| r.id).collect();
        while !waiting.is_empty() {
            let wake = wakes.recv().await.expect("the listener keeps up");
            if waiting.remove(&wake.session) {
                assert_eq!(wake.head, 2, "the wake-up carries the head");
            }
        }
        listener.close().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_replicas_published_bridges_replace_its_earlier_ones_and_expire_with_their_ttl() {
    with_store(|store, _schema| async move {
        let ad = |id: &str, replica: &str| crate::store::BridgeAd {
            bridge_id: id.into(),
            principal: format!("owner-of-{id}"),
            connected: id != "b2",
            replica: replica.into(),
            labels: [("pool".to_owned(), "gpu".to_owned())].into(),
            profiles: vec!["mock".into()],
            runtimes: 2,
        };
        store
            .publish_bridges("a@x:1", &[ad("b1", "a@x:1"), ad("b2", "a@x:1")], TTL)
            .await
            .unwrap();
        store
            .publish_bridges("c@x:3", &[ad("b3", "c@x:3")], Duration::ZERO)
            .await
            .unwrap();
        store
            .publish_bridges("a@x:1", &[ad("b2", "a@x:1")], TTL)
            .await
            .unwrap();
        // c's publication, with no TTL, has expired already.
        let ads = store.bridge_ads().await.unwrap();
        assert_eq!(ads, vec![ad("b2", "a@x:1")]);
    })
    .await;
}

#[tokio::test]
async fn a_group_blocked_past_the_statement_timeout_answers_every_batch_unavailable_at_once() {
    let Some(schema) = TestSchema::create().await else {
        return;
    };
    let store = PostgresStore::connect(PostgresOptions {
        statement_timeout: Duration::from_millis(300),
        ..schema.options()
    })
    .await
    .expect("the store opens");
    let records: Vec<_> = (0..10).map(|i| session("user:alice", i)).collect();
    for record in &records {
        store.create_session(record).await.unwrap();
    }
    // Another client holds every session row, as a stuck transaction would.
    let mut holder = connect_plain(&schema.url).await;
    let hold = holder.transaction().await.unwrap();
    hold.batch_execute(&format!(
        "SELECT pk FROM {}.sessions FOR UPDATE",
        schema.name
    ))
    .await
    .unwrap();
    let (jobs, answers): (Vec<_>, Vec<_>) = records
        .iter()
        .map(|record| queued(record.id, entries(frames(1, 1))))
        .unzip();
    // Committed one by one after the group failed, the last answer would take ten timeouts.
    tokio::time::timeout(
        Duration::from_millis(1500),
        super::group::commit_group(
            &store.pool,
            &store.target,
            super::group::Bounds {
                pool_wait: store.pool_wait,
                answer_within: store.answer_within,
            },
            jobs,
        ),
    )
    .await
    .expect("every batch is answered within a few statement timeouts");
    for answer in answers {
        let error = Error::from(answer.await.unwrap().unwrap_err());
        assert_eq!(error.code, ErrorCode::StoreUnavailable, "{error}");
    }
    hold.rollback().await.unwrap();
    for record in &records {
        assert_eq!(
            store.head_offset(record.id).await.unwrap(),
            0,
            "nothing stored"
        );
    }
    store.close().await.unwrap();
    drop(store);
    schema.drop_schema().await;
}

#[test]
fn every_connection_gets_a_connect_timeout_keepalives_and_a_tcp_user_timeout_unless_the_url_sets_them()
 {
    let mut config: tokio_postgres::Config = "postgres://u@h/db".parse().unwrap();
    super::bound_connections(&mut config);
    assert_eq!(config.get_connect_timeout(), Some(&super::CONNECT_TIMEOUT));
    assert!(config.get_keepalives());
    assert_eq!(config.get_keepalives_idle(), super::KEEPALIVE_IDLE);
    assert_eq!(
        config.get_keepalives_interval(),
        Some(super::KEEPALIVE_INTERVAL)
    );
    assert_eq!(
        config.get_keepalives_retries(),
        Some(super::KEEPALIVE_RETRIES)
    );
    assert_eq!(
        config.get_tcp_user_timeout(),
        Some(&super::TCP_USER_TIMEOUT)
    );

    let mut config: tokio_postgres::Config = "postgres://u@h/db?connect_timeout=3\
        &keepalives_idle=30&keepalives_interval=7&keepalives_retries=9&tcp_user_timeout=4"
        .parse()
        .unwrap();
    super::bound_connections(&mut config);
    assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(3)));
    assert_eq!(config.get_keepalives_idle(), Duration::from_secs(30));
    assert_eq!(
        config.get_keepalives_interval(),
        Some(Duration::from_secs(7))
    );
    assert_eq!(config.get_keepalives_retries(), Some(9));
    assert_eq!(config.get_tcp_user_timeout(), Some(&Duration::from_secs(4)));
}
