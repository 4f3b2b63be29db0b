//! Single flight: on one replica at most one claim-and-reopen of a session runs at a time. Two
//! calls (or a call and the failover tick) finding the same session unheld would otherwise both
//! claim it — a claim by the replica that already holds the lease keeps its fence, so fencing
//! cannot tell their actors apart — and both bring it back. The second waits for the first,
//! then finds the session held.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use tokio::sync::OwnedMutexGuard;
use uuid::Uuid;

/// The claims in flight on this replica, one lock per session while someone holds or waits.
#[derive(Default)]
pub(super) struct Flights {
    running: Mutex<HashMap<Uuid, Arc<tokio::sync::Mutex<()>>>>,
}

impl Flights {
    /// Waits until no other claim of `session_id` runs here; the claim is this caller's until
    /// the returned guard drops.
    pub(super) async fn enter(&self, session_id: Uuid) -> Flight<'_> {
        let lock = self
            .running
            .lock()
            .expect("not poisoned")
            .entry(session_id)
            .or_default()
            .clone();
        let guard = lock.lock_owned().await;
        Flight {
            flights: self,
            session_id,
            guard: Some(guard),
        }
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.running.lock().expect("not poisoned").len()
    }
}

/// One claim in flight; the next waiting caller enters when it drops.
pub(super) struct Flight<'a> {
    flights: &'a Flights,
    session_id: Uuid,
    guard: Option<OwnedMutexGuard<()>>,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut running = self.flights.running.lock().expect("not poisoned");
        // Only the table holds the lock now: nobody waits, so the entry goes.
        if running
            .get(&self.session_id)
            .is_some_and(|lock| Arc::strong_count(lock) == 1)
        {
            running.remove(&self.session_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_second_claim_of_one_session_waits_for_the_first_and_other_sessions_do_not() {
        let flights = Flights::default();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let first = flights.enter(a).await;
        let other = tokio::time::timeout(Duration::from_secs(5), flights.enter(b))
            .await
            .expect("another session's claim does not wait");
        let second = flights.enter(a);
        tokio::pin!(second);
        assert!(
            futures::poll!(second.as_mut()).is_pending(),
            "the same session's second claim waits"
        );
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .expect("it enters once the first is done");
        drop((second, other));
        assert_eq!(flights.tracked(), 0, "no entry outlives its claims");
    }
}
