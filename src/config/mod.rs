//! Configuration of `serve`: command-line flags, each with an `AGENT_HARNESS_*`
//! environment fallback, over a TOML config file whose top-level keys mirror the flags in
//! snake_case, over defaults. Unknown keys in the file are an error naming the key.

pub mod listing;
pub mod model_proxy;
pub mod preset;
pub(crate) mod profile;
#[cfg(test)]
pub(crate) mod reference;
pub mod sandbox;

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::Context;
use serde::Deserialize;

pub use crate::auth::tls::TlsFiles;
use crate::domain::{invocation, limits::Limits};
pub use crate::telemetry::LogFormat;
pub use preset::Preset;
pub use profile::{
    Launch, LaunchKeys, MOCK_PROFILE, OnReopenFailure, PermissionPolicy, PermissionRule, Profile,
    ProfileFile, RemoteTarget, Resilience, RuleDecision, named_preset,
};

pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:50051";
pub(crate) const DEFAULT_DATA_DIR: &str = "./data";
pub(crate) const DEFAULT_DRAIN_GRACE: Duration = Duration::from_secs(30);
pub(crate) const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
/// How often a retention pass looks for closed sessions to delete.
pub(crate) const DEFAULT_RETENTION_EVERY: Duration = Duration::from_secs(60);
/// Sessions deleted per retention transaction: small enough that a turn's commit waiting behind
/// one batch is not held up noticeably (each takes its log with it).
pub(crate) const DEFAULT_RETENTION_BATCH: usize = 50;
/// The shortest `retention` accepted, so a slip of the unit ("30s" for "30d") cannot wipe every
/// closed transcript within moments of its close.
pub(crate) const MIN_RETENTION: Duration = Duration::from_secs(60);

/// Which gRPC services a process serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServiceName {
    /// `AgentSessionService`.
    Sessions,
    /// `ChannelTranslatorService`.
    Translator,
    /// `RuntimeGatewayService`.
    Gateway,
}

pub use crate::store::SqliteSynchronous;

/// A database URL. It may carry a password, so it never prints: its `Debug` shows only that one
/// is set (configs are logged with `{:?}` in places), and `--help` hides the env var's value.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    /// The URL itself, for the one place that connects with it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DatabaseUrl(<redacted>)")
    }
}

impl From<String> for DatabaseUrl {
    fn from(url: String) -> Self {
        Self(url)
    }
}

impl std::str::FromStr for DatabaseUrl {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(Self(text.to_owned()))
    }
}

/// The flags of `agent-harness serve`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// Address to serve gRPC on [default: 127.0.0.1:50051]
    #[arg(long, env = "AGENT_HARNESS_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Directory for the embedded store and runtime bookkeeping [default: ./data]
    #[arg(long, env = "AGENT_HARNESS_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// TOML config file (top-level keys mirror these flags; profiles as [profiles.<name>])
    #[arg(long, env = "AGENT_HARNESS_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Base URL of the static file service, for TranslateChannelMessage and mentions
    #[arg(long, env = "AGENT_HARNESS_STATIC_FILES_BASE_URL", value_name = "URL")]
    pub static_files_base_url: Option<String>,
    /// Services to serve, comma-separated [default: sessions,translator,gateway]
    #[arg(
        long,
        env = "AGENT_HARNESS_SERVICES",
        value_name = "LIST",
        value_delimiter = ','
    )]
    pub services: Option<Vec<ServiceName>>,
    /// Address to serve Prometheus metrics on (off when unset)
    #[arg(long, env = "AGENT_HARNESS_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// OTLP/gRPC collector to export traces to, e.g. http://127.0.0.1:4317 (off when unset,
    /// unless OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set)
    #[arg(long, env = "AGENT_HARNESS_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// TOML file of [[tokens]] with sha256, principal, kind (no-token mode when unset)
    #[arg(long, env = "AGENT_HARNESS_TOKENS_FILE", value_name = "FILE")]
    pub tokens_file: Option<PathBuf>,
    /// PEM certificate chain for TLS
    #[arg(long, env = "AGENT_HARNESS_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS
    #[arg(long, env = "AGENT_HARNESS_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle: require client certificates signed by it (mutual TLS)
    #[arg(long, env = "AGENT_HARNESS_TLS_CLIENT_CA", value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
    /// Allow a non-loopback listen address with no tokens configured (logs a warning)
    #[arg(
        long,
        env = "AGENT_HARNESS_INSECURE_ALLOW_NON_LOOPBACK",
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    pub insecure_allow_non_loopback: Option<bool>,
    /// Log format [default: text]
    #[arg(long, env = "AGENT_HARNESS_LOG_FORMAT", value_name = "FORMAT")]
    pub log_format: Option<LogFormat>,
    /// SQLite synchronous mode [default: normal]
    #[arg(long, env = "AGENT_HARNESS_SQLITE_SYNCHRONOUS", value_name = "MODE")]
    pub sqlite_synchronous: Option<SqliteSynchronous>,
    /// PostgreSQL URL (postgres://user@host:port/db?sslmode=…): store sessions there, shared by
    /// every replica, instead of in SQLite in the data directory
    #[arg(
        long,
        env = "AGENT_HARNESS_DATABASE_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    pub database_url: Option<DatabaseUrl>,
    /// How long one store statement (PostgreSQL; a SQLite read) may run before it is cancelled
    /// [default: 10s]
    #[arg(long, env = "AGENT_HARNESS_STATEMENT_TIMEOUT", value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub statement_timeout: Option<Duration>,
    /// How long running turns may take to end after SIGTERM [default: 30s]
    #[arg(long, env = "AGENT_HARNESS_DRAIN_GRACE", value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub drain_grace: Option<Duration>,
    /// HOST:PORT other replicas dial to reach this one [default: the bound listen
    /// address]
    #[arg(
        long,
        env = "AGENT_HARNESS_ADVERTISE_ADDRESS",
        value_name = "HOST:PORT"
    )]
    pub advertise_address: Option<String>,
    /// How long a replica's hold on a session lasts unless renewed [default: 10s]
    #[arg(long, env = "AGENT_HARNESS_LEASE_TTL", value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub lease_ttl: Option<Duration>,
    /// Delete closed sessions (record, log, queue, labels) this long after they closed, e.g.
    /// "30d"; at least 1m [default: off, kept forever]
    #[arg(long, env = "AGENT_HARNESS_RETENTION", value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub retention: Option<Duration>,
    /// File holding the token this replica presents to its peers when it forwards a call (a
    /// token of kind `replica` in their tokens file)
    #[arg(long, env = "AGENT_HARNESS_REPLICA_TOKEN_FILE", value_name = "PATH")]
    pub replica_token_file: Option<PathBuf>,
    /// PEM file of the CA that issued the other replicas' TLS certificates, trusted when this
    /// replica forwards a call to one [default: tls_client_ca]
    #[arg(long, env = "AGENT_HARNESS_REPLICA_TLS_CA", value_name = "PATH")]
    pub replica_tls_ca: Option<PathBuf>,
    /// An origin (scheme://host[:port]) whose pages may call over gRPC-Web; repeat
    /// for several. Any origin enables gRPC-Web [default: none]
    #[arg(
        long = "cors-allow-origin",
        env = "AGENT_HARNESS_CORS_ALLOW_ORIGIN",
        value_name = "ORIGIN",
        value_delimiter = ','
    )]
    pub cors_allow_origins: Vec<String>,
    /// Accept gRPC-Web (and HTTP/1.1) on the listen address, for same-origin pages and proxies
    /// [default: off; on with --console or any --cors-allow-origin]
    #[arg(
        long,
        env = "AGENT_HARNESS_GRPC_WEB",
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    pub grpc_web: Option<bool>,
    /// Serve the built-in web console at / (implies --grpc-web) [default: off]
    #[arg(
        long,
        env = "AGENT_HARNESS_CONSOLE",
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    pub console: Option<bool>,
}

/// The config file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<SocketAddr>,
    pub data_dir: Option<PathBuf>,
    pub static_files_base_url: Option<String>,
    pub services: Option<Vec<ServiceName>>,
    pub metrics_listen: Option<SocketAddr>,
    pub otlp_endpoint: Option<String>,
    pub tokens_file: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_client_ca: Option<PathBuf>,
    pub insecure_allow_non_loopback: Option<bool>,
    pub log_format: Option<LogFormat>,
    pub sqlite_synchronous: Option<SqliteSynchronous>,
    pub database_url: Option<DatabaseUrl>,
    pub statement_timeout: Option<String>,
    pub drain_grace: Option<String>,
    pub advertise_address: Option<String>,
    pub lease_ttl: Option<String>,
    pub retention: Option<String>,
    pub replica_token_file: Option<PathBuf>,
    pub replica_tls_ca: Option<PathBuf>,
    pub cors_allow_origins: Option<Vec<String>>,
    pub grpc_web: Option<bool>,
    pub console: Option<bool>,
    /// The `_meta` key marking the hidden invocation block.
    pub invocation_meta_key: Option<String>,
    #[serde(default)]
    pub limits: Limits,
    /// The boxes runtimes run in (config/sandbox.rs).
    #[serde(default)]
    pub sandbox: sandbox::SandboxFile,
    /// What every box's model proxy shares: its timeout, what each model costs
    /// (config/model_proxy.rs).
    #[serde(default)]
    pub model_proxy: model_proxy::ModelProxyFile,
    #[serde(default)]
    pub profiles: BTreeMap<String, ProfileFile>,
}

impl FileConfig {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("config file {}", path.display()))
    }
}

/// The set of served services.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceSet {
    pub sessions: bool,
    pub translator: bool,
    pub gateway: bool,
}

impl ServiceSet {
    pub const ALL: Self = Self {
        sessions: true,
        translator: true,
        gateway: true,
    };

    fn from_list(list: &[ServiceName]) -> Self {
        Self {
            sessions: list.contains(&ServiceName::Sessions),
            translator: list.contains(&ServiceName::Translator),
            gateway: list.contains(&ServiceName::Gateway),
        }
    }
}

/// What a browser may reach: none of it unless configured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrowserConfig {
    /// Origins allowed by CORS, exactly as browsers send them (`https://ui.example:8443`).
    pub cors_allow_origins: Vec<String>,
    /// gRPC-Web asked for explicitly.
    pub grpc_web: bool,
    /// The built-in console at `/`.
    pub console: bool,
}

impl BrowserConfig {
    /// gRPC-Web (and with it HTTP/1.1) is accepted when asked for, when the console needs it,
    /// or when some origin is allowed to use it.
    pub fn grpc_web_enabled(&self) -> bool {
        self.grpc_web || self.console || !self.cors_allow_origins.is_empty()
    }

    fn resolve(
        args_origins: Vec<String>,
        file_origins: Option<Vec<String>>,
        grpc_web: bool,
        console: bool,
    ) -> anyhow::Result<Self> {
        let cors_allow_origins = if args_origins.is_empty() {
            file_origins.unwrap_or_default()
        } else {
            args_origins
        };
        for origin in &cors_allow_origins {
            let parsed = url::Url::parse(origin)
                .with_context(|| format!("cors_allow_origins: {origin:?} is not an origin"))?;
            // Browsers send `Origin` as scheme://host[:port] with nothing after it, and CORS
            // compares it byte for byte: anything else here could never match.
            if !matches!(parsed.scheme(), "https" | "http")
                || parsed.origin().ascii_serialization() != *origin
            {
                anyhow::bail!(
                    "cors_allow_origins: {origin:?} must be an origin like https://ui.example:8443 \
                     (scheme, host and port only, no trailing slash)"
                );
            }
        }
        Ok(Self {
            cors_allow_origins,
            grpc_web,
            console,
        })
    }
}

/// The resolved configuration of a `serve` process.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub static_files_base_url: Option<String>,
    pub services: ServiceSet,
    pub metrics_listen: Option<SocketAddr>,
    /// Where traces are exported over OTLP (see `telemetry::traces` for the variables).
    pub otlp_endpoint: Option<String>,
    pub tokens_file: Option<PathBuf>,
    /// How often the tokens file is checked for changes (`None`: only SIGHUP reloads it). Not a
    /// flag: tests shorten it.
    pub tokens_poll_interval: Option<Duration>,
    pub tls: Option<TlsFiles>,
    pub insecure_allow_non_loopback: bool,
    pub log_format: LogFormat,
    pub sqlite_synchronous: SqliteSynchronous,
    /// PostgreSQL instead of SQLite. May hold a password: it never prints.
    pub database_url: Option<DatabaseUrl>,
    /// How long one store statement (PostgreSQL; a SQLite read) may run before it is cancelled.
    pub statement_timeout: Duration,
    pub drain_grace: Duration,
    /// HOST:PORT other replicas dial (`None`: the bound listen address).
    pub advertise_address: Option<String>,
    /// How long a lease on a session lasts unless renewed.
    pub lease_ttl: Duration,
    /// Closed sessions older than this (since they closed) are deleted; `None`: kept forever.
    pub retention: Option<Duration>,
    /// How often a retention pass runs (the first one this long after start). Not a flag:
    /// tests change it.
    pub retention_every: Duration,
    /// The most sessions one retention batch (one store transaction) deletes. Not a flag:
    /// tests change it.
    pub retention_batch: usize,
    /// The token presented to peer replicas when forwarding.
    pub replica_token_file: Option<PathBuf>,
    /// The CA trusted for peer replicas' certificates when forwarding over TLS.
    pub replica_tls_ca: Option<PathBuf>,
    pub invocation_meta_key: String,
    pub limits: Limits,
    pub profiles: BTreeMap<String, Arc<Profile>>,
    /// gRPC-Web, CORS and the console.
    pub browser: BrowserConfig,
    /// The config file this was read from, if any (no box may show it).
    pub config_file: Option<PathBuf>,
    /// The `[sandbox]` table: what every box shares (where HOMEs live, the agents' ids, the
    /// cgroup parent). The paths no box may show are found from the rest of this config when the
    /// server starts ([`ServeConfig::sandbox_settings`]).
    pub sandbox: sandbox::SandboxFile,
    /// This very executable: the sandbox launcher (`sandbox-exec`) and the `mock` agent.
    pub program: PathBuf,
    /// The `[model_proxy]` table: its limits, and what it charges each call it meters.
    pub model_proxy: model_proxy::ModelProxySettings,
}

impl ServeConfig {
    /// The session engine's options.
    /// The session engine's options, for a server bound at `bound` (the advertised address
    /// unless one is configured).
    /// The retention the engine applies, when configured.
    pub(crate) fn retention(&self) -> Option<crate::session::manager::Retention> {
        self.retention
            .map(|age| crate::session::manager::Retention {
                age,
                every: self.retention_every,
                batch: self.retention_batch,
            })
    }

    /// What every box shares, from the `[sandbox]` table and the server's own files as this
    /// config names them now (the data dir, config, tokens file, TLS files, secrets).
    pub fn sandbox_settings(&self) -> anyhow::Result<crate::acp::sandbox::SandboxSettings> {
        let tls = self.tls.as_ref();
        let protected = protected_paths(
            &self.data_dir,
            self.config_file.as_deref(),
            self.tokens_file.as_deref(),
            tls,
            [
                self.replica_token_file.as_ref(),
                self.replica_tls_ca.as_ref(),
            ],
            self.profiles
                .values()
                .flat_map(|p| p.secrets.files.values()),
        );
        let mut settings =
            self.sandbox
                .settings(&self.data_dir, self.program.clone(), protected)?;
        settings.model_limits = self.model_proxy.limits;
        Ok(settings)
    }

    pub(crate) fn engine_options(
        &self,
        bound: SocketAddr,
    ) -> anyhow::Result<crate::session::EngineOptions> {
        Ok(crate::session::EngineOptions {
            limits: self.limits.clone(),
            profiles: self.profiles.clone(),
            meta_key: self.invocation_meta_key.clone(),
            static_files_base_url: self.static_files_base_url.clone(),
            tokens_configured: self.tokens_file.is_some(),
            replica: crate::session::ReplicaOptions::new(
                self.advertise_address
                    .as_deref()
                    .unwrap_or(&bound.to_string()),
                self.lease_ttl,
                self.database_url.is_some(),
            ),
            budgets: Default::default(),
            traces: Default::default(),
            sandbox: self.sandbox_settings()?,
            prices: self.model_proxy.prices.clone(),
            presets: preset::all_names().into_iter().map(str::to_owned).collect(),
        })
    }

    /// Flags (and their env fallbacks) over the config file over defaults. `mock_program` is the
    /// executable the built-in `mock` profile runs (normally this very binary).
    pub fn resolve(args: ServeArgs, mock_program: PathBuf) -> anyhow::Result<Self> {
        let file = match &args.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };
        Self::from_parts(args, file, mock_program)
    }

    pub fn from_parts(
        args: ServeArgs,
        file: FileConfig,
        mock_program: PathBuf,
    ) -> anyhow::Result<Self> {
        let services = args
            .services
            .or(file.services)
            .map(|list| ServiceSet::from_list(&list))
            .unwrap_or(ServiceSet::ALL);
        if services == ServiceSet::from_list(&[]) {
            anyhow::bail!("services is empty: name at least one of sessions, translator, gateway");
        }
        let model_proxy = model_proxy::settings(&file.model_proxy)?;
        let tls_cert = args.tls_cert.or(file.tls_cert);
        let tls_key = args.tls_key.or(file.tls_key);
        let tls_client_ca = args.tls_client_ca.or(file.tls_client_ca);
        let tls = match (tls_cert, tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert,
                key,
                client_ca: tls_client_ca,
            }),
            (None, None) if tls_client_ca.is_none() => None,
            _ => anyhow::bail!(
                "TLS needs both tls_cert and tls_key (and tls_client_ca only with them)"
            ),
        };
        let lease_ttl = match (args.lease_ttl, file.lease_ttl) {
            (Some(ttl), _) => ttl,
            (None, Some(text)) => profile::parse_duration("lease_ttl", &text)?,
            (None, None) => DEFAULT_LEASE_TTL,
        };
        if lease_ttl < Duration::from_millis(500) {
            anyhow::bail!("lease_ttl must be at least 500ms (got {lease_ttl:?})");
        }
        let retention = match (args.retention, file.retention) {
            (Some(retention), _) => Some(retention),
            (None, Some(text)) => Some(profile::parse_duration("retention", &text)?),
            (None, None) => None,
        };
        if let Some(retention) = retention
            && retention < MIN_RETENTION
        {
            anyhow::bail!(
                "retention must be at least 1m (got {}): closed sessions would be deleted while \
                 their clients may still read them",
                humantime::format_duration(retention)
            );
        }
        let statement_timeout = match (args.statement_timeout, file.statement_timeout) {
            (Some(timeout), _) => timeout,
            (None, Some(text)) => profile::parse_duration("statement_timeout", &text)?,
            (None, None) => crate::store::DEFAULT_STATEMENT_TIMEOUT,
        };
        if statement_timeout < Duration::from_millis(1) {
            anyhow::bail!("statement_timeout must be at least 1ms (got {statement_timeout:?})");
        }
        let advertise_address = args
            .advertise_address
            .or(file.advertise_address)
            .filter(|a| !a.is_empty());
        if let Some(address) = &advertise_address {
            match address.rsplit_once(':') {
                Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {}
                _ => anyhow::bail!("advertise_address {address:?} must be HOST:PORT"),
            }
        }
        let drain_grace = match (args.drain_grace, file.drain_grace) {
            (Some(grace), _) => grace,
            (None, Some(text)) => profile::parse_duration("drain_grace", &text)?,
            (None, None) => DEFAULT_DRAIN_GRACE,
        };
        let static_files_base_url = args.static_files_base_url.or(file.static_files_base_url);
        if let Some(url) = &static_files_base_url {
            let parsed = url::Url::parse(url)
                .with_context(|| format!("static_files_base_url {url:?} is not a URL"))?;
            if !matches!(parsed.scheme(), "https" | "http") {
                anyhow::bail!("static_files_base_url {url:?} must use https or http");
            }
        }
        let tokens_file = args.tokens_file.or(file.tokens_file);
        let browser = BrowserConfig::resolve(
            args.cors_allow_origins,
            file.cors_allow_origins,
            args.grpc_web.or(file.grpc_web).unwrap_or(false),
            args.console.or(file.console).unwrap_or(false),
        )?;

        let data_dir = args
            .data_dir
            .or(file.data_dir)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        let protected = protected_paths(
            &data_dir,
            args.config.as_deref(),
            tokens_file.as_deref(),
            tls.as_ref(),
            [
                args.replica_token_file
                    .as_ref()
                    .or(file.replica_token_file.as_ref()),
                args.replica_tls_ca
                    .as_ref()
                    .or(file.replica_tls_ca.as_ref()),
            ],
            file.profiles.values().flat_map(|p| p.env_files.values()),
        );
        let sandbox_defaults = file.sandbox.defaults()?;
        // Checked now, so a bad [sandbox] table stops the config from loading.
        file.sandbox
            .settings(&data_dir, mock_program.clone(), protected.clone())?;
        let program = mock_program.clone();
        let mut profiles = BTreeMap::new();
        let mut mock = Profile::builtin_mock(mock_program);
        if let Some(policy) = &mut mock.sandbox {
            policy.limits = sandbox_defaults.limits;
        }
        profiles.insert(MOCK_PROFILE.to_owned(), Arc::new(mock));
        for (name, profile) in file.profiles {
            if name.is_empty()
                || name == "."
                || name == ".."
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                anyhow::bail!(
                    "profile name {name:?} may hold only letters, digits, '-', '_' and '.' \
                     (and is neither . nor ..: it names a folder of HOMEs)"
                );
            }
            let mut profile = profile;
            // `[profiles.mock]` without a command changes the built-in mock (e.g. gives it
            // allowed_cwd_roots once tokens are on) rather than asking for one.
            if name == MOCK_PROFILE && profile.command.is_none() && profile.preset.is_none() {
                profile.command = Some(program.to_string_lossy().into_owned());
                profile
                    .args
                    .get_or_insert_with(|| vec!["mock-agent".to_owned(), "--resume".to_owned()]);
            }
            let profile = profile.resolve_with(&name, &sandbox_defaults, Some(&protected))?;
            // With real principals, a runtime's working directory must be fenced in. (The
            // built-in mock profile, unless redefined here, then refuses every cwd.)
            if tokens_file.is_some() && profile.allowed_cwd_roots.is_none() {
                anyhow::bail!(
                    "profiles.{name}.allowed_cwd_roots is required once tokens_file is set"
                );
            }
            profiles.insert(name, Arc::new(profile));
        }
        // Warm runtimes hold live-runtime slots for good; leave room for sessions to start.
        let warm: usize = profiles.values().map(|p| p.warm_pool).sum();
        if warm > 0 && warm >= file.limits.live_runtimes {
            anyhow::bail!(
                "the profiles' warm_pool values add up to {warm}, which leaves no room under \
                 limits.live_runtimes = {}",
                file.limits.live_runtimes
            );
        }

        Ok(Self {
            listen: args
                .listen
                .or(file.listen)
                .unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("valid default")),
            data_dir,
            static_files_base_url,
            services,
            metrics_listen: args.metrics_listen.or(file.metrics_listen),
            otlp_endpoint: args.otlp_endpoint.or(file.otlp_endpoint),
            tokens_file,
            tokens_poll_interval: Some(crate::auth::DEFAULT_TOKENS_POLL),
            tls,
            insecure_allow_non_loopback: args
                .insecure_allow_non_loopback
                .or(file.insecure_allow_non_loopback)
                .unwrap_or(false),
            log_format: args.log_format.or(file.log_format).unwrap_or_default(),
            sqlite_synchronous: args
                .sqlite_synchronous
                .or(file.sqlite_synchronous)
                .unwrap_or_default(),
            database_url: args
                .database_url
                .or(file.database_url)
                .filter(|url| !url.expose().is_empty()),
            statement_timeout,
            drain_grace,
            advertise_address,
            lease_ttl,
            retention,
            retention_every: DEFAULT_RETENTION_EVERY,
            retention_batch: DEFAULT_RETENTION_BATCH,
            replica_token_file: args.replica_token_file.or(file.replica_token_file),
            replica_tls_ca: args.replica_tls_ca.or(file.replica_tls_ca),
            invocation_meta_key: file
                .invocation_meta_key
                .unwrap_or_else(|| invocation::DEFAULT_META_KEY.to_owned()),
            limits: file.limits,
            profiles,
            browser,
            sandbox: file.sandbox,
            program,
            config_file: args.config,
            model_proxy,
        })
    }
}

/// The server's own files, which no box may show: the data dir, the config file, the tokens
/// file, TLS keys and certificates, the replica's token and CA, every profile's `env_files`.
/// Canonical where they exist (a path through a link is caught as well as the link itself).
fn protected_paths<'a>(
    data_dir: &'a Path,
    config: Option<&'a Path>,
    tokens_file: Option<&'a Path>,
    tls: Option<&'a TlsFiles>,
    replica: [Option<&'a PathBuf>; 2],
    env_files: impl Iterator<Item = &'a PathBuf>,
) -> Vec<PathBuf> {
    let tls_files = tls
        .into_iter()
        .flat_map(|t| [Some(&t.cert), Some(&t.key), t.client_ca.as_ref()])
        .flatten()
        .map(PathBuf::as_path);
    let mut paths: Vec<PathBuf> = std::iter::once(data_dir)
        .chain(config)
        .chain(tokens_file)
        .chain(tls_files)
        .chain(replica.into_iter().flatten().map(PathBuf::as_path))
        .chain(env_files.map(PathBuf::as_path))
        .map(|path| {
            std::fs::canonicalize(path).unwrap_or_else(|_| match path.is_absolute() {
                true => path.to_path_buf(),
                false => std::env::current_dir()
                    .map(|dir| dir.join(path))
                    .unwrap_or_else(|_| path.to_path_buf()),
            })
        })
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(args: ServeArgs, file: &str) -> anyhow::Result<ServeConfig> {
        let file: FileConfig = toml::from_str(file)?;
        ServeConfig::from_parts(args, file, "/bin/true".into())
    }

    #[test]
    fn a_replica_advertises_its_bound_address_unless_told_otherwise_and_leases_last_ten_seconds() {
        let config = resolve(ServeArgs::default(), "").unwrap();
        assert_eq!(config.lease_ttl, Duration::from_secs(10));
        let bound: SocketAddr = "127.0.0.1:4321".parse().unwrap();
        let replica = config.engine_options(bound).unwrap().replica;
        assert!(replica.id.ends_with("@127.0.0.1:4321"), "{}", replica.id);
        assert!(!replica.shared_store);

        let config = resolve(
            ServeArgs::default(),
            "advertise_address = \"pod-1.harness:50051\"\nlease_ttl = \"2s\"",
        )
        .unwrap();
        assert_eq!(config.lease_ttl, Duration::from_secs(2));
        let replica = config.engine_options(bound).unwrap().replica;
        assert!(
            replica.id.ends_with("@pod-1.harness:50051"),
            "{}",
            replica.id
        );

        let config = resolve(ServeArgs::default(), "statement_timeout = \"3s\"").unwrap();
        assert_eq!(config.statement_timeout, Duration::from_secs(3));
        assert_eq!(
            resolve(ServeArgs::default(), "").unwrap().statement_timeout,
            Duration::from_secs(10)
        );

        for bad in [
            "statement_timeout = \"0s\"",
            "advertise_address = \"no-port\"",
            "advertise_address = \":50051\"",
            "lease_ttl = \"10ms\"",
        ] {
            assert!(resolve(ServeArgs::default(), bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn retention_is_off_by_default_parsed_from_file_or_flag_and_refused_under_a_minute() {
        assert_eq!(resolve(ServeArgs::default(), "").unwrap().retention, None);
        let config = resolve(ServeArgs::default(), "retention = \"1h\"").unwrap();
        assert_eq!(config.retention, Some(Duration::from_secs(3600)));
        let flag = ServeArgs {
            retention: Some(Duration::from_secs(120)),
            ..Default::default()
        };
        assert_eq!(
            resolve(flag, "retention = \"1h\"").unwrap().retention,
            Some(Duration::from_secs(120))
        );
        let error = resolve(ServeArgs::default(), "retention = \"30s\"")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("retention must be at least 1m (got 30s)"),
            "{error}"
        );
        assert!(resolve(ServeArgs::default(), "retention = \"soon\"").is_err());
    }

    #[test]
    fn a_mock_table_without_a_command_changes_the_built_in_mock() {
        let config = resolve(
            ServeArgs::default(),
            "tokens_file = \"/etc/t.toml\"\n[profiles.mock]\nallowed_cwd_roots = [\"/w/{principal}\"]",
        )
        .unwrap();
        let mock = &config.profiles["mock"];
        assert_eq!(mock.args, ["mock-agent", "--resume"]);
        assert_eq!(mock.command, config.program);
        assert!(mock.allowed_cwd_roots.is_some());
        // Its own command still wins.
        let config = resolve(
            ServeArgs::default(),
            "[profiles.mock]\ncommand = \"my-agent\"",
        )
        .unwrap();
        assert_eq!(config.profiles["mock"].command, PathBuf::from("my-agent"));
    }

    #[test]
    fn defaults_serve_everything_on_loopback_with_the_mock_profile() {
        let config = resolve(ServeArgs::default(), "").unwrap();
        assert_eq!(config.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(config.data_dir, PathBuf::from("./data"));
        assert_eq!(config.services, ServiceSet::ALL);
        assert!(config.profiles.contains_key("mock"));
        assert_eq!(config.invocation_meta_key, "macro/invocation-context");
        assert_eq!(config.limits, Limits::default());
    }

    #[test]
    fn a_database_url_with_a_password_never_shows_in_a_printed_config() {
        let secret = "postgres://app:hunter2@db.internal:5432/harness";
        let config = resolve(
            ServeArgs::default(),
            &format!("database_url = \"{secret}\""),
        )
        .unwrap();
        assert_eq!(
            config.database_url.as_ref().map(DatabaseUrl::expose),
            Some(secret)
        );
        let printed = format!("{config:?}");
        assert!(!printed.contains("hunter2"), "{printed}");
        assert!(printed.contains("DatabaseUrl(<redacted>)"), "{printed}");
    }

    #[test]
    fn browsers_get_nothing_unless_an_origin_grpc_web_or_the_console_is_configured() {
        let config = resolve(ServeArgs::default(), "").unwrap();
        assert_eq!(config.browser, BrowserConfig::default());
        assert!(!config.browser.grpc_web_enabled());

        let config = resolve(
            ServeArgs::default(),
            "cors_allow_origins = [\"https://ui.example:8443\", \"http://localhost:5173\"]",
        )
        .unwrap();
        assert_eq!(config.browser.cors_allow_origins.len(), 2);
        assert!(config.browser.grpc_web_enabled() && !config.browser.console);

        let flags = ServeArgs {
            cors_allow_origins: vec!["https://other.example".into()],
            console: Some(true),
            ..Default::default()
        };
        let config = resolve(flags, "cors_allow_origins = [\"https://ui.example\"]").unwrap();
        assert_eq!(config.browser.cors_allow_origins, ["https://other.example"]);
        assert!(config.browser.console && config.browser.grpc_web_enabled());

        let config = resolve(ServeArgs::default(), "grpc_web = true").unwrap();
        assert!(config.browser.grpc_web_enabled() && !config.browser.console);
    }

    #[test]
    fn a_cors_origin_must_be_exactly_what_a_browser_sends() {
        for bad in [
            "https://ui.example/",
            "https://ui.example/app",
            "ui.example",
            "file:///tmp",
            "*",
            "https://UI.example",
        ] {
            let file = format!("cors_allow_origins = [{bad:?}]");
            let err = resolve(ServeArgs::default(), &file).unwrap_err();
            assert!(
                format!("{err:#}").contains("cors_allow_origins"),
                "{bad}: {err:#}"
            );
        }
    }

    #[test]
    fn a_flag_overrides_the_file() {
        let args = ServeArgs {
            listen: Some("127.0.0.1:7000".parse().unwrap()),
            ..Default::default()
        };
        let config = resolve(args, "listen = \"127.0.0.1:6000\"\ndata_dir = \"/srv\"").unwrap();
        assert_eq!(config.listen.port(), 7000);
        assert_eq!(config.data_dir, PathBuf::from("/srv"));
    }

    #[test]
    fn an_unknown_top_level_key_is_an_error_naming_it() {
        let err = resolve(ServeArgs::default(), "lissten = \"x\"").unwrap_err();
        assert!(format!("{err:#}").contains("lissten"), "{err:#}");
    }

    #[test]
    fn warm_pools_must_leave_room_under_the_live_runtime_cap() {
        let file = "[limits]\nlive_runtimes = 4\n[profiles.a]\ncommand = \"x\"\nwarm_pool = 2\n\
                    sandbox = \"off\"\n[profiles.b]\ncommand = \"x\"\nwarm_pool = 2\n\
                    sandbox = \"off\"";
        let err = resolve(ServeArgs::default(), file).unwrap_err();
        assert!(err.to_string().contains("live_runtimes"), "{err}");
        let config = resolve(
            ServeArgs::default(),
            "[limits]\nlive_runtimes = 4\n[profiles.a]\ncommand = \"x\"\nwarm_pool = 3\nsandbox = \"off\"",
        )
        .unwrap();
        assert_eq!(config.profiles["a"].warm_pool, 3);
    }

    #[test]
    fn profiles_and_limits_come_from_the_file() {
        let config = resolve(
            ServeArgs::default(),
            r#"
            drain_grace = "5s"
            services = ["translator"]
            [limits]
            queued_actions = 10
            [profiles.claude]
            command = "npx"
            args = ["@agentclientprotocol/claude-agent-acp"]
            "#,
        )
        .unwrap();
        assert_eq!(config.drain_grace, Duration::from_secs(5));
        assert!(config.services.translator && !config.services.sessions);
        assert_eq!(config.limits.queued_actions, 10);
        assert_eq!(config.limits.attachments, 32);
        assert_eq!(config.profiles["claude"].args.len(), 1);
    }

    #[test]
    fn tokens_require_every_profile_to_fence_its_cwd() {
        let args = ServeArgs {
            tokens_file: Some("/etc/tokens.toml".into()),
            ..Default::default()
        };
        resolve(args.clone(), "").unwrap();
        let err = resolve(args, "[profiles.p]\ncommand = \"x\"").unwrap_err();
        assert!(err.to_string().contains("allowed_cwd_roots"), "{err}");
    }

    #[test]
    fn half_a_tls_configuration_is_refused() {
        let args = ServeArgs {
            tls_cert: Some("/c.pem".into()),
            ..Default::default()
        };
        assert!(resolve(args, "").is_err());
    }

    #[test]
    fn a_static_files_base_url_must_be_http() {
        assert!(
            resolve(
                ServeArgs::default(),
                "static_files_base_url = \"file:///x\""
            )
            .is_err()
        );
        assert!(
            resolve(
                ServeArgs::default(),
                "static_files_base_url = \"https://s/\""
            )
            .is_ok()
        );
    }
}
