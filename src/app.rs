//! The composition root: builds every part from a [`ServeConfig`], serves gRPC, and stops cleanly.

use std::{net::SocketAddr, sync::Arc};

use anyhow::Context;
use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle};
use tonic::{
    server::NamedService,
    service::{RoutesBuilder, interceptor::InterceptedService},
    transport::{Server, server::TcpIncoming},
};
use tonic_health::ServingStatus;

use std::sync::atomic::AtomicBool;
use tokio::sync::Semaphore;

use crate::{
    acp::process::RuntimeRegistry,
    config::ServeConfig,
    grpc::{
        auth::Authenticator, gateway::GatewayService, sessions::SessionsService,
        translator::TranslatorService,
    },
    pb::{
        self,
        v1::{
            agent_session_service_server::AgentSessionServiceServer,
            channel_translator_service_server::ChannelTranslatorServiceServer,
            runtime_gateway_service_server::RuntimeGatewayServiceServer,
        },
    },
    session::{EngineContext, Sessions},
    store::{
        Store,
        sqlite::{DB_FILE_NAME, SqliteStore},
    },
    translate::Translator,
};

/// A serving harness.
pub struct RunningServer {
    local_addr: SocketAddr,
    store: Option<Arc<SqliteStore>>,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl RunningServer {
    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting calls, lets in-flight calls finish, and returns when the server is down.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        (&mut self.task).await.context("server task")??;
        if let Some(store) = self.store.take() {
            // Everything acknowledged is already durable; this checkpoints the WAL.
            store.close().await.context("closing the store")?;
        }
        Ok(())
    }
}

fn refuses_insecure_listen(config: &ServeConfig) -> anyhow::Result<()> {
    // Refused rather than silently ignored until they are built.
    if config.tokens_file.is_some() {
        anyhow::bail!("tokens_file is not supported yet: the server would run unauthenticated");
    }
    if config.tls.is_some() {
        anyhow::bail!("TLS is not supported yet: the server would serve plaintext");
    }
    if config.tokens_file.is_none() && !config.listen.ip().is_loopback() {
        if !config.insecure_allow_non_loopback {
            anyhow::bail!(
                "refusing to listen on non-loopback {} with no tokens configured: every caller \
                 would be the all-powerful `local` principal. Configure --tokens-file, or pass \
                 --insecure-allow-non-loopback if you really mean it",
                config.listen
            );
        }
        tracing::warn!(
            listen = %config.listen,
            "serving on a non-loopback address with NO authentication (--insecure-allow-non-loopback)"
        );
    }
    Ok(())
}

/// The session engine over the configured store.
async fn open_sessions(config: &ServeConfig) -> anyhow::Result<(Sessions, Arc<SqliteStore>)> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating data dir {}", config.data_dir.display()))?;
    let path = config.data_dir.join(DB_FILE_NAME);
    let sqlite = Arc::new(
        SqliteStore::open(&path, config.sqlite_synchronous)
            .with_context(|| format!("opening the store {}", path.display()))?,
    );
    let store: Arc<dyn Store> = sqlite.clone();
    let ctx = Arc::new(EngineContext {
        store,
        limits: Arc::new(config.limits.clone()),
        profiles: config.profiles.clone(),
        registry: RuntimeRegistry::open(&config.data_dir).context("runtime registry")?,
        runtime_slots: Arc::new(Semaphore::new(config.limits.live_runtimes)),
        meta_key: config.invocation_meta_key.clone(),
        translator: Translator::new(config.static_files_base_url.as_deref()),
        tokens_configured: config.tokens_file.is_some(),
        draining: AtomicBool::new(false),
        streams: tokio::sync::watch::channel(Default::default()).0,
    });
    Ok((Sessions::open(ctx).await?, sqlite))
}

/// Binds the listener, builds every part and starts serving in the background.
pub async fn start(config: ServeConfig) -> anyhow::Result<RunningServer> {
    refuses_insecure_listen(&config)?;
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let local_addr = listener.local_addr()?;

    let limits = Arc::new(config.limits.clone());
    let auth = Authenticator::no_tokens();
    let (health, health_service) = tonic_health::server::health_reporter();
    let mut routes = RoutesBuilder::default();
    let mut served: Vec<&'static str> = Vec::new();
    let max_message = config.limits.grpc_message_bytes;

    let (sessions, store) = if config.services.sessions {
        let (sessions, store) = open_sessions(&config).await?;
        (Some(Arc::new(sessions)), Some(store))
    } else {
        (None, None)
    };
    if let Some(sessions) = &sessions {
        let service = AgentSessionServiceServer::new(SessionsService::new(sessions.clone()))
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(max_message);
        routes.add_service(InterceptedService::new(service, auth.clone()));
        served.push(<AgentSessionServiceServer<SessionsService> as NamedService>::NAME);
    }
    if config.services.translator {
        let translator = Arc::new(Translator::new(config.static_files_base_url.as_deref()));
        let service =
            ChannelTranslatorServiceServer::new(TranslatorService::new(translator, limits.clone()))
                .max_decoding_message_size(max_message)
                .max_encoding_message_size(max_message);
        routes.add_service(InterceptedService::new(service, auth.clone()));
        served.push(<ChannelTranslatorServiceServer<TranslatorService> as NamedService>::NAME);
    }
    if config.services.gateway {
        let service = RuntimeGatewayServiceServer::new(GatewayService)
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(max_message);
        routes.add_service(InterceptedService::new(service, auth.clone()));
        served.push(<RuntimeGatewayServiceServer<GatewayService> as NamedService>::NAME);
    }
    for name in &served {
        health
            .set_service_status(*name, ServingStatus::Serving)
            .await;
    }
    routes.add_service(health_service);

    let mut reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        // google.rpc error details, so grpcurl and buf curl decode ErrorInfo.
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET);
    let mut reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET);
    // List only what this process serves (plus health and reflection themselves).
    for name in served.iter().copied().chain(["grpc.health.v1.Health"]) {
        reflection_v1 = reflection_v1.with_service_name(name);
        reflection_v1alpha = reflection_v1alpha.with_service_name(name);
    }
    routes.add_service(reflection_v1.build_v1().context("reflection v1")?);
    routes.add_service(
        reflection_v1alpha
            .build_v1alpha()
            .context("reflection v1alpha")?,
    );

    let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
    let server = Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(20)))
        .add_routes(routes.routes())
        // A custom incoming stream ignores `Server::tcp_nodelay`: it is set on each accepted
        // socket here, or Nagle holds back small HTTP/2 frames (streams) behind delayed ACKs.
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            async {
                let _ = shutdown_rx.await;
            },
        );
    let task = tokio::spawn(server);
    tracing::info!(%local_addr, services = ?served, "serving gRPC");
    Ok(RunningServer {
        local_addr,
        store,
        shutdown: Some(shutdown_tx),
        task,
    })
}
