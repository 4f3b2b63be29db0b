//! Retention: closed sessions older than the configured age (since they closed) are deleted
//! with everything they hold, in bounded batches, by a background task on every replica.
//!
//! Each batch is one store transaction of at most `batch` sessions, so a pass holds the store
//! no longer than one batch at a time: a turn's commit waits behind one batch at worst, never
//! behind a whole pass. Passes on several replicas may overlap: deletes are idempotent, and
//! PostgreSQL hands concurrent passes disjoint batches. `DeleteSession` stays immediate; this
//! only removes what nobody deleted.

use std::{
    sync::{Arc, Weak},
    time::{Duration, SystemTime},
};

use tokio::task::JoinHandle;
use uuid::Uuid;

use super::Sessions;
use crate::{
    domain::{Result, session::SessionStatus},
    session::{Command, metrics},
    store::RetentionReport,
};

/// Pages one reclaim step gives back at most (8 MiB of 4 KiB pages): space is returned in
/// steps between which the store serves others.
const RECLAIM_STEP_PAGES: u64 = 2048;

/// When and how much a pass deletes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Retention {
    /// How long after its close a session is deleted.
    pub age: Duration,
    /// How often a pass runs (the first one period after start).
    pub every: Duration,
    /// At most this many sessions are deleted per store transaction.
    pub batch: usize,
}

impl Sessions {
    /// One retention pass: deletes, batch after batch, every closed session that closed more
    /// than `age` ago, then gives freed space back where the store can. Subscribers of a
    /// deleted session end with SESSION_NOT_FOUND.
    pub(crate) async fn retention_pass(&self, retention: &Retention) -> Result<RetentionReport> {
        let started = std::time::Instant::now();
        let cutoff = SystemTime::now()
            .checked_sub(retention.age)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let batch = retention.batch.max(1);
        let mut report = RetentionReport::default();
        loop {
            let deleted = self.ctx.store.delete_closed_before(cutoff, batch).await?;
            if deleted.is_empty() {
                break;
            }
            report.batches += 1;
            report.deleted += deleted.len() as u64;
            report.largest_batch = report.largest_batch.max(deleted.len() as u64);
            metrics::retention_deleted(deleted.len() as u64);
            for id in &deleted {
                self.forget_deleted(*id).await;
            }
            if deleted.len() < batch {
                break;
            }
            // Whatever waited for the store behind this batch goes first.
            tokio::task::yield_now().await;
        }
        // Closed here but deleted by another replica's pass: the actor still holds its stream.
        for handle in self.all() {
            let (record, _) = handle.shared.snapshot();
            if record.status == SessionStatus::Closed && record.updated_at < cutoff {
                self.forget_deleted(record.id).await;
            }
        }
        if report.deleted > 0 {
            loop {
                let pages = self.ctx.store.reclaim_space(RECLAIM_STEP_PAGES).await?;
                report.pages_reclaimed += pages;
                if pages < RECLAIM_STEP_PAGES {
                    break;
                }
                tokio::task::yield_now().await;
            }
            metrics::retention_reclaimed(report.pages_reclaimed);
            tracing::info!(
                deleted = report.deleted,
                batches = report.batches,
                pages_reclaimed = report.pages_reclaimed,
                took = ?started.elapsed(),
                retention = %humantime::format_duration(retention.age),
                "retention: deleted closed sessions"
            );
        }
        Ok(report)
    }

    /// A session deleted from the store that this replica may still hold: its actor ends and
    /// its subscribers get SESSION_NOT_FOUND.
    async fn forget_deleted(&self, id: Uuid) {
        let Some(handle) = self.held(id) else {
            return;
        };
        // The store has nothing left to delete; the actor publishes the deletion and ends.
        let _ = handle.ask(|reply| Command::Delete { reply }).await;
        self.handles.write().expect("not poisoned").remove(&id);
    }

    /// Starts the background passes; the task ends with the registry.
    pub(crate) fn spawn_retention(self: &Arc<Self>, retention: Retention) -> JoinHandle<()> {
        let sessions: Weak<Self> = Arc::downgrade(self);
        tracing::info!(
            retention = %humantime::format_duration(retention.age),
            every = %humantime::format_duration(retention.every),
            batch = retention.batch,
            "retention: closed sessions are deleted this long after they closed"
        );
        tokio::spawn(async move {
            let start = tokio::time::Instant::now() + retention.every;
            let mut ticks = tokio::time::interval_at(start, retention.every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(sessions) = sessions.upgrade() else {
                    return;
                };
                if sessions.ctx.is_draining() {
                    return;
                }
                match sessions.retention_pass(&retention).await {
                    Ok(_) => metrics::retention_pass("ok"),
                    Err(error) => {
                        metrics::retention_pass("failed");
                        tracing::warn!(%error, "retention: a pass failed; the next one retries");
                    }
                }
            }
        })
    }
}
