//! Which replica runs which session: a session's actor and runtime run only on the
//! replica holding its lease in the database. Claiming on create and on first use, renewing
//! every held lease well within the TTL, claiming orphaned sessions with work left (failover),
//! and releasing on drain. With one replica (SQLite) every claim is granted and nothing is
//! fenced.

use std::{collections::HashSet, sync::Arc, time::Duration};

use tokio::task::JoinHandle;
use uuid::Uuid;

use super::Sessions;
use crate::{
    domain::{Error, Result, session::SessionStatus},
    session::{ReplicaOptions, SessionHandle},
    store::LeaseClaim,
};

/// Where a call for a session must run.
pub(crate) enum Claim {
    /// Here, with this fence (`None`: one replica, no fencing).
    Here {
        fence: Option<u64>,
        taken_over: bool,
    },
    /// On the live replica at this advertised address.
    Elsewhere(String),
}

impl Sessions {
    fn replica(&self) -> &ReplicaOptions {
        self.ctx.replica()
    }

    /// Claims the session's lease for this replica.
    pub(super) async fn claim(&self, session_id: Uuid) -> Result<Claim> {
        let replica = self.replica();
        if !replica.shared_store {
            return Ok(Claim::Here {
                fence: None,
                taken_over: false,
            });
        }
        let before = self.ctx.store.get_lease(session_id).await?;
        match self
            .ctx
            .store
            .claim_lease(session_id, &replica.id, replica.lease_ttl)
            .await?
        {
            LeaseClaim::Granted(lease) => {
                // A takeover: the lease was someone else's (or ours before a fenced write).
                let taken_over = before.is_some_and(|b| b.fence != lease.fence);
                if taken_over {
                    tracing::info!(session = %session_id, fence = lease.fence, "claimed the session's lease");
                }
                Ok(Claim::Here {
                    fence: Some(lease.fence),
                    taken_over,
                })
            }
            LeaseClaim::HeldBy(lease) => match ReplicaOptions::address_of(&lease.owner_replica) {
                Some(address) => Ok(Claim::Elsewhere(address.to_owned())),
                None => Err(Error::internal(format!(
                    "session {session_id} is held by replica {:?}, which has no address",
                    lease.owner_replica
                ))),
            },
        }
    }

    /// Claims a session this replica has just stored; its fence. A session that cannot be claimed
    /// is removed again, so no session is left that nobody runs.
    pub(super) async fn claim_new(&self, session_id: Uuid) -> Result<Option<u64>> {
        let claimed = match self.claim(session_id).await {
            Ok(Claim::Here { fence, .. }) => return Ok(fence),
            Ok(Claim::Elsewhere(address)) => Err(Error::internal(format!(
                "a new session was claimed by another replica ({address})"
            ))),
            Err(error) => Err(error),
        };
        if let Err(e) = self.ctx.store.delete_session(session_id).await {
            tracing::error!(session = %session_id, error = %e, "could not remove an unclaimed session");
        }
        claimed
    }

    /// The live handle of a session held here, if any (a handle whose lease was lost is dropped).
    pub(super) fn held(&self, session_id: Uuid) -> Option<SessionHandle> {
        let found = self
            .handles
            .read()
            .expect("not poisoned")
            .get(&session_id)
            .cloned();
        match found {
            Some(handle) if handle.shared.is_lost() => {
                self.forget_lost(&handle);
                None
            }
            found => found,
        }
    }

    /// Removes a handle whose lease was lost (unless a newer one replaced it).
    fn forget_lost(&self, handle: &SessionHandle) {
        let mut handles = self.handles.write().expect("not poisoned");
        if handles
            .get(&handle.shared.id)
            .is_some_and(|h| Arc::ptr_eq(&h.shared, &handle.shared))
        {
            handles.remove(&handle.shared.id);
        }
    }

    /// Puts a freshly resumed handle in the registry, unless a live one got there first.
    pub(super) fn install(&self, handle: SessionHandle) -> SessionHandle {
        let mut handles = self.handles.write().expect("not poisoned");
        match handles.get(&handle.shared.id) {
            Some(existing) if !existing.shared.is_lost() => existing.clone(),
            _ => {
                handles.insert(handle.shared.id, handle.clone());
                handle
            }
        }
    }

    /// Starts the tasks that keep this replica's leases (renewal) and take over the sessions of
    /// replicas that died (failover). None with one replica.
    pub(crate) fn spawn_ownership(self: &Arc<Self>) -> Vec<JoinHandle<()>> {
        if !self.replica().shared_store {
            return Vec::new();
        }
        let ttl = self.replica().lease_ttl;
        let renew = {
            let sessions = Arc::downgrade(self);
            tokio::spawn(async move {
                // Three renewals per TTL: one lost round trip still leaves time for the next.
                let mut tick = tokio::time::interval(ttl / 3);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut last_renewed = tokio::time::Instant::now();
                loop {
                    tick.tick().await;
                    let Some(sessions) = sessions.upgrade() else {
                        return;
                    };
                    if sessions.renew().await {
                        last_renewed = tokio::time::Instant::now();
                    } else if last_renewed.elapsed() >= ttl {
                        // Unrenewed past the TTL, another replica may hold any of them now.
                        sessions.lose_all("leases not renewed within the TTL");
                    }
                }
            })
        };
        let failover = {
            let sessions = Arc::downgrade(self);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval((ttl / 4).min(Duration::from_secs(1)));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(sessions) = sessions.upgrade() else {
                        return;
                    };
                    if sessions.ctx.is_draining() {
                        return;
                    }
                    if let Err(error) = sessions.claim_orphans().await {
                        tracing::warn!(%error, "failover: could not claim orphaned sessions");
                    }
                    sessions.move_relayed().await;
                }
            })
        };
        vec![renew, failover, self.spawn_bridge_publisher()]
    }

    /// Renews every lease held here; a session whose lease another replica took stops. Whether
    /// the renewal reached the database.
    async fn renew(&self) -> bool {
        if self.released.load(std::sync::atomic::Ordering::SeqCst) {
            return true;
        }
        let replica = self.replica();
        let renewed = match self
            .ctx
            .store
            .renew_leases(&replica.id, replica.lease_ttl)
            .await
        {
            Ok(leases) => leases,
            Err(error) => {
                tracing::warn!(%error, "could not renew leases");
                return false;
            }
        };
        let held: HashSet<(Uuid, u64)> = renewed.iter().map(|l| (l.session_id, l.fence)).collect();
        for handle in self.all() {
            let Some(fence) = handle.shared.fence else {
                continue;
            };
            if held.contains(&(handle.shared.id, fence)) || handle.shared.is_lost() {
                continue;
            }
            // Not renewed: claimed after the renewal began, or lost. Ask the lease itself.
            match self.ctx.store.get_lease(handle.shared.id).await {
                Ok(Some(lease)) if lease.owner_replica == replica.id && lease.fence == fence => {}
                Ok(_) => self.lose(&handle, "lease taken by another replica"),
                Err(error) => tracing::warn!(%error, "could not read a lease"),
            }
        }
        true
    }

    fn lose(&self, handle: &SessionHandle, why: &str) {
        tracing::warn!(session = %handle.shared.id, why, "lost a session's lease");
        handle.shared.mark_lost();
        self.forget_lost(handle);
    }

    fn lose_all(&self, why: &str) {
        for handle in self.all() {
            if handle.shared.fence.is_some() && !handle.shared.is_lost() {
                self.lose(&handle, why);
            }
        }
    }

    /// Failover: claims every session no live replica holds that has queued work or a
    /// turn in flight, closes that turn as FAILED ("owner replica lost") and reopens the runtime
    /// to drain the queue. Other orphans are claimed on their next call.
    async fn claim_orphans(&self) -> Result<()> {
        let store = &self.ctx.store;
        for id in store.orphaned_sessions().await? {
            if self.held(id).is_some() {
                continue;
            }
            let _flight = self.flights.enter(id).await;
            if self.held(id).is_some() {
                continue;
            }
            let Some(record) = store.get_session(id).await? else {
                continue;
            };
            // A remote session goes to the replica holding a matching bridge, which claims it.
            if self.home_for_open(&record.profile).await?.is_some() {
                continue;
            }
            let turn_in_flight = matches!(
                record.status,
                SessionStatus::Running | SessionStatus::AwaitingInput
            );
            if !turn_in_flight && store.load_queue(id).await?.is_empty() {
                continue;
            }
            if store.get_lease(id).await?.is_none() {
                // Never claimed: its creator may be between storing and claiming it.
                let age = record.created_at.elapsed().unwrap_or_default();
                if age < self.replica().lease_ttl {
                    continue;
                }
            }
            let Claim::Here { fence, .. } = self.claim(id).await? else {
                continue;
            };
            tracing::info!(session = %id, ?fence, turn_in_flight, "failover: took over a session of a lost replica");
            let handle = self.resume(record, true, fence, true).await?;
            self.install(handle);
        }
        Ok(())
    }

    /// Gives up one lease held here: the actor stops and never writes again, and another replica
    /// may claim the session at once.
    pub(super) async fn release_one(&self, handle: &SessionHandle) {
        let Some(fence) = handle.shared.fence else {
            return;
        };
        handle.shared.mark_lost();
        self.forget_lost(handle);
        let replica = &self.replica().id;
        if let Err(error) = self
            .ctx
            .store
            .release_lease(handle.shared.id, replica, fence)
            .await
        {
            tracing::warn!(session = %handle.shared.id, %error, "could not release a lease");
        }
    }

    /// Gives up every lease held here (after draining, or when the server stops), so other
    /// replicas take over at once; the actors here stop and never write again.
    pub(crate) async fn release_all(&self) {
        let replica = self.replica();
        if !replica.shared_store {
            return;
        }
        self.released
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for handle in self.all() {
            let Some(fence) = handle.shared.fence else {
                continue;
            };
            handle.shared.mark_lost();
            if let Err(error) = self
                .ctx
                .store
                .release_lease(handle.shared.id, &replica.id, fence)
                .await
            {
                tracing::warn!(session = %handle.shared.id, %error, "could not release a lease");
            }
        }
    }
}
