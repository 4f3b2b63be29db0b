//! Group commit: the `commit` calls waiting at one moment share one transaction, so one WAL flush
//! makes many batches durable.
//!
//! Why: `COMMIT` returns once the WAL is flushed to disk (durability, SPEC §9.2). With one
//! transaction per batch, every batch paid a flush and four round trips on a pool connection of
//! its own, and 100 busy sessions queued for the pool's connections and for the flushes (turns/s
//! a fifth of SQLite's, whose single writer groups its commits the same way, see
//! `sqlite/writer.rs`).
//!
//! How: a caller queues its batch with a reply channel. A dispatcher takes whatever is waiting (up
//! to [`MAX_GROUP`]) as soon as one of [`GROUPS`] slots is free, so a lone batch goes at once and
//! batches gather while the slots are busy. A group is one transaction, four round trips however
//! many batches it holds:
//! 1. `BEGIN`;
//! 2. each session's row locked `FOR UPDATE`, pipelined — so a session's commits are serialised
//!    even across replicas, and the head read inside stays the head;
//! 3. every batch's statements, pipelined ([`Planned::send`]);
//! 4. `COMMIT` when every batch passed its checks; then every caller is answered `Ok`.
//!
//! A refused batch — fenced, a gap in offsets, an action id already recorded, its session gone,
//! or a statement the database rejected — has had its statements run by then, so the transaction
//! is rolled back, that batch's caller gets its error and the rest of the group is tried again
//! without it. Refusals are rare (a takeover, a re-sent action id), so the common path pays for no
//! savepoints. Only the first refusal of a session is a verdict: a later batch of the same session
//! ran on top of the refused one's writes, so it is tried again too; and a rejected statement
//! aborts the transaction, so every batch after it is tried again.
//!
//! Order: batches are sorted by session id, stably, so one session's batches keep the order they
//! were queued in. Rows of several sessions are held at once — by groups of this replica and of
//! others, and by lease renewal — so every such holder takes them in session-id order (the session
//! rows, then the leases through the fence checks; renewal its leases) and none waits on another
//! in a cycle.

use std::{collections::HashMap, sync::Arc};

use deadpool_postgres::{Client, Pool};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_postgres::{Row, types::ToSql};
use uuid::Uuid;

use super::{
    Context,
    commit::{Pending, Planned, Refusal, Statements, Tx, in_order, precheck},
    from_pool, from_postgres, is_unreachable,
};
use crate::{
    domain::{Error, Result},
    store::{Batch, StoreError},
};

/// Groups committing at once. More than one, so a group's statements run while another waits for
/// its flush; few, so batches gather instead of spreading thin over many flushes.
const GROUPS: usize = 2;
/// At most this many batches share one transaction.
const MAX_GROUP: usize = 128;

const LOCK_SQL: &str = "SELECT pk FROM sessions WHERE id = $1 FOR UPDATE";

/// One caller's batch and where its outcome goes.
pub(super) struct Job {
    pub(super) session_id: Uuid,
    pub(super) batch: Batch,
    pub(super) reply: oneshot::Sender<Result<()>>,
}

/// The queue of batches waiting to be committed; see the module documentation.
pub(super) struct Committer {
    jobs: mpsc::UnboundedSender<Job>,
}

impl Committer {
    /// Starts the dispatcher; it ends once the committer is dropped. `target` names the database
    /// in messages.
    pub(super) fn start(pool: Pool, target: String) -> Self {
        let (jobs, waiting) = mpsc::unbounded_channel();
        tokio::spawn(dispatch(pool, Arc::from(target), waiting));
        Self { jobs }
    }

    /// Commits `batch` with whatever else is waiting; returns once it is durable, or with its own
    /// error.
    pub(super) async fn commit(&self, session_id: Uuid, batch: Batch) -> Result<()> {
        precheck(session_id, &batch)?;
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job {
                session_id,
                batch,
                reply,
            })
            .map_err(|_| StoreError::closed("postgres store: the committer has stopped"))?;
        answer
            .await
            .map_err(|_| StoreError::task("postgres store: a commit was dropped unanswered"))?
    }
}

async fn dispatch(pool: Pool, target: Arc<str>, mut waiting: mpsc::UnboundedReceiver<Job>) {
    let slots = Arc::new(Semaphore::new(GROUPS));
    while let Some(first) = waiting.recv().await {
        // A free slot first, then the group: while every slot is busy, batches gather.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut group = vec![first];
        while group.len() < MAX_GROUP
            && let Ok(job) = waiting.try_recv()
        {
            group.push(job);
        }
        let (pool, target) = (pool.clone(), target.clone());
        tokio::spawn(async move {
            commit_group(&pool, &target, group).await;
            drop(slot);
        });
    }
}

/// Commits `jobs` in one transaction (more than one when some are refused) and answers each.
pub(super) async fn commit_group(pool: &Pool, target: &str, mut jobs: Vec<Job>) {
    jobs.sort_by_key(|job| job.session_id);
    let mut client = match pool.get().await {
        Ok(client) => client,
        Err(e) => {
            let error = from_pool(&format!("postgres store: no connection to {target}"), e).into();
            return answer_all(jobs, &error);
        }
    };
    while !jobs.is_empty() {
        match attempt(&mut client, &jobs).await {
            Ok(None) => {
                for job in jobs {
                    // A caller that stopped waiting no longer cares; the batch stands either way.
                    let _ = job.reply.send(Ok(()));
                }
                return;
            }
            Ok(Some(verdicts)) => {
                jobs = jobs
                    .into_iter()
                    .zip(verdicts)
                    .filter_map(|(job, verdict)| match verdict {
                        Some(error) => {
                            let _ = job.reply.send(Err(error));
                            None
                        }
                        None => Some(job),
                    })
                    .collect();
            }
            Err(error) => return answer_all(jobs, &error),
        }
    }
}

fn answer_all(jobs: Vec<Job>, error: &Error) {
    for job in jobs {
        let _ = job.reply.send(Err(error.clone()));
    }
}

/// One try at a group: `Ok(None)` once committed; `Ok(Some(verdicts))` after a rollback, with the
/// error of each refused batch and `None` for those to try again; `Err` fails them all (the
/// database is unreachable, or the commit itself failed).
async fn attempt(client: &mut Client, jobs: &[Job]) -> Result<Option<Vec<Option<Error>>>> {
    let tx = client
        .transaction()
        .await
        .context("starting a transaction")?;
    let refusals = apply(&tx, jobs).await?;
    if refusals.iter().all(Option::is_none) {
        tx.commit().await.context("committing a batch")?;
        return Ok(None);
    }
    // Dropping the transaction sends its ROLLBACK, ahead of the reads for the messages below.
    drop(tx);
    let mut verdicts = Vec::with_capacity(jobs.len());
    for (job, refusal) in jobs.iter().zip(refusals) {
        verdicts.push(match refusal {
            Some(refusal) => Some(refusal.into_error(client, job.session_id).await),
            None => None,
        });
    }
    Ok(Some(verdicts))
}

/// Locks the group's sessions and runs every batch's statements in `tx`; the refusal of each
/// batch that has a verdict (see the module documentation).
async fn apply(tx: &Tx<'_>, jobs: &[Job]) -> Result<Vec<Option<Refusal>>> {
    let mut refusals: Vec<Option<Refusal>> = jobs.iter().map(|_| None).collect();

    // Each session's row once, in session order (the jobs are sorted).
    let lock = tx
        .prepare_cached(LOCK_SQL)
        .await
        .context("locking a session")?;
    let mut sessions: Vec<Uuid> = jobs.iter().map(|job| job.session_id).collect();
    sessions.dedup();
    let locking: Vec<Pending<'_, Option<Row>>> = sessions
        .iter()
        .map(|id| -> Pending<'_, Option<Row>> {
            let lock = &lock;
            Box::pin(async move { tx.query_opt(lock, &[id as &(dyn ToSql + Sync)]).await })
        })
        .collect();
    let mut pks = HashMap::with_capacity(sessions.len());
    for (id, locked) in sessions.iter().zip(in_order(locking).await) {
        match locked {
            Ok(Some(row)) => {
                pks.insert(*id, row.get::<_, i64>(0));
            }
            Ok(None) => {}
            Err(e) => {
                // The transaction is aborted: the later locks failed because of this one.
                let first = jobs.iter().position(|job| job.session_id == *id);
                refusals[first.expect("a session of the group")] =
                    Some(Refusal::Failed(rejected(e, "locking a session")?));
                return Ok(refusals);
            }
        }
    }

    let statements = Statements::prepare(tx).await?;
    let planned: Vec<Option<Planned<'_>>> = jobs
        .iter()
        .map(|job| {
            let pk = pks.get(&job.session_id)?;
            Some(Planned::new(*pk, job.session_id, &job.batch))
        })
        .collect();
    let mut sent = Vec::new();
    // The job each sent statement belongs to.
    let mut owners = Vec::new();
    for (i, plan) in planned.iter().enumerate() {
        match plan {
            Some(plan) => {
                plan.send(tx, &statements, &mut sent);
                owners.resize(sent.len(), i);
            }
            None => refusals[i] = Some(Refusal::NotFound),
        }
    }
    let (pending, checks): (Vec<_>, Vec<_>) = sent.into_iter().unzip();
    let results = in_order(pending).await;
    for ((i, check), result) in owners.into_iter().zip(checks).zip(results) {
        match result {
            Ok(count) => {
                if refusals[i].is_none() {
                    refusals[i] = check.refusal(count);
                }
            }
            Err(e) => {
                let error = rejected(e, "applying a batch")?;
                refusals[i].get_or_insert(Refusal::Failed(error));
                // The transaction is aborted: every later statement failed because of this one,
                // so the later batches have no verdict yet.
                break;
            }
        }
    }

    // A batch after a refused one of its session ran on top of that one's writes: no verdict.
    let mut refused = None;
    for (job, refusal) in jobs.iter().zip(&mut refusals) {
        if refused == Some(job.session_id) {
            *refusal = None;
        } else if refusal.is_some() {
            refused = Some(job.session_id);
        }
    }
    Ok(refusals)
}

/// A statement the database rejected, as the batch's error; `Err` when the database is
/// unreachable, which fails the whole group.
fn rejected(e: tokio_postgres::Error, doing: &str) -> Result<Error> {
    let unreachable = is_unreachable(&e);
    let error: Error = from_postgres(&format!("postgres store: {doing}"), e).into();
    if unreachable { Err(error) } else { Ok(error) }
}
