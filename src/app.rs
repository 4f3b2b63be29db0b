//! The composition root: builds every part from a [`ServeConfig`], serves gRPC, and stops cleanly.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};
use tonic::{
    server::NamedService,
    service::{RoutesBuilder, interceptor::InterceptedService},
    transport::{Server, ServerTlsConfig, server::TcpIncoming},
};
use tonic_health::{ServingStatus, server::HealthReporter};

use tower::util::MapResponseLayer;

use crate::{
    acp::process::ProcessTable,
    auth::{Reloaded, TokenStore, tls},
    config::{BrowserConfig, ServeConfig},
    domain::{Error, ErrorCode},
    grpc::{
        auth::Authenticator, browser, forward::Forwarder,
        framed::agent_session_service_server::AgentSessionServiceServer, gateway::GatewayService,
        loopback_only::LoopbackOnlyLayer, relay::Relay, sessions::SessionsService, status,
        translator::TranslatorService,
    },
    pb::{
        self,
        v1::{
            channel_translator_service_server::ChannelTranslatorServiceServer,
            runtime_gateway_service_server::RuntimeGatewayServiceServer,
        },
    },
    session::{EngineContext, Sessions},
    store::{
        Store,
        postgres::{PostgresOptions, PostgresStore},
        sqlite::{DB_FILE_NAME, SqliteStore},
    },
    telemetry::{self, metrics::RpcMetricsLayer},
    translate::Translator,
};

/// How long in-flight calls may take to finish once the server stops accepting new ones.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(5);

/// How often readiness asks the store whether it can serve.
const STORE_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// A store check without an answer in this long counts as a failed one.
const STORE_CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// A serving harness.
pub struct RunningServer {
    local_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    store: Option<Arc<dyn Store>>,
    sessions: Option<Arc<Sessions>>,
    health: HealthReporter,
    served: Vec<&'static str>,
    drain_grace: Duration,
    shutdown: watch::Sender<bool>,
    /// The tokens (with the task reloading them), when configured.
    tokens: Option<WatchedTokens>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
    metrics_task: Option<JoinHandle<()>>,
    /// Turns readiness NOT_SERVING while the store cannot be reached (see [`watch_store`]).
    store_watch: Option<JoinHandle<()>>,
    /// The configured retention, and the task running its passes.
    retention: Option<(crate::session::manager::Retention, JoinHandle<()>)>,
    /// OTLP trace export, when configured.
    trace_export: Option<telemetry::traces::TraceExport>,
}

impl RunningServer {
    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Rereads the tokens file now, as SIGHUP does (`None` when no tokens are configured).
    pub fn reload_tokens(&self) -> Option<anyhow::Result<Reloaded>> {
        self.tokens.as_ref().map(|(store, _)| store.reload())
    }

    /// Runs one retention pass now, as the background task does every period (`None` when no
    /// retention is configured or no sessions are served).
    pub async fn retention_pass(&self) -> Option<anyhow::Result<crate::store::RetentionReport>> {
        let (retention, _) = self.retention.as_ref()?;
        let sessions = self.sessions.as_ref()?;
        Some(
            sessions
                .retention_pass(retention)
                .await
                .map_err(anyhow::Error::from),
        )
    }

    /// The address of the Prometheus endpoint, when one is served.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// SIGTERM: readiness turns NOT_SERVING at once (liveness stays SERVING); new
    /// sessions and turn-occupying actions are refused with DRAINING while stops and answers are
    /// still accepted; running turns get until the drain grace to end; then streams end with
    /// DRAINING, runtimes are stopped, the log is flushed, and the server stops.
    pub async fn drain_and_stop(mut self) -> anyhow::Result<()> {
        // From now on readiness stays NOT_SERVING, whatever the store does.
        self.stop_store_watch().await;
        // Refuse new work first, so nobody who sees NOT_SERVING can still start a turn.
        if let Some(sessions) = &self.sessions {
            sessions.context().start_draining();
        }
        for name in &self.served {
            self.health
                .set_service_status(*name, ServingStatus::NotServing)
                .await;
        }
        if let Some(sessions) = &self.sessions {
            tracing::info!(grace = ?self.drain_grace, "draining");
            sessions.drain(self.drain_grace).await;
        }
        self.shutdown().await
    }

    /// Stops accepting calls, lets in-flight calls finish (open streams end at once; anything
    /// else still open after `STOP_GRACE` (5 s) is cut), and returns when the server is down.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.stop_store_watch().await;
        if let Some((_, task)) = self.retention.take() {
            task.abort();
        }
        if let Some((_, watcher)) = self.tokens.take() {
            watcher.abort();
        }
        if let Some(sessions) = &self.sessions {
            sessions.context().stop_warm_pools();
            sessions
                .context()
                .stop_streams(crate::session::subscribe::StreamStop::Draining);
            // Other replicas may take this one's sessions at once.
            sessions.release_all().await;
        }
        let _ = self.shutdown.send(true);
        match tokio::time::timeout(STOP_GRACE, &mut self.task).await {
            Ok(result) => result.context("server task")??,
            Err(_) => {
                // A client holding a stream open (say, a health watch) must not keep us up.
                tracing::warn!(grace = ?STOP_GRACE, "calls still open after the stop grace; cutting them");
                self.task.abort();
            }
        }
        if let Some(task) = self.metrics_task.take() {
            let _ = task.await;
        }
        if let Some(export) = self.trace_export.take() {
            export.shutdown();
        }
        if let Some(store) = self.store.take() {
            // Everything acknowledged is already durable; this checkpoints the WAL.
            store.close().await.context("closing the store")?;
        }
        Ok(())
    }
}

impl RunningServer {
    async fn stop_store_watch(&mut self) {
        if let Some(task) = self.store_watch.take() {
            task.abort();
            // Awaited, so a status it was setting is set before anyone else sets one.
            let _ = task.await;
        }
    }
}

/// Readiness follows the store: the sessions service turns NOT_SERVING while
/// [`Store::check`] fails (a database that cannot be reached) and SERVING again once it
/// answers, checked every [`STORE_CHECK_INTERVAL`] and logged on each change. An embedded store
/// always answers.
fn watch_store(
    store: Arc<dyn Store>,
    health: HealthReporter,
    service: &'static str,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut serving = true;
        let mut ticks = tokio::time::interval(STORE_CHECK_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let checked = tokio::time::timeout(STORE_CHECK_TIMEOUT, store.check())
                .await
                .unwrap_or_else(|_| {
                    Err(Error::new(
                        ErrorCode::StoreUnavailable,
                        format!("the store did not answer within {STORE_CHECK_TIMEOUT:?}"),
                    ))
                });
            match (serving, checked) {
                (true, Err(error)) => {
                    tracing::error!(%error, service, "the store is unreachable: readiness NOT_SERVING");
                    health
                        .set_service_status(service, ServingStatus::NotServing)
                        .await;
                    serving = false;
                }
                (false, Ok(())) => {
                    tracing::info!(service, "the store answers again: readiness SERVING");
                    health
                        .set_service_status(service, ServingStatus::Serving)
                        .await;
                    serving = true;
                }
                _ => {}
            }
        }
    })
}

fn refuses_insecure_listen(config: &ServeConfig) -> anyhow::Result<()> {
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
async fn open_sessions(
    config: &ServeConfig,
    bound: std::net::SocketAddr,
    auth: &Authenticator,
    traces: &crate::session::traces::Traces,
) -> anyhow::Result<(Sessions, Arc<dyn Store>)> {
    let created = crate::store::private::create_dir(&config.data_dir)
        .with_context(|| format!("creating data dir {}", config.data_dir.display()))?;
    if !created {
        warn_if_open_to_others(&config.data_dir, "the data directory");
    }
    let store: Arc<dyn Store> = match &config.database_url {
        Some(url) => {
            let options = PostgresOptions {
                statement_timeout: config.statement_timeout,
                ..PostgresOptions::new(url.expose().to_owned())
            };
            let postgres = PostgresStore::connect(options).await?;
            tracing::info!(database = postgres.target(), "store: PostgreSQL");
            Arc::new(postgres)
        }
        None => {
            let path = config.data_dir.join(DB_FILE_NAME);
            warn_if_open_to_others(&path, "the store");
            Arc::new(
                SqliteStore::open(&path, config.sqlite_synchronous)
                    .with_context(|| format!("opening the store {}", path.display()))?
                    .with_statement_timeout(config.statement_timeout),
            )
        }
    };
    let processes = ProcessTable::open(&config.data_dir).context("the runtime process table")?;
    let mut options = config.engine_options(bound)?;
    options.budgets = auth.budgets();
    options.traces = traces.clone();
    tracing::info!(
        replica = %options.replica.id,
        lease_ttl = ?options.replica.lease_ttl,
        shared_store = options.replica.shared_store,
        "replica identity"
    );
    let ctx = Arc::new(EngineContext::new(store.clone(), processes, options));
    describe_sandbox(config, &ctx, bound);
    Ok((Sessions::open(ctx).await?, store))
}

/// Says at start what the boxes enforce here, which profiles run unboxed or with an open
/// network, and which limits cannot be applied (their sessions would fail to start).
fn describe_sandbox(config: &ServeConfig, ctx: &EngineContext, bound: std::net::SocketAddr) {
    let sandbox = ctx.sandbox();
    sandbox.set_harness_addresses(
        std::iter::once(bound)
            .chain(config.metrics_listen)
            .collect(),
    );
    let local = config.profiles.values().filter(|p| p.remote.is_none());
    let (boxed, unboxed): (Vec<_>, Vec<_>) = local.partition(|p| p.sandbox.is_some());
    if !boxed.is_empty() {
        let removed = sandbox.remove_leftovers(ctx.processes());
        if removed > 0 {
            tracing::info!(removed, "removed runtime cgroups a previous process left");
        }
        tracing::info!(
            profiles = ?boxed.iter().map(|p| &p.name).collect::<Vec<_>>(),
            homes_dir = %sandbox.settings().homes_dir.display(),
            "sandbox: {}",
            sandbox.describe()
        );
        // One box built at once, beside serving, so a machine that cannot build boxes says so
        // now rather than at the first session.
        if let Some(probe) = config.profiles.get(crate::config::MOCK_PROFILE).cloned() {
            let sandbox = sandbox.clone();
            tokio::spawn(async move {
                let policy = crate::acp::sandbox::BoxPolicy::default();
                let checked = sandbox
                    .check(
                        "(start-up probe)",
                        probe.launch(),
                        &policy,
                        std::time::Duration::from_secs(30),
                    )
                    .await;
                match checked {
                    Ok(report) if report.problems(&probe.command.to_string_lossy()).is_empty() => {
                        tracing::info!("sandbox: a box was built and ran here");
                    }
                    Ok(report) => {
                        tracing::error!(problems = ?report.problems(&probe.command.to_string_lossy()), "sandbox: a box was built but is not usable")
                    }
                    Err(why) => {
                        tracing::error!(%why, "sandbox: boxes cannot be built here; boxed sessions will fail to start")
                    }
                }
            });
        }
    }
    for profile in &boxed {
        let policy = profile.sandbox.as_ref().expect("boxed");
        if policy.egress == crate::acp::sandbox::Egress::Open {
            tracing::warn!(profile = %profile.name, "egress = \"open\": this profile's agents reach any host the server can, its own ports included");
        }
        if let Err(why) = sandbox.check_limits(policy) {
            tracing::error!(profile = %profile.name, %why, "this profile's limits cannot be applied here: its sessions will fail to start (lift them with sandbox.memory = \"none\" and sandbox.pids = \"none\", or fix the cause)");
        }
    }
    for profile in unboxed {
        tracing::warn!(profile = %profile.name, "sandbox = \"off\": this profile's agents run as the server's user, with its files and network in reach");
    }
}

/// Warns when users other than the owner and its group may read `path` (it holds every
/// transcript). Only the others' bits count: a Kubernetes `fsGroup` gives the group access on
/// purpose.
fn warn_if_open_to_others(path: &std::path::Path, what: &str) {
    if let Some(mode) = crate::store::private::open_to_others(path) {
        tracing::warn!(
            path = %path.display(),
            mode = format!("{mode:04o}"),
            "{what} is readable by other users of this machine, and it holds every transcript: \
             chmod o-rwx it (the server makes new ones 0700 and 0600)"
        );
    }
}

/// The token this replica presents when it forwards a call to a peer, from
/// `replica_token_file`; none without tokens (every caller is `local` then).
fn replica_token(config: &ServeConfig) -> anyhow::Result<Option<String>> {
    let Some(path) = &config.replica_token_file else {
        if config.tokens_file.is_some() && config.database_url.is_some() {
            tracing::warn!(
                "tokens are configured but no replica_token_file: calls forwarded to other replicas will be refused"
            );
        }
        return Ok(None);
    };
    let token = std::fs::read_to_string(path)
        .with_context(|| format!("reading the replica token file {}", path.display()))?;
    let token = token.trim();
    if token.is_empty() {
        anyhow::bail!("the replica token file {} is empty", path.display());
    }
    Ok(Some(token.to_owned()))
}

/// The live tokens and the task that reloads them.
type WatchedTokens = (Arc<TokenStore>, JoinHandle<()>);

/// Authentication: bearer tokens from the tokens file (reloaded on SIGHUP and on change), or
/// the no-token `local` principal. A bad tokens file stops startup.
fn authenticator(config: &ServeConfig) -> anyhow::Result<(Authenticator, Option<WatchedTokens>)> {
    let Some(path) = &config.tokens_file else {
        return Ok((Authenticator::no_tokens(), None));
    };
    let store = TokenStore::open(path)?;
    let watcher = store.watch(config.tokens_poll_interval)?;
    Ok((
        Authenticator::with_tokens(store.clone()),
        Some((store, watcher)),
    ))
}

/// The transport's browser options, from the configuration's browser section.
fn browser_options(config: &BrowserConfig, tokens: bool) -> browser::BrowserOptions {
    browser::BrowserOptions {
        // The console's new-session form starts in the directory the server was started in;
        // said only to loopback pages (no tokens), never to anyone who can reach the port.
        default_cwd: (config.console && !tokens)
            .then(|| std::env::current_dir().ok())
            .flatten()
            .map(|dir| dir.to_string_lossy().into_owned()),
        cors_allow_origins: config.cors_allow_origins.clone(),
        grpc_web: config.grpc_web_enabled(),
        console: config.console,
    }
}

/// Where a browser on this machine opens the console: a wildcard listen address is reached
/// through loopback.
fn console_url(addr: SocketAddr, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    let host = match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => "127.0.0.1".to_owned(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => "[::1]".to_owned(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    format!("{scheme}://{host}:{}/", addr.port())
}

/// Binds the listener, builds every part and starts serving in the background.
/// A profile passing through variables the harness lacks starts its runtimes without them: said
/// once at start (names only), a warning when none of them is set, so a forgotten API key shows
/// before an agent complains. (Presets pass through alternatives: some are often unset.)
fn warn_of_unset_passthrough(config: &ServeConfig) {
    for (name, profile) in &config.profiles {
        let unset = profile.secrets.unset_passthrough();
        if unset.is_empty() {
            continue;
        }
        if unset.len() == profile.secrets.passthrough.len() && profile.secrets.files.is_empty() {
            tracing::warn!(profile = %name, unset = ?unset, "none of the variables env_passthrough names is set in the harness's environment; its runtimes start without them");
        } else {
            tracing::info!(profile = %name, unset = ?unset, "env_passthrough: these variables are not set here and are left out");
        }
    }
}

pub async fn start(config: ServeConfig) -> anyhow::Result<RunningServer> {
    refuses_insecure_listen(&config)?;
    let front = Front::new(&config)?;
    let (auth, tokens) = authenticator(&config)?;
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let local_addr = listener.local_addr()?;

    let trace_export = telemetry::traces::start(config.otlp_endpoint.as_deref())?;
    let traces = trace_export
        .as_ref()
        .map(|t| t.traces.clone())
        .unwrap_or_default();
    let Services {
        mut routes,
        served,
        sessions,
        store,
    } = build_services(&config, local_addr, &auth, &traces).await?;
    let (health, store_watch) = add_health(&mut routes, &served, store.clone()).await;
    let retention = config
        .retention()
        .zip(sessions.as_ref())
        .map(|(retention, sessions)| (retention, sessions.spawn_retention(retention)));
    add_reflection(&mut routes, &served)?;

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (metrics_addr, metrics_task) =
        serve_metrics(&config, sessions.clone(), shutdown_rx.clone()).await?;
    let task = serve_grpc(&config, front, listener, routes, shutdown_rx, traces)?;
    tracing::info!(%local_addr, services = ?served, tls = config.tls.is_some(), tokens = config.tokens_file.is_some(), "serving gRPC");
    warn_of_unset_passthrough(&config);
    if config.browser.grpc_web_enabled() {
        tracing::info!(
            cors_allow_origins = ?config.browser.cors_allow_origins,
            console = config.browser.console,
            "serving gRPC-Web"
        );
    }
    if config.browser.console {
        tracing::info!(url = %console_url(local_addr, config.tls.is_some()), "the web console is at this URL");
    }
    Ok(RunningServer {
        local_addr,
        metrics_addr,
        store,
        sessions,
        health,
        served,
        drain_grace: config.drain_grace,
        shutdown: shutdown_tx,
        tokens,
        task,
        metrics_task,
        store_watch,
        retention,
        trace_export,
    })
}

/// What faces the network besides the routes: TLS and the browser layers, built first so that a
/// bad setting stops startup before the port is bound or the store opened.
struct Front {
    tls: Option<ServerTlsConfig>,
    browser: browser::BrowserOptions,
    grpc_web: Option<GrpcWebLayer>,
}

type GrpcWebLayer = tower::layer::util::Stack<tonic_web::GrpcWebLayer, tower_http::cors::CorsLayer>;

impl Front {
    fn new(config: &ServeConfig) -> anyhow::Result<Self> {
        let tls = config.tls.as_ref().map(tls::server_config).transpose()?;
        let browser = browser_options(&config.browser, config.tokens_file.is_some());
        let grpc_web = browser::grpc_web_layer(&browser)?;
        Ok(Self {
            tls,
            browser,
            grpc_web,
        })
    }
}

/// The configured services, built and routed but not served yet.
struct Services {
    routes: RoutesBuilder,
    /// The names of the services configured (health and reflection aside).
    served: Vec<&'static str>,
    sessions: Option<Arc<Sessions>>,
    store: Option<Arc<dyn Store>>,
}

/// Builds the configured services: the sessions over the store (with forwarding to and relaying
/// for other replicas), the translator and the gateway, each behind authentication and the
/// message limits.
async fn build_services(
    config: &ServeConfig,
    local_addr: SocketAddr,
    auth: &Authenticator,
    traces: &crate::session::traces::Traces,
) -> anyhow::Result<Services> {
    let mut routes = RoutesBuilder::default();
    let mut served: Vec<&'static str> = Vec::new();
    let max_message = config.limits.grpc_message_bytes;
    // Requests are held to the limit; responses may carry one log entry as long as a runtime
    // line may be (ReadLog pages stay under the limit otherwise), so nothing logged is unreadable.
    let max_response = max_message.max(config.limits.runtime_line_bytes + 64 * 1024);

    let (sessions, store) = if config.services.sessions {
        let (sessions, store) = open_sessions(config, local_addr, auth, traces).await?;
        let sessions = Arc::new(sessions);
        // The tasks hold the registry weakly and end with it.
        drop(sessions.spawn_ownership());
        (Some(sessions), Some(store))
    } else {
        (None, None)
    };
    let mut relay = None;
    if let Some(sessions) = &sessions {
        let (service, relayed) = sessions_service(config, sessions)?;
        relay = relayed;
        let service = AgentSessionServiceServer::new(service)
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(max_response);
        routes.add_service(InterceptedService::new(service, auth.clone()));
        served.push(<AgentSessionServiceServer<SessionsService> as NamedService>::NAME);
    }
    if config.services.translator {
        let limits = Arc::new(config.limits.clone());
        let translator = Arc::new(Translator::new(config.static_files_base_url.as_deref()));
        let service =
            ChannelTranslatorServiceServer::new(TranslatorService::new(translator, limits))
                .max_decoding_message_size(max_message)
                .max_encoding_message_size(max_response);
        routes.add_service(InterceptedService::new(service, auth.clone()));
        served.push(<ChannelTranslatorServiceServer<TranslatorService> as NamedService>::NAME);
    }
    if config.services.gateway {
        let gateway = sessions.as_ref().map(|s| s.context().gateway().clone());
        let service = RuntimeGatewayServiceServer::new(GatewayService::new(gateway, relay))
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(max_response);
        routes.add_service(InterceptedService::new(service, auth.for_gateway()));
        served.push(<RuntimeGatewayServiceServer<GatewayService> as NamedService>::NAME);
    }
    Ok(Services {
        routes,
        served,
        sessions,
        store,
    })
}

/// The sessions service, forwarding calls for sessions other replicas own, and the relay of
/// bridges that redial this replica while another replica still owns their runtimes' sessions.
fn sessions_service(
    config: &ServeConfig,
    sessions: &Arc<Sessions>,
) -> anyhow::Result<(SessionsService, Option<Arc<Relay>>)> {
    let replica_token = replica_token(config)?;
    // Peers exist only on a shared database.
    let peer_tls = match (&config.tls, &config.database_url) {
        (Some(files), Some(_)) => Some(tls::peer_client_config(
            files,
            config.replica_tls_ca.as_deref(),
        )?),
        _ => None,
    };
    let relay = config.database_url.is_some().then(|| {
        Arc::new(Relay {
            sessions: sessions.clone(),
            replica_token: replica_token.clone(),
            peer_tls: peer_tls.clone(),
        })
    });
    let own_address = sessions.context().replica().address().map(str::to_owned);
    let service = SessionsService::new(
        sessions.clone(),
        Forwarder::new(replica_token, peer_tls, own_address),
    );
    Ok((service, relay))
}

/// Health: every service served is SERVING, and the sessions service's readiness follows the
/// store from now on ([`watch_store`]).
async fn add_health(
    routes: &mut RoutesBuilder,
    served: &[&'static str],
    store: Option<Arc<dyn Store>>,
) -> (HealthReporter, Option<JoinHandle<()>>) {
    let (health, health_service) = tonic_health::server::health_reporter();
    for name in served {
        health
            .set_service_status(*name, ServingStatus::Serving)
            .await;
    }
    let store_watch = store.map(|store| {
        let service = <AgentSessionServiceServer<SessionsService> as NamedService>::NAME;
        watch_store(store, health.clone(), service)
    });
    routes.add_service(health_service);
    (health, store_watch)
}

/// Server reflection, v1 and v1alpha, listing only what this process serves (plus health and
/// reflection themselves).
fn add_reflection(routes: &mut RoutesBuilder, served: &[&'static str]) -> anyhow::Result<()> {
    let mut reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        // google.rpc error details, so grpcurl and buf curl decode ErrorInfo.
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET);
    let mut reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET);
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
    Ok(())
}

/// Resolves once `shutdown` says stop.
async fn stopped(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Serves the Prometheus endpoint in the background when one is configured, until `shutdown`
/// says stop: its bound address and its task.
async fn serve_metrics(
    config: &ServeConfig,
    sessions: Option<Arc<Sessions>>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<(Option<SocketAddr>, Option<JoinHandle<()>>)> {
    let Some(addr) = config.metrics_listen else {
        return Ok((None, None));
    };
    telemetry::metrics::install();
    let listener = telemetry::metrics::bind(addr)
        .await
        .with_context(|| format!("binding the metrics endpoint {addr}"))?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(telemetry::metrics::serve(
        listener,
        sessions,
        stopped(shutdown),
    ));
    tracing::info!(metrics_addr = %bound, "serving Prometheus metrics on /metrics");
    Ok((Some(bound), Some(task)))
}

/// Serves `routes` on `listener` in the background until `shutdown` says stop, behind the
/// front's layers, the RPC metrics and the message-limit mapping.
fn serve_grpc(
    config: &ServeConfig,
    front: Front,
    listener: TcpListener,
    routes: RoutesBuilder,
    shutdown: watch::Receiver<bool>,
    traces: crate::session::traces::Traces,
) -> anyhow::Result<JoinHandle<Result<(), tonic::transport::Error>>> {
    let mut builder = Server::builder();
    if let Some(tls) = front.tls {
        builder = builder.tls_config(tls).context("TLS configuration")?;
    }
    let server = builder
        .trace_fn(|request| tracing::info_span!("rpc", method = %request.uri().path()))
        // HTTP/1.1 always, so a browser on the port gets a readable answer (the front layer's
        // hint); the console and gRPC-Web only when configured.
        .accept_http1(true)
        // No DNS rebinding: with no tokens, browsers are served only from loopback pages.
        .layer(tower::util::option_layer(
            config
                .tokens_file
                .is_none()
                .then(|| LoopbackOnlyLayer::new(&config.browser.cors_allow_origins)),
        ))
        .layer(browser::FrontLayer::new(&front.browser))
        .layer(tower::util::option_layer(front.grpc_web))
        .layer(RpcMetricsLayer)
        .layer(telemetry::traces::RpcSpanLayer::new(traces))
        .layer(MapResponseLayer::new(status::message_limit_mapper(
            config.limits.grpc_message_bytes,
        )))
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(20)))
        .add_routes(routes.routes())
        // A custom incoming stream ignores `Server::tcp_nodelay`: it is set on each accepted
        // socket here, or Nagle holds back small HTTP/2 frames (streams) behind delayed ACKs.
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            stopped(shutdown),
        );
    Ok(tokio::spawn(server))
}
