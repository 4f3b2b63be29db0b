//! Applying a [`Batch`] in one transaction with few round trips.
//!
//! After the session row is locked, every statement of the batch is sent at once (tokio-postgres
//! pipelines requests sent before their answers are awaited) and run by the server in the order
//! sent. Checks that can fail the batch — the fence, dense offsets, a new action id already
//! recorded — are statements whose row counts are inspected once all answers are in; any failure
//! rolls the whole transaction back, so what the pipeline wrote is never committed.

use std::{
    future::Future,
    pin::Pin,
    task::{Context as TaskContext, Poll},
};

use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::Context;
use crate::{
    domain::{ActionId, Error, ErrorCode, Result},
    store::{Batch, QueueOp, StoreError, context_to_json, fenced, to_micros, work_to_json},
};

type Tx<'a> = deadpool_postgres::Transaction<'a>;
type Pending<'a> = Pin<Box<dyn Future<Output = Result<u64, tokio_postgres::Error>> + Send + 'a>>;

/// What a statement's row count must be for the batch to stand.
enum Check {
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

/// Polls every future in order, each until done: on the first poll every request is sent, in
/// order, before any answer is awaited.
async fn in_order(mut pending: Vec<Pending<'_>>) -> Vec<Result<u64, tokio_postgres::Error>> {
    let mut results: Vec<Option<Result<u64, tokio_postgres::Error>>> =
        pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx: &mut TaskContext<'_>| {
        let mut done = true;
        for (future, result) in pending.iter_mut().zip(results.iter_mut()) {
            if result.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(outcome) => *result = Some(outcome),
                    Poll::Pending => done = false,
                }
            }
        }
        if done { Poll::Ready(()) } else { Poll::Pending }
    })
    .await;
    results
        .into_iter()
        .map(|r| r.expect("polled to the end"))
        .collect()
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

/// The owned parameters of one queue operation.
struct QueueRow<'b> {
    sql: &'static str,
    action_id: Uuid,
    actor: Option<&'b str>,
    created_at: i64,
    traceparent: Option<&'b str>,
    context: Option<String>,
    work: Option<String>,
}

/// Applies `batch` to the session whose row `pk` the transaction has locked. Returns with the
/// transaction still open; the caller commits.
pub(super) async fn apply(tx: &Tx<'_>, pk: i64, session_id: Uuid, batch: &Batch) -> Result<()> {
    let entries = &batch.entries;
    // Offsets inside the batch: checked here, the continuation from the head by the insert.
    let first = entries.first().map(|e| e.offset);
    if let Some(first) = first {
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

    // Owned parameters, so the pending statements can borrow them.
    let fence = batch.fence.map(|f| i64::try_from(f).unwrap_or(-1));
    let first_offset = first.map_or(0, |f| f as i64);
    let offsets: Vec<i64> = (0..entries.len() as i64)
        .map(|i| first_offset + i)
        .collect();
    let directions: Vec<i16> = entries
        .iter()
        .map(|e| e.direction.as_i64() as i16)
        .collect();
    let actors: Vec<&str> = entries.iter().map(|e| e.actor.as_str()).collect();
    let action_ids: Vec<Option<Uuid>> = entries
        .iter()
        .map(|e| e.action_id.as_ref().map(ActionId::as_uuid))
        .collect();
    let epochs: Vec<i64> = entries.iter().map(|e| i64::from(e.epoch)).collect();
    let times: Vec<i64> = entries.iter().map(|e| to_micros(e.created_at)).collect();
    let jsons: Vec<&str> = entries.iter().map(|e| e.json.as_str()).collect();
    let expected_head = first_offset - 1;
    let queue_rows: Vec<QueueRow<'_>> = batch.queue.iter().map(queue_row).collect();
    let new_actions: Vec<(Uuid, &str, i64, &str)> = batch
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
        .collect();
    let action_states: Vec<(Uuid, &str)> = batch
        .action_states
        .iter()
        .map(|(id, state)| (id.as_uuid(), state.as_str()))
        .collect();
    let record = batch.session.as_ref().map(|r| {
        let label_keys: Vec<&str> = r.labels.keys().map(String::as_str).collect();
        let label_values: Vec<&str> = r.labels.values().map(String::as_str).collect();
        let positions: Vec<i64> = (0..r.editors.len() as i64).collect();
        (
            r,
            r.status.as_str(),
            to_micros(r.created_at),
            to_micros(r.updated_at),
            label_keys,
            label_values,
            positions,
        )
    });

    // Prepared (and cached per connection) before anything is sent.
    let prepare = |sql: &'static str| async move {
        tx.prepare_cached(sql)
            .await
            .context("preparing a statement")
    };
    let fence_stmt = prepare(FENCE_SQL).await?;
    let log_stmt = prepare(LOG_SQL).await?;
    let mut queue_stmts = Vec::with_capacity(queue_rows.len());
    for row in &queue_rows {
        queue_stmts.push(prepare(row.sql).await?);
    }
    let new_action_stmt = prepare(NEW_ACTION_SQL).await?;
    let action_state_stmt = prepare(ACTION_STATE_SQL).await?;
    let record_stmts = [
        RECORD_SQL,
        CLEAR_LABELS_SQL,
        CLEAR_EDITORS_SQL,
        LABELS_SQL,
        EDITORS_SQL,
    ];
    let mut prepared_record = Vec::new();
    if record.is_some() {
        for sql in record_stmts {
            prepared_record.push(prepare(sql).await?);
        }
    }

    let mut pending: Vec<Pending<'_>> = Vec::new();
    let mut checks: Vec<Check> = Vec::new();
    if let (Some(fence), Some(wanted)) = (&fence, batch.fence) {
        pending.push(Box::pin(
            tx.execute_raw(&fence_stmt, [p(&session_id), p(fence)]),
        ));
        checks.push(Check::Fence(wanted));
    }
    if let Some(first) = first {
        pending.push(Box::pin(tx.execute_raw(
            &log_stmt,
            [
                p(&pk),
                p(&offsets),
                p(&directions),
                p(&actors),
                p(&action_ids),
                p(&epochs),
                p(&times),
                p(&jsons),
                p(&expected_head),
            ],
        )));
        checks.push(Check::Log {
            entries: entries.len() as u64,
            first,
        });
    }
    for (row, stmt) in queue_rows.iter().zip(&queue_stmts) {
        let future: Pending<'_> = if row.actor.is_some() {
            Box::pin(tx.execute_raw(
                stmt,
                [
                    p(&pk),
                    p(&row.action_id),
                    p(&row.actor),
                    p(&row.created_at),
                    p(&row.traceparent),
                    p(&row.context),
                    p(&row.work),
                ],
            ))
        } else if row.sql == CLEAR_QUEUE_SQL {
            Box::pin(tx.execute_raw(stmt, [p(&pk)]))
        } else {
            Box::pin(tx.execute_raw(stmt, [p(&pk), p(&row.action_id)]))
        };
        pending.push(future);
        checks.push(Check::Any);
    }
    for ((id, state, created, fingerprint), action) in new_actions.iter().zip(&batch.new_actions) {
        pending.push(Box::pin(tx.execute_raw(
            &new_action_stmt,
            [p(&pk), p(id), p(state), p(created), p(fingerprint)],
        )));
        checks.push(Check::NewAction(action.action_id));
    }
    for (id, state) in &action_states {
        pending.push(Box::pin(
            tx.execute_raw(&action_state_stmt, [p(&pk), p(id), p(state)]),
        ));
        checks.push(Check::Any);
    }
    if let Some((r, status, created, updated, keys, values, positions)) = &record {
        pending.push(Box::pin(tx.execute_raw(
            &prepared_record[0],
            [
                p(&pk),
                p(&r.name),
                p(&r.owner),
                p(&r.profile),
                p(&r.cwd),
                p(&r.model),
                p(&r.acp_session_id),
                p(status),
                p(&r.status_reason),
                p(created),
                p(updated),
                p(&r.profile_fingerprint),
                p(&r.request_fingerprint),
                p(&r.can_resume),
                p(&r.can_load),
            ],
        )));
        pending.push(Box::pin(tx.execute_raw(&prepared_record[1], [p(&pk)])));
        pending.push(Box::pin(tx.execute_raw(&prepared_record[2], [p(&pk)])));
        pending.push(Box::pin(
            tx.execute_raw(&prepared_record[3], [p(&pk), p(keys), p(values)]),
        ));
        pending.push(Box::pin(tx.execute_raw(
            &prepared_record[4],
            [p(&pk), p(positions), p(&r.editors)],
        )));
        checks.extend((0..5).map(|_| Check::Any));
    }

    let results = in_order(pending).await;
    // The first failure in statement order explains the batch; later statements of an aborted
    // transaction only fail because of it.
    for (result, check) in results.into_iter().zip(checks) {
        let count = result.context("applying a batch")?;
        match check {
            Check::Any => {}
            Check::Fence(wanted) if count != 1 => {
                // Best effort: the message's "current" is only a hint.
                let current = current_fence(tx, session_id).await.ok().flatten();
                return Err(fenced(session_id, wanted, current));
            }
            Check::Log { entries, first } if count != entries => {
                let head = tx
                    .query_one(
                        "SELECT coalesce(max(\"offset\"), 0) FROM log WHERE session_pk = $1",
                        &[&pk],
                    )
                    .await
                    .map_or_else(
                        |_| "the head".to_owned(),
                        |row| row.get::<_, i64>(0).to_string(),
                    );
                return Err(StoreError::refused(format!(
                    "log offsets must continue densely from {head}: got {first}"
                ))
                .into());
            }
            Check::NewAction(action_id) if count == 0 => {
                return Err(Error::new(
                    ErrorCode::ActionIdConflict,
                    format!("action id {action_id} is already recorded"),
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// A parameter as the trait object the statements take.
fn p(value: &(dyn ToSql + Sync)) -> &(dyn ToSql + Sync) {
    value
}

async fn current_fence(tx: &Tx<'_>, session_id: Uuid) -> Result<Option<u64>> {
    Ok(tx
        .query_opt(
            "SELECT fence FROM leases WHERE session_id = $1",
            &[&session_id],
        )
        .await
        .context("reading the lease")?
        .and_then(|row| u64::try_from(row.get::<_, i64>(0)).ok()))
}

fn queue_row(op: &QueueOp) -> QueueRow<'_> {
    match op {
        QueueOp::PushBack(entry) | QueueOp::PushFront(entry) | QueueOp::Update(entry) => QueueRow {
            sql: match op {
                QueueOp::PushBack(_) => PUSH_BACK_SQL,
                QueueOp::PushFront(_) => PUSH_FRONT_SQL,
                _ => UPDATE_QUEUED_SQL,
            },
            action_id: entry.action_id.as_uuid(),
            actor: Some(entry.actor.as_str()),
            created_at: to_micros(entry.created_at),
            traceparent: entry.traceparent.as_deref(),
            context: context_to_json(&entry.context),
            work: Some(work_to_json(entry)),
        },
        QueueOp::Remove(action_id) => QueueRow {
            sql: REMOVE_QUEUED_SQL,
            action_id: action_id.as_uuid(),
            actor: None,
            created_at: 0,
            traceparent: None,
            context: None,
            work: None,
        },
        QueueOp::Clear => QueueRow {
            sql: CLEAR_QUEUE_SQL,
            action_id: Uuid::nil(),
            actor: None,
            created_at: 0,
            traceparent: None,
            context: None,
            work: None,
        },
    }
}
