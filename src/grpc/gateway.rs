//! `RuntimeGatewayService`: bridges dialling in with the runtimes they run. Thin: the
//! first message must be a hello; the rest is decoded into the engine's bridge messages and
//! served by [`Gateway::serve`]; what the engine sends back is encoded on the way out.
//!
//! A bridge is its token: the hello is admitted only if it is within bounds, claims no label
//! its runtime token does not allow, and names a bridge id no other principal holds — here, on
//! another replica (its published bridges), or on the replica owning the runtimes it lists
//! (that replica refuses the relayed stream, and the refusal is the answer). A refused hello
//! is the call's status and changes nothing.

use std::{pin::Pin, sync::Arc};

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::{
    auth,
    relay::{self, RELAYED_BY_HEADER, Relay, Routes},
};
use crate::{
    acp::remote::{self, FromBridge, Gateway, Hello, Refused, StillRunning, ToBridge},
    domain::{Error, ErrorCode, Principal, PrincipalKind},
    pb::v1::{
        BridgeHello, ConnectRequest, ConnectResponse, KillRuntime, LineAck, RuntimeStdin,
        SpawnRuntime, connect_request::Frame as In, connect_response::Frame as Out,
        runtime_gateway_service_server::RuntimeGatewayService,
    },
};

#[derive(Debug, Default)]
pub(crate) struct GatewayService {
    /// `None` when this process serves no sessions: there is nothing to run on a bridge.
    gateway: Option<Arc<Gateway>>,
    /// With several replicas: relays a redialled bridge's runtimes to the replicas owning them.
    relay: Option<Arc<Relay>>,
}

impl GatewayService {
    pub(crate) fn new(gateway: Option<Arc<Gateway>>, relay: Option<Arc<Relay>>) -> Self {
        Self { gateway, relay }
    }
}

fn hello_of(hello: &BridgeHello) -> Hello {
    Hello {
        bridge_id: hello.bridge_id.clone(),
        labels: hello
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        profiles: hello.profiles.clone(),
        version: hello.version.clone(),
        running: hello
            .running
            .iter()
            .map(|r| StillRunning {
                key: r.runtime_key.clone(),
                last_stdin_seq: r.last_stdin_seq,
                last_stdout_seq: r.last_stdout_seq,
            })
            .collect(),
    }
}

/// Refuses a hello claiming a label the bridge's own runtime token does not allow. A stream a
/// replica relays was checked by that replica (it authenticated the bridge's token).
fn check_labels(
    hello: &Hello,
    principal: &Principal,
    credential: Option<&auth::Credential>,
) -> Result<(), Error> {
    let Some(grant) = credential.map(auth::Credential::grant) else {
        return Ok(());
    };
    if grant.kind != PrincipalKind::Runtime || grant.principal != principal.id {
        return Ok(());
    }
    match grant.disallowed_label(&hello.labels) {
        None => Ok(()),
        Some(key) => Err(Error::new(
            ErrorCode::Forbidden,
            format!("this runtime token may not claim the bridge label {key:?}"),
        )),
    }
}

/// One message from a bridge, after the hello.
fn decode(message: Result<ConnectRequest, Status>) -> Result<FromBridge, Refused> {
    let message =
        message.map_err(|status| Refused(format!("stream failed: {}", status.message())))?;
    Ok(match message.frame {
        Some(In::Spawned(m)) => FromBridge::Spawned { key: m.runtime_key },
        Some(In::SpawnFailed(m)) => FromBridge::SpawnFailed {
            key: m.runtime_key,
            error: m.error,
            stderr_tail: m.stderr_tail,
        },
        Some(In::Stdout(m)) => FromBridge::Stdout {
            key: m.runtime_key,
            seq: m.seq,
            line: m.line,
        },
        Some(In::Exited(m)) => FromBridge::Exited {
            key: m.runtime_key,
            code: m.code,
            signal: m.signal,
            stderr_tail: m.stderr_tail,
        },
        Some(In::Ack(m)) => FromBridge::Ack {
            key: m.runtime_key,
            seq: m.seq,
        },
        Some(In::Hello(_)) => return Err(Refused("a second hello on one stream".into())),
        None => return Err(Refused("a message without a frame".into())),
    })
}

fn encode(message: ToBridge) -> ConnectResponse {
    let frame = match message {
        ToBridge::Spawn {
            key,
            profile,
            cwd,
            session_id,
            owner,
        } => Out::Spawn(SpawnRuntime {
            runtime_key: key,
            profile,
            cwd,
            session_id,
            owner,
        }),
        ToBridge::Stdin { key, seq, line } => Out::Stdin(RuntimeStdin {
            runtime_key: key,
            seq,
            line,
        }),
        ToBridge::Kill { key, grace } => Out::Kill(KillRuntime {
            runtime_key: key,
            stop_grace: grace.map(super::convert::duration_to_pb),
        }),
        ToBridge::Ack { key, seq } => Out::Ack(LineAck {
            runtime_key: key,
            seq,
        }),
    };
    ConnectResponse { frame: Some(frame) }
}

#[tonic::async_trait]
impl RuntimeGatewayService for GatewayService {
    type ConnectStream = Pin<Box<dyn Stream<Item = Result<ConnectResponse, Status>> + Send>>;

    async fn connect(
        &self,
        request: Request<Streaming<ConnectRequest>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let principal = auth::principal(&request)?;
        let credential = auth::credential(&request);
        let Some(gateway) = self.gateway.clone() else {
            return Err(Error::new(
                ErrorCode::Unimplemented,
                "this process serves no sessions, so it runs nothing on bridges",
            )
            .into());
        };
        let relayed_by = relayed_by(request.metadata(), &principal);
        let mut inbound = request.into_inner();
        let routes: Routes = Arc::default();
        let (relayed_tx, relayed_rx) = mpsc::channel::<ConnectResponse>(remote::OUTBOUND_MESSAGES);
        let mut hello_pb = match inbound.next().await {
            Some(Ok(ConnectRequest {
                frame: Some(In::Hello(hello)),
            })) => hello,
            Some(Err(status)) => return Err(status),
            _ => {
                return Err(Error::invalid("the first message of Connect must be a hello").into());
            }
        };
        let hello = hello_of(&hello_pb);
        remote::check_hello(&hello)?;
        if hello_pb
            .running
            .iter()
            .any(|r| r.session_id.len() > remote::MAX_HELLO_TEXT)
        {
            return Err(Error::limit(
                "hello.session_id",
                remote::MAX_HELLO_TEXT,
                "a session id of the hello (bytes)",
            )
            .into());
        }
        check_labels(&hello, &principal, credential.as_ref())?;
        gateway.check_owner(&hello.bridge_id, &principal.id)?;
        if let Some(relay) = &self.relay {
            if let Some(holder) = relay
                .sessions
                .bridge_held_elsewhere(&hello.bridge_id, &principal.id)
                .await?
            {
                tracing::warn!(bridge = %hello.bridge_id, principal = %principal.id, %holder,
                    "refused a hello naming a bridge another principal holds on another replica");
                return Err(remote::held_by_another(&hello.bridge_id).into());
            }
            // The replica owning a listed runtime refuses a stream that is not its bridge's;
            // its refusal is this call's answer (the relayed streams opened so far close with
            // `routes`).
            relay
                .take_foreign(&mut hello_pb, &principal, &routes, &relayed_tx)
                .await?;
        }
        drop(hello_pb);
        let (out_tx, out_rx) = mpsc::channel(remote::OUTBOUND_MESSAGES);
        // The runtimes relayed to their owner are no longer this replica's to take up.
        let mut hello = hello;
        {
            let relayed = routes.lock().expect("not poisoned");
            hello.running.retain(|r| !relayed.contains_key(&r.key));
        }
        let admitted = match gateway.admit(&hello, &principal.id, out_tx, relayed_by) {
            Ok(admitted) => admitted,
            Err(error) => {
                routes.lock().expect("not poisoned").clear();
                return Err(error.into());
            }
        };
        let (end_tx, end_rx) = tokio::sync::oneshot::channel::<Status>();
        drop(relayed_tx);
        tokio::spawn(async move {
            // Messages for relayed runtimes go to their owner's route as they are, never waiting
            // for it (a slow owner holds up its own runtimes only); the rest are ours.
            let relay_routes = routes.clone();
            let inbound = inbound.filter_map(move |message| {
                let ours = match message {
                    Ok(message) => relay::forward(&relay_routes, message).map(Ok),
                    Err(status) => Some(Err(status)),
                };
                futures::future::ready(ours.map(decode))
            });
            let inbound = Box::pin(inbound);
            let served = gateway.serve(admitted, inbound).await;
            // The bridge's stream ended: so do the streams relayed for it.
            routes.lock().expect("not poisoned").clear();
            if let Err(Refused(why)) = served {
                let _ = end_tx.send(Error::invalid(why).into());
            }
        });
        let local = ReceiverStream::new(out_rx).map(|m| Ok(encode(m)));
        let relayed = ReceiverStream::new(relayed_rx).map(Ok);
        let outbound = futures::stream::select(local, relayed);
        // A refused stream ends with its reason after whatever was already queued.
        let ending =
            futures::stream::once(end_rx).filter_map(|end| async move { end.ok().map(Err) });
        let stream: Self::ConnectStream = Box::pin(outbound.chain(ending));
        Ok(Response::new(auth::end_when_revoked(stream, credential)))
    }
}

/// The replica relaying this stream (it holds the bridge's own stream), if it is one. With tokens
/// the header counts only on a call a replica forwarded — the auth layer accepted
/// `x-forwarded-principal` from a `replica` principal alone — so a bridge cannot mark its own
/// stream as relayed and keep it out of placement.
fn relayed_by(
    metadata: &tonic::metadata::MetadataMap,
    principal: &crate::domain::Principal,
) -> Option<String> {
    let forwarded = metadata.contains_key(auth::FORWARDED_PRINCIPAL_HEADER);
    if principal.kind != crate::domain::PrincipalKind::Local && !forwarded {
        return None;
    }
    metadata
        .get(RELAYED_BY_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use tonic::metadata::MetadataMap;

    use super::*;
    use crate::domain::{Principal, PrincipalKind};

    fn principal(kind: PrincipalKind) -> Principal {
        Principal {
            id: "sandbox-7".into(),
            kind,
            acting_user: None,
        }
    }

    #[test]
    fn only_a_forwarded_stream_or_one_without_tokens_counts_as_relayed() {
        let mut marked = MetadataMap::new();
        marked.insert(RELAYED_BY_HEADER, "10.0.0.2:50051".parse().unwrap());
        let bridge = principal(PrincipalKind::Runtime);
        assert_eq!(
            relayed_by(&marked, &bridge),
            None,
            "a bridge's own header is ignored"
        );
        assert_eq!(
            relayed_by(&marked, &Principal::local()).as_deref(),
            Some("10.0.0.2:50051"),
            "without tokens every caller is trusted alike"
        );
        marked.insert(
            auth::FORWARDED_PRINCIPAL_HEADER,
            "sandbox-7".parse().unwrap(),
        );
        assert_eq!(
            relayed_by(&marked, &bridge).as_deref(),
            Some("10.0.0.2:50051"),
            "forwarded by a replica"
        );
    }
}
