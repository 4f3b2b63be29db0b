//! A real agent-harness server, in-process on `127.0.0.1:0`, with typed clients for each service.
//!
//! ```ignore
//! let h = Harness::start().await;
//! let reply = h.translator().translate_channel_message(request).await?;
//! h.shutdown().await;
//! ```
//!
//! `Harness::start_with(|config| { … })` edits the [`ServeConfig`] before the server starts.
//! Every test body runs inside [`bounded`], so a hang fails the test instead of the run.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use agent_harness::{
    app::{self, RunningServer},
    config::{FileConfig, ServeArgs, ServeConfig},
    pb::v1::{
        agent_session_service_client::AgentSessionServiceClient,
        channel_translator_service_client::ChannelTranslatorServiceClient,
        runtime_gateway_service_client::RuntimeGatewayServiceClient,
    },
};
use tempfile::TempDir;
use tonic::{
    Code, Status,
    transport::{Channel, Endpoint},
};
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::{
    v1::server_reflection_client::ServerReflectionClient as ReflectionV1Client,
    v1alpha::server_reflection_client::ServerReflectionClient as ReflectionV1AlphaClient,
};
use tonic_types::{ErrorInfo, StatusExt};

pub use crate::{TEST_TIMEOUT, bounded, within};

/// The static files base URL every harness gets unless a test changes it.
pub const STATIC_BASE_URL: &str = "https://static.example";

/// The `ErrorInfo.domain` of every error the harness returns.
pub const ERROR_DOMAIN: &str = "agent-harness";

/// Fully-qualified names of the services a default harness serves.
pub const SESSIONS_SERVICE: &str = "agent_harness.v1.AgentSessionService";
pub const TRANSLATOR_SERVICE: &str = "agent_harness.v1.ChannelTranslatorService";
pub const GATEWAY_SERVICE: &str = "agent_harness.v1.RuntimeGatewayService";
pub const HEALTH_SERVICE: &str = "grpc.health.v1.Health";

/// A configuration for tests: defaults, listening on an ephemeral loopback port, with `data_dir`
/// and `mock_program` as the built-in `mock` profile's program.
pub fn test_config(data_dir: PathBuf, mock_program: PathBuf) -> ServeConfig {
    let args = ServeArgs {
        listen: Some("127.0.0.1:0".parse().expect("valid")),
        data_dir: Some(data_dir),
        ..Default::default()
    };
    ServeConfig::from_parts(args, FileConfig::default(), mock_program).expect("defaults are valid")
}

/// A running server and a connection to it.
pub struct Harness {
    server: Option<RunningServer>,
    channel: Channel,
    addr: SocketAddr,
    config: ServeConfig,
    /// Holds the data dir (`data/`) and a workspace beside it (`work/`): no session's cwd may
    /// hold or lie in the data dir.
    root: TempDir,
}

/// The workspace beside a test configuration's data dir (see [`Harness::workspace`]), for a
/// profile's `allowed_cwd_roots` set before the server starts.
pub fn workspace_for(config: &ServeConfig) -> PathBuf {
    config
        .data_dir
        .parent()
        .expect("the data dir has a parent")
        .join("work")
}

impl Harness {
    /// A server with the default configuration: every service, the built-in `mock` profile
    /// (this crate's own binary), a fresh data dir, and [`STATIC_BASE_URL`] for the translator.
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// Like [`Harness::start`], after `configure` has edited the configuration.
    pub async fn start_with(configure: impl FnOnce(&mut ServeConfig)) -> Self {
        let root = tempfile::Builder::new()
            .prefix("agent-harness-it-")
            .tempdir()
            .expect("temporary data dir");
        let data_dir = root.path().join("data");
        std::fs::create_dir(&data_dir).expect("the data dir");
        let mut config = test_config(data_dir, crate::service_bin());
        std::fs::create_dir(workspace_for(&config)).expect("the workspace");
        config.static_files_base_url = Some(STATIC_BASE_URL.to_owned());
        configure(&mut config);

        let server = app::start(config.clone()).await.expect("the server starts");
        let addr = server.local_addr();
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .expect("valid endpoint")
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("a connection to the server");
        Self {
            server: Some(server),
            channel,
            addr,
            config,
            root,
        }
    }

    /// A directory sessions may work in (the default cwd of [`crate::support::create_request`]).
    pub fn workspace(&self) -> PathBuf {
        self.root.path().join("work")
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The Prometheus endpoint's address, when the configuration asked for one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.server.as_ref().and_then(|s| s.metrics_addr())
    }

    /// The configuration the server was started with.
    pub fn config(&self) -> &ServeConfig {
        &self.config
    }

    /// The running server (e.g. to reload its tokens).
    pub fn server(&self) -> &RunningServer {
        self.server.as_ref().expect("the server is running")
    }

    /// The server's (temporary) data dir.
    pub fn data_dir(&self) -> &Path {
        &self.config.data_dir
    }

    /// The shared connection (cheap to clone); for a client not covered below.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// A fresh connection of its own, e.g. to test what happens when one caller goes away.
    pub async fn connect(&self) -> Channel {
        Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("valid endpoint")
            .connect()
            .await
            .expect("a connection to the server")
    }

    pub fn sessions(&self) -> AgentSessionServiceClient<Channel> {
        AgentSessionServiceClient::new(self.channel())
    }

    pub fn translator(&self) -> ChannelTranslatorServiceClient<Channel> {
        ChannelTranslatorServiceClient::new(self.channel())
    }

    pub fn gateway(&self) -> RuntimeGatewayServiceClient<Channel> {
        RuntimeGatewayServiceClient::new(self.channel())
    }

    pub fn health(&self) -> HealthClient<Channel> {
        HealthClient::new(self.channel())
    }

    pub fn reflection_v1(&self) -> ReflectionV1Client<Channel> {
        ReflectionV1Client::new(self.channel())
    }

    pub fn reflection_v1alpha(&self) -> ReflectionV1AlphaClient<Channel> {
        ReflectionV1AlphaClient::new(self.channel())
    }

    /// Stops the server gracefully and waits until it is down. (Dropping a harness also stops
    /// it, without waiting.)
    pub async fn shutdown(mut self) {
        if let Some(server) = self.server.take() {
            server.shutdown().await.expect("a clean shutdown");
        }
    }
}

/// The `google.rpc.ErrorInfo` of an error status; panics if it has none or a foreign domain.
pub fn error_info(status: &Status) -> ErrorInfo {
    let info = status
        .get_details_error_info()
        .unwrap_or_else(|| panic!("status carries no google.rpc.ErrorInfo: {status:?}"));
    assert_eq!(info.domain, ERROR_DOMAIN, "ErrorInfo domain of {status:?}");
    info
}

/// The stable reason (`ErrorInfo.reason`) of an error status.
pub fn error_reason(status: &Status) -> String {
    error_info(status).reason
}

/// Asserts a status has the given code and `ErrorInfo.reason`.
#[track_caller]
pub fn assert_error(status: &Status, code: Code, reason: &str) {
    assert_eq!(status.code(), code, "code of {status:?}");
    assert_eq!(error_reason(status), reason, "reason of {status:?}");
}

/// Unwraps the error of a call that must fail.
#[track_caller]
pub fn expect_err<T: std::fmt::Debug>(result: Result<T, Status>) -> Status {
    match result {
        Ok(value) => panic!("expected an error status, got {value:?}"),
        Err(status) => status,
    }
}
