//! The statements that commit a group of [`Batch`]es in one transaction (see `postgres/group.rs`
//! for how a group is gathered): a fixed handful however many batches the group holds.
//!
//! Why so few: once commits were grouped, the PostgreSQL backends' CPU bounded the turn rate on
//! two shared cores, most of it the fixed cost of each statement executed (the protocol, the
//! executor's start-up, the socket). With a statement per table per batch the bench's turns/s on
//! PostgreSQL were 0.2–0.3 of SQLite's; with one per table per group, about 0.6.
//!
//! 1. [`read`]: the group's session rows locked `FOR UPDATE`, then their log heads, their leases
//!    locked `FOR SHARE` and which of the new action ids are recorded already — up to four
//!    statements, pipelined. While the rows are locked nobody else writes these sessions or
//!    hands their leases on, so what was read stays true until `COMMIT`.
//! 2. [`judge`]: every check (the fence, dense offsets, new action ids) decided in order, as if
//!    the batches were committed one after another; a refused batch writes nothing.
//! 3. [`Writes`]: the accepted batches' rows, one statement per table (queue operations, whose
//!    positions depend on the operations before them, one each), pipelined.

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    pin::Pin,
    task::{Context as TaskContext, Poll},
};

use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::{
    domain::{ActionId, Error, ErrorCode, Result},
    store::{Batch, CommitError, QueueOp, StoreError, context_to_json, to_micros, work_to_json},
};

pub(super) type Tx<'a> = deadpool_postgres::Transaction<'a>;
/// A statement sent (on its first poll) whose answer is awaited.
type Pending<'a, T> = Pin<Box<dyn Future<Output = Result<T, tokio_postgres::Error>> + Send + 'a>>;

/// Polls every future until done and returns their outcomes in order. The first poll sends every
/// request, in order, before any answer is awaited (tokio-postgres pipelines them); after that the
/// answers come back in the order sent, so waiting on the oldest unanswered one is enough.
async fn in_order<T>(mut pending: Vec<Pending<'_, T>>) -> Vec<Result<T, tokio_postgres::Error>> {
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

// Locked in session order, as every holder of several sessions' rows takes them (see
// `postgres/group.rs`).
const LOCK_SQL: &str = "SELECT id, pk FROM sessions WHERE id = ANY($1) ORDER BY id FOR UPDATE";
const FENCES_SQL: &str = "SELECT session_id, fence FROM leases WHERE session_id = ANY($1) \
     ORDER BY session_id FOR SHARE";
// After the lock: a new statement sees every commit that finished before it.
const HEADS_SQL: &str = "SELECT s.id, (SELECT coalesce(max(l.\"offset\"), 0) FROM log l \
     WHERE l.session_pk = s.pk) FROM sessions s WHERE s.id = ANY($1)";
const RECORDED_SQL: &str = "SELECT w.session_id, w.action_id \
     FROM unnest($1::uuid[], $2::uuid[]) AS w(session_id, action_id) \
     JOIN sessions s ON s.id = w.session_id \
     JOIN actions a ON a.session_pk = s.pk AND a.action_id = w.action_id";

/// One session of a group as the database holds it, once its row is locked.
#[derive(Default)]
pub(super) struct Stored {
    pk: i64,
    /// The lease's fence (`None`: never leased). Read only when a batch carries a fence.
    fence: Option<u64>,
    head: u64,
    /// The batches' new action ids that are recorded already.
    recorded: HashSet<Uuid>,
}

/// Locks the group's sessions and reads what the checks need: the sessions found.
pub(super) async fn read(
    tx: &Tx<'_>,
    batches: &[(Uuid, &Batch)],
) -> Result<HashMap<Uuid, Stored>, tokio_postgres::Error> {
    let mut sessions: Vec<Uuid> = batches.iter().map(|(id, _)| *id).collect();
    sessions.dedup();
    let mut fenced: Vec<Uuid> = batches
        .iter()
        .filter(|(_, batch)| batch.fence.is_some())
        .map(|(id, _)| *id)
        .collect();
    fenced.dedup();
    let (action_sessions, action_ids): (Vec<Uuid>, Vec<Uuid>) = batches
        .iter()
        .flat_map(|(id, batch)| {
            batch
                .new_actions
                .iter()
                .map(|a| (*id, a.action_id.as_uuid()))
        })
        .unzip();

    let lock = tx.prepare_cached(LOCK_SQL).await?;
    let heads = tx.prepare_cached(HEADS_SQL).await?;
    let fences = tx.prepare_cached(FENCES_SQL).await?;
    let recorded = tx.prepare_cached(RECORDED_SQL).await?;
    // The lock first: the reads after it see what the sessions' last writers committed.
    let mut pending = vec![
        query(tx, &lock, vec![&sessions]),
        query(tx, &heads, vec![&sessions]),
    ];
    if !fenced.is_empty() {
        pending.push(query(tx, &fences, vec![&fenced]));
    }
    if !action_ids.is_empty() {
        pending.push(query(tx, &recorded, vec![&action_sessions, &action_ids]));
    }
    let mut answers = in_order(pending).await.into_iter();
    let mut found: HashMap<Uuid, Stored> = HashMap::new();
    for row in answers.next().expect("the lock")? {
        let pk = row.try_get(1)?;
        found.insert(
            row.try_get(0)?,
            Stored {
                pk,
                ..Stored::default()
            },
        );
    }
    for row in answers.next().expect("the heads")? {
        if let Some(stored) = found.get_mut(&row.try_get::<_, Uuid>(0)?) {
            stored.head = u64::try_from(row.try_get::<_, i64>(1)?).unwrap_or_default();
        }
    }
    if !fenced.is_empty() {
        for row in answers.next().expect("the fences")? {
            if let Some(stored) = found.get_mut(&row.try_get::<_, Uuid>(0)?) {
                stored.fence = u64::try_from(row.try_get::<_, i64>(1)?).ok();
            }
        }
    }
    if !action_ids.is_empty() {
        for row in answers.next().expect("the recorded action ids")? {
            if let Some(stored) = found.get_mut(&row.try_get::<_, Uuid>(0)?) {
                stored.recorded.insert(row.try_get(1)?);
            }
        }
    }
    Ok(found)
}

fn query<'a>(
    tx: &'a Tx<'_>,
    statement: &'a tokio_postgres::Statement,
    params: Vec<&'a (dyn ToSql + Sync)>,
) -> Pending<'a, Vec<tokio_postgres::Row>> {
    Box::pin(async move { tx.query(statement, &params).await })
}

/// Each batch's verdict (`None`: accepted), in order, as if committed one after another: an
/// accepted batch moves its session's head and records its action ids for the batches after it.
pub(super) fn judge(
    batches: &[(Uuid, &Batch)],
    found: &mut HashMap<Uuid, Stored>,
) -> Vec<Option<CommitError>> {
    batches
        .iter()
        .map(|&(session_id, batch)| {
            let Some(stored) = found.get_mut(&session_id) else {
                return Some(Error::session_not_found(&session_id.to_string()).into());
            };
            if let Some(fence) = batch.fence
                && stored.fence != Some(fence)
            {
                return Some(CommitError::Fenced {
                    session_id,
                    fence,
                    current: stored.fence,
                });
            }
            if let Some(first) = batch.entries.first().map(|e| e.offset)
                && first != stored.head + 1
            {
                return Some(
                    StoreError::refused(format!(
                        "log offsets must continue densely from {}: got {first}",
                        stored.head
                    ))
                    .into(),
                );
            }
            let mut new = HashSet::new();
            for action in &batch.new_actions {
                let id = action.action_id.as_uuid();
                if stored.recorded.contains(&id) || !new.insert(id) {
                    return Some(
                        Error::new(
                            ErrorCode::ActionIdConflict,
                            format!("action id {} is already recorded", action.action_id),
                        )
                        .into(),
                    );
                }
            }
            stored.head += batch.entries.len() as u64;
            stored.recorded.extend(new);
            None
        })
        .collect()
}

const LOG_SQL: &str = "INSERT INTO log (session_pk, \"offset\", direction, actor, action_id, \
     epoch, created_at, json) \
     SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::smallint[], $4::text[], $5::uuid[], \
                          $6::bigint[], $7::bigint[], $8::text[])";
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
const NEW_ACTIONS_SQL: &str = "INSERT INTO actions (session_pk, action_id, state, created_at, \
     fingerprint) SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::text[], $4::bigint[], \
     $5::text[])";
const USAGE_SQL: &str = "INSERT INTO usage_records (session_id, principal, profile, at, \
     input_tokens, output_tokens, cost_micros, currency, source, action_id) \
     SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], \
                          $6::bigint[], $7::bigint[], $8::text[], $9::text[], $10::uuid[])";
const ACTION_STATES_SQL: &str = "UPDATE actions a SET state = v.state \
     FROM unnest($1::bigint[], $2::uuid[], $3::text[]) AS v(session_pk, action_id, state) \
     WHERE a.session_pk = v.session_pk AND a.action_id = v.action_id";
const RECORDS_SQL: &str = "UPDATE sessions s SET name = v.name, owner = v.owner, \
     profile = v.profile, cwd = v.cwd, model = v.model, acp_session_id = v.acp_session_id, \
     status = v.status, status_reason = v.status_reason, created_at = v.created_at, \
     updated_at = v.updated_at, profile_fingerprint = v.profile_fingerprint, \
     request_fingerprint = v.request_fingerprint, can_resume = v.can_resume, \
     can_load = v.can_load \
     FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], \
                 $7::text[], $8::text[], $9::text[], $10::bigint[], $11::bigint[], $12::text[], \
                 $13::text[], $14::boolean[], $15::boolean[]) \
          AS v(pk, name, owner, profile, cwd, model, acp_session_id, status, status_reason, \
               created_at, updated_at, profile_fingerprint, request_fingerprint, can_resume, \
               can_load) \
     WHERE s.pk = v.pk";
const CLEAR_LABELS_SQL: &str = "DELETE FROM session_labels WHERE session_pk = ANY($1)";
const CLEAR_EDITORS_SQL: &str = "DELETE FROM session_editors WHERE session_pk = ANY($1)";
const LABELS_SQL: &str = "INSERT INTO session_labels (session_pk, key, value) \
     SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[])";
const EDITORS_SQL: &str = "INSERT INTO session_editors (session_pk, position, principal) \
     SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[])";

/// One queue operation's parameters, in the order of its statement's placeholders after `$1`.
struct QueueRow<'b> {
    sql: &'static str,
    pk: i64,
    action_id: Uuid,
    entry: Option<QueuedColumns<'b>>,
}

/// The log entries of a group, column by column (each column is one array parameter).
#[derive(Default)]
struct LogRows<'b> {
    session_pk: Vec<i64>,
    offset: Vec<i64>,
    direction: Vec<i16>,
    actor: Vec<&'b str>,
    action_id: Vec<Option<Uuid>>,
    epoch: Vec<i64>,
    created_at: Vec<i64>,
    json: Vec<&'b str>,
}

/// The new action ids of a group, column by column.
#[derive(Default)]
struct UsageRows<'b> {
    session_id: Vec<Uuid>,
    principal: Vec<&'b str>,
    profile: Vec<&'b str>,
    at: Vec<i64>,
    input_tokens: Vec<i64>,
    output_tokens: Vec<i64>,
    cost_micros: Vec<i64>,
    currency: Vec<&'b str>,
    source: Vec<&'static str>,
    action_id: Vec<Option<Uuid>>,
}

#[derive(Default)]
struct ActionRows<'b> {
    session_pk: Vec<i64>,
    action_id: Vec<Uuid>,
    state: Vec<&'static str>,
    created_at: Vec<i64>,
    fingerprint: Vec<&'b str>,
}

/// The rows the accepted batches of a group write, borrowed from the batches.
#[derive(Default)]
pub(super) struct Writes<'b> {
    log: LogRows<'b>,
    /// In the batches' order: a push's position depends on the operations before it.
    queue: Vec<QueueRow<'b>>,
    new_actions: ActionRows<'b>,
    usage: UsageRows<'b>,
    /// The last state each action id was given in the group.
    action_states: HashMap<(i64, Uuid), &'static str>,
    /// The last record of each session in the group.
    records: HashMap<i64, &'b crate::domain::session::SessionRecord>,
}

impl<'b> Writes<'b> {
    /// The rows of the batches whose verdict is `None`, in order.
    pub(super) fn of(
        batches: &[(Uuid, &'b Batch)],
        verdicts: &[Option<CommitError>],
        found: &HashMap<Uuid, Stored>,
    ) -> Self {
        let mut writes = Self::default();
        for (&(session_id, batch), verdict) in batches.iter().zip(verdicts) {
            let (None, Some(stored)) = (verdict, found.get(&session_id)) else {
                continue;
            };
            let pk = stored.pk;
            let log = &mut writes.log;
            for entry in &batch.entries {
                log.session_pk.push(pk);
                log.offset.push(entry.offset as i64);
                log.direction.push(entry.direction.as_i64() as i16);
                log.actor.push(&entry.actor);
                log.action_id
                    .push(entry.action_id.as_ref().map(ActionId::as_uuid));
                log.epoch.push(i64::from(entry.epoch));
                log.created_at.push(to_micros(entry.created_at));
                log.json.push(&entry.json);
            }
            writes
                .queue
                .extend(batch.queue.iter().map(|op| queue_row(pk, op)));
            for action in &batch.new_actions {
                let id = action.action_id.as_uuid();
                // The inserts run before the updates here; one batch after another, a state given
                // before the id was recorded changed nothing.
                writes.action_states.remove(&(pk, id));
                let new = &mut writes.new_actions;
                new.session_pk.push(pk);
                new.action_id.push(id);
                new.state.push(action.state.as_str());
                new.created_at.push(to_micros(action.created_at));
                new.fingerprint.push(&action.fingerprint);
            }
            for (id, state) in &batch.action_states {
                writes
                    .action_states
                    .insert((pk, id.as_uuid()), state.as_str());
            }
            for usage in &batch.usage {
                let rows = &mut writes.usage;
                rows.session_id.push(usage.session_id);
                rows.principal.push(&usage.principal);
                rows.profile.push(&usage.profile);
                rows.at.push(to_micros(usage.at));
                rows.input_tokens
                    .push(usage.input_tokens.min(i64::MAX as u64) as i64);
                rows.output_tokens
                    .push(usage.output_tokens.min(i64::MAX as u64) as i64);
                rows.cost_micros.push(usage.cost_micros);
                rows.currency.push(&usage.currency);
                rows.source.push(usage.source.as_str());
                rows.action_id
                    .push(usage.action_id.as_ref().map(ActionId::as_uuid));
            }
            if let Some(record) = &batch.session {
                writes.records.insert(pk, record);
            }
        }
        writes
    }

    /// Whether the accepted batches write nothing at all.
    pub(super) fn is_empty(&self) -> bool {
        self.log.session_pk.is_empty()
            && self.queue.is_empty()
            && self.new_actions.session_pk.is_empty()
            && self.usage.session_id.is_empty()
            && self.action_states.is_empty()
            && self.records.is_empty()
    }

    /// Runs the statements, pipelined; the first error, if one failed.
    pub(super) async fn apply(&self, tx: &Tx<'_>) -> Result<(), tokio_postgres::Error> {
        let (states_pk, states_id, states): (Vec<i64>, Vec<Uuid>, Vec<&str>) = self
            .action_states
            .iter()
            .map(|(&(pk, id), &state)| (pk, id, state))
            .collect();
        let records = Records::of(&self.records);

        let mut prepared = HashMap::new();
        for sql in [
            LOG_SQL,
            PUSH_BACK_SQL,
            PUSH_FRONT_SQL,
            UPDATE_QUEUED_SQL,
            REMOVE_QUEUED_SQL,
            CLEAR_QUEUE_SQL,
            NEW_ACTIONS_SQL,
            USAGE_SQL,
            ACTION_STATES_SQL,
            RECORDS_SQL,
            CLEAR_LABELS_SQL,
            CLEAR_EDITORS_SQL,
            LABELS_SQL,
            EDITORS_SQL,
        ] {
            prepared.insert(sql, tx.prepare_cached(sql).await?);
        }
        let statement = |sql: &str| &prepared[sql];

        let mut pending: Vec<Pending<'_, u64>> = Vec::new();
        let log = &self.log;
        if !log.session_pk.is_empty() {
            pending.push(Box::pin(tx.execute_raw(
                statement(LOG_SQL),
                [
                    p(&log.session_pk),
                    p(&log.offset),
                    p(&log.direction),
                    p(&log.actor),
                    p(&log.action_id),
                    p(&log.epoch),
                    p(&log.created_at),
                    p(&log.json),
                ],
            )));
        }
        for row in &self.queue {
            pending.push(match &row.entry {
                Some((actor, created_at, traceparent, context, work)) => Box::pin(tx.execute_raw(
                    statement(row.sql),
                    [
                        p(&row.pk),
                        p(&row.action_id),
                        p(actor),
                        p(created_at),
                        p(traceparent),
                        p(context),
                        p(work),
                    ],
                )),
                None if row.sql == CLEAR_QUEUE_SQL => {
                    Box::pin(tx.execute_raw(statement(row.sql), [p(&row.pk)]))
                }
                None => {
                    Box::pin(tx.execute_raw(statement(row.sql), [p(&row.pk), p(&row.action_id)]))
                }
            });
        }
        let new = &self.new_actions;
        if !new.session_pk.is_empty() {
            pending.push(Box::pin(tx.execute_raw(
                statement(NEW_ACTIONS_SQL),
                [
                    p(&new.session_pk),
                    p(&new.action_id),
                    p(&new.state),
                    p(&new.created_at),
                    p(&new.fingerprint),
                ],
            )));
        }
        let usage = &self.usage;
        if !usage.session_id.is_empty() {
            pending.push(Box::pin(tx.execute_raw(
                statement(USAGE_SQL),
                [
                    p(&usage.session_id),
                    p(&usage.principal),
                    p(&usage.profile),
                    p(&usage.at),
                    p(&usage.input_tokens),
                    p(&usage.output_tokens),
                    p(&usage.cost_micros),
                    p(&usage.currency),
                    p(&usage.source),
                    p(&usage.action_id),
                ],
            )));
        }
        if !states.is_empty() {
            pending.push(Box::pin(tx.execute_raw(
                statement(ACTION_STATES_SQL),
                [p(&states_pk), p(&states_id), p(&states)],
            )));
        }
        if let Some(r) = &records {
            pending.push(Box::pin(tx.execute_raw(
                statement(RECORDS_SQL),
                [
                    p(&r.pk),
                    p(&r.name),
                    p(&r.owner),
                    p(&r.profile),
                    p(&r.cwd),
                    p(&r.model),
                    p(&r.acp_session_id),
                    p(&r.status),
                    p(&r.status_reason),
                    p(&r.created_at),
                    p(&r.updated_at),
                    p(&r.profile_fingerprint),
                    p(&r.request_fingerprint),
                    p(&r.can_resume),
                    p(&r.can_load),
                ],
            )));
            pending.push(Box::pin(
                tx.execute_raw(statement(CLEAR_LABELS_SQL), [p(&r.pk)]),
            ));
            pending.push(Box::pin(
                tx.execute_raw(statement(CLEAR_EDITORS_SQL), [p(&r.pk)]),
            ));
            if !r.labels.0.is_empty() {
                pending.push(Box::pin(tx.execute_raw(
                    statement(LABELS_SQL),
                    [p(&r.labels.0), p(&r.labels.1), p(&r.labels.2)],
                )));
            }
            if !r.editors.0.is_empty() {
                pending.push(Box::pin(tx.execute_raw(
                    statement(EDITORS_SQL),
                    [p(&r.editors.0), p(&r.editors.1), p(&r.editors.2)],
                )));
            }
        }
        // The first error explains the failure; later statements of an aborted transaction
        // only fail because of it.
        in_order(pending)
            .await
            .into_iter()
            .try_for_each(|r| r.map(drop))
    }
}

/// The records of a group, column by column, with their labels and editors.
struct Records<'b> {
    pk: Vec<i64>,
    name: Vec<&'b str>,
    owner: Vec<&'b str>,
    profile: Vec<&'b str>,
    cwd: Vec<&'b str>,
    model: Vec<&'b str>,
    acp_session_id: Vec<&'b str>,
    status: Vec<&'static str>,
    status_reason: Vec<&'b str>,
    created_at: Vec<i64>,
    updated_at: Vec<i64>,
    profile_fingerprint: Vec<&'b str>,
    request_fingerprint: Vec<&'b str>,
    can_resume: Vec<bool>,
    can_load: Vec<bool>,
    labels: (Vec<i64>, Vec<&'b str>, Vec<&'b str>),
    editors: (Vec<i64>, Vec<i64>, Vec<&'b str>),
}

impl<'b> Records<'b> {
    fn of(records: &HashMap<i64, &'b crate::domain::session::SessionRecord>) -> Option<Self> {
        if records.is_empty() {
            return None;
        }
        let mut all = Self {
            pk: Vec::new(),
            name: Vec::new(),
            owner: Vec::new(),
            profile: Vec::new(),
            cwd: Vec::new(),
            model: Vec::new(),
            acp_session_id: Vec::new(),
            status: Vec::new(),
            status_reason: Vec::new(),
            created_at: Vec::new(),
            updated_at: Vec::new(),
            profile_fingerprint: Vec::new(),
            request_fingerprint: Vec::new(),
            can_resume: Vec::new(),
            can_load: Vec::new(),
            labels: Default::default(),
            editors: Default::default(),
        };
        for (&pk, r) in records {
            all.pk.push(pk);
            all.name.push(&r.name);
            all.owner.push(&r.owner);
            all.profile.push(&r.profile);
            all.cwd.push(&r.cwd);
            all.model.push(&r.model);
            all.acp_session_id.push(&r.acp_session_id);
            all.status.push(r.status.as_str());
            all.status_reason.push(&r.status_reason);
            all.created_at.push(to_micros(r.created_at));
            all.updated_at.push(to_micros(r.updated_at));
            all.profile_fingerprint.push(&r.profile_fingerprint);
            all.request_fingerprint.push(&r.request_fingerprint);
            all.can_resume.push(r.can_resume);
            all.can_load.push(r.can_load);
            for (key, value) in &r.labels {
                all.labels.0.push(pk);
                all.labels.1.push(key);
                all.labels.2.push(value);
            }
            for (position, editor) in r.editors.iter().enumerate() {
                all.editors.0.push(pk);
                all.editors.1.push(position as i64);
                all.editors.2.push(editor);
            }
        }
        Some(all)
    }
}

/// A parameter as the trait object the statements take.
fn p(value: &(dyn ToSql + Sync)) -> &(dyn ToSql + Sync) {
    value
}

/// A queued entry's columns after its action id.
type QueuedColumns<'b> = (&'b str, i64, Option<&'b str>, Option<String>, String);

fn queued_columns(entry: &crate::domain::queue::QueuedEntry) -> QueuedColumns<'_> {
    (
        entry.actor.as_str(),
        to_micros(entry.created_at),
        entry.traceparent.as_deref(),
        context_to_json(&entry.context),
        work_to_json(entry),
    )
}

fn queue_row(pk: i64, op: &QueueOp) -> QueueRow<'_> {
    let entry = queued_columns;
    match op {
        QueueOp::PushBack(e) => QueueRow {
            sql: PUSH_BACK_SQL,
            pk,
            action_id: e.action_id.as_uuid(),
            entry: Some(entry(e)),
        },
        QueueOp::PushFront(e) => QueueRow {
            sql: PUSH_FRONT_SQL,
            pk,
            action_id: e.action_id.as_uuid(),
            entry: Some(entry(e)),
        },
        QueueOp::Update(e) => QueueRow {
            sql: UPDATE_QUEUED_SQL,
            pk,
            action_id: e.action_id.as_uuid(),
            entry: Some(entry(e)),
        },
        QueueOp::Remove(action_id) => QueueRow {
            sql: REMOVE_QUEUED_SQL,
            pk,
            action_id: action_id.as_uuid(),
            entry: None,
        },
        QueueOp::Clear => QueueRow {
            sql: CLEAR_QUEUE_SQL,
            pk,
            action_id: Uuid::nil(),
            entry: None,
        },
    }
}
