//! Forwarding between replicas. Every `AgentSessionService` call runs here first; a
//! call for a session another live replica owns comes back from the registry as "owned
//! elsewhere" (with the owner's advertised address) and is sent on to that replica over gRPC,
//! as the caller's principal. The hop authenticates with this replica's `replica` token and
//! names the caller in `x-forwarded-principal` / `x-forwarded-principal-kind` (plus
//! `x-acting-user` as given), which the owner accepts from a `replica` principal only. Clients
//! never see which replica owns what: the owner's answer is returned as it is. A replica that
//! serves TLS dials its peers over TLS (trusting `replica_tls_ca`, presenting its own
//! certificate when they require client certificates).
//!
//! Reads (GetSession, ListSessions, ReadLog, GetTranscript, GetQueue) are never forwarded: any
//! replica answers them from the store, so they still answer while the owner is paused or
//! partitioned and its lease has not expired yet.

use std::{collections::HashMap, pin::Pin, sync::Mutex, time::Duration};

use futures::{Stream, StreamExt};
use tonic::{
    Code, Request, Response, Status,
    metadata::{MetadataMap, MetadataValue},
    transport::{Channel, ClientTlsConfig, Endpoint},
};
use tonic_types::{ErrorDetails, StatusExt};

use super::{
    auth::{self, ACTING_USER_HEADER, FORWARDED_KIND_HEADER, FORWARDED_PRINCIPAL_HEADER},
    frame::SubscribeFrame,
    framed::agent_session_service_server::AgentSessionService,
    sessions::SessionsService,
    status::ERROR_DOMAIN,
};
use crate::{
    domain::{Principal, PrincipalKind},
    pb::v1::{self as pb, agent_session_service_client::AgentSessionServiceClient},
    session::manager::owners::OwnedElsewhere,
};

type Reply<T> = Result<Response<T>, Status>;
type Client = AgentSessionServiceClient<Channel>;

/// How long to wait for a connection to the owner replica.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the owner may take to answer a forwarded call (for Subscribe: to open the stream).
/// A paused owner accepts connections but never answers; after this the caller is told to retry,
/// by which time its lease has usually expired and the session is claimed elsewhere.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a create handed to the replica holding the bridge may take: it includes starting
/// the agent there, which a profile may allow much longer than a forwarded call's usual bound.
const CREATE_FORWARD_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest message accepted from the owner (its own responses are bounded by its limits).
const MAX_FORWARDED_MESSAGE: usize = 64 * 1024 * 1024;
/// Reason of the status when the owner replica cannot be reached (the lease has not expired
/// yet; the session is claimed here once it does).
const REPLICA_UNAVAILABLE: &str = "REPLICA_UNAVAILABLE";

/// The session service, with calls for sessions owned elsewhere forwarded to their owner.
pub(crate) struct RoutedSessions {
    inner: SessionsService,
    /// The token this replica presents to its peers (`None`: no tokens configured).
    replica_token: Option<String>,
    /// How peers are dialed when replicas serve TLS (`None`: plaintext, like this one).
    peer_tls: Option<ClientTlsConfig>,
    channels: Mutex<HashMap<String, Channel>>,
}

impl RoutedSessions {
    pub(crate) fn new(
        inner: SessionsService,
        replica_token: Option<String>,
        peer_tls: Option<ClientTlsConfig>,
    ) -> Self {
        Self {
            inner,
            replica_token,
            peer_tls,
            channels: Mutex::new(HashMap::new()),
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
                    // A relayed stream learns that the owner died or stalled.
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

    /// After a local attempt: the owner's address when the call must go there.
    fn route<T>(&self, caller: &Caller, reply: &Reply<T>) -> Result<Option<String>, Status> {
        let Err(status) = reply else {
            return Ok(None);
        };
        let Some(address) = owner_of(status) else {
            return Ok(None);
        };
        if caller.forwarded {
            // Forwarded here, yet owned elsewhere: the lease moved under the hop. One hop only,
            // so a call never circles; the caller retries.
            return Err(unavailable("the session is moving between replicas"));
        }
        Ok(Some(address))
    }

    async fn unary<Req, Resp, Here, HereFut, There, ThereFut>(
        &self,
        request: Request<Req>,
        here: Here,
        there: There,
    ) -> Reply<Resp>
    where
        Req: Clone,
        Here: FnOnce(Request<Req>) -> HereFut,
        HereFut: Future<Output = Reply<Resp>>,
        There: FnOnce(Client, Request<Req>) -> ThereFut,
        ThereFut: Future<Output = Reply<Resp>>,
    {
        self.unary_within(FORWARD_TIMEOUT, request, here, there)
            .await
    }

    /// [`Self::unary`], waiting up to `timeout` for the owner's answer.
    async fn unary_within<Req, Resp, Here, HereFut, There, ThereFut>(
        &self,
        timeout: Duration,
        request: Request<Req>,
        here: Here,
        there: There,
    ) -> Reply<Resp>
    where
        Req: Clone,
        Here: FnOnce(Request<Req>) -> HereFut,
        HereFut: Future<Output = Reply<Resp>>,
        There: FnOnce(Client, Request<Req>) -> ThereFut,
        ThereFut: Future<Output = Reply<Resp>>,
    {
        let caller = Caller::of(&request)?;
        let message = request.get_ref().clone();
        let reply = here(request).await;
        let Some(address) = self.route(&caller, &reply)? else {
            return reply;
        };
        tracing::debug!(owner = %address, "forwarding a call to the session's owner");
        let client = self.client(&address)?;
        match tokio::time::timeout(timeout, there(client, self.hop(&caller, message)?)).await {
            Ok(reply) => reply.map_err(|status| unreachable_owner(status, &address)),
            Err(_) => {
                tracing::warn!(owner = %address, "the session's owner replica did not answer in time");
                Err(unavailable(
                    "the replica that runs this session did not answer; retry shortly",
                ))
            }
        }
    }
}

/// Who made a call, as the owner must see it.
struct Caller {
    principal: Principal,
    traceparent: Option<String>,
    /// The call was itself forwarded by a peer.
    forwarded: bool,
}

impl Caller {
    fn of<T>(request: &Request<T>) -> Result<Self, Status> {
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

/// The owner's address of an "owned elsewhere" refusal of the registry: its typed source, set
/// in process (a status from the wire never has one).
fn owner_of(status: &Status) -> Option<String> {
    let source = std::error::Error::source(status)?;
    source
        .downcast_ref::<OwnedElsewhere>()
        .map(|owned| owned.address.clone())
}

/// UNAVAILABLE, retryable: the owner cannot be reached now.
fn unavailable(message: &str) -> Status {
    let mut details = ErrorDetails::with_error_info(
        REPLICA_UNAVAILABLE,
        ERROR_DOMAIN,
        HashMap::<String, String>::new(),
    );
    details.set_retry_info(Some(Duration::from_secs(1)));
    Status::with_error_details(Code::Unavailable, message, details)
}

/// The owner's answer as it is, unless the owner was not reached at all (a transport error has
/// no ErrorInfo of ours): then a retryable UNAVAILABLE that does not name the replica.
fn unreachable_owner(status: Status, address: &str) -> Status {
    let ours = status
        .get_error_details()
        .error_info()
        .is_some_and(|info| info.domain == ERROR_DOMAIN);
    if ours {
        return status;
    }
    tracing::warn!(owner = %address, %status, "could not reach the session's owner replica");
    unavailable("the replica that runs this session cannot be reached; retry shortly")
}

#[tonic::async_trait]
impl AgentSessionService for RoutedSessions {
    type SubscribeStream = Pin<Box<dyn Stream<Item = Result<SubscribeFrame, Status>> + Send>>;

    async fn create_session(
        &self,
        request: Request<pb::CreateSessionRequest>,
    ) -> Reply<pb::CreateSessionResponse> {
        // Created here, owned here; but a remote profile's session is created on the replica
        // holding a matching bridge's stream, which also starts its runtime.
        self.unary_within(
            CREATE_FORWARD_TIMEOUT,
            request,
            |r| self.inner.create_session(r),
            |mut c, r| async move { c.create_session(r).await },
        )
        .await
    }

    async fn get_session(
        &self,
        request: Request<pb::GetSessionRequest>,
    ) -> Reply<pb::GetSessionResponse> {
        // A read: served from the store here, whoever owns the session.
        self.inner.get_session(request).await
    }

    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Reply<pb::ListSessionsResponse> {
        self.inner.list_sessions(request).await
    }

    async fn fork_session(
        &self,
        request: Request<pb::ForkSessionRequest>,
    ) -> Reply<pb::ForkSessionResponse> {
        // Forked where the parent runs: the new session's runtime forks the parent's context.
        self.unary(
            request,
            |r| self.inner.fork_session(r),
            |mut c, r| async move { c.fork_session(r).await },
        )
        .await
    }

    async fn close_session(
        &self,
        request: Request<pb::CloseSessionRequest>,
    ) -> Reply<pb::CloseSessionResponse> {
        self.unary(
            request,
            |r| self.inner.close_session(r),
            |mut c, r| async move { c.close_session(r).await },
        )
        .await
    }

    async fn delete_session(
        &self,
        request: Request<pb::DeleteSessionRequest>,
    ) -> Reply<pb::DeleteSessionResponse> {
        self.unary(
            request,
            |r| self.inner.delete_session(r),
            |mut c, r| async move { c.delete_session(r).await },
        )
        .await
    }

    async fn control(&self, request: Request<pb::ControlRequest>) -> Reply<pb::ControlResponse> {
        self.unary(
            request,
            |r| self.inner.control(r),
            |mut c, r| async move { c.control(r).await },
        )
        .await
    }

    async fn get_queue(
        &self,
        request: Request<pb::GetQueueRequest>,
    ) -> Reply<pb::GetQueueResponse> {
        // A read: served from the store here, whoever owns the session.
        self.inner.get_queue(request).await
    }

    async fn edit_queued_prompt(
        &self,
        request: Request<pb::EditQueuedPromptRequest>,
    ) -> Reply<pb::EditQueuedPromptResponse> {
        self.unary(
            request,
            |r| self.inner.edit_queued_prompt(r),
            |mut c, r| async move { c.edit_queued_prompt(r).await },
        )
        .await
    }

    async fn remove_queued_action(
        &self,
        request: Request<pb::RemoveQueuedActionRequest>,
    ) -> Reply<pb::RemoveQueuedActionResponse> {
        self.unary(
            request,
            |r| self.inner.remove_queued_action(r),
            |mut c, r| async move { c.remove_queued_action(r).await },
        )
        .await
    }

    async fn read_log(&self, request: Request<pb::ReadLogRequest>) -> Reply<pb::ReadLogResponse> {
        // A read: served from the store here, whoever owns the session.
        self.inner.read_log(request).await
    }

    async fn get_transcript(
        &self,
        request: Request<pb::GetTranscriptRequest>,
    ) -> Reply<pb::GetTranscriptResponse> {
        // A read: served from the store here, whoever owns the session.
        self.inner.get_transcript(request).await
    }

    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> Reply<Self::SubscribeStream> {
        let credential = auth::credential(&request);
        self.unary(
            request,
            |r| self.inner.subscribe(r),
            |mut c, r| async move {
                let stream = c.subscribe(r).await?.into_inner();
                let stream: Self::SubscribeStream =
                    Box::pin(stream.map(|item| item.map(SubscribeFrame::from)));
                // The caller's token still ends the relayed stream when it is revoked here.
                Ok(Response::new(auth::end_when_revoked(stream, credential)))
            },
        )
        .await
    }
}
