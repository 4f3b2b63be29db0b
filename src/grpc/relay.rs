//! A bridge that redials another replica (README, "Remote runtimes: bridges", with several replicas): the runtimes its
//! hello lists may belong to sessions another live replica still owns. Rather than kill them,
//! this replica relays their messages to that owner over a `Connect` stream of its own, as the
//! bridge would have sent them, so the owner's runtime tasks take them up again (resend by
//! sequence number, duplicates dropped) and the sessions go on with no fault and no gap. The
//! relay is transparent: it forwards the wire messages as they are, one stream per owner, and
//! routes each bridge message by its runtime key (keys the owner spawns through the relay later
//! are learned from its `spawn`). The relayed stream ends with the bridge's stream.
//!
//! The owner keeps the lease while the relay runs, so a turn in flight finishes there; once the
//! session is idle the owner gives it up (see `Sessions::move_relayed`) and the replica holding
//! the bridge's stream claims it. Moving a lease mid-turn with the actor's state is not built.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{
    Request,
    metadata::MetadataValue,
    transport::{ClientTlsConfig, Endpoint},
};

use super::auth::{FORWARDED_KIND_HEADER, FORWARDED_PRINCIPAL_HEADER};
use crate::{
    acp::remote::OUTBOUND_MESSAGES,
    domain::{Principal, PrincipalKind},
    pb::v1::{
        BridgeHello, BridgeRuntime, ConnectRequest, ConnectResponse, KillRuntime,
        connect_request::Frame as Up, connect_response::Frame as Down,
        runtime_gateway_service_client::RuntimeGatewayServiceClient,
    },
    session::Sessions,
};

/// The header a relayed stream names the relaying replica in (its advertised address).
pub(crate) const RELAYED_BY_HEADER: &str = "x-relayed-by";

/// Where a bridge message goes: the owner replica's relayed stream, by runtime key.
pub(crate) type Routes = Arc<Mutex<HashMap<String, mpsc::Sender<ConnectRequest>>>>;

/// What a replica needs to relay bridge streams to its peers.
pub(crate) struct Relay {
    pub sessions: Arc<Sessions>,
    /// The token this replica presents to its peers (`None`: no tokens configured).
    pub replica_token: Option<String>,
    pub peer_tls: Option<ClientTlsConfig>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay").finish_non_exhaustive()
    }
}

/// The runtime key a bridge message is about (`None`: a hello).
pub(crate) fn key_of(message: &ConnectRequest) -> Option<&str> {
    Some(match message.frame.as_ref()? {
        Up::Spawned(m) => &m.runtime_key,
        Up::SpawnFailed(m) => &m.runtime_key,
        Up::Stdout(m) => &m.runtime_key,
        Up::Exited(m) => &m.runtime_key,
        Up::Ack(m) => &m.runtime_key,
        Up::Hello(_) => return None,
    })
}

impl Relay {
    /// Splits a hello's runtimes: those of sessions another live replica owns are relayed
    /// there (their keys routed to it from now on, what it sends merged into `down`); the hello
    /// keeps the rest. A peer that cannot be reached leaves its runtimes in the hello. A peer
    /// that refuses the stream as not this principal's bridge (PERMISSION_DENIED) refuses the
    /// whole hello: its status is the answer.
    pub(crate) async fn take_foreign(
        &self,
        hello: &mut BridgeHello,
        principal: &Principal,
        routes: &Routes,
        down: &mpsc::Sender<ConnectResponse>,
    ) -> Result<(), tonic::Status> {
        let mut by_owner: HashMap<String, Vec<BridgeRuntime>> = HashMap::new();
        let mut kept = Vec::new();
        for runtime in std::mem::take(&mut hello.running) {
            match self.sessions.owner_elsewhere(&runtime.session_id).await {
                Some(address) => by_owner.entry(address).or_default().push(runtime),
                None => kept.push(runtime),
            }
        }
        for (address, running) in by_owner {
            let keys: Vec<String> = running.iter().map(|r| r.runtime_key.clone()).collect();
            let relayed = BridgeHello {
                running: running.clone(),
                ..hello.clone()
            };
            match self
                .open(&address, relayed, principal, routes, down.clone())
                .await
            {
                Ok(()) => {
                    metrics::counter!(crate::acp::remote::BRIDGE_RELAYED_RUNTIMES)
                        .increment(keys.len() as u64);
                    tracing::info!(bridge = %hello.bridge_id, owner = %address, runtimes = ?keys,
                        "bridge redialled here: relaying its runtimes to the replica owning their sessions");
                }
                Err(error) => {
                    if let Some(status) = error.downcast_ref::<tonic::Status>()
                        && status.code() == tonic::Code::PermissionDenied
                    {
                        tracing::warn!(bridge = %hello.bridge_id, principal = %principal.id,
                            owner = %address, "the replica owning a bridge's runtimes refused its stream");
                        return Err(status.clone());
                    }
                    tracing::warn!(bridge = %hello.bridge_id, owner = %address, %error,
                        "could not relay a bridge's runtimes to their owner replica");
                    kept.extend(running);
                }
            }
        }
        hello.running = kept;
        Ok(())
    }

    /// Opens the relayed stream to `address` and starts passing the owner's messages down.
    async fn open(
        &self,
        address: &str,
        hello: BridgeHello,
        principal: &Principal,
        routes: &Routes,
        down: mpsc::Sender<ConnectResponse>,
    ) -> anyhow::Result<()> {
        let scheme = match self.peer_tls {
            Some(_) => "https",
            None => "http",
        };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))?;
        if let Some(tls) = &self.peer_tls {
            endpoint = endpoint.tls_config(tls.clone())?;
        }
        let channel = endpoint
            .connect_timeout(std::time::Duration::from_secs(3))
            .http2_keep_alive_interval(std::time::Duration::from_secs(5))
            .keep_alive_timeout(std::time::Duration::from_secs(5))
            .keep_alive_while_idle(true)
            .tcp_nodelay(true)
            .connect()
            .await?;
        let mut client = RuntimeGatewayServiceClient::new(channel)
            .max_decoding_message_size(64 * 1024 * 1024)
            .max_encoding_message_size(64 * 1024 * 1024);
        let (up_tx, up_rx) = mpsc::channel(OUTBOUND_MESSAGES);
        let keys: Vec<String> = hello
            .running
            .iter()
            .map(|r| r.runtime_key.clone())
            .collect();
        up_tx
            .send(ConnectRequest {
                frame: Some(Up::Hello(hello)),
            })
            .await?;
        let mut request = Request::new(ReceiverStream::new(up_rx));
        let metadata = request.metadata_mut();
        if let Some(token) = &self.replica_token {
            metadata.insert(
                "authorization",
                MetadataValue::try_from(format!("Bearer {token}"))?,
            );
        }
        let me = self.sessions.context().replica().id.clone();
        if let Some(address) = crate::session::ReplicaOptions::address_of(&me) {
            metadata.insert(RELAYED_BY_HEADER, MetadataValue::try_from(address)?);
        }
        if principal.kind != PrincipalKind::Local {
            metadata.insert(
                FORWARDED_PRINCIPAL_HEADER,
                MetadataValue::try_from(principal.id.as_str())?,
            );
            metadata.insert(FORWARDED_KIND_HEADER, MetadataValue::from_static("runtime"));
        }
        let mut stream =
            tokio::time::timeout(std::time::Duration::from_secs(5), client.connect(request))
                .await??
                .into_inner();
        {
            let mut routes = routes.lock().expect("not poisoned");
            for key in keys {
                routes.insert(key, up_tx.clone());
            }
        }
        let routes = routes.clone();
        // Only the routes hold the relayed stream open: when the bridge's stream ends they are
        // cleared, and the owner sees the relayed stream end too.
        let up_tx = up_tx.downgrade();
        tokio::spawn(async move {
            while let Some(Ok(message)) = stream.next().await {
                // A runtime the owner starts through the relay: its messages go back there.
                if let (Some(Down::Spawn(spawn)), Some(up)) = (&message.frame, up_tx.upgrade()) {
                    routes
                        .lock()
                        .expect("not poisoned")
                        .insert(spawn.runtime_key.clone(), up);
                }
                // Waiting here is the flow control, as on any bridge stream.
                if down.send(message).await.is_err() {
                    break;
                }
            }
            // The owner ended the relayed stream (it stopped, or gave the runtimes up): their keys
            // route nowhere now, and the bridge stops them rather than run agents nobody drives
            // (the owner's sessions reopen wherever they are claimed next).
            let Some(up) = up_tx.upgrade() else {
                return; // the bridge's own stream ended first
            };
            let orphaned: Vec<String> = {
                let mut routes = routes.lock().expect("not poisoned");
                let keys = routes
                    .iter()
                    .filter(|(_, tx)| tx.same_channel(&up))
                    .map(|(key, _)| key.clone())
                    .collect();
                routes.retain(|_, tx| !tx.same_channel(&up));
                keys
            };
            for key in orphaned {
                tracing::info!(runtime = %key, "the owner replica ended a relayed stream: stopping its runtime");
                let kill = ConnectResponse {
                    // No session holds it any more: stopped as a harness stops a runtime.
                    frame: Some(Down::Kill(KillRuntime {
                        runtime_key: key,
                        stop_grace: Some(super::convert::duration_to_pb(
                            crate::acp::process::DEFAULT_STOP_GRACE,
                        )),
                    })),
                };
                if down.send(kill).await.is_err() {
                    break;
                }
            }
        });
        Ok(())
    }
}
