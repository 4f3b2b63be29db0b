//! The registry of sessions: finds them for a caller (another caller's session reads as
//! SESSION_NOT_FOUND), brings stored ones back, and routes each operation to the session's actor.
//! Creating sessions ([`create`]), reading sessions and logs ([`reads`]) and paging transcripts
//! ([`transcript`]) live beside it. No global lock is held across an await.

mod bridges;
mod create;
mod flight;
mod fork;
pub(crate) mod owners;
mod reads;
mod retention;
mod transcript;

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, RwLock},
};

use uuid::Uuid;

pub(crate) use create::{CreateInput, Creation};
pub(crate) use reads::ListInput;
pub(crate) use retention::Retention;

use super::{
    Command, ControlInput, ControlOutcome, EngineContext, Profile, SessionHandle,
    actor::{Actor, Resume},
    metrics::Gauges,
};
use crate::domain::{
    ActionId, Error, Principal, Result,
    action_id::parse_session_id,
    queue::QueuedEntry,
    session::{SessionRecord, SessionStatus},
};

pub(crate) const DEFAULT_PAGE_SIZE: usize = 50;
pub(crate) const MAX_PAGE_SIZE: usize = 500;
/// ReadLog defaults.
pub(crate) const DEFAULT_LOG_LIMIT: usize = 500;
pub(crate) const MAX_LOG_LIMIT: usize = 5000;

pub(crate) struct Sessions {
    ctx: Arc<EngineContext>,
    /// Shared with the task that finishes a create (see `Sessions::create`).
    handles: Arc<RwLock<HashMap<Uuid, SessionHandle>>>,
    /// Held while a new session is counted against its owner's cap and stored: a store serving
    /// one process counts, then stores (PostgreSQL does both in one transaction under a lock on
    /// the owner, which holds the cap across replicas too).
    admission: tokio::sync::Mutex<()>,
    /// Set once this replica gave its leases up (drained): they are renewed no more.
    released: std::sync::atomic::AtomicBool,
    /// At most one claim-and-reopen per session at a time.
    flights: flight::Flights,
    /// The leases held here and until when their sessions may run (see `owners`).
    clock: owners::LeaseClock,
}

/// Where a call about a session runs, decided before the call is dispatched.
pub(crate) enum Located {
    /// Here: the session's actor.
    Here(SessionHandle),
    /// On the live replica at this advertised address: it owns the session, or holds the bridge
    /// the session's runtime needs.
    Owner(String),
}

impl Sessions {
    /// Opens the registry over the store: every session that is not closed gets its actor back.
    pub(crate) async fn open(ctx: Arc<EngineContext>) -> Result<Self> {
        let reaped = ctx.processes.reap_leftovers();
        if reaped > 0 {
            tracing::warn!(
                reaped,
                "killed runtimes left over from a previous harness process"
            );
        }
        let sessions = Self {
            ctx: ctx.clone(),
            handles: Arc::new(RwLock::new(HashMap::new())),
            admission: tokio::sync::Mutex::new(()),
            released: std::sync::atomic::AtomicBool::new(false),
            flights: flight::Flights::default(),
            clock: owners::LeaseClock::default(),
        };
        // With other replicas on the database, a session is resumed by whoever claims it: the
        // failover task (queued work, a turn in flight) or its next call (see `owners`).
        let records = match ctx.replica().shared_store {
            true => Vec::new(),
            false => ctx.store.open_sessions().await?,
        };
        for record in records {
            let id = record.id;
            let handle = sessions.resume(record, true, None, false).await?;
            sessions
                .handles
                .write()
                .expect("not poisoned")
                .insert(id, handle);
        }
        ctx.start_warm_pools();
        Ok(sessions)
    }

    pub(crate) fn context(&self) -> &Arc<EngineContext> {
        &self.ctx
    }

    /// Brings back the actor of a stored session, without a runtime (`after_restart`: loaded
    /// at harness start, so its runtime died with the previous process; `owner_lost`: it died
    /// with another replica), writing with `fence`.
    async fn resume(
        &self,
        record: SessionRecord,
        after_restart: bool,
        fence: Option<u64>,
        owner_lost: bool,
    ) -> Result<SessionHandle> {
        let store = &self.ctx.store;
        // With several replicas, a commit of a former actor whose answer was lost (or that was
        // abandoned when its lease ran out) may still be running on the database: the session
        // is read once it has ended, so the new actor starts from what stays.
        let record = match self.ctx.replica().shared_store {
            true => {
                store.settle(record.id).await?;
                store
                    .get_session(record.id)
                    .await?
                    .ok_or_else(|| Error::session_not_found(&record.id.to_string()))?
            }
            false => record,
        };
        let head = store.head_offset(record.id).await?;
        let epoch = match head {
            0 => 0,
            head => store
                .read_log(record.id, head - 1, 1)
                .await?
                .first()
                .map_or(0, |e| e.epoch),
        };
        let queue = store.load_queue(record.id).await?;
        let profile = self
            .ctx
            .profiles
            .get(&record.profile)
            .cloned()
            .unwrap_or_else(|| {
                Arc::new(Profile::builtin_mock(PathBuf::from(format!(
                    "/nonexistent/profile-{}-is-no-longer-configured",
                    record.profile
                ))))
            });
        Ok(Actor::spawn(
            self.ctx.clone(),
            profile,
            Resume {
                record,
                head,
                epoch,
                queue,
                after_restart,
                fence,
                owner_lost,
            },
            None,
        ))
    }

    /// Where a call about a session the caller may see runs: here, with its actor's handle, or
    /// on the replica that owns it (or holds the bridge its runtime needs), which the transport
    /// forwards the call to. Any other session reads as SESSION_NOT_FOUND. A session nobody
    /// holds is claimed here, so callers validate a request before they locate its session.
    pub(crate) async fn locate(&self, principal: &Principal, session_id: &str) -> Result<Located> {
        let id = parse_session_id(session_id)?;
        let handle = match self.held(id) {
            Some(handle) => {
                if principal.may_access(&handle.shared.owner, &handle.shared.editors)
                    && let Some(address) = self.hand_over_idle(&handle).await?
                {
                    return Ok(Located::Owner(address));
                }
                handle
            }
            None => {
                // Not held here: closed sessions are not kept in memory, and with several
                // replicas the session may be another's, or nobody's since its owner died.
                let _flight = self.flights.enter(id).await;
                if let Some(handle) = self.held(id) {
                    // Brought back by the claim this call waited for.
                    if !principal.may_access(&handle.shared.owner, &handle.shared.editors) {
                        return Err(Error::session_not_found(session_id));
                    }
                    return Ok(Located::Here(handle));
                }
                let record = self
                    .ctx
                    .store
                    .get_session(id)
                    .await?
                    .ok_or_else(|| Error::session_not_found(session_id))?;
                if !principal.may_access(&record.owner, &record.editors) {
                    return Err(Error::session_not_found(session_id));
                }
                if let Some(home) = self.home_for_open(&record.profile).await?
                    && let Some(address) = self.moved_to(id, &record.profile, home)
                {
                    return Ok(Located::Owner(address));
                }
                let handle = match self.claim(id).await? {
                    owners::Claim::Here { fence, taken_over } => {
                        // Claimed from a replica that died: its runtime died with it.
                        // With leases nothing runs it here yet: recover as after a restart.
                        self.resume(record, fence.is_some(), fence, taken_over)
                            .await?
                    }
                    owners::Claim::Elsewhere(address) => return Ok(Located::Owner(address)),
                };
                self.install(handle)
            }
        };
        if !principal.may_access(&handle.shared.owner, &handle.shared.editors) {
            return Err(Error::session_not_found(session_id));
        }
        Ok(Located::Here(handle))
    }

    pub(crate) async fn control(
        &self,
        handle: &SessionHandle,
        principal: &Principal,
        input: ControlInput,
        traceparent: Option<String>,
    ) -> Result<ControlOutcome> {
        let principal = principal.clone();
        handle
            .ask(|reply| Command::Control {
                principal,
                input: Box::new(input),
                traceparent,
                reply,
            })
            .await
    }

    pub(crate) async fn get_queue(
        &self,
        principal: &Principal,
        session_id: &str,
    ) -> Result<Vec<QueuedEntry>> {
        self.read_queue(principal, session_id).await
    }

    pub(crate) async fn edit_queued(
        &self,
        handle: &SessionHandle,
        principal: &Principal,
        action_id: ActionId,
        text: String,
    ) -> Result<QueuedEntry> {
        let principal = principal.clone();
        handle
            .ask(|reply| Command::EditQueued {
                principal,
                action_id,
                text,
                reply,
            })
            .await
    }

    pub(crate) async fn remove_queued(
        &self,
        handle: &SessionHandle,
        action_id: ActionId,
    ) -> Result<()> {
        handle
            .ask(|reply| Command::RemoveQueued { action_id, reply })
            .await
    }

    pub(crate) async fn close(&self, handle: &SessionHandle) -> Result<(SessionRecord, u64)> {
        let record = handle.ask(|reply| Command::Close { reply }).await?;
        tracing::info!(session = %record.id, "session closed");
        Ok((record, handle.shared.head()))
    }

    pub(crate) async fn delete(&self, handle: &SessionHandle) -> Result<()> {
        handle.ask(|reply| Command::Delete { reply }).await?;
        self.handles
            .write()
            .expect("not poisoned")
            .remove(&handle.shared.id);
        tracing::info!(session = %handle.shared.id, "session deleted");
        Ok(())
    }

    /// Draining: waits until no turn runs or `grace` has passed, ends every stream
    /// with DRAINING, then stops every runtime. New sessions and turns are already refused.
    pub(crate) async fn drain(&self, grace: std::time::Duration) {
        // No session can start now: warm runtimes would only wait to be killed.
        self.ctx.stop_warm_pools();
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let activity = self.ctx.activity.notified();
            let busy = self
                .all()
                .iter()
                .filter(|h| {
                    matches!(
                        h.shared.status(),
                        SessionStatus::Running
                            | SessionStatus::AwaitingInput
                            | SessionStatus::Starting
                    )
                })
                .count();
            if busy == 0 {
                break;
            }
            tracing::info!(busy, "draining: waiting for running turns");
            if tokio::time::timeout_at(deadline, activity).await.is_err() {
                tracing::warn!(
                    busy,
                    "draining: grace period over; failing the turns still running"
                );
                break;
            }
        }
        let _ = self
            .ctx
            .streams
            .send(super::subscribe::StreamStop::Draining);
        let drains = self.all().into_iter().map(|handle| async move {
            let _ = handle.ask(|reply| Command::Drain { reply }).await;
        });
        futures::future::join_all(drains).await;
        self.release_all().await;
    }

    /// The record and head of a session held in memory, as they stand now.
    fn live_snapshot(&self, id: Uuid) -> Option<(SessionRecord, u64)> {
        self.handles
            .read()
            .expect("not poisoned")
            .get(&id)
            .map(|h| h.shared.snapshot())
    }

    /// The registry's gauges now, for a metrics scrape.
    pub(crate) fn gauges(&self) -> Gauges {
        let mut by_status = [0u64; SessionStatus::ALL.len()];
        let (mut queued, mut subscribers) = (0u64, 0u64);
        for handle in self.all() {
            let status = handle.shared.status();
            by_status[SessionStatus::ALL
                .iter()
                .position(|s| *s == status)
                .unwrap_or(0)] += 1;
            queued += handle.shared.queue_len() as u64;
            subscribers += handle.shared.subscriber_count() as u64;
        }
        let live_runtimes =
            self.ctx.limits.live_runtimes - self.ctx.runtime_slots.available_permits();
        Gauges {
            by_status: SessionStatus::ALL.iter().copied().zip(by_status).collect(),
            queued,
            subscribers,
            live_runtimes: live_runtimes as u64,
            warm_pools: self.ctx.warm_pool_gauges(),
        }
    }

    /// Every live session handle (for draining and metrics).
    pub(crate) fn all(&self) -> Vec<SessionHandle> {
        self.handles
            .read()
            .expect("not poisoned")
            .values()
            .cloned()
            .collect()
    }
}

/// The id of a queued action, as a request names it.
pub(crate) fn parse_queued_id(text: &str) -> Result<ActionId> {
    ActionId::from_stored(text)
        .ok_or_else(|| Error::invalid(format!("action_id {text:?} is not a UUID")))
}
