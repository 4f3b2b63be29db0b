//! TLS and mutual TLS with certificates made by each test (rcgen): a client that
//! trusts the server's CA is served; plaintext, an untrusted server certificate, and — with
//! mutual TLS — a client without a certificate from the configured CA are refused. Bad PEM files
//! stop startup naming the file.

use std::{path::PathBuf, time::Duration};

use agent_harness::{
    app::{self, RunningServer},
    config::{ServeConfig, TlsFiles},
    pb::v1 as pb,
};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use tempfile::TempDir;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::{
    auth::{ADA, Bearer, EVERYONE, TokensFile, with_tokens},
    harness::{assert_error, bounded, expect_err},
};

/// A certificate authority that can issue server and client certificates.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its private key, as PEM.
pub struct Issued {
    pub cert: String,
    pub key: String,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("a key"))
            .expect("a CA certificate");
        Self { issuer }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    pub fn issue(&self, names: &[&str]) -> Issued {
        let key = KeyPair::generate().expect("a key");
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("params");
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("client"),
        );
        let cert = params.signed_by(&key, &self.issuer).expect("a certificate");
        Issued {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// PEM files on disk for a server (and for the command line's `--ca-file`, `--cert`, `--key`).
pub struct Files {
    dir: TempDir,
}

impl Files {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("a temporary dir"),
        }
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("a PEM file is written");
        path
    }

    pub fn server(&self, ca: &Ca, client_ca: Option<&Ca>) -> TlsFiles {
        let server = ca.issue(&["localhost", "127.0.0.1"]);
        TlsFiles {
            cert: self.write("server.pem", &server.cert),
            key: self.write("server.key", &server.key),
            client_ca: client_ca.map(|ca| self.write("client-ca.pem", &ca.pem())),
        }
    }
}

pub fn config(data: &TempDir, tls: TlsFiles) -> ServeConfig {
    let mut config = crate::harness::test_config(
        data.path().to_owned(),
        env!("CARGO_BIN_EXE_agent-harness").into(),
    );
    config.tls = Some(tls);
    config
}

/// Connects over TLS trusting `ca`, presenting `identity`, and asks for health.
async fn health_over_tls(
    server: &RunningServer,
    ca: &Ca,
    identity: Option<&Issued>,
) -> Result<(), String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.pem()))
        .domain_name("localhost");
    if let Some(id) = identity {
        tls = tls.identity(Identity::from_pem(&id.cert, &id.key));
    }
    let endpoint =
        Endpoint::from_shared(format!("https://localhost:{}", server.local_addr().port()))
            .expect("an endpoint")
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(5))
            .tls_config(tls)
            .map_err(|e| e.to_string())?;
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    health(channel).await
}

async fn health(channel: Channel) -> Result<(), String> {
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map(|_| ())
        .map_err(|e| format!("call: {e:?}"))
}

async fn health_in_plaintext(server: &RunningServer) -> Result<(), String> {
    let channel = Endpoint::from_shared(format!("http://127.0.0.1:{}", server.local_addr().port()))
        .expect("an endpoint")
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    health(channel).await
}

#[tokio::test]
async fn a_tls_server_serves_a_client_trusting_its_ca_and_refuses_plaintext_and_distrust() {
    bounded(async {
        let (data, files, ca) = (
            tempfile::tempdir().unwrap(),
            Files::new(),
            Ca::new("server CA"),
        );
        let server = app::start(config(&data, files.server(&ca, None)))
            .await
            .expect("the TLS server starts");
        health_over_tls(&server, &ca, None)
            .await
            .expect("a client trusting the CA is served");
        let err = health_in_plaintext(&server)
            .await
            .expect_err("plaintext is refused");
        assert!(!err.is_empty());
        let err = health_over_tls(&server, &Ca::new("another CA"), None)
            .await
            .expect_err("a client that does not trust the server's CA refuses it");
        assert!(err.contains("UnknownIssuer"), "{err}");
        health_over_tls(&server, &ca, None)
            .await
            .expect("the server serves on after refusing bad clients");
        server.shutdown().await.unwrap();
    })
    .await
}

#[tokio::test]
async fn with_mutual_tls_a_client_without_a_certificate_from_the_client_ca_is_refused() {
    bounded(async {
        let data = tempfile::tempdir().unwrap();
        let files = Files::new();
        let (server_ca, client_ca, rogue_ca) = (
            Ca::new("server CA"),
            Ca::new("client CA"),
            Ca::new("rogue CA"),
        );
        let server = app::start(config(&data, files.server(&server_ca, Some(&client_ca))))
            .await
            .expect("the mTLS server starts");
        let good = client_ca.issue(&["ada-laptop"]);
        health_over_tls(&server, &server_ca, Some(&good))
            .await
            .expect("a client with a certificate from the client CA is served");

        let err = health_over_tls(&server, &server_ca, None)
            .await
            .expect_err("no client certificate");
        assert!(err.contains("CertificateRequired"), "{err}");
        let rogue = rogue_ca.issue(&["mallory"]);
        let err = health_over_tls(&server, &server_ca, Some(&rogue))
            .await
            .expect_err("a certificate from another CA");
        assert!(err.contains("UnknownCA"), "{err}");
        // A client presenting the server's own certificate (issued by the server CA, not the
        // client CA) is refused too.
        let server_issued = server_ca.issue(&["localhost"]);
        let err = health_over_tls(&server, &server_ca, Some(&server_issued))
            .await
            .expect_err("a certificate from the server CA is not a client certificate here");
        assert!(err.contains("UnknownCA"), "{err}");
        health_in_plaintext(&server).await.expect_err("plaintext");

        health_over_tls(&server, &server_ca, Some(&good))
            .await
            .expect("the server serves on after refusing bad clients");
        server.shutdown().await.unwrap();
    })
    .await
}

#[tokio::test]
async fn over_mutual_tls_a_bearer_token_is_still_required() {
    bounded(async {
        let data = tempfile::tempdir().unwrap();
        let files = Files::new();
        let (server_ca, client_ca) = (Ca::new("server CA"), Ca::new("client CA"));
        let tokens = TokensFile::new(EVERYONE);
        let mut config = config(&data, files.server(&server_ca, Some(&client_ca)));
        with_tokens(&mut config, &tokens.path, None);
        let server = app::start(config).await.expect("starts");
        let client = client_ca.issue(&["ci"]);
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(server_ca.pem()))
            .domain_name("localhost")
            .identity(Identity::from_pem(&client.cert, &client.key));
        let channel =
            Endpoint::from_shared(format!("https://localhost:{}", server.local_addr().port()))
                .unwrap()
                .tls_config(tls)
                .unwrap()
                .connect()
                .await
                .expect("a mutual TLS connection");
        let sessions = |token: Option<&str>| {
            pb::agent_session_service_client::AgentSessionServiceClient::with_interceptor(
                channel.clone(),
                Bearer::new(token, None),
            )
        };
        let status = expect_err(
            sessions(None)
                .list_sessions(pb::ListSessionsRequest::default())
                .await,
        );
        assert_error(&status, tonic::Code::Unauthenticated, "UNAUTHENTICATED");
        sessions(Some(ADA))
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .expect("a token over mutual TLS");
        server.shutdown().await.unwrap();
    })
    .await
}

#[tokio::test]
async fn unusable_tls_files_stop_startup_naming_the_file() {
    bounded(async {
        let data = tempfile::tempdir().unwrap();
        let files = Files::new();
        let ca = Ca::new("CA");
        let good = files.server(&ca, None);
        let start_err = |tls: TlsFiles| {
            let config = config(&data, tls);
            async move {
                format!(
                    "{:#}",
                    app::start(config).await.err().expect("startup fails")
                )
            }
        };

        let missing = TlsFiles {
            cert: files.dir.path().join("absent.pem"),
            ..good.clone()
        };
        let err = start_err(missing).await;
        assert!(
            err.contains("tls_cert") && err.contains("absent.pem"),
            "{err}"
        );

        let not_pem = TlsFiles {
            key: files.write("junk.key", "not a key"),
            ..good.clone()
        };
        let err = start_err(not_pem).await;
        assert!(err.contains("tls_key") && err.contains("junk.key"), "{err}");

        let other = ca.issue(&["localhost"]);
        let mismatched = TlsFiles {
            key: files.write("other.key", &other.key),
            ..good.clone()
        };
        let err = start_err(mismatched).await;
        assert!(
            err.contains("unusable") && err.contains("other.key"),
            "{err}"
        );
        assert!(
            !err.contains("PRIVATE KEY-----\n"),
            "key material must not be printed: {err}"
        );

        let bad_ca = TlsFiles {
            client_ca: Some(files.write("ca.pem", &other.key)),
            ..good.clone()
        };
        let err = start_err(bad_ca).await;
        assert!(err.contains("tls_client_ca"), "{err}");
    })
    .await
}
