//! Remote sessions with several replicas (docs/bridges.md, "Several replicas"): a session whose profile runs on
//! a bridge is owned by the replica holding that bridge's stream. Each replica publishes the
//! bridges connected to it in the shared store (refreshed well within the lease TTL, and at
//! once when one connects or leaves); a replica asked to create or open a remote session without
//! a matching bridge of its own hands the call to a replica that has one, through the same
//! forwarding as any call for a session owned elsewhere.
//!
//! Each publication names the principal whose token the bridge connected with, and bridges
//! whose runtimes wait for a redial are published too (not connected, so placed on by no one):
//! a bridge id is its principal's on every replica, and no other principal's hello takes it.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use tokio::task::JoinHandle;
use uuid::Uuid;

use super::Sessions;
use crate::{
    acp::remote::{labels_match, labels_text, principal_allowed},
    domain::session::SessionStatus,
    domain::{Error, ErrorCode, Result},
    session::{Command, Profile, ReplicaOptions, SessionHandle},
    store::BridgeAd,
};

/// How often a placement waiting for a bridge looks at the other replicas' bridges again (they
/// have no wake-up of their own; bridges connecting here do).
const PLACEMENT_POLL: Duration = Duration::from_millis(250);

/// Where a remote session should run.
pub(super) enum Home {
    Here,
    /// On the replica at this advertised address, which holds a matching bridge's stream.
    Elsewhere {
        address: String,
        bridge_id: String,
    },
}

impl Sessions {
    /// Publishes this replica's bridges until the registry is dropped or drained: every third of
    /// the lease TTL, and whenever a bridge connects or leaves.
    pub(super) fn spawn_bridge_publisher(self: &Arc<Self>) -> JoinHandle<()> {
        let sessions = Arc::downgrade(self);
        let ttl = self.ctx.replica().lease_ttl;
        let gateway = self.ctx.gateway().clone();
        tokio::spawn(async move {
            loop {
                let changed = gateway.changed();
                {
                    let Some(sessions) = sessions.upgrade() else {
                        return;
                    };
                    // A draining replica takes no new sessions: it stops offering its bridges.
                    let draining = sessions.ctx.is_draining();
                    let ads: Vec<BridgeAd> = match draining {
                        true => Vec::new(),
                        false => sessions.local_ads(),
                    };
                    let replica = sessions.ctx.replica();
                    if let Err(error) = sessions
                        .ctx
                        .store
                        .publish_bridges(&replica.id, &ads, ttl)
                        .await
                    {
                        tracing::warn!(%error, "could not publish this replica's bridges");
                    }
                    if draining {
                        return;
                    }
                }
                tokio::select! {
                    () = changed => {}
                    () = tokio::time::sleep(ttl / 3) => {}
                }
            }
        })
    }

    fn local_ads(&self) -> Vec<BridgeAd> {
        let replica = &self.ctx.replica().id;
        self.ctx
            .gateway()
            .summaries()
            .into_iter()
            .map(|b| BridgeAd {
                bridge_id: b.bridge_id,
                principal: b.principal,
                connected: b.connected,
                replica: replica.clone(),
                labels: b.labels,
                profiles: b.profiles,
                runtimes: b.runtimes,
            })
            .collect()
    }

    /// The principal holding `bridge_id` on another live replica, if it is not `principal`: a
    /// hello naming it is not that bridge's (a bridge is its token). An ad of an older replica
    /// (no principal) proves nothing either way.
    pub(crate) async fn bridge_held_elsewhere(
        &self,
        bridge_id: &str,
        principal: &str,
    ) -> Result<Option<String>> {
        if !self.ctx.replica().shared_store {
            return Ok(None);
        }
        let me = &self.ctx.replica().id;
        let ads = self.ctx.store.bridge_ads().await?;
        Ok(ads
            .into_iter()
            .find(|ad| {
                &ad.replica != me
                    && ad.bridge_id == bridge_id
                    && !ad.principal.is_empty()
                    && ad.principal != principal
            })
            .map(|ad| ad.principal))
    }

    /// The least-loaded bridge matching `labels` (of one of `principals`, if given) that another
    /// live replica published.
    async fn bridge_elsewhere(
        &self,
        labels: &BTreeMap<String, String>,
        principals: Option<&[String]>,
    ) -> Result<Option<Home>> {
        let replica = self.ctx.replica();
        let me = &replica.id;
        let ads = self.ctx.store.bridge_ads().await?;
        Ok(ads
            .into_iter()
            // An earlier run of this replica published its bridges too; they died with it.
            .filter(|ad| !replica.is_earlier_run(&ad.replica))
            .filter(|ad| ad.connected && &ad.replica != me && labels_match(labels, &ad.labels))
            .filter(|ad| principal_allowed(principals, &ad.principal))
            .filter_map(|ad| {
                let address = ReplicaOptions::address_of(&ad.replica)?.to_owned();
                Some((ad.runtimes, ad.bridge_id, address))
            })
            .min()
            .map(|(_, bridge_id, address)| Home::Elsewhere { address, bridge_id }))
    }

    /// Where a new session of a remote profile runs (several replicas only): here when a
    /// matching bridge is connected here, else on a replica that holds one. Waits for a bridge
    /// to appear anywhere within the profile's `startup_timeout`, then RUNTIME_START_FAILED
    /// naming the labels.
    pub(super) async fn home_for_new(&self, profile: &Profile) -> Result<Home> {
        let Some(remote) = &profile.remote else {
            return Ok(Home::Here);
        };
        if !self.ctx.replica().shared_store {
            return Ok(Home::Here);
        }
        let labels = &remote.bridge_labels;
        let principals = remote.bridge_principals.as_deref();
        let deadline = tokio::time::Instant::now() + profile.startup_timeout;
        loop {
            let connected = self.ctx.gateway().connected();
            if self.ctx.gateway().has_match(labels, principals) {
                return Ok(Home::Here);
            }
            if let Some(home) = self.bridge_elsewhere(labels, principals).await? {
                return Ok(home);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::new(
                    ErrorCode::RuntimeStartFailed,
                    format!(
                        "could not start a remote runtime of profile {}: no connected bridge \
                         matched labels {} on any replica within {}",
                        profile.name,
                        labels_text(labels),
                        humantime::format_duration(profile.startup_timeout)
                    ),
                ));
            }
            let wait = PLACEMENT_POLL.min(deadline - tokio::time::Instant::now());
            let _ = tokio::time::timeout(wait, connected).await;
        }
    }

    /// For a call about a remote session that is not running here: the replica to hand it to,
    /// when no matching bridge is connected here but another replica holds one (no waiting).
    pub(super) async fn home_for_open(&self, profile_name: &str) -> Result<Option<Home>> {
        if !self.ctx.replica().shared_store {
            return Ok(None);
        }
        let Some(remote) = self
            .ctx
            .profiles
            .get(profile_name)
            .and_then(|p| p.remote.as_ref())
        else {
            return Ok(None);
        };
        let principals = remote.bridge_principals.as_deref();
        if self
            .ctx
            .gateway()
            .has_match(&remote.bridge_labels, principals)
        {
            return Ok(None);
        }
        self.bridge_elsewhere(&remote.bridge_labels, principals)
            .await
    }

    /// Sessions whose runtime runs on a bridge whose stream another replica holds (and relays
    /// here): once idle, each stops its runtime (SUSPENDED) and gives its lease up, so the next
    /// call claims it on the replica holding the bridge, which reopens it by resume. A turn in
    /// flight finishes through the relay first.
    pub(super) async fn move_relayed(&self) {
        for handle in self.all() {
            if handle.shared.is_lost() || handle.shared.status() != SessionStatus::Idle {
                continue;
            }
            let bridge = handle.shared.bridge.lock().expect("not poisoned").clone();
            let Some(bridge) = bridge else { continue };
            let Some(to) = self.ctx.gateway().relayed_by(&bridge) else {
                continue;
            };
            match handle.ask(|reply| Command::HandOff { reply }).await {
                Ok(true) => {}
                _ => continue,
            }
            let replica = self.ctx.replica();
            tracing::info!(session = %handle.shared.id, bridge = %bridge, from = %replica.id,
                to = %to, "lease moved: the session's bridge is connected to another replica");
            metrics::counter!(crate::acp::remote::BRIDGE_LEASE_MOVES).increment(1);
            self.release_one(&handle).await;
        }
    }

    /// The advertised address of another live replica holding the session's lease, if any (a
    /// runtime a redialled bridge lists for it is relayed there).
    pub(crate) async fn owner_elsewhere(&self, session_id: &str) -> Option<String> {
        let replica = self.ctx.replica();
        if !replica.shared_store {
            return None;
        }
        let id = Uuid::parse_str(session_id).ok()?;
        let lease = self.ctx.store.get_lease(id).await.ok()??;
        let live = lease.expires_at > std::time::SystemTime::now();
        // An earlier run of this replica is no owner elsewhere: relaying there comes back here.
        (live && lease.owner_replica != replica.id && !replica.is_earlier_run(&lease.owner_replica))
            .then(|| ReplicaOptions::address_of(&lease.owner_replica).map(str::to_owned))
            .flatten()
    }

    /// The replica a call goes to when the session's home is elsewhere (`None`: here), logged.
    pub(super) fn moved_to(&self, session_id: Uuid, profile: &str, home: Home) -> Option<String> {
        match home {
            Home::Here => None,
            Home::Elsewhere { address, bridge_id } => {
                let labels = self
                    .ctx
                    .profiles
                    .get(profile)
                    .and_then(|p| p.remote.as_ref())
                    .map(|r| labels_text(&r.bridge_labels))
                    .unwrap_or_default();
                tracing::debug!(session = %session_id, bridge = %bridge_id, %labels, to = %address,
                    "the session's bridge is connected to another replica: handing the call there");
                Some(address)
            }
        }
    }

    /// A session held here without a runtime, whose bridge now is connected to another replica
    /// only: this replica gives its lease up (the actor stops and never writes again), and the
    /// call goes to the replica holding the bridge, which claims it there. That replica's
    /// address, or `None` when the session stays here.
    pub(super) async fn hand_over_idle(&self, handle: &SessionHandle) -> Result<Option<String>> {
        if handle.shared.status().has_runtime() {
            return Ok(None);
        }
        let profile = handle.shared.snapshot().0.profile;
        let Some(home) = self.home_for_open(&profile).await? else {
            return Ok(None);
        };
        let Home::Elsewhere { address, bridge_id } = &home else {
            return Ok(None);
        };
        let replica = self.ctx.replica();
        tracing::info!(session = %handle.shared.id, bridge = %bridge_id, from = %replica.id,
            to = %address, "lease moved: the session's bridge is connected to another replica");
        metrics::counter!(crate::acp::remote::BRIDGE_LEASE_MOVES).increment(1);
        self.release_one(handle).await;
        Ok(self.moved_to(handle.shared.id, &profile, home))
    }
}
