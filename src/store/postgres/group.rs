//! Group commit: the `commit` calls waiting at one moment share one transaction, so one WAL flush
//! makes many batches durable.
//!
//! Why: `COMMIT` returns once the WAL is flushed to disk (durability). With one
//! transaction per batch, every batch paid a flush, four round trips and its own statements on a
//! pool connection of its own, and 100 busy sessions queued for the pool's connections and for
//! the flushes (turns/s a fifth of SQLite's, whose single writer groups its commits the same way,
//! see `sqlite/writer.rs`).
//!
//! How: a caller queues its batch with a reply channel. A dispatcher takes whatever is waiting (up
//! to [`MAX_GROUP`]) as soon as one of [`GROUPS`] slots is free, so a lone batch goes at once and
//! batches gather while the slots are busy. A group is one transaction — `BEGIN`, the reads that
//! lock its sessions and decide every check, the writes of the batches that passed, `COMMIT` —
//! whose statements serve all its batches (see `postgres/commit.rs`). A batch refused by a check
//! (fenced, a gap in offsets, an action id already recorded, its session gone) writes nothing and
//! gets its own error; the others commit. Should the database reject a statement, the group's
//! batches are committed again one by one, so the error reaches the batch that caused it.
//!
//! Ambiguity: a failure before `COMMIT` was sent stored nothing (unavailable, as the error
//! says). Once it was sent, a connection that fails, or stays silent past the deadline, leaves
//! the outcome unknown: the accepted batches get [`CommitError::Ambiguous`], and their writers
//! read back (`store::landed`) instead of assuming either.
//!
//! Order: batches are sorted by session id, stably, so one session's batches keep the order they
//! were queued in and are judged one after another. Rows of several sessions are held at once — by
//! groups of this replica and of others, and by lease renewal — so every such holder locks them in
//! session-id order (the session rows, then the leases; renewal its leases) and none waits on
//! another in a cycle.

use std::{sync::Arc, time::Duration};

use deadpool_postgres::{Client, Pool};
use tokio::sync::{Semaphore, mpsc, oneshot};
use uuid::Uuid;

use super::{commit, from_pool, from_postgres, is_cancelled, is_unreachable};
use crate::{
    domain::{Error, Result},
    store::{Batch, CommitError, StoreError},
};

/// Groups committing at once. More than one, so a group's statements run while another waits for
/// its flush; few, so batches gather instead of spreading thin over many flushes.
const GROUPS: usize = 2;
/// At most this many batches share one transaction.
const MAX_GROUP: usize = 128;

/// How long a group waits for a connection, and then for its transaction's answers.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    pub(super) pool_wait: Duration,
    pub(super) answer_within: Duration,
}

/// One caller's batch and where its outcome goes.
pub(super) struct Job {
    pub(super) session_id: Uuid,
    pub(super) batch: Batch,
    pub(super) reply: oneshot::Sender<Result<(), CommitError>>,
}

/// The queue of batches waiting to be committed; see the module documentation.
pub(super) struct Committer {
    jobs: mpsc::UnboundedSender<Job>,
}

impl Committer {
    /// Starts the dispatcher; it ends once the committer is dropped. `target` names the database
    /// in messages; see [`commit_group`] for the `bounds`.
    pub(super) fn start(pool: Pool, target: String, bounds: Bounds) -> Self {
        let (jobs, waiting) = mpsc::unbounded_channel();
        tokio::spawn(dispatch(pool, Arc::from(target), bounds, waiting));
        Self { jobs }
    }

    /// Commits `batch` with whatever else is waiting; returns once it is durable, or with its own
    /// error.
    pub(super) async fn commit(&self, session_id: Uuid, batch: Batch) -> Result<(), CommitError> {
        commit::precheck(session_id, &batch)?;
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job {
                session_id,
                batch,
                reply,
            })
            .map_err(|_| StoreError::closed("postgres store: the committer has stopped"))?;
        // The group's task ended without answering (it panicked) at a stage nobody knows.
        answer.await.map_err(|_| {
            CommitError::ambiguous("postgres store: a commit was dropped unanswered", None)
        })?
    }
}

async fn dispatch(
    pool: Pool,
    target: Arc<str>,
    bounds: Bounds,
    mut waiting: mpsc::UnboundedReceiver<Job>,
) {
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
            commit_group(&pool, &target, bounds, group).await;
            drop(slot);
        });
    }
}

/// Commits `jobs` in one transaction and answers each. No connection within `pool_wait` fails
/// them as unavailable. A transaction with no answer within `answer_within` is on a connection
/// that is gone, which is closed, never reused: its batches fail as unavailable if `COMMIT` was
/// not sent yet, or as ambiguous if it was (the database may or may not have committed them),
/// as do batches whose connection dropped while `COMMIT` was awaited.
pub(super) async fn commit_group(pool: &Pool, target: &str, bounds: Bounds, mut jobs: Vec<Job>) {
    let Bounds {
        pool_wait,
        answer_within,
    } = bounds;
    jobs.sort_by_key(|job| job.session_id);
    let mut client = match super::pooled(pool, pool_wait).await {
        Ok(client) => client,
        Err(e) => {
            let error = from_pool(&format!("postgres store: no connection to {target}"), e).into();
            return answer_all(jobs, &error);
        }
    };
    let mut groups = vec![jobs];
    while let Some(group) = groups.pop() {
        match attempt(&mut client, &group, answer_within, target).await {
            Ok(verdicts) => answer_each(group, verdicts),
            // A statement of a group of several failed: the statements serve many batches, so
            // which one it was is found by committing each alone.
            Err(Failure::Rejected(_)) if group.len() > 1 => {
                groups.extend(group.into_iter().rev().map(|job| vec![job]));
            }
            Err(Failure::Rejected(error) | Failure::Unreachable(error)) => {
                answer_all(group, &error)
            }
            Err(Failure::Ambiguous { verdicts, message }) => {
                let verdicts = verdicts.into_iter().map(|verdict| {
                    Some(verdict.unwrap_or_else(|| CommitError::ambiguous(message.clone(), None)))
                });
                answer_each(group, verdicts.collect());
            }
            Err(Failure::Late { commit_sent }) => {
                drop(deadpool_postgres::Object::take(client));
                let late = format!(
                    "postgres store: {target} did not answer a commit within {answer_within:?}"
                );
                if commit_sent {
                    for job in group {
                        let _ = job.reply.send(Err(CommitError::ambiguous(
                            format!("{late}, after COMMIT was sent"),
                            None,
                        )));
                    }
                } else {
                    let error = StoreError::Unavailable {
                        message: late.clone(),
                        source: None,
                    }
                    .into();
                    answer_all(group, &error);
                }
                // Groups split off earlier were never attempted: nothing of them was sent.
                let error = StoreError::Unavailable {
                    message: late,
                    source: None,
                }
                .into();
                for rest in groups {
                    answer_all(rest, &error);
                }
                return;
            }
        }
    }
}

/// Answers each job with its verdict (`None`: committed).
fn answer_each(jobs: Vec<Job>, verdicts: Vec<Option<CommitError>>) {
    for (job, verdict) in jobs.into_iter().zip(verdicts) {
        // A caller that stopped waiting no longer cares; the batch stands either way.
        let _ = job.reply.send(verdict.map_or(Ok(()), Err));
    }
}

fn answer_all(jobs: Vec<Job>, error: &Error) {
    for job in jobs {
        let _ = job.reply.send(Err(CommitError::Failed(error.clone())));
    }
}

/// Why a group failed as a whole.
enum Failure {
    /// The database refused a statement (or the commit): the transaction is rolled back.
    Rejected(Error),
    /// The database could not be reached before `COMMIT` was sent: nothing was stored.
    Unreachable(Error),
    /// The connection failed while the answer to `COMMIT` was awaited: the batches the checks
    /// accepted may or may not be stored; the refused ones keep their verdicts.
    Ambiguous {
        verdicts: Vec<Option<CommitError>>,
        message: String,
    },
    /// No answer within the deadline (the connection is gone); `COMMIT` was sent or not.
    Late { commit_sent: bool },
}

impl Failure {
    fn of(doing: &str) -> impl FnOnce(tokio_postgres::Error) -> Self {
        move |e| {
            // A statement that ran past the statement timeout fails every batch of the group
            // at once: committed alone, each would wait as long again.
            let unreachable = is_unreachable(&e) || is_cancelled(&e);
            let error = from_postgres(&format!("postgres store: {doing}"), e).into();
            if unreachable {
                Self::Unreachable(error)
            } else {
                Self::Rejected(error)
            }
        }
    }
}

/// One transaction for `jobs`, answered within `within`: each batch's verdict (`None`:
/// committed) once it is durable.
async fn attempt(
    client: &mut Client,
    jobs: &[Job],
    within: Duration,
    target: &str,
) -> Result<Vec<Option<CommitError>>, Failure> {
    let deadline = tokio::time::Instant::now() + within;
    let late = |commit_sent| move |_| Failure::Late { commit_sent };
    let batches: Vec<(Uuid, &Batch)> = jobs
        .iter()
        .map(|job| (job.session_id, &job.batch))
        .collect();
    let tx = tokio::time::timeout_at(deadline, client.transaction())
        .await
        .map_err(late(false))?
        .map_err(Failure::of("starting a transaction"))?;
    let verdicts = tokio::time::timeout_at(deadline, statements(&tx, &batches))
        .await
        .map_err(late(false))??;
    // From here on the database may commit whatever this process learns.
    match tokio::time::timeout_at(deadline, tx.commit())
        .await
        .map_err(late(true))?
    {
        Ok(()) => Ok(verdicts),
        // The server answered: it did not commit (a deferred check, a serialization failure).
        Err(e) if e.as_db_error().is_some() && !is_cancelled(&e) => {
            Err(Failure::of("committing a batch")(e))
        }
        // The connection failed (or the commit was cancelled) with the answer outstanding.
        Err(e) => Err(Failure::Ambiguous {
            verdicts,
            message: format!(
                "postgres store: the answer of {target} to a COMMIT was lost: {}",
                super::describe(&e)
            ),
        }),
    }
}

/// The group's reads, checks and writes inside `tx`: each batch's verdict.
async fn statements(
    tx: &commit::Tx<'_>,
    batches: &[(Uuid, &Batch)],
) -> Result<Vec<Option<CommitError>>, Failure> {
    let mut found = commit::read(tx, batches)
        .await
        .map_err(Failure::of("locking the sessions"))?;
    let verdicts = commit::judge(batches, &mut found);
    let writes = commit::Writes::of(batches, &verdicts, &found);
    if !writes.is_empty() {
        writes
            .apply(tx)
            .await
            .map_err(Failure::of("applying a batch"))?;
    }
    Ok(verdicts)
}
