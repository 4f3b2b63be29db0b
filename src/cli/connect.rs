//! The connection to the server: where it is (`--server` / `AGENT_HARNESS_SERVER`) and the
//! bearer token (`AGENT_HARNESS_TOKEN`), attached to every call.

use std::time::Duration;

use clap::Args;
use tonic::{
    Request, Status,
    metadata::MetadataValue,
    service::{Interceptor, interceptor::InterceptedService},
    transport::{Channel, Endpoint},
};

use super::{Failure, exit};
use crate::pb::v1::agent_session_service_client::AgentSessionServiceClient;

/// Where the server is.
#[derive(Args, Clone)]
pub struct ServerArgs {
    /// The server's URL (plaintext `http://`; TLS is not supported by these subcommands yet).
    #[arg(
        long,
        env = "AGENT_HARNESS_SERVER",
        default_value = "http://127.0.0.1:50051"
    )]
    server: String,
}

/// Adds `authorization: Bearer <token>` when a token is set.
#[derive(Clone)]
pub(crate) struct Bearer(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

pub(crate) type Client = AgentSessionServiceClient<InterceptedService<Channel, Bearer>>;

impl ServerArgs {
    /// A client of `AgentSessionService`. The channel connects lazily and reconnects by itself,
    /// so `follow` survives a server restart on the same address.
    pub(crate) async fn connect(&self) -> Result<Client, Failure> {
        let token = match std::env::var("AGENT_HARNESS_TOKEN") {
            Ok(token) if !token.is_empty() => Some(
                format!("Bearer {token}")
                    .parse()
                    .map_err(|_| Failure::new(exit::USAGE, "AGENT_HARNESS_TOKEN is not ASCII"))?,
            ),
            _ => None,
        };
        let endpoint = Endpoint::from_shared(self.server.clone())
            .map_err(|e| Failure::new(exit::USAGE, format!("bad --server {:?}: {e}", self.server)))?
            .connect_timeout(Duration::from_secs(5));
        // Connect once now so an unreachable server is reported as such, with its address.
        let channel = endpoint.connect().await.map_err(|e| {
            Failure::new(
                exit::UNAVAILABLE,
                format!("cannot reach {}: {e}", self.server),
            )
        })?;
        Ok(AgentSessionServiceClient::with_interceptor(
            channel,
            Bearer(token),
        ))
    }
}
