//! TLS between replicas: replicas that serve mutual TLS forward a call to the
//! session's owner over TLS, trusting `replica_tls_ca` and presenting their own certificate.
//! Needs `AGENT_HARNESS_TEST_DATABASE_URL` like the other PostgreSQL tests.

use std::{path::Path, time::Duration};

use agent_harness::{
    app::{self, RunningServer},
    config::TlsFiles,
    pb::v1::{self as pb, agent_session_service_client::AgentSessionServiceClient},
};
use tempfile::TempDir;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::{
    harness::bounded,
    postgres::{execute, test_schema, url_in_schema},
    support::{Session, prompt},
    tls::{Ca, Issued},
};

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// A replica on the database serving mutual TLS with `server`'s certificate; peers (and
/// clients) must present a certificate from `ca`.
async fn replica(
    dir: &Path,
    name: &str,
    database_url: &str,
    ca: &Ca,
    server: &Issued,
) -> RunningServer {
    let data = dir.join(format!("data-{name}"));
    std::fs::create_dir_all(&data).unwrap();
    let mut config = crate::harness::test_config(data, env!("CARGO_BIN_EXE_agent-harness").into());
    config.database_url = Some(database_url.to_owned().into());
    config.tls = Some(TlsFiles {
        cert: write(dir, &format!("{name}.pem"), &server.cert),
        key: write(dir, &format!("{name}.key"), &server.key),
        client_ca: Some(write(dir, "client-ca.pem", &ca.pem())),
    });
    config.replica_tls_ca = Some(write(dir, "replica-ca.pem", &ca.pem()));
    app::start(config).await.expect("the replica starts")
}

async fn client_of(
    server: &RunningServer,
    ca: &Ca,
    identity: &Issued,
) -> AgentSessionServiceClient<Channel> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.pem()))
        .domain_name("localhost")
        .identity(Identity::from_pem(&identity.cert, &identity.key));
    let channel =
        Endpoint::from_shared(format!("https://localhost:{}", server.local_addr().port()))
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .expect("a TLS connection");
    AgentSessionServiceClient::new(channel)
}

#[tokio::test]
async fn with_mutual_tls_a_call_to_a_replica_that_does_not_own_the_session_is_forwarded_over_tls() {
    let Some((url, schema)) = test_schema().await else {
        return;
    };
    let database_url = url_in_schema(&url, &schema);
    bounded(async {
        let dir = TempDir::new().unwrap();
        let ca = Ca::new("replicas");
        // Each replica's certificate names the address it advertises (the bound 127.0.0.1).
        let server = ca.issue(&["localhost", "127.0.0.1"]);
        let caller = ca.issue(&["a caller"]);
        let a = replica(dir.path(), "a", &database_url, &ca, &server).await;
        let b = replica(dir.path(), "b", &database_url, &ca, &server).await;

        let mut on_a = Session::create_with_client(
            client_of(&a, &ca, &caller).await,
            pb::CreateSessionRequest {
                profile: "mock".into(),
                cwd: agent_harness_testkit::workspace_in(dir.path())
                    .to_string_lossy()
                    .into_owned(),
                ..Default::default()
            },
        )
        .await;
        let mut watch = on_a.watch().await;
        let mut via_b = Session::attach(client_of(&b, &ca, &caller).await, &on_a.id);
        let reply = via_b
            .act(prompt("forwarded over tls"))
            .await
            .expect("B forwards the prompt to A over mutual TLS");
        assert_eq!(
            watch.response_to(&reply.action_id).await["result"]["stopReason"],
            "end_turn"
        );
        // Served by the owner: the queue read through B is A's (forwarded too).
        assert!(via_b.queue().await.is_empty());
        drop(watch);
        b.shutdown().await.unwrap();
        a.shutdown().await.unwrap();
    })
    .await;
    execute(&url, &format!("DROP SCHEMA {schema} CASCADE")).await;
}
