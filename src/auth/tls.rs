//! The server's TLS settings from PEM files (`--tls-cert`, `--tls-key`, and for mutual TLS
//! `--tls-client-ca`). Every problem is a startup error naming the file; key material is never
//! printed.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, Server, ServerTlsConfig};

/// The TLS files the server reads at startup (`config` fills them from flags and file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// How long a client may take to complete the TLS handshake before its connection is dropped
/// (a client that never finishes must not hold a connection slot forever).
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

fn read_pem(path: &Path, setting: &str, label: &str) -> anyhow::Result<Vec<u8>> {
    let bytes =
        std::fs::read(path).with_context(|| format!("{setting}: reading {}", path.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    let holds = text.lines().any(|line| {
        line.starts_with("-----BEGIN ") && line.trim_end().ends_with(&format!("{label}-----"))
    });
    if !holds {
        anyhow::bail!(
            "{setting}: {} holds no PEM block `-----BEGIN …{label}-----`",
            path.display()
        );
    }
    Ok(bytes)
}

/// Builds (and checks, by building a server with it) the TLS configuration.
pub(crate) fn server_config(files: &TlsFiles) -> anyhow::Result<ServerTlsConfig> {
    let cert = read_pem(&files.cert, "tls_cert", "CERTIFICATE")?;
    let key = read_pem(&files.key, "tls_key", "PRIVATE KEY")?;
    if let Ok(meta) = std::fs::metadata(&files.key)
        && meta.permissions().mode() & 0o004 != 0
    {
        tracing::warn!(file = %files.key.display(), "the TLS private key is readable by every user on this machine");
    }
    let mut config = ServerTlsConfig::new()
        .identity(Identity::from_pem(cert, key))
        .timeout(HANDSHAKE_TIMEOUT);
    if let Some(ca) = &files.client_ca {
        let ca = read_pem(ca, "tls_client_ca", "CERTIFICATE")?;
        config = config
            .client_ca_root(Certificate::from_pem(ca))
            .client_auth_optional(false);
    }
    // The certificate, the key and the CA are parsed (and matched) only when a server takes
    // the configuration: do it now, so a bad file stops startup rather than every handshake.
    Server::builder().tls_config(config.clone()).map_err(|e| {
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        anyhow::anyhow!(
            "TLS configuration (tls_cert {}, tls_key {}{}) is unusable: {message}",
            files.cert.display(),
            files.key.display(),
            files
                .client_ca
                .as_ref()
                .map(|ca| format!(", tls_client_ca {}", ca.display()))
                .unwrap_or_default()
        )
    })?;
    Ok(config)
}

/// How this replica dials its peers when it serves TLS itself: trusting `peer_ca`
/// (else the client CA, the usual single internal CA), and — when the peers require client
/// certificates — presenting its own certificate, which must then be issued by their client CA.
pub(crate) fn peer_client_config(
    files: &TlsFiles,
    peer_ca: Option<&Path>,
) -> anyhow::Result<ClientTlsConfig> {
    let mut config = ClientTlsConfig::new().timeout(HANDSHAKE_TIMEOUT);
    match (peer_ca, &files.client_ca) {
        (Some(ca), _) => {
            let ca = read_pem(ca, "replica_tls_ca", "CERTIFICATE")?;
            config = config.ca_certificate(Certificate::from_pem(ca));
        }
        (None, Some(ca)) => {
            let ca = read_pem(ca, "tls_client_ca", "CERTIFICATE")?;
            config = config.ca_certificate(Certificate::from_pem(ca));
        }
        (None, None) => tracing::warn!(
            "TLS without replica_tls_ca or tls_client_ca: calls forwarded to other replicas \
             trust no certificate and will fail"
        ),
    }
    if files.client_ca.is_some() {
        let cert = read_pem(&files.cert, "tls_cert", "CERTIFICATE")?;
        let key = read_pem(&files.key, "tls_key", "PRIVATE KEY")?;
        config = config.identity(Identity::from_pem(cert, key));
    }
    Ok(config)
}
