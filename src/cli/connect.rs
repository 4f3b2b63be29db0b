//! The connection to the server: where it is (`--server` / `AGENT_HARNESS_SERVER`), how TLS is
//! trusted for an `https://` server (`--ca-file`, `--cert`/`--key`), and the bearer token
//! (`AGENT_HARNESS_TOKEN`), attached to every call.

use std::{path::PathBuf, time::Duration};

use clap::Args;
use tonic::{
    Request, Status,
    metadata::MetadataValue,
    service::{Interceptor, interceptor::InterceptedService},
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity},
};

use super::{Failure, exit};
use crate::pb::v1::agent_session_service_client::AgentSessionServiceClient;

/// Where the server is.
#[derive(Args, Clone)]
pub struct ServerArgs {
    /// The server's URL: `http://` for plaintext, `https://` for TLS.
    #[arg(
        long,
        global = true,
        env = "AGENT_HARNESS_SERVER",
        default_value = "http://127.0.0.1:50051"
    )]
    server: String,
    /// PEM CA certificates to trust for an `https://` server, besides the system's roots.
    #[arg(
        long,
        global = true,
        env = "AGENT_HARNESS_CA_FILE",
        value_name = "PATH"
    )]
    ca_file: Option<PathBuf>,
    /// PEM client certificate for a server that requires mutual TLS (with --key).
    #[arg(
        long,
        global = true,
        env = "AGENT_HARNESS_CERT",
        value_name = "PATH",
        requires = "key"
    )]
    cert: Option<PathBuf>,
    /// PEM private key of --cert.
    #[arg(
        long,
        global = true,
        env = "AGENT_HARNESS_KEY",
        value_name = "PATH",
        requires = "cert"
    )]
    key: Option<PathBuf>,
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
        let endpoint = self.with_tls(endpoint)?;
        // Connect once now so an unreachable or untrusted server is reported as such, with its
        // address.
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| match tls_failure(&e) {
                Some(tls) => {
                    Failure::new(exit::TLS, format!("TLS with {} failed: {tls}", self.server))
                }
                None => Failure::new(
                    exit::UNAVAILABLE,
                    format!("cannot reach {}: {}", self.server, chain(&e)),
                ),
            })?;
        Ok(AgentSessionServiceClient::with_interceptor(
            channel,
            Bearer(token),
        ))
    }
}

impl ServerArgs {
    /// Sets up TLS for an `https://` server; the TLS options without one are a mistake worth
    /// saying rather than silently sending plaintext.
    fn with_tls(&self, endpoint: Endpoint) -> Result<Endpoint, Failure> {
        if !self.server.starts_with("https://") {
            if self.ca_file.is_some() || self.cert.is_some() {
                return Err(Failure::new(
                    exit::USAGE,
                    "--ca-file, --cert and --key need an https:// --server",
                ));
            }
            return Ok(endpoint);
        }
        let mut tls = ClientTlsConfig::new();
        if let Some(path) = &self.ca_file {
            tls = tls.ca_certificate(Certificate::from_pem(read(path)?));
        }
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        // The system's roots when it has any; a host without them still works with --ca-file.
        match endpoint.clone().tls_config(tls.clone().with_native_roots()) {
            Ok(endpoint) => Ok(endpoint),
            Err(_) if self.ca_file.is_some() => endpoint.tls_config(tls).map_err(bad_tls_files),
            Err(e) => Err(bad_tls_files(e)),
        }
    }
}

fn read(path: &PathBuf) -> Result<Vec<u8>, Failure> {
    std::fs::read(path)
        .map_err(|e| Failure::new(exit::USAGE, format!("cannot read {}: {e}", path.display())))
}

fn bad_tls_files(e: tonic::transport::Error) -> Failure {
    Failure::new(
        exit::USAGE,
        format!(
            "cannot use the TLS files (--ca-file, --cert, --key) or the system's roots: {}",
            chain(&e)
        ),
    )
}

/// The TLS error behind a failed connect, if it was one: an untrusted server certificate, or
/// ours refused. `io::Error::source` skips the error it wraps, so each one is unwrapped by hand.
fn tls_failure<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(tls) = error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(tls);
        }
        next = error.source();
    }
    None
}

/// An error and its causes on one line; tonic's own `Display` says only "transport error".
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}
