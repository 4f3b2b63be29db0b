//! Fair shares of the store's connections for session list scans.
//!
//! A list scan is the one read whose cost a caller chooses (filters, pages), so a single caller
//! sending many of them could hold every connection while each runs up to the statement timeout,
//! and everyone else's reads and writes would wait. Two bounds stop that:
//!
//! - each principal runs at most [`PER_PRINCIPAL`] scans at once; further ones wait their turn
//!   without holding a connection, so one principal's slow lists never delay another's;
//! - all principals together hold at most a part of the connections for scans, so many
//!   principals listing at once still leave connections for GetSession, Control and commits.
//!
//! A wait ends with the caller's deadline (the call is dropped) or after the store's pool wait,
//! as STORE_UNAVAILABLE.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::StoreError;
use crate::domain::Result;

/// List scans one principal may run at once.
pub(crate) const PER_PRINCIPAL: usize = 2;

/// Admits list scans.
pub(crate) struct ListGate {
    /// The principals with scans running or waiting, each with its own permits.
    principals: Mutex<HashMap<String, Arc<Semaphore>>>,
    total: Arc<Semaphore>,
    wait: Duration,
}

/// A scan admitted by the gate: its permits go back when dropped.
pub(crate) struct ListPass<'a> {
    _total: Option<OwnedSemaphorePermit>,
    _own: Slot<'a>,
}

/// One principal's place at the gate: its permit, and the map entry it keeps alive.
struct Slot<'a> {
    gate: &'a ListGate,
    key: String,
    semaphore: Arc<Semaphore>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut principals = self
            .gate
            .principals
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        self.permit.take();
        // Only the map and this slot hold it: nobody of this principal runs or waits.
        if Arc::strong_count(&self.semaphore) == 2 {
            principals.remove(&self.key);
        }
    }
}

impl ListGate {
    /// At most `total` scans at once in all, [`PER_PRINCIPAL`] per principal; a scan waits for
    /// its turn at most `wait`.
    pub(crate) fn new(total: usize, wait: Duration) -> Self {
        Self {
            principals: Mutex::new(HashMap::new()),
            total: Arc::new(Semaphore::new(total.max(1))),
            wait,
        }
    }

    /// Waits for a turn of `principal` (`None`: the unauthenticated `local` caller, who lists
    /// everything) within both bounds.
    pub(crate) async fn enter(&self, principal: Option<&str>) -> Result<ListPass<'_>> {
        let key = principal.unwrap_or_default().to_owned();
        let semaphore = self
            .principals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(PER_PRINCIPAL)))
            .clone();
        let mut own = Slot {
            gate: self,
            key,
            semaphore: semaphore.clone(),
            permit: None,
        };
        let admitted = tokio::time::timeout(self.wait, async {
            own.permit = Some(semaphore.acquire_owned().await.ok()?);
            self.total.clone().acquire_owned().await.ok()
        })
        .await;
        match admitted {
            Ok(Some(total)) => Ok(ListPass {
                _total: Some(total),
                _own: own,
            }),
            _ => Err(StoreError::Unavailable {
                message: format!(
                    "store: no turn to list sessions within {}s: too many lists are running",
                    self.wait.as_secs()
                ),
                source: None,
            }
            .into()),
        }
    }
}

impl ListPass<'_> {
    /// The principal it admits (for tests).
    #[cfg(test)]
    fn principal(&self) -> &str {
        &self._own.key
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ErrorCode;

    #[tokio::test]
    async fn one_principal_waits_beyond_its_share_while_another_gets_in_at_once() {
        let gate = ListGate::new(8, Duration::from_millis(200));
        let a1 = gate.enter(Some("alice")).await.unwrap();
        let _a2 = gate.enter(Some("alice")).await.unwrap();
        let third = gate.enter(Some("alice")).await.err().expect("alice waits");
        assert_eq!(third.code, ErrorCode::StoreUnavailable);
        let bob = gate.enter(Some("bob")).await.expect("bob is not held up");
        assert_eq!(bob.principal(), "bob");
        drop(a1);
        gate.enter(Some("alice")).await.expect("alice's turn came");
    }

    #[tokio::test]
    async fn all_principals_together_stay_within_the_total_and_leave_no_entries_behind() {
        let gate = ListGate::new(2, Duration::from_millis(100));
        let a = gate.enter(Some("a")).await.unwrap();
        let b = gate.enter(Some("b")).await.unwrap();
        assert!(gate.enter(Some("c")).await.is_err(), "the total is spent");
        drop((a, b));
        let _c = gate.enter(None).await.unwrap();
        assert_eq!(
            gate.principals.lock().unwrap().len(),
            1,
            "only the one running"
        );
    }
}
