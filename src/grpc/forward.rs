//! Forwarding between replicas. A call about a session that another live replica runs (or
//! that must be created where a matching bridge is connected) is located before it is
//! dispatched (`Sessions::locate`); when the answer is "the replica at this address", the
//! handler hands the decoded request, encoded again, to [`Forwarder`], which sends it there as
//! the caller's principal. The hop authenticates with this replica's `replica` token and names
//! the caller in `x-forwarded-principal` / `x-forwarded-principal-kind` (plus `x-acting-user` as
//! given), which the owner accepts from a `replica` principal only. Clients never see which
//! replica owns what: the owner's answer is returned as it is. A replica that serves TLS dials
//! its peers over TLS (trusting `replica_tls_ca`, presenting its own certificate when they
//! require client certificates).
//!
//! Reads (GetSession, ListSessions, ReadLog, GetTranscript, GetQueue, Subscribe) are never
//! forwarded: any replica answers them from the store, so they still answer while the owner is
//! paused or partitioned and its lease has not expired yet.

use std::{collections::HashMap, sync::Mutex, time::Duration};

use tonic::{
    Request, Response, Status,
    metadata::{MetadataMap, MetadataValue},
    transport::{Channel, ClientTlsConfig, Endpoint},
};
use tonic_types::StatusExt;

use super::{
    auth::{self, ACTING_USER_HEADER, FORWARDED_KIND_HEADER, FORWARDED_PRINCIPAL_HEADER},
    status::ERROR_DOMAIN,
};
use crate::{
    domain::{ActionId, Error, ErrorCode, Principal, PrincipalKind},
    pb::v1::agent_session_service_client::AgentSessionServiceClient,
};

type Reply<T> = Result<Response<T>, Status>;
pub(crate) type Client = AgentSessionServiceClient<Channel>;

/// How long to wait for a connection to the owner replica.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the owner may take to answer a forwarded call. A paused owner accepts connections
/// but never answers; after this the caller is told to retry, by which time its lease has
/// usually expired and the session is claimed elsewhere.
pub(crate) const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a create handed to the replica holding the bridge may take: it includes starting
/// the agent there, which a profile may allow much longer than a forwarded call's usual bound.
pub(crate) const CREATE_FORWARD_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest message accepted from the owner (its own responses are bounded by its limits).
const MAX_FORWARDED_MESSAGE: usize = 64 * 1024 * 1024;

/// Sends calls on to the replica that runs their session, over one pooled channel per peer.
pub(crate) struct Forwarder {
    /// The token this replica presents to its peers (`None`: no tokens configured).
    replica_token: Option<String>,
    /// How peers are dialed when replicas serve TLS (`None`: plaintext, like this one).
    peer_tls: Option<ClientTlsConfig>,
    channels: Mutex<HashMap<String, Channel>>,
    /// This replica's own advertised address: never a hop's destination.
    own_address: Option<String>,
}

impl Forwarder {
    pub(crate) fn new(
        replica_token: Option<String>,
        peer_tls: Option<ClientTlsConfig>,
        own_address: Option<String>,
    ) -> Self {
        Self {
            replica_token,
            peer_tls,
            channels: Mutex::new(HashMap::new()),
            own_address,
        }
    }

    fn client(&self, address: &str) -> Result<Client, Status> {
        let mut channels = self.channels.lock().expect("not poisoned");
        let channel = match channels.get(address) {
            Some(channel) => channel.clone(),
            None => {
                let bad = |e: tonic::transport::Error| {
                    unavailable(&format!("bad replica address {address:?}: {e}"))
                };
                // A replica serving TLS dials its peers over TLS too: they share one config.
                let scheme = match self.peer_tls {
                    Some(_) => "https",
                    None => "http",
                };
                let mut endpoint =
                    Endpoint::from_shared(format!("{scheme}://{address}")).map_err(bad)?;
                if let Some(tls) = &self.peer_tls {
                    endpoint = endpoint.tls_config(tls.clone()).map_err(bad)?;
                }
                let channel = endpoint
                    .connect_timeout(CONNECT_TIMEOUT)
                    // A hop learns that the owner died or stalled.
                    .http2_keep_alive_interval(Duration::from_secs(5))
                    .keep_alive_timeout(Duration::from_secs(5))
                    .keep_alive_while_idle(true)
                    .tcp_nodelay(true)
                    .connect_lazy();
                channels.insert(address.to_owned(), channel.clone());
                channel
            }
        };
        Ok(Client::new(channel)
            .max_decoding_message_size(MAX_FORWARDED_MESSAGE)
            .max_encoding_message_size(MAX_FORWARDED_MESSAGE))
    }

    /// The request to send to the owner: the message, this replica's credentials, and the
    /// caller's principal and trace context.
    fn hop<T>(&self, caller: &Caller, message: T) -> Result<Request<T>, Status> {
        let mut request = Request::new(message);
        let metadata = request.metadata_mut();
        if let Some(token) = &self.replica_token {
            insert(metadata, "authorization", &format!("Bearer {token}"))?;
        }
        if caller.principal.kind != PrincipalKind::Local {
            insert(metadata, FORWARDED_PRINCIPAL_HEADER, &caller.principal.id)?;
            insert(
                metadata,
                FORWARDED_KIND_HEADER,
                caller.principal.kind.as_str(),
            )?;
        }
        if let Some(user) = &caller.principal.acting_user {
            insert(metadata, ACTING_USER_HEADER, user)?;
        }
        if let Some(traceparent) = &caller.traceparent {
            insert(metadata, "traceparent", traceparent)?;
        }
        Ok(request)
    }

    /// Sends `message` to the replica at `address` with `call`, waiting up to `timeout` for its
    /// answer, which is returned as it is. `unanswered` is the status when the call may have
    /// reached the owner but no answer came back — none in time, or the connection failed after
    /// the request went out: the owner may or may not have acted.
    pub(crate) async fn call<Req, Resp, Call, CallFut>(
        &self,
        caller: &Caller,
        address: &str,
        timeout: Duration,
        message: Req,
        call: Call,
        unanswered: impl FnOnce() -> Status,
    ) -> Reply<Resp>
    where
        Call: FnOnce(Client, Request<Req>) -> CallFut,
        CallFut: Future<Output = Reply<Resp>>,
    {
        if caller.forwarded {
            // Forwarded here, yet owned elsewhere: the lease moved under the hop. One hop only,
            // so a call never circles; the caller retries.
            return Err(unavailable("the session is moving between replicas"));
        }
        if self.own_address.as_deref() == Some(address) {
            // A stale entry of an earlier run of this replica (the engine skips those; this is
            // the last guard): the hop would reach this very process, without the caller's
            // credentials. Retryable: the entry lapses within the lease TTL.
            tracing::warn!(owner = %address, "not forwarding a call to this replica's own address");
            return Err(unavailable(
                "the session is held by an earlier run of this replica; retry shortly",
            ));
        }
        tracing::debug!(owner = %address, "forwarding a call to the session's owner");
        let client = self.client(address)?;
        let request = self.hop(caller, message)?;
        match tokio::time::timeout(timeout, call(client, request)).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(status)) if is_ours(&status) => Err(status),
            Ok(Err(status)) if never_connected(&status) => Err(unreachable_owner(status, address)),
            Ok(Err(status)) => {
                tracing::warn!(owner = %address, %status, "the connection to the session's owner replica failed during a call");
                Err(unanswered())
            }
            Err(_) => {
                tracing::warn!(owner = %address, "the session's owner replica did not answer in time");
                Err(unanswered())
            }
        }
    }
}

/// Who made a call, as the owner must see it.
pub(crate) struct Caller {
    pub(crate) principal: Principal,
    pub(crate) traceparent: Option<String>,
    /// The call was itself forwarded by a peer.
    forwarded: bool,
}

impl Caller {
    pub(crate) fn of<T>(request: &Request<T>) -> Result<Self, Status> {
        Ok(Self {
            principal: auth::principal(request)?,
            traceparent: auth::traceparent(request),
            forwarded: request.metadata().contains_key(FORWARDED_PRINCIPAL_HEADER)
                || request.metadata().contains_key(FORWARDED_KIND_HEADER),
        })
    }
}

fn insert(metadata: &mut MetadataMap, key: &'static str, value: &str) -> Result<(), Status> {
    let value = MetadataValue::try_from(value)
        .map_err(|_| Status::internal(format!("{key} cannot be forwarded as a header")))?;
    metadata.insert(key, value);
    Ok(())
}

/// UNAVAILABLE (REPLICA_UNAVAILABLE), retryable: the owner cannot be reached now (its lease has
/// not expired yet; the session is claimed here once it does).
pub(crate) fn unavailable(message: &str) -> Status {
    Error::new(ErrorCode::ReplicaUnavailable, message).into()
}

/// UNAVAILABLE (OUTCOME_UNKNOWN), retryable: a forwarded Control got no answer from the owner,
/// which may or may not have taken it. The action id was minted before the hop, so a retry
/// with it is answered with the action's status, or takes it.
pub(crate) fn outcome_unknown(action_id: ActionId) -> Status {
    Error::new(
        ErrorCode::OutcomeUnknown,
        format!(
            "the replica that runs this session did not answer; action {action_id} may or may \
             not have been taken: retry with that action_id"
        ),
    )
    .with("action_id", action_id)
    .into()
}

/// Whether a status is an answer of a replica (it carries our ErrorInfo), not a transport
/// failure.
fn is_ours(status: &Status) -> bool {
    status
        .get_error_details()
        .error_info()
        .is_some_and(|info| info.domain == ERROR_DOMAIN)
}

/// Whether a transport failure happened while connecting, so the request never left.
fn never_connected(status: &Status) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(status);
    while let Some(error) = cause {
        if error.is::<tonic::ConnectError>() {
            return true;
        }
        cause = error.source();
    }
    false
}

/// A retryable UNAVAILABLE for an owner that could not be reached at all, which does not name
/// the replica.
fn unreachable_owner(status: Status, address: &str) -> Status {
    tracing::warn!(owner = %address, %status, "could not reach the session's owner replica");
    unavailable("the replica that runs this session cannot be reached; retry shortly")
}
