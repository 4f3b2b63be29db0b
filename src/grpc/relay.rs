//! A bridge that redials another replica (docs/bridges.md, "Several replicas"): the runtimes its
//! hello lists may belong to sessions another live replica still owns. Rather than kill them,
//! this replica relays their messages to that owner over a `Connect` stream of its own, as the
//! bridge would have sent them, so the owner's runtime tasks take them up again (resend by
//! sequence number, duplicates dropped) and the sessions go on with no fault and no gap. The
//! relay is transparent: it forwards the wire messages as they are, one stream per owner (a
//! [`Route`]), and routes each bridge message by its runtime key (keys the owner spawns through
//! the relay later are learned from its `spawn`). The relayed stream ends with the bridge's stream.
//!
//! Flow control per route: the bridge's stream is read by one loop for all its runtimes, so that
//! loop never waits for an owner. It puts each relayed message on its route's queue and goes on;
//! the relayed stream takes from that queue as fast as its owner reads (HTTP/2 flow control).
//! What keeps a slow owner's queue short is the bridge's own window: it sends no more than
//! [`MAX_UNACKED_LINES`](crate::acp::remote::MAX_UNACKED_LINES) lines of a runtime its owner has
//! not acknowledged, then stops reading that agent. A route whose queue would pass
//! [`ROUTE_BUDGET_BYTES`] anyway (very long lines, or a bridge that ignores its window) is cut
//! at once rather than waited on: its relayed stream ends, so the owner sees it end (its
//! runtimes wait out their reconnect grace, then fault and reopen), and the bridge is told to
//! stop those runtimes. An owner that answers nothing at all loses its route to the stream's
//! HTTP/2 keepalive (10 s) the same way. Either way the bridge's other runtimes never wait.
//!
//! The owner keeps the lease while the relay runs, so a turn in flight finishes there; once the
//! session is idle the owner gives it up (see `Sessions::move_relayed`) and the replica holding
//! the bridge's stream claims it. Moving a lease mid-turn with the actor's state is not built.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, Weak},
};

use futures::StreamExt;
use prost::Message as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{
    Request,
    metadata::MetadataValue,
    transport::{ClientTlsConfig, Endpoint},
};

use super::auth::{FORWARDED_KIND_HEADER, FORWARDED_PRINCIPAL_HEADER};
use crate::{
    acp::remote::{BRIDGE_RELAY_CUTS, BRIDGE_RELAYED_RUNTIMES},
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

/// The bytes one route may hold for its owner before it is cut (module doc): room for the
/// bridge's whole window of a runtime in lines of tens of kilobytes.
pub(crate) const ROUTE_BUDGET_BYTES: usize = 64 * 1024 * 1024;
/// What a queued message costs beyond its encoded bytes, so that many tiny ones are bounded too.
const MESSAGE_COST: usize = 256;

/// Where a bridge message goes: the owner replica's route, by runtime key.
pub(crate) type Routes = Arc<Mutex<HashMap<String, Route>>>;

/// One owner's relayed stream as the bridge's stream sees it: a queue it never waits on, bounded
/// by a budget of bytes (module doc). Clones share the route; it lives as long as a key routes
/// to it, and when the last clone goes its relayed stream ends after what is queued.
#[derive(Clone)]
pub(crate) struct Route(Arc<RouteState>);

struct RouteState {
    owner: String,
    queue: mpsc::UnboundedSender<Queued>,
    room: Arc<Semaphore>,
    budget: usize,
    /// Set once the route is cut: its stream is reset and its runtimes stopped.
    cut: watch::Sender<bool>,
}

/// A message on a route's queue, holding its share of the budget until the stream takes it.
struct Queued {
    message: ConnectRequest,
    _room: OwnedSemaphorePermit,
}

/// The receiving ends of a new route: what its relayed stream sends, and the cut.
struct RouteEnds {
    queue: mpsc::UnboundedReceiver<Queued>,
    cut: watch::Receiver<bool>,
}

impl Route {
    fn new(owner: &str, budget: usize) -> (Self, RouteEnds) {
        let (queue, queue_rx) = mpsc::unbounded_channel();
        let (cut, cut_rx) = watch::channel(false);
        let state = RouteState {
            owner: owner.to_owned(),
            queue,
            room: Arc::new(Semaphore::new(budget)),
            budget,
            cut,
        };
        let ends = RouteEnds {
            queue: queue_rx,
            cut: cut_rx,
        };
        (Self(Arc::new(state)), ends)
    }

    fn is(&self, other: &Weak<RouteState>) -> bool {
        std::ptr::eq(Arc::as_ptr(&self.0), other.as_ptr())
    }

    /// Queues `message` for the owner without waiting: cuts the route instead when its budget
    /// has no room for it. A cut route drops what it is given.
    fn offer(&self, message: ConnectRequest) {
        let state = &self.0;
        if *state.cut.borrow() {
            return;
        }
        let cost = message.encoded_len().saturating_add(MESSAGE_COST);
        let room = u32::try_from(cost)
            .ok()
            .and_then(|cost| state.room.clone().try_acquire_many_owned(cost).ok());
        match room {
            Some(room) => {
                // Fails only once the stream is gone; the bridge's resend covers what it held.
                let _ = state.queue.send(Queued {
                    message,
                    _room: room,
                });
            }
            None => self.cut(cost),
        }
    }

    fn cut(&self, wanted: usize) {
        let state = &self.0;
        if state.cut.send_replace(true) {
            return;
        }
        metrics::counter!(BRIDGE_RELAY_CUTS).increment(1);
        let queued = state.budget - state.room.available_permits();
        tracing::warn!(owner = %state.owner, queued_bytes = queued, message_bytes = wanted,
            budget_bytes = state.budget,
            "a relayed route fell too far behind its owner replica: cutting it (the owner's sessions reopen)");
    }
}

/// Hands a bridge message to its route, if its runtime is relayed; gives it back otherwise (it
/// is this replica's). Never waits (module doc).
pub(crate) fn forward(routes: &Routes, message: ConnectRequest) -> Option<ConnectRequest> {
    let route = key_of(&message).and_then(|key| {
        let routes = routes.lock().expect("not poisoned");
        routes.get(key).cloned()
    });
    match route {
        Some(route) => {
            route.offer(message);
            None
        }
        None => Some(message),
    }
}

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
fn key_of(message: &ConnectRequest) -> Option<&str> {
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
                    metrics::counter!(BRIDGE_RELAYED_RUNTIMES).increment(keys.len() as u64);
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
        let mut client = self.client_of(address).await?;
        let keys: Vec<String> = hello
            .running
            .iter()
            .map(|r| r.runtime_key.clone())
            .collect();
        let (route, ends) = Route::new(address, ROUTE_BUDGET_BYTES);
        let mut cut = ends.cut.clone();
        let request = self.relayed_request(hello, ends, principal)?;
        let stream =
            tokio::time::timeout(std::time::Duration::from_secs(5), client.connect(request))
                .await??
                .into_inner();
        let weak = Arc::downgrade(&route.0);
        {
            let mut routes = routes.lock().expect("not poisoned");
            for key in keys {
                routes.insert(key, route.clone());
            }
        }
        // Only the routes hold the route open: when the bridge's stream ends they are cleared,
        // and the owner sees the relayed stream end too.
        drop(route);
        let routes = routes.clone();
        tokio::spawn(async move {
            let ended = pass_down(stream, &routes, &weak, &down, &mut cut).await;
            stop_orphans(&routes, &weak, &down, ended).await;
        });
        Ok(())
    }

    async fn client_of(
        &self,
        address: &str,
    ) -> anyhow::Result<RuntimeGatewayServiceClient<tonic::transport::Channel>> {
        let scheme = match self.peer_tls {
            Some(_) => "https",
            None => "http",
        };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))?;
        if let Some(tls) = &self.peer_tls {
            endpoint = endpoint.tls_config(tls.clone())?;
        }
        // The keepalive also ends a route whose owner answers nothing (module doc).
        let channel = endpoint
            .connect_timeout(std::time::Duration::from_secs(3))
            .http2_keep_alive_interval(std::time::Duration::from_secs(5))
            .keep_alive_timeout(std::time::Duration::from_secs(5))
            .keep_alive_while_idle(true)
            .tcp_nodelay(true)
            .connect()
            .await?;
        Ok(RuntimeGatewayServiceClient::new(channel)
            .max_decoding_message_size(64 * 1024 * 1024)
            .max_encoding_message_size(64 * 1024 * 1024))
    }

    /// The relayed stream's request: the hello, then the route's queue until the route is cut
    /// (or its last clone goes and the queue runs dry).
    fn relayed_request(
        &self,
        hello: BridgeHello,
        ends: RouteEnds,
        principal: &Principal,
    ) -> anyhow::Result<Request<impl futures::Stream<Item = ConnectRequest> + use<>>> {
        let RouteEnds { queue, mut cut } = ends;
        let hello = ConnectRequest {
            frame: Some(Up::Hello(hello)),
        };
        // Taking a message out releases its share of the budget.
        let messages = futures::stream::once(async { hello })
            .chain(UnboundedReceiverStream::new(queue).map(|queued| queued.message))
            .take_until(async move { cut_off(&mut cut).await });
        let mut request = Request::new(messages);
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
        Ok(request)
    }
}

/// Resolves once the route is cut (never, if the route is gone: its stream ends by itself).
async fn cut_off(cut: &mut watch::Receiver<bool>) {
    if cut.wait_for(|cut| *cut).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Why a relayed stream stopped being passed down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The owner ended it, or its connection failed (the keepalive included).
    ByOwner,
    /// The route was cut (module doc).
    Cut,
    /// The bridge's own stream is gone.
    BridgeGone,
}

/// Passes the owner's messages down to the bridge until the relayed stream ends or the route is
/// cut; a runtime the owner starts through the relay is routed back to it from then on.
async fn pass_down(
    mut stream: tonic::Streaming<ConnectResponse>,
    routes: &Routes,
    route: &Weak<RouteState>,
    down: &mpsc::Sender<ConnectResponse>,
    cut: &mut watch::Receiver<bool>,
) -> Ended {
    loop {
        let message = tokio::select! {
            message = stream.next() => message,
            () = cut_off(cut) => return Ended::Cut,
        };
        let Some(Ok(message)) = message else {
            return Ended::ByOwner;
        };
        if let (Some(Down::Spawn(spawn)), Some(state)) = (&message.frame, route.upgrade()) {
            routes
                .lock()
                .expect("not poisoned")
                .insert(spawn.runtime_key.clone(), Route(state));
        }
        // Waiting here waits for the bridge, which every route shares anyway.
        if down.send(message).await.is_err() {
            return Ended::BridgeGone;
        }
    }
}

/// After a relayed stream ended or was cut: its keys route nowhere now, and the bridge stops
/// their runtimes rather than run agents nobody drives (the owner's sessions reopen wherever they
/// are claimed next). Nothing to do once the bridge's own stream ended (the routes are cleared).
async fn stop_orphans(
    routes: &Routes,
    route: &Weak<RouteState>,
    down: &mpsc::Sender<ConnectResponse>,
    ended: Ended,
) {
    let orphaned: Vec<String> = {
        let mut routes = routes.lock().expect("not poisoned");
        let keys = routes
            .iter()
            .filter(|(_, r)| r.is(route))
            .map(|(key, _)| key.clone())
            .collect();
        routes.retain(|_, r| !r.is(route));
        keys
    };
    for key in orphaned {
        match ended {
            Ended::Cut => {
                tracing::info!(runtime = %key, "a relayed route was cut: stopping its runtime");
            }
            _ => {
                tracing::info!(runtime = %key, "the owner replica ended a relayed stream: stopping its runtime");
            }
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::v1::RuntimeStdout;

    fn stdout(key: &str, seq: u64, bytes: usize) -> ConnectRequest {
        ConnectRequest {
            frame: Some(Up::Stdout(RuntimeStdout {
                runtime_key: key.into(),
                seq,
                line: vec![b'x'; bytes],
            })),
        }
    }

    fn seq_of(queued: &Queued) -> u64 {
        match &queued.message.frame {
            Some(Up::Stdout(m)) => m.seq,
            other => panic!("not a stdout line: {other:?}"),
        }
    }

    fn routes_with(key: &str, route: &Route) -> Routes {
        Arc::new(Mutex::new(HashMap::from([(key.to_owned(), route.clone())])))
    }

    #[test]
    fn a_relayed_message_goes_on_its_routes_queue_and_any_other_is_given_back() {
        let (route, mut ends) = Route::new("owner:1", 1 << 20);
        let routes = routes_with("relayed", &route);
        assert!(forward(&routes, stdout("relayed", 1, 10)).is_none());
        assert!(forward(&routes, stdout("ours", 1, 10)).is_some());
        let hello = ConnectRequest {
            frame: Some(Up::Hello(BridgeHello::default())),
        };
        assert!(forward(&routes, hello).is_some(), "a hello has no route");
        assert_eq!(seq_of(&ends.queue.try_recv().unwrap()), 1);
        assert!(ends.queue.try_recv().is_err());
    }

    #[test]
    fn a_route_holds_what_fits_its_budget_in_order_and_taking_a_message_frees_its_room() {
        let line = 1000;
        let cost = stdout("k", 1, line).encoded_len() + MESSAGE_COST;
        let (route, mut ends) = Route::new("owner:1", 3 * cost);
        for seq in 1..=3 {
            route.offer(stdout("k", seq, line));
        }
        assert_eq!(route.0.room.available_permits(), 0);
        let first = ends.queue.try_recv().unwrap();
        assert_eq!(seq_of(&first), 1);
        drop(first);
        route.offer(stdout("k", 4, line));
        assert!(!*ends.cut.borrow(), "room was made: not cut");
        let seqs: Vec<u64> = std::iter::from_fn(|| ends.queue.try_recv().ok())
            .map(|q| seq_of(&q))
            .collect();
        assert_eq!(seqs, [2, 3, 4]);
    }

    #[test]
    fn a_message_past_a_routes_budget_cuts_it_at_once_and_what_follows_is_dropped() {
        let line = 1000;
        let cost = stdout("k", 1, line).encoded_len() + MESSAGE_COST;
        let (route, mut ends) = Route::new("owner:1", 2 * cost);
        for seq in 1..=3 {
            route.offer(stdout("k", seq, line));
        }
        assert!(*ends.cut.borrow(), "the third line does not fit: cut");
        let queued = ends.queue.try_recv().unwrap();
        drop(queued);
        route.offer(stdout("k", 4, line));
        let seqs: Vec<u64> = std::iter::from_fn(|| ends.queue.try_recv().ok())
            .map(|q| seq_of(&q))
            .collect();
        assert_eq!(seqs, [2], "nothing is queued on a cut route");
    }
}
