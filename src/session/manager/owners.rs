//! Which replica runs which session: a session's actor and runtime run only on the
//! replica holding its lease in the database. Claiming on create and on first use, renewing
//! every held lease well within the TTL, claiming orphaned sessions with work left (failover),
//! and releasing on drain. With one replica (SQLite) every claim is granted and nothing is
//! fenced.
//!
//! **Self-fencing by the clock.** The database fences a replica's writes, but only the replica
//! can stop its own runtimes. So each lease held here has a deadline on this replica's monotonic
//! clock: the moment the request that granted or last renewed it was *sent*, plus the TTL, less
//! [`SELF_FENCE_MARGIN_PERCENT`] of it. The database set the lease's expiry at least a TTL after
//! that request arrived, so a replica that stops a session at its deadline has stopped it before
//! any other replica may claim it — whether or not the database ever answers. A renewal is one
//! statement for every lease held here, bounded by the deadline it could extend; renewals do not
//! wait for one another, so one stuck connection does not stop the next attempt.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    task::{JoinHandle, JoinSet},
    time::Instant,
};
use uuid::Uuid;

use super::Sessions;
use crate::{
    domain::{Error, ErrorCode, Result, session::SessionStatus},
    session::{ReplicaOptions, SessionHandle},
    store::{Lease, LeaseClaim, Store},
};

/// The share of the lease TTL a replica keeps in hand: it stops a session whose lease it could
/// not renew `lease_ttl` less this much after it sent the last renewal (7 s of the default
/// 10 s). The margin covers stopping the runtime (a `SIGKILL` to its process group), a timer
/// that fires late on a loaded machine, and clocks that run at slightly different rates; it
/// must be at least 20 %.
pub(crate) const SELF_FENCE_MARGIN_PERCENT: u32 = 30;

/// How long after sending the request that granted or renewed a lease this replica may still
/// run its session: the TTL less the margin.
pub(crate) fn self_fence_after(ttl: Duration) -> Duration {
    ttl - ttl * SELF_FENCE_MARGIN_PERCENT / 100
}

/// Renewals in flight at once at most: one per renewal period, each bounded by the deadline it
/// could extend, so about two at a time when the database does not answer.
const RENEWALS_IN_FLIGHT: usize = 4;

/// The leases this replica holds and until when, on its monotonic clock, it may run their
/// sessions.
#[derive(Default)]
pub(crate) struct LeaseClock {
    held: Mutex<HashMap<Uuid, HeldLease>>,
}

#[derive(Debug, Clone, Copy)]
struct HeldLease {
    fence: u64,
    until: Instant,
}

impl LeaseClock {
    /// A lease granted by a claim: held until `until`.
    fn granted(&self, session_id: Uuid, fence: u64, until: Instant) {
        let mut held = self.held.lock().expect("not poisoned");
        let lease = held.entry(session_id).or_insert(HeldLease { fence, until });
        if lease.fence != fence {
            *lease = HeldLease { fence, until };
        }
        lease.until = lease.until.max(until);
    }

    /// A lease renewed: held until `until`, unless it is no longer held here (its time ran out
    /// meanwhile, and its session stopped: it stays stopped).
    fn renewed(&self, session_id: Uuid, fence: u64, until: Instant) {
        let mut held = self.held.lock().expect("not poisoned");
        if let Some(lease) = held.get_mut(&session_id)
            && lease.fence == fence
        {
            lease.until = lease.until.max(until);
        }
    }

    fn forget(&self, session_id: Uuid, fence: u64) {
        let mut held = self.held.lock().expect("not poisoned");
        if held.get(&session_id).is_some_and(|l| l.fence == fence) {
            held.remove(&session_id);
        }
    }

    fn holds(&self, session_id: Uuid, fence: u64) -> bool {
        self.held
            .lock()
            .expect("not poisoned")
            .get(&session_id)
            .is_some_and(|l| l.fence == fence)
    }

    /// Every lease held, as `(session, fence)`.
    fn snapshot(&self) -> Vec<(Uuid, u64)> {
        let held = self.held.lock().expect("not poisoned");
        held.iter().map(|(id, l)| (*id, l.fence)).collect()
    }

    /// The first deadline to come.
    fn earliest(&self) -> Option<Instant> {
        let held = self.held.lock().expect("not poisoned");
        held.values().map(|l| l.until).min()
    }

    /// Drops the leases whose time is up at `now`; which they were.
    fn take_overdue(&self, now: Instant) -> Vec<(Uuid, u64)> {
        let mut held = self.held.lock().expect("not poisoned");
        let overdue: Vec<(Uuid, u64)> = held
            .iter()
            .filter(|(_, l)| l.until <= now)
            .map(|(id, l)| (*id, l.fence))
            .collect();
        for (id, _) in &overdue {
            held.remove(id);
        }
        overdue
    }
}

/// The outcome of one renewal attempt: what it listed, and the leases renewed (`None`: no
/// answer in time).
struct Renewal {
    listed: Vec<(Uuid, u64)>,
    renewed: Option<Vec<Lease>>,
    until: Instant,
}

/// Renews `listed`, bounded by the deadline a renewal sent now would give them: an answer later
/// than that would extend nothing.
async fn renew_once(
    store: Arc<dyn Store>,
    replica: String,
    listed: Vec<(Uuid, u64)>,
    ttl: Duration,
) -> Renewal {
    let until = Instant::now() + self_fence_after(ttl);
    let renewed =
        match tokio::time::timeout_at(until, store.renew_leases(&replica, &listed, ttl)).await {
            Ok(Ok(leases)) => Some(leases),
            Ok(Err(error)) => {
                tracing::warn!(%error, "could not renew leases");
                None
            }
            Err(_) => {
                tracing::warn!(
                    leases = listed.len(),
                    "the database did not answer a lease renewal in time"
                );
                None
            }
        };
    Renewal {
        listed,
        renewed,
        until,
    }
}

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
        let sent = Instant::now();
        match self
            .ctx
            .store
            .claim_lease(session_id, &replica.id, replica.lease_ttl)
            .await?
        {
            LeaseClaim::Granted(lease) => {
                let until = sent + self_fence_after(replica.lease_ttl);
                if Instant::now() >= until {
                    // Granted, but answered so late that the session would have to stop at
                    // once: leave the lease to lapse.
                    return Err(Error::new(
                        ErrorCode::StoreUnavailable,
                        format!(
                            "session {session_id}: the database answered the claim of its lease \
                             too late to run it here"
                        ),
                    ));
                }
                self.clock.granted(session_id, lease.fence, until);
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
            // A lease an earlier run of this replica left: forwarding would come back here.
            // It lapses within the lease TTL; until then the call is retried.
            LeaseClaim::HeldBy(lease) if replica.is_earlier_run(&lease.owner_replica) => {
                tracing::debug!(session = %session_id, holder = %lease.owner_replica,
                    "the session's lease is held by an earlier run of this replica; retry once it lapses");
                Err(Error::new(
                    ErrorCode::ReplicaUnavailable,
                    format!(
                        "session {session_id} is still held by an earlier run of this replica \
                         (restarted); it is taken up here once that lease lapses: retry shortly"
                    ),
                ))
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

    /// Starts the tasks that keep this replica's leases (renewal, and stopping the sessions whose
    /// leases ran out of time) and take over the sessions of replicas that died (failover). None
    /// with one replica.
    pub(crate) fn spawn_ownership(self: &Arc<Self>) -> Vec<JoinHandle<()>> {
        if !self.replica().shared_store {
            return Vec::new();
        }
        let ttl = self.replica().lease_ttl;
        let renew = {
            let sessions = Arc::downgrade(self);
            let store = self.ctx.store.clone();
            let replica = self.replica().id.clone();
            tokio::spawn(async move {
                // Three renewals per TTL: one lost round trip still leaves time for the next.
                let mut tick = tokio::time::interval(ttl / 3);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut renewals = JoinSet::new();
                loop {
                    let Some(earliest) = sessions.upgrade().map(|s| s.clock.earliest()) else {
                        return;
                    };
                    let deadline = async {
                        match earliest {
                            Some(at) => tokio::time::sleep_until(at).await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        _ = tick.tick() => {
                            let Some(sessions) = sessions.upgrade() else {
                                return;
                            };
                            let listed = sessions.clock.snapshot();
                            if !listed.is_empty()
                                && !sessions.released.load(std::sync::atomic::Ordering::SeqCst)
                                && renewals.len() < RENEWALS_IN_FLIGHT
                            {
                                renewals.spawn(renew_once(store.clone(), replica.clone(), listed, ttl));
                            }
                        }
                        Some(Ok(renewal)) = renewals.join_next() => {
                            let Some(sessions) = sessions.upgrade() else {
                                return;
                            };
                            sessions.renewed(renewal);
                        }
                        () = deadline => {}
                    }
                    let Some(sessions) = sessions.upgrade() else {
                        return;
                    };
                    sessions.stop_overdue();
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

    /// Applies a renewal's answer: the leases renewed are held longer; a lease listed but not
    /// renewed was taken by another replica (or released), so its session stops.
    fn renewed(&self, renewal: Renewal) {
        let Some(renewed) = renewal.renewed else {
            return;
        };
        let kept: HashSet<(Uuid, u64)> = renewed.iter().map(|l| (l.session_id, l.fence)).collect();
        for &(session_id, fence) in &kept {
            self.clock.renewed(session_id, fence, renewal.until);
        }
        for (session_id, fence) in renewal.listed {
            if kept.contains(&(session_id, fence)) || !self.clock.holds(session_id, fence) {
                continue;
            }
            self.clock.forget(session_id, fence);
            if let Some(handle) = self.fenced_handle(session_id, fence) {
                self.lose(&handle, "lease taken by another replica");
            }
        }
    }

    /// Stops every session whose lease's time is up here: it was not renewed within the TTL less
    /// the margin, so another replica may soon claim it. Its actor stops its runtime and never
    /// writes again.
    fn stop_overdue(&self) {
        let overdue = self.clock.take_overdue(Instant::now());
        for handle in self.all() {
            let Some(fence) = handle.shared.fence else {
                continue;
            };
            if handle.shared.is_lost() {
                continue;
            }
            let id = handle.shared.id;
            if overdue.contains(&(id, fence)) || !self.clock.holds(id, fence) {
                let ttl = self.replica().lease_ttl;
                tracing::warn!(
                    session = %id,
                    fence,
                    lease_ttl = ?ttl,
                    stop_after = ?self_fence_after(ttl),
                    "lease not renewed in time; stopping the session"
                );
                handle.shared.mark_lost();
                self.forget_lost(&handle);
            }
        }
    }

    /// The live handle of a session held here with `fence`.
    fn fenced_handle(&self, session_id: Uuid, fence: u64) -> Option<SessionHandle> {
        self.held(session_id)
            .filter(|handle| handle.shared.fence == Some(fence))
    }

    fn lose(&self, handle: &SessionHandle, why: &str) {
        tracing::warn!(session = %handle.shared.id, why, "lost a session's lease");
        if let Some(fence) = handle.shared.fence {
            self.clock.forget(handle.shared.id, fence);
        }
        handle.shared.mark_lost();
        self.forget_lost(handle);
    }

    /// Failover: claims every session no live replica holds that has queued work or a
    /// turn in flight, closes that turn as FAILED ("owner replica lost") and reopens the runtime
    /// to drain the queue. Other orphans are claimed on their next call. The store lists only
    /// sessions with work, so idle sessions cost a tick nothing; each one listed is read again
    /// here, since its work may have been taken meanwhile.
    async fn claim_orphans(&self) -> Result<()> {
        let store = &self.ctx.store;
        for id in store.orphans_with_work().await? {
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
        self.clock.forget(handle.shared.id, fence);
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
            self.clock.forget(handle.shared.id, fence);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_self_fencing_margin_is_at_least_a_fifth_of_the_ttl() {
        for ttl in [500, 2_000, 10_000, 600_000].map(Duration::from_millis) {
            let margin = ttl - self_fence_after(ttl);
            assert!(margin >= ttl / 5, "{ttl:?}: {margin:?}");
            assert!(
                self_fence_after(ttl) > ttl / 3,
                "renewals every ttl/3 still fit"
            );
        }
    }

    #[test]
    fn a_lease_runs_out_at_its_own_deadline_and_stays_out_once_taken_overdue() {
        let clock = LeaseClock::default();
        let now = Instant::now();
        let (early, late) = (Uuid::now_v7(), Uuid::now_v7());
        clock.granted(early, 1, now + Duration::from_secs(1));
        // Claimed after the other's last renewal: its own, later deadline.
        clock.granted(late, 4, now + Duration::from_secs(2));
        assert_eq!(clock.earliest(), Some(now + Duration::from_secs(1)));
        assert!(clock.take_overdue(now).is_empty());
        assert_eq!(
            clock.take_overdue(now + Duration::from_secs(1)),
            [(early, 1)]
        );
        assert!(!clock.holds(early, 1) && clock.holds(late, 4));
        // A renewal answered after the session stopped brings nothing back.
        clock.renewed(early, 1, now + Duration::from_secs(5));
        assert!(!clock.holds(early, 1));
        clock.renewed(late, 4, now + Duration::from_secs(5));
        assert_eq!(clock.earliest(), Some(now + Duration::from_secs(5)));
    }

    #[test]
    fn a_renewal_never_shortens_a_lease_and_only_its_own_fence_counts() {
        let clock = LeaseClock::default();
        let now = Instant::now();
        let id = Uuid::now_v7();
        clock.granted(id, 2, now + Duration::from_secs(3));
        // An older renewal answering late.
        clock.renewed(id, 2, now + Duration::from_secs(1));
        assert_eq!(clock.earliest(), Some(now + Duration::from_secs(3)));
        // A renewal of a fence no longer held.
        clock.renewed(id, 1, now + Duration::from_secs(9));
        assert_eq!(clock.earliest(), Some(now + Duration::from_secs(3)));
        // Claimed again with a new fence: the new lease's deadline alone.
        clock.granted(id, 3, now + Duration::from_secs(2));
        assert_eq!(clock.snapshot(), [(id, 3)]);
        assert_eq!(clock.earliest(), Some(now + Duration::from_secs(2)));
        clock.forget(id, 2);
        assert!(clock.holds(id, 3), "forgetting another fence leaves it");
        clock.forget(id, 3);
        assert!(clock.snapshot().is_empty());
    }
}
