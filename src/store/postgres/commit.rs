//! The statements that apply a [`Batch`], sent so that a whole group of batches costs few round
//! trips (see `postgres/group.rs` for how batches are gathered into one transaction).
//!
//! Every statement of every batch of a group is sent at once (tokio-postgres pipelines requests
//! sent before their answers are awaited) and run by the server in the order sent. Checks that can
//! refuse a batch — the fence, dense offsets, a new action id already recorded — are statements
//! whose row counts are inspected once all answers are in ([`Check`]); a refused batch's
//! statements have run by then, so the group's transaction is rolled back and tried again
//! without it.

use std::{
    future::Future,
    pin::Pin,
    task::{Context as TaskContext, Poll},
};

use tokio_postgres::{Statement, types::ToSql};
use uuid::Uuid;

use super::Context;
use crate::{
    domain::{ActionId, Error, ErrorCode, Result},
    store::{Batch, QueueOp, StoreError, context_to_json, fenced, to_micros, work_to_json},
};

pub(super) type Tx<'a> = deadpool_postgres::Transaction<'a>;
/// A statement sent (on its first poll) whose answer is awaited.
pub(super) type Pending<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, tokio_postgres::Error>> + Send + 'a>>;

/// Polls every future until done and returns their outcomes in order. The first poll sends every
/// request, in order, before any answer is awaited; after that the answers come back in the
/// order sent, so waiting on the oldest unanswered one is enough (polling them all on every
/// wake-up would cost time quadratic in the size of a group).
pub(super) async fn in_order<T>(
    mut pending: Vec<Pending<'_, T>>,
) -> Vec<Result<T, tokio_postgres::Error>> {
    let mut results: Vec<Option<Result<T, tokio_postgres::Error>>> =
        pending.iter().map(|_| None).collect();
    let mut first_poll = true;
    let mut oldest = 0;
    std::future::poll_fn(|cx: &mut TaskContext<'_>| {
        for (future, result) in pending.iter_mut().zip(results.iter_mut()).skip(oldest) {
            if result.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(outcome) => *result = Some(outcome),
                    Poll::Pending if first_poll => {}
                    Poll::Pending => break,
                }
            }
        }
        first_poll = false;
        while results.get(oldest).is_some_and(Option::is_some) {
            oldest += 1;
        }
        if oldest == results.len() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    results
        .into_iter()
        .map(|r| r.expect("polled to the end"))
        .collect()
}

/// What a statement's row count must be for its batch to stand.
pub(super) enum Check {
    Any,
    /// The lease still carries the writer's fence.
    Fence(u64),
    /// Every entry was appended: the batch continued from the head.
    Log {
        entries: u64,
        first: u64,
    },
    /// The action id was new.
    NewAction(ActionId),
}

impl Check {
    /// Why a row count refuses the batch, if it does.
    pub(super) fn refusal(&self, count: u64) -> Option<Refusal> {
        match *self {
            Self::Fence(wanted) if count != 1 => Some(Refusal::Fenced(wanted)),
            Self::Log { entries, first } if count != entries => Some(Refusal::Gap { first }),
            Self::NewAction(action_id) if count == 0 => Some(Refusal::Duplicate(action_id)),
            _ => None,
        }
    }
}

/// Why a batch was refused, as found inside the group's transaction. It becomes the caller's
/// error once the transaction is rolled back ([`Refusal::into_error`]), so the hints the message
/// carries (the current fence, the head) are read outside it.
pub(super) enum Refusal {
    /// No session row to lock.
    NotFound,
    /// The lease no longer carries this fence.
    Fenced(u64),
    /// The first offset was not head + 1.
    Gap {
        first: u64,
    },
    Duplicate(ActionId),
    /// A statement failed (the database refused it).
    Failed(Error),
}

impl Refusal {
    pub(super) async fn into_error(
        self,
        client: &tokio_postgres::Client,
        session_id: Uuid,
    ) -> Error {
        match self {
            Self::NotFound => Error::session_not_found(&session_id.to_string()),
            Self::Fenced(wanted) => {
                // Best effort: the message's "current" is only a hint.
                let current = client
                    .query_opt(
                        "SELECT fence FROM leases WHERE session_id = $1",
                        &[&session_id],
                    )
                    .await
                    .ok()
                    .flatten()
                    .and_then(|row| u64::try_from(row.get::<_, i64>(0)).ok());
                fenced(session_id, wanted, current)
            }
            Self::Gap { first } => {
                let head = client
                    .query_one(
                        "SELECT coalesce(max(\"offset\"), 0) FROM log \
                         WHERE session_pk = (SELECT pk FROM sessions WHERE id = $1)",
                        &[&session_id],
                    )
                    .await
                    .map_or_else(
                        |_| "the head".to_owned(),
                        |row| row.get::<_, i64>(0).to_string(),
                    );
                StoreError::refused(format!(
                    "log offsets must continue densely from {head}: got {first}"
                ))
                .into()
            }
            Self::Duplicate(action_id) => Error::new(
                ErrorCode::ActionIdConflict,
                format!("action id {action_id} is already recorded"),
            ),
            Self::Failed(error) => error,
        }
    }
}

/// What can be refused without asking the database: offsets not dense inside the batch, offsets
/// out of the stored range, the record of another session.
pub(super) fn precheck(session_id: Uuid, batch: &Batch) -> Result<()> {
    let entries = &batch.entries;
    if let Some(first) = entries.first().map(|e| e.offset) {
        for (i, entry) in entries.iter().enumerate() {
            if entry.offset != first + i as u64 {
                return Err(StoreError::refused(format!(
                    "log offsets must be dense inside a batch: got {} after {}",
                    entry.offset,
                    first + i as u64 - 1
                ))
                .into());
            }
        }
        if i64::try_from(first + entries.len() as u64).is_err() {
            return Err(StoreError::refused("log offsets exceed the stored range").into());
        }
    }
    if let Some(record) = &batch.session
        && record.id != session_id
    {
        return Err(StoreError::refused(format!(
            "postgres store: a batch for session {session_id} carries the record of session {}",
            record.id
        ))
        .into());
    }
    Ok(())
}

const FENCE_SQL: &str = "SELECT 1 FROM leases WHERE session_id = $1 AND fence = $2 FOR SHARE";
// The head check is part of the insert: a new statement sees every commit that finished before
// it, and the session row lock keeps other writers out until ours ends.
const LOG_SQL: &str = "INSERT INTO log (session_pk, \"offset\", direction, actor, action_id, \
     epoch, created_at, json) \
     SELECT $1, o, d, a, i, e, c, j \
     FROM unnest($2::bigint[], $3::smallint[], $4::text[], $5::uuid[], $6::bigint[], \
                 $7::bigint[], $8::text[]) AS t(o, d, a, i, e, c, j) \
     WHERE (SELECT coalesce(max(\"offset\"), 0) FROM log WHERE session_pk = $1) = $9";
const PUSH_BACK_SQL: &str = "INSERT INTO queue (session_pk, action_id, position, actor, \
     created_at, traceparent, context, work) VALUES ($1, $2, \
     (SELECT coalesce(max(position), 0) + 1 FROM queue WHERE session_pk = $1), \
     $3, $4, $5, $6, $7)";
const PUSH_FRONT_SQL: &str = "INSERT INTO queue (session_pk, action_id, position, actor, \
     created_at, traceparent, context, work) VALUES ($1, $2, \
     (SELECT coalesce(min(position), 1) - 1 FROM queue WHERE session_pk = $1), \
     $3, $4, $5, $6, $7)";
const UPDATE_QUEUED_SQL: &str = "UPDATE queue SET actor = $3, created_at = $4, \
     traceparent = $5, context = $6, work = $7 WHERE session_pk = $1 AND action_id = $2";
const REMOVE_QUEUED_SQL: &str = "DELETE FROM queue WHERE session_pk = $1 AND action_id = $2";
const CLEAR_QUEUE_SQL: &str = "DELETE FROM queue WHERE session_pk = $1";
const NEW_ACTION_SQL: &str = "INSERT INTO actions (session_pk, action_id, state, created_at, \
     fingerprint) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (session_pk, action_id) DO NOTHING";
const ACTION_STATE_SQL: &str =
    "UPDATE actions SET state = $3 WHERE session_pk = $1 AND action_id = $2";
const RECORD_SQL: &str = "UPDATE sessions SET name = $2, owner = $3, profile = $4, cwd = $5, \
     model = $6, acp_session_id = $7, status = $8, status_reason = $9, created_at = $10, \
     updated_at = $11, profile_fingerprint = $12, request_fingerprint = $13, can_resume = $14, \
     can_load = $15 WHERE pk = $1";
const CLEAR_LABELS_SQL: &str = "DELETE FROM session_labels WHERE session_pk = $1";
const CLEAR_EDITORS_SQL: &str = "DELETE FROM session_editors WHERE session_pk = $1";
const LABELS_SQL: &str = "INSERT INTO session_labels (session_pk, key, value) \
     SELECT $1, k, v FROM unnest($2::text[], $3::text[]) AS t(k, v)";
const EDITORS_SQL: &str = "INSERT INTO session_editors (session_pk, position, principal) \
     SELECT $1, p, e FROM unnest($2::bigint[], $3::text[]) AS t(p, e)";

/// Every statement a batch may need, prepared (and cached per connection) before anything is
/// sent, so the pipeline holds no preparation round trips.
pub(super) struct Statements {
    fence: Statement,
    log: Statement,
    push_back: Statement,
    push_front: Statement,
    update_queued: Statement,
    remove_queued: Statement,
    clear_queue: Statement,
    new_action: Statement,
    action_state: Statement,
    /// The record, its labels and editors: [`RECORD_SQL`] to [`EDITORS_SQL`].
    record: [Statement; 5],
}

impl Statements {
    pub(super) async fn prepare(tx: &Tx<'_>) -> Result<Self> {
        let prepare = |sql: &'static str| async move {
            tx.prepare_cached(sql)
                .await
                .context("preparing a statement")
        };
        Ok(Self {
            fence: prepare(FENCE_SQL).await?,
            log: prepare(LOG_SQL).await?,
            push_back: prepare(PUSH_BACK_SQL).await?,
            push_front: prepare(PUSH_FRONT_SQL).await?,
            update_queued: prepare(UPDATE_QUEUED_SQL).await?,
            remove_queued: prepare(REMOVE_QUEUED_SQL).await?,
            clear_queue: prepare(CLEAR_QUEUE_SQL).await?,
            new_action: prepare(NEW_ACTION_SQL).await?,
            action_state: prepare(ACTION_STATE_SQL).await?,
            record: [
                prepare(RECORD_SQL).await?,
                prepare(CLEAR_LABELS_SQL).await?,
                prepare(CLEAR_EDITORS_SQL).await?,
                prepare(LABELS_SQL).await?,
                prepare(EDITORS_SQL).await?,
            ],
        })
    }
}

/// The owned parameters of one queue operation.
struct QueueRow<'b> {
    op: &'b QueueOp,
    action_id: Uuid,
    actor: Option<&'b str>,
    created_at: i64,
    traceparent: Option<&'b str>,
    context: Option<String>,
    work: Option<String>,
}

/// One batch's statement parameters, owned here so the pending statements can borrow them.
pub(super) struct Planned<'b> {
    /// The session row's key, read by the lock that opened the batch's part of the transaction.
    pk: i64,
    session_id: Uuid,
    batch: &'b Batch,
    fence: Option<i64>,
    offsets: Vec<i64>,
    directions: Vec<i16>,
    actors: Vec<&'b str>,
    action_ids: Vec<Option<Uuid>>,
    epochs: Vec<i64>,
    times: Vec<i64>,
    jsons: Vec<&'b str>,
    expected_head: i64,
    queue: Vec<QueueRow<'b>>,
    new_actions: Vec<(Uuid, &'static str, i64, &'b str)>,
    action_states: Vec<(Uuid, &'static str)>,
    record: Option<RecordParams<'b>>,
}

struct RecordParams<'b> {
    status: &'static str,
    created: i64,
    updated: i64,
    label_keys: Vec<&'b str>,
    label_values: Vec<&'b str>,
    positions: Vec<i64>,
}

impl<'b> Planned<'b> {
    /// The parameters of `batch` (already through [`precheck`]) for the session row `pk`.
    pub(super) fn new(pk: i64, session_id: Uuid, batch: &'b Batch) -> Self {
        let entries = &batch.entries;
        let first_offset = entries.first().map_or(0, |e| e.offset as i64);
        Self {
            pk,
            session_id,
            batch,
            fence: batch.fence.map(|f| i64::try_from(f).unwrap_or(-1)),
            offsets: (0..entries.len() as i64)
                .map(|i| first_offset + i)
                .collect(),
            directions: entries
                .iter()
                .map(|e| e.direction.as_i64() as i16)
                .collect(),
            actors: entries.iter().map(|e| e.actor.as_str()).collect(),
            action_ids: entries
                .iter()
                .map(|e| e.action_id.as_ref().map(ActionId::as_uuid))
                .collect(),
            epochs: entries.iter().map(|e| i64::from(e.epoch)).collect(),
            times: entries.iter().map(|e| to_micros(e.created_at)).collect(),
            jsons: entries.iter().map(|e| e.json.as_str()).collect(),
            expected_head: first_offset - 1,
            queue: batch.queue.iter().map(queue_row).collect(),
            new_actions: batch
                .new_actions
                .iter()
                .map(|a| {
                    (
                        a.action_id.as_uuid(),
                        a.state.as_str(),
                        to_micros(a.created_at),
                        a.fingerprint.as_str(),
                    )
                })
                .collect(),
            action_states: batch
                .action_states
                .iter()
                .map(|(id, state)| (id.as_uuid(), state.as_str()))
                .collect(),
            record: batch.session.as_ref().map(|r| RecordParams {
                status: r.status.as_str(),
                created: to_micros(r.created_at),
                updated: to_micros(r.updated_at),
                label_keys: r.labels.keys().map(String::as_str).collect(),
                label_values: r.labels.values().map(String::as_str).collect(),
                positions: (0..r.editors.len() as i64).collect(),
            }),
        }
    }

    /// The batch's statements, in order, each with what its row count must be; each is sent
    /// when first polled.
    pub(super) fn send<'a>(
        &'a self,
        tx: &'a Tx<'_>,
        statements: &'a Statements,
        out: &mut Vec<(Pending<'a, u64>, Check)>,
    ) {
        let pk = &self.pk;
        if let (Some(fence), Some(wanted)) = (&self.fence, self.batch.fence) {
            out.push((
                Box::pin(tx.execute_raw(&statements.fence, [p(&self.session_id), p(fence)])),
                Check::Fence(wanted),
            ));
        }
        if let Some(first) = self.batch.entries.first().map(|e| e.offset) {
            out.push((
                Box::pin(tx.execute_raw(
                    &statements.log,
                    [
                        p(pk),
                        p(&self.offsets),
                        p(&self.directions),
                        p(&self.actors),
                        p(&self.action_ids),
                        p(&self.epochs),
                        p(&self.times),
                        p(&self.jsons),
                        p(&self.expected_head),
                    ],
                )),
                Check::Log {
                    entries: self.batch.entries.len() as u64,
                    first,
                },
            ));
        }
        for row in &self.queue {
            let future: Pending<'a, u64> = match row.op {
                QueueOp::PushBack(_) | QueueOp::PushFront(_) | QueueOp::Update(_) => {
                    let statement = match row.op {
                        QueueOp::PushBack(_) => &statements.push_back,
                        QueueOp::PushFront(_) => &statements.push_front,
                        _ => &statements.update_queued,
                    };
                    Box::pin(tx.execute_raw(
                        statement,
                        [
                            p(pk),
                            p(&row.action_id),
                            p(&row.actor),
                            p(&row.created_at),
                            p(&row.traceparent),
                            p(&row.context),
                            p(&row.work),
                        ],
                    ))
                }
                QueueOp::Remove(_) => {
                    Box::pin(tx.execute_raw(&statements.remove_queued, [p(pk), p(&row.action_id)]))
                }
                QueueOp::Clear => Box::pin(tx.execute_raw(&statements.clear_queue, [p(pk)])),
            };
            out.push((future, Check::Any));
        }
        for ((id, state, created, fingerprint), action) in
            self.new_actions.iter().zip(&self.batch.new_actions)
        {
            out.push((
                Box::pin(tx.execute_raw(
                    &statements.new_action,
                    [p(pk), p(id), p(state), p(created), p(fingerprint)],
                )),
                Check::NewAction(action.action_id),
            ));
        }
        for (id, state) in &self.action_states {
            out.push((
                Box::pin(tx.execute_raw(&statements.action_state, [p(pk), p(id), p(state)])),
                Check::Any,
            ));
        }
        if let (Some(params), Some(r)) = (&self.record, &self.batch.session) {
            let [record, clear_labels, clear_editors, labels, editors] = &statements.record;
            let record: Pending<'a, u64> = Box::pin(tx.execute_raw(
                record,
                [
                    p(pk),
                    p(&r.name),
                    p(&r.owner),
                    p(&r.profile),
                    p(&r.cwd),
                    p(&r.model),
                    p(&r.acp_session_id),
                    p(&params.status),
                    p(&r.status_reason),
                    p(&params.created),
                    p(&params.updated),
                    p(&r.profile_fingerprint),
                    p(&r.request_fingerprint),
                    p(&r.can_resume),
                    p(&r.can_load),
                ],
            ));
            out.push((record, Check::Any));
            out.push((Box::pin(tx.execute_raw(clear_labels, [p(pk)])), Check::Any));
            out.push((Box::pin(tx.execute_raw(clear_editors, [p(pk)])), Check::Any));
            out.push((
                Box::pin(tx.execute_raw(
                    labels,
                    [p(pk), p(&params.label_keys), p(&params.label_values)],
                )),
                Check::Any,
            ));
            out.push((
                Box::pin(tx.execute_raw(editors, [p(pk), p(&params.positions), p(&r.editors)])),
                Check::Any,
            ));
        }
    }
}

/// A parameter as the trait object the statements take.
fn p(value: &(dyn ToSql + Sync)) -> &(dyn ToSql + Sync) {
    value
}

fn queue_row(op: &QueueOp) -> QueueRow<'_> {
    match op {
        QueueOp::PushBack(entry) | QueueOp::PushFront(entry) | QueueOp::Update(entry) => QueueRow {
            op,
            action_id: entry.action_id.as_uuid(),
            actor: Some(entry.actor.as_str()),
            created_at: to_micros(entry.created_at),
            traceparent: entry.traceparent.as_deref(),
            context: context_to_json(&entry.context),
            work: Some(work_to_json(entry)),
        },
        QueueOp::Remove(action_id) => QueueRow {
            op,
            action_id: action_id.as_uuid(),
            actor: None,
            created_at: 0,
            traceparent: None,
            context: None,
            work: None,
        },
        QueueOp::Clear => QueueRow {
            op,
            action_id: Uuid::nil(),
            actor: None,
            created_at: 0,
            traceparent: None,
            context: None,
            work: None,
        },
    }
}
