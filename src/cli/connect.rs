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

/// The server this process talks to, as messages show it (password redacted).
static SERVER: std::sync::OnceLock<String> = std::sync::OnceLock::new();

pub(crate) fn server_shown() -> &'static str {
    SERVER.get().map_or("the server", String::as_str)
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
    /// The server's URL as given.
    pub(crate) fn url(&self) -> &str {
        &self.server
    }

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
        let server = redacted_url(&self.server);
        let _ = SERVER.set(server.clone());
        if userinfo(&self.server).is_some() {
            eprintln!(
                "warning: the user and password in --server are neither used nor sent (the \
                 token comes from AGENT_HARNESS_TOKEN)"
            );
        }
        let endpoint = Endpoint::from_shared(without_userinfo(&self.server))
            .map_err(|e| Failure::new(exit::USAGE, format!("bad --server {server:?}: {e}")))?
            .connect_timeout(Duration::from_secs(5));
        if token.is_some()
            && let Some(warning) = cleartext_token_warning(&self.server)
        {
            eprintln!("warning: {warning}");
        }
        let endpoint = self.with_tls(endpoint)?;
        // Connect once now so an unreachable or untrusted server is reported as such, with its
        // address.
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| match tls_failure(&e) {
                Some(tls) => Failure::new(exit::TLS, format!("TLS with {server} failed: {tls}")),
                None => Failure::new(
                    exit::UNAVAILABLE,
                    format!("cannot reach {server}: {}", chain(&e)),
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
/// A cause that only repeats what is already said (hyper and tonic both wrap the same
/// "tcp connect error") is said once.
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let said = cause.to_string();
        if !said.is_empty() && !text.ends_with(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        next = cause.source();
    }
    text
}

/// Where `url`'s userinfo is (`user:password@`, through the `@`), if it has one. Works on text
/// that is not a valid URL too, since that is when it is echoed back.
fn userinfo(url: &str) -> Option<std::ops::Range<usize>> {
    let start = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[start..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let at = authority.rfind('@')?;
    Some(start..start + at + 1)
}

/// `url` with the password of its userinfo, if any, replaced by `***`: for every message that
/// names the server (`http://ada:***@harness.example`).
pub(crate) fn redacted_url(url: &str) -> String {
    let Some(info) = userinfo(url) else {
        return url.to_owned();
    };
    match url[info.clone()].find(':') {
        Some(colon) => format!(
            "{}***{}",
            &url[..info.start + colon + 1],
            &url[info.end - 1..]
        ),
        None => url.to_owned(),
    }
}

/// `url` without its userinfo: the CLI authenticates with AGENT_HARNESS_TOKEN only, and a
/// password left in the URL would travel in every request's `:authority`.
fn without_userinfo(url: &str) -> String {
    match userinfo(url) {
        Some(info) => format!("{}{}", &url[..info.start], &url[info.end..]),
        None => url.to_owned(),
    }
}

/// What to warn before a token goes over plain `http://` to a host that is not this machine
/// (anyone on the path can read it and act as its principal); `None` when it need not be said.
pub(crate) fn cleartext_token_warning(url: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    if !uri.scheme_str()?.eq_ignore_ascii_case("http") {
        return None;
    }
    let host = uri.host()?;
    if crate::net::is_loopback_host(host) {
        return None;
    }
    Some(format!(
        "the token goes over plain http:// to {host}, which is not this machine: anyone on the \
         network path can read it and use it. Use https://"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_in_the_server_url_is_redacted_and_nothing_else_changes() {
        for (url, shown) in [
            (
                "http://ada:s3cret@harness.example:50051",
                "http://ada:***@harness.example:50051",
            ),
            ("https://ada:p@ss@h:1/x?y#z", "https://ada:***@h:1/x?y#z"),
            (
                "ada:s3cret@harness.example:50051",
                "ada:***@harness.example:50051",
            ),
            ("http://:s3cret@h", "http://:***@h"),
            ("http://ada@harness.example", "http://ada@harness.example"),
            ("http://127.0.0.1:50051", "http://127.0.0.1:50051"),
            ("http://h/path@x:y", "http://h/path@x:y"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redacted_url(url), shown, "{url}");
        }
    }

    #[test]
    fn the_userinfo_is_never_sent() {
        for (url, sent) in [
            (
                "http://ada:s3cret@harness.example:50051/",
                "http://harness.example:50051/",
            ),
            ("https://ada@h", "https://h"),
            ("http://h/a@b", "http://h/a@b"),
            ("http://127.0.0.1:50051", "http://127.0.0.1:50051"),
        ] {
            assert_eq!(without_userinfo(url), sent, "{url}");
        }
    }

    #[test]
    fn a_token_over_plain_http_warns_only_for_hosts_beyond_loopback() {
        for url in [
            "http://harness.example:50051",
            "http://10.0.0.5:50051",
            "HTTP://ada:pw@harness.example",
            "http://[2001:db8::1]:50051",
        ] {
            let warning = cleartext_token_warning(url).expect(url);
            assert!(!warning.contains("pw"), "{warning}");
        }
        for url in [
            "https://harness.example:50051",
            "http://127.0.0.1:50051",
            "http://localhost:50051",
            "http://[::1]:50051",
            "http://app.localhost",
            "not a url",
        ] {
            assert_eq!(cleartext_token_warning(url), None, "{url}");
        }
    }
}
