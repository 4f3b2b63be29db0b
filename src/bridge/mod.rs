//! `agent-harness bridge`: runs agents where the code is and dials the harness's
//! `RuntimeGatewayService.Connect`. The harness names one of the bridge's own profiles, a cwd
//! and a session; it never sends a command line.
//!
//! Each runtime has one task: it numbers the agent's stdout lines and keeps the ones the harness
//! has not acknowledged (bounded: when the harness stops acknowledging, the task stops reading
//! the agent, so the agent blocks on its own stdout), writes the harness's stdin lines in order
//! and drops duplicates. When the stream breaks the agents keep running for `reconnect_grace`
//! while the bridge redials with backoff and jitter; the next hello lists them with the last
//! sequence numbers seen, and each side resends what the other did not take.
//!
//! A client of the gateway only: it uses the wire types and the runtime transport (`acp`) to
//! start processes, never the engine.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::Context;
use serde::Deserialize;
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    sync::mpsc,
    time::Instant,
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use crate::{
    acp::{
        RuntimeSpec,
        launch::{self, Launch},
        process::{self, ProcessTable, StderrTail},
        remote::DEFAULT_RECONNECT_GRACE,
    },
    pb::v1::{
        BridgeHello, BridgeRuntime, ConnectRequest, LineAck, RuntimeExited, RuntimeSpawnFailed,
        RuntimeSpawned, RuntimeStdout, SpawnRuntime, connect_request::Frame as Up,
        connect_response::Frame as Down,
        runtime_gateway_service_client::RuntimeGatewayServiceClient,
    },
};

/// Stdout lines kept until the harness acknowledges them, per runtime.
const MAX_UNACKED_LINES: usize = 1024;
/// Messages waiting to go up the stream.
const OUTBOUND_MESSAGES: usize = 256;
/// Events waiting for one runtime task.
const RUNTIME_EVENTS: usize = 64;
/// A line longer than this is cut (the harness then refuses it as not JSON and faults the
/// runtime) rather than sent as a message the harness's size limit would refuse over and over.
const MAX_LINE_BYTES: usize = 4 * 1024 * 1024 - 64 * 1024;
/// How long past a graceful stop's grace a runtime task waits to report the exit.
const STOP_REPORT_MARGIN: Duration = Duration::from_secs(5);
/// Redial backoff: from the first delay, doubling, up to the cap, each with jitter.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_CAP: Duration = Duration::from_secs(10);

/// `agent-harness bridge` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct BridgeArgs {
    /// The harness URL, e.g. https://harness.example:50051 (TLS when the scheme is https)
    #[arg(long, env = "AGENT_HARNESS_BRIDGE_CONNECT")]
    pub connect: String,
    /// A file holding the bridge's token (a tokens-file entry of kind "runtime")
    #[arg(long, env = "AGENT_HARNESS_BRIDGE_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// The bridge's TOML config: `bridge_id`, `labels`, `reconnect_grace`, `[profiles.<name>]`
    #[arg(long, env = "AGENT_HARNESS_BRIDGE_CONFIG")]
    pub config: PathBuf,
    /// A PEM file of the CA that signed the harness's certificate (https URLs), trusted besides
    /// the system's roots
    #[arg(long)]
    pub tls_ca_file: Option<PathBuf>,
}

/// A bridge profile: what to run (as a harness profile says it: a `preset`, or a command,
/// with its environment).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeProfile {
    /// A tested agent whose command line and environment fill in what is left out.
    pub preset: Option<String>,
    pub command: Option<String>,
    pub args: Option<Vec<String>>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The bridge's own variables the runtime gets, when set (API keys).
    #[serde(default)]
    pub env_passthrough: Vec<String>,
    /// Variables read from files when a runtime starts.
    #[serde(default)]
    pub env_files: BTreeMap<String, PathBuf>,
    /// `None`: any absolute directory.
    pub allowed_cwd_roots: Option<Vec<PathBuf>>,
    /// How long its runtimes get between SIGTERM and SIGKILL when the bridge itself goes away
    /// (its watchdog stops them; default "2s"). A stop the harness asks for carries its own grace.
    pub stop_grace: Option<String>,
    /// `"off"`, `"on"` (the default) or the box's settings, as a harness profile has them.
    pub sandbox: Option<toml::Value>,
    /// Where its boxed runtimes may connect, as a harness profile says it.
    pub egress: Option<toml::Value>,
}

impl BridgeProfile {
    /// What it runs: its keys over its preset's.
    pub fn launch(&self, name: &str) -> anyhow::Result<crate::config::Launch> {
        let table = format!("profiles.{name}");
        let preset = crate::config::named_preset(&table, self.preset.as_deref())?;
        crate::config::LaunchKeys {
            command: self.command.clone(),
            args: self.args.clone(),
            env: self.env.clone(),
            env_passthrough: self.env_passthrough.clone(),
            env_files: self.env_files.clone(),
        }
        .resolve(&table, preset)
    }

    /// Its box (`None`: unboxed), checked against the bridge's own files.
    pub fn box_policy(
        &self,
        name: &str,
        defaults: &crate::config::sandbox::SandboxDefaults,
        protected: &[PathBuf],
    ) -> anyhow::Result<Option<crate::acp::sandbox::BoxPolicy>> {
        let table = format!("profiles.{name}");
        let preset = crate::config::named_preset(&table, self.preset.as_deref())?;
        let policy = crate::config::sandbox::box_policy(
            &table,
            self.sandbox.as_ref(),
            self.egress.as_ref(),
            preset,
            defaults,
            Some(protected),
        )?;
        if policy.is_some() && self.env.contains_key("HOME") {
            anyhow::bail!(
                "{table} sets HOME, but a boxed runtime's HOME is its owner's under \
                 sandbox.homes_dir; remove it, or set sandbox = \"off\""
            );
        }
        Ok(policy)
    }

    fn stop_grace(&self) -> anyhow::Result<Duration> {
        let Some(text) = &self.stop_grace else {
            return Ok(process::DEFAULT_STOP_GRACE);
        };
        let grace = humantime::parse_duration(text)
            .with_context(|| format!("stop_grace = {text:?} is not a duration"))?;
        if grace > process::MAX_STOP_GRACE {
            anyhow::bail!(
                "stop_grace = {text:?} is over the maximum of {}",
                humantime::format_duration(process::MAX_STOP_GRACE)
            );
        }
        Ok(grace)
    }
}

/// The bridge's config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeConfig {
    /// Stable across reconnections; default: the host name and a random suffix per process.
    pub bridge_id: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// How long agents outlive a broken stream (default "30s").
    pub reconnect_grace: Option<String>,
    /// Where runtime records live, so leftovers of a crashed bridge are reaped (default: a
    /// directory under the system's temporary directory, per bridge id).
    pub data_dir: Option<PathBuf>,
    /// The boxes its runtimes run in, as a harness's `[sandbox]` (HOMEs default to
    /// `<data_dir>/homes`).
    #[serde(default)]
    pub sandbox: crate::config::sandbox::SandboxFile,
    #[serde(default)]
    pub profiles: BTreeMap<String, BridgeProfile>,
}

impl BridgeConfig {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the bridge config {}", path.display()))?;
        let config: Self = toml::from_str(&text)
            .with_context(|| format!("parsing the bridge config {}", path.display()))?;
        for (name, profile) in &config.profiles {
            let launch = profile.launch(name)?;
            let unset = launch.secrets.unset_passthrough();
            if !unset.is_empty() {
                tracing::info!(profile = %name, unset = ?unset, "env_passthrough: these variables are not set here and are left out");
            }
            profile
                .stop_grace()
                .with_context(|| format!("profiles.{name}"))?;
            for root in profile.allowed_cwd_roots.iter().flatten() {
                if !root.is_absolute() {
                    anyhow::bail!(
                        "profiles.{name}.allowed_cwd_roots holds {root:?}, which is not absolute"
                    );
                }
            }
        }
        Ok(config)
    }
}

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    match ok {
        true if end > 0 => String::from_utf8_lossy(&buf[..end]).into_owned(),
        _ => "bridge".to_owned(),
    }
}

/// What one runtime task is told.
enum Event {
    Stdin {
        seq: u64,
        line: Vec<u8>,
    },
    Ack {
        seq: u64,
    },
    /// Stop the runtime: gracefully with a grace, else at once.
    Kill(Option<Duration>),
    Attached(mpsc::Sender<ConnectRequest>),
    Detached,
}

/// Where a runtime's two directions stand, for the next hello.
#[derive(Default)]
struct Seqs {
    last_stdin: AtomicU64,
    last_stdout: AtomicU64,
}

struct Handle {
    events: mpsc::Sender<Event>,
    seqs: Arc<Seqs>,
    /// The session it was spawned for, named in the hello.
    session_id: String,
}

struct Bridge {
    id: String,
    config: BridgeConfig,
    grace: Duration,
    processes: ProcessTable,
    runtimes: Mutex<HashMap<String, Handle>>,
    sandbox: crate::acp::sandbox::Sandbox,
    /// Each profile's box (`None`: unboxed), by name.
    boxes: BTreeMap<String, Option<crate::acp::sandbox::BoxPolicy>>,
}

/// Runs the bridge until the process is stopped.
pub async fn run(args: BridgeArgs) -> anyhow::Result<()> {
    let config = BridgeConfig::load(&args.config)?;
    let id = config.bridge_id.clone().unwrap_or_else(|| {
        format!(
            "{}-{}",
            host_name(),
            &uuid::Uuid::now_v7().simple().to_string()[20..]
        )
    });
    let grace = match &config.reconnect_grace {
        Some(text) => humantime::parse_duration(text)
            .with_context(|| format!("reconnect_grace = {text:?} is not a duration"))?,
        None => DEFAULT_RECONNECT_GRACE,
    };
    let data_dir = config.data_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("agent-harness-bridge-{}", id.replace('/', "_")))
    });
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    let processes = ProcessTable::open(&data_dir).context("the runtime process table")?;
    processes.reap_leftovers();
    // The bridge's own files stay out of every box: its token, its config, its data dir.
    let protected: Vec<PathBuf> = [
        Some(&data_dir),
        Some(&args.config),
        args.token_file.as_ref(),
    ]
    .into_iter()
    .flatten()
    .chain(config.profiles.values().flat_map(|p| p.env_files.values()))
    .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
    .collect();
    let defaults = config.sandbox.defaults()?;
    let launcher = std::env::current_exe().context("this executable's path")?;
    let settings = config
        .sandbox
        .settings(&data_dir, launcher, protected.clone())?;
    let sandbox = crate::acp::sandbox::Sandbox::new(settings);
    let mut boxes = BTreeMap::new();
    for (name, profile) in &config.profiles {
        let policy = profile.box_policy(name, &defaults, &protected)?;
        match &policy {
            Some(policy) => {
                if let Err(why) = sandbox.check_limits(policy) {
                    tracing::error!(profile = %name, %why, "this profile's limits cannot be applied here: its runtimes will fail to start");
                }
            }
            None => {
                tracing::warn!(profile = %name, "sandbox = \"off\": this profile's agents run as the bridge's user, with its files (its token among them) in reach")
            }
        }
        boxes.insert(name.clone(), policy);
    }
    if boxes.values().any(Option::is_some) {
        sandbox.remove_leftovers(&processes);
        tracing::info!(homes_dir = %sandbox.settings().homes_dir.display(), "sandbox: {}", sandbox.describe());
    }
    let token = match &args.token_file {
        Some(path) => {
            let token = std::fs::read_to_string(path)
                .with_context(|| format!("reading the token file {}", path.display()))?;
            Some(token.trim().to_owned())
        }
        None => None,
    };
    let shown_url = crate::cli::redacted_url(&args.connect);
    if token.is_some()
        && let Some(warning) = crate::cli::cleartext_token_warning(&args.connect)
    {
        tracing::warn!(connect = %shown_url, "{warning}");
    }
    let mut endpoint = Endpoint::from_shared(args.connect.clone())
        .with_context(|| format!("--connect {shown_url:?} is not a URL"))?
        .connect_timeout(Duration::from_secs(10))
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(20));
    if args.connect.starts_with("https://") {
        let mut tls = ClientTlsConfig::new();
        if let Some(ca) = &args.tls_ca_file {
            let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        // The system's roots when the host has any; a sandbox image without them still works
        // with --tls-ca-file.
        endpoint = match endpoint.clone().tls_config(tls.clone().with_native_roots()) {
            Ok(endpoint) => endpoint,
            Err(_) if args.tls_ca_file.is_some() => endpoint.tls_config(tls)?,
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context("no TLS roots: the system has none and --tls-ca-file was not given"));
            }
        };
    }
    tracing::info!(bridge = %id, connect = %shown_url, labels = ?config.labels,
        profiles = ?config.profiles.keys().collect::<Vec<_>>(), "bridge starting");
    let bridge = Arc::new(Bridge {
        id,
        config,
        grace,
        processes,
        runtimes: Mutex::new(HashMap::new()),
        sandbox,
        boxes,
    });
    let mut attempt: u32 = 0;
    loop {
        let connected = bridge
            .session(&endpoint, token.as_deref(), &mut attempt)
            .await;
        match connected {
            Ok(()) => {
                tracing::warn!(bridge = %bridge.id, "the harness ended the stream; redialling")
            }
            Err(error) => match refusal(&error) {
                // Refused, not broken: the operator must act (token, labels, bridge id). The
                // bridge keeps redialling, as an id held by another principal may be freed.
                Some(status) => tracing::error!(bridge = %bridge.id, code = ?status.code(),
                    reason = %status.message(),
                    "the harness refused this bridge (check its token, labels and bridge id); redialling"),
                None => {
                    tracing::warn!(bridge = %bridge.id, error = %format!("{error:#}"), "stream broken; redialling")
                }
            },
        }
        bridge.broadcast(|| Event::Detached).await;
        let delay = backoff(attempt);
        attempt = attempt.saturating_add(1);
        tokio::time::sleep(delay).await;
    }
}

/// The harness's refusal of this bridge (its token, its hello), as opposed to a broken stream.
fn refusal(error: &anyhow::Error) -> Option<&tonic::Status> {
    error
        .chain()
        .filter_map(|cause| cause.downcast_ref::<tonic::Status>())
        .find(|status| {
            matches!(
                status.code(),
                tonic::Code::PermissionDenied
                    | tonic::Code::Unauthenticated
                    | tonic::Code::InvalidArgument
            )
        })
}

/// The delay before redial number `attempt` (0 first): doubling from [`BACKOFF_FIRST`] up to
/// [`BACKOFF_CAP`], then a random half to a whole of it, so many bridges do not redial at once.
fn backoff(attempt: u32) -> Duration {
    let full = BACKOFF_FIRST
        .saturating_mul(1u32 << attempt.min(16))
        .min(BACKOFF_CAP);
    // The low bits of a v7 uuid are random.
    let jitter = ((uuid::Uuid::now_v7().as_u128() & 0xffff_ffff) % 1000) as u32;
    full / 2 + full / 2 * jitter / 1000
}

impl Bridge {
    async fn broadcast(&self, event: impl Fn() -> Event) {
        let senders: Vec<mpsc::Sender<Event>> = {
            let runtimes = self.runtimes.lock().expect("not poisoned");
            runtimes.values().map(|h| h.events.clone()).collect()
        };
        for events in senders {
            let _ = events.send(event()).await;
        }
    }

    fn hello(&self) -> ConnectRequest {
        let running = {
            let runtimes = self.runtimes.lock().expect("not poisoned");
            runtimes
                .iter()
                .map(|(key, h)| BridgeRuntime {
                    runtime_key: key.clone(),
                    last_stdin_seq: h.seqs.last_stdin.load(Ordering::Acquire),
                    last_stdout_seq: h.seqs.last_stdout.load(Ordering::Acquire),
                    session_id: h.session_id.clone(),
                })
                .collect()
        };
        ConnectRequest {
            frame: Some(Up::Hello(BridgeHello {
                bridge_id: self.id.clone(),
                labels: self.config.labels.clone().into_iter().collect(),
                profiles: self.config.profiles.keys().cloned().collect(),
                version: env!("CARGO_PKG_VERSION").to_owned(),
                running,
            })),
        }
    }

    /// One stream: hello, take up the runtimes, then serve the harness's messages until it ends.
    async fn session(
        self: &Arc<Self>,
        endpoint: &Endpoint,
        token: Option<&str>,
        attempt: &mut u32,
    ) -> anyhow::Result<()> {
        let channel = endpoint.connect().await.context("dialling the harness")?;
        let mut client = RuntimeGatewayServiceClient::new(channel)
            .max_decoding_message_size(16 * 1024 * 1024)
            .max_encoding_message_size(16 * 1024 * 1024);
        let (up, up_rx) = mpsc::channel(OUTBOUND_MESSAGES);
        up.send(self.hello()).await.expect("the receiver is here");
        let mut request = tonic::Request::new(ReceiverStream::new(up_rx));
        if let Some(token) = token {
            let value = format!("Bearer {token}")
                .parse()
                .context("the token is not a valid header value")?;
            request.metadata_mut().insert("authorization", value);
        }
        let mut down = client
            .connect(request)
            .await
            .context("Connect refused")?
            .into_inner();
        *attempt = 0;
        tracing::info!(bridge = %self.id, "connected to the harness");
        self.broadcast(|| Event::Attached(up.clone())).await;
        while let Some(message) = down.message().await.context("reading the stream")? {
            match message.frame {
                Some(Down::Spawn(spawn)) => self.spawn(spawn, &up).await,
                Some(Down::Stdin(m)) => {
                    self.tell(
                        &m.runtime_key,
                        Event::Stdin {
                            seq: m.seq,
                            line: m.line,
                        },
                    )
                    .await
                }
                Some(Down::Ack(m)) => self.tell(&m.runtime_key, Event::Ack { seq: m.seq }).await,
                Some(Down::Kill(m)) => {
                    let grace = m.stop_grace.map(duration_from_pb);
                    self.tell(&m.runtime_key, Event::Kill(grace)).await
                }
                None => tracing::warn!(bridge = %self.id, "a message without a frame was ignored"),
            }
        }
        Ok(())
    }

    async fn tell(&self, key: &str, event: Event) {
        let events = {
            let runtimes = self.runtimes.lock().expect("not poisoned");
            runtimes.get(key).map(|h| h.events.clone())
        };
        match events {
            // Waiting here stops the stream being read while one runtime is slow: flow control.
            Some(events) => {
                let _ = events.send(event).await;
            }
            None => {
                tracing::debug!(bridge = %self.id, key, "a message for a runtime this bridge does not run")
            }
        }
    }

    /// Starts a runtime from one of this bridge's profiles, or says why not.
    async fn spawn(self: &Arc<Self>, spawn: SpawnRuntime, up: &mpsc::Sender<ConnectRequest>) {
        let key = spawn.runtime_key.clone();
        let failed = |error: String, stderr_tail: String| ConnectRequest {
            frame: Some(Up::SpawnFailed(RuntimeSpawnFailed {
                runtime_key: key.clone(),
                error,
                stderr_tail,
            })),
        };
        if self
            .runtimes
            .lock()
            .expect("not poisoned")
            .contains_key(&key)
        {
            let _ = up
                .send(failed(
                    format!("runtime key {key} is already in use"),
                    String::new(),
                ))
                .await;
            return;
        }
        let started = self.start(&spawn).await;
        let (child, profile) = match started {
            Ok(started) => started,
            Err(error) => {
                tracing::warn!(bridge = %self.id, session = %spawn.session_id, profile = %spawn.profile, %error, "could not start a runtime");
                let _ = up.send(failed(error, String::new())).await;
                return;
            }
        };
        tracing::info!(bridge = %self.id, session = %spawn.session_id, runtime = %key, profile, started = ?child.described, "runtime started");
        let (events_tx, events_rx) = mpsc::channel(RUNTIME_EVENTS);
        let seqs = Arc::new(Seqs::default());
        self.runtimes.lock().expect("not poisoned").insert(
            key.clone(),
            Handle {
                events: events_tx,
                seqs: seqs.clone(),
                session_id: spawn.session_id.clone(),
            },
        );
        let _ = up
            .send(ConnectRequest {
                frame: Some(Up::Spawned(RuntimeSpawned {
                    runtime_key: key.clone(),
                })),
            })
            .await;
        let task = RuntimeTask {
            key,
            out: Some(up.clone()),
            next_stdout_seq: 1,
            unacked: VecDeque::new(),
            last_stdin_seq: 0,
            seqs,
            grace: self.grace,
            detached_until: None,
        };
        let bridge = self.clone();
        tokio::spawn(async move {
            let key = task.key.clone();
            task.run(child, events_rx).await;
            bridge.runtimes.lock().expect("not poisoned").remove(&key);
        });
    }

    /// Starts a runtime the harness asked for, through the one launch path (boxed unless its
    /// profile says `sandbox = "off"`).
    async fn start(&self, spawn: &SpawnRuntime) -> Result<(launch::Runtime, String), String> {
        // Checking the cwd asks the file system: on a blocking thread, so a slow mount holds up
        // this spawn only, never the worker thread the other runtimes' tasks run on.
        let checked = {
            let (config, request) = (self.config.clone(), spawn.clone());
            let forbidden = self.sandbox.settings().server_paths();
            tokio::task::spawn_blocking(move || check_cwd(&config, &request, &forbidden))
                .await
                .unwrap_or_else(|e| Err(format!("could not start the runtime: {e}")))?
        };
        let profile = &self.config.profiles[&spawn.profile];
        // Checked when the config was loaded.
        let launch = profile
            .launch(&spawn.profile)
            .map_err(|e| format!("{e:#}"))?;
        let command = PathBuf::from(&launch.command);
        let spec = RuntimeSpec {
            command: &command,
            args: &launch.args,
            env: &launch.env,
            secrets: &launch.secrets,
            // Checked when the config was loaded.
            stop_grace: profile.stop_grace().unwrap_or(process::DEFAULT_STOP_GRACE),
        };
        let home = self.sandbox.home_of(&spawn.profile, &spawn.owner);
        let boxed = self
            .boxes
            .get(&spawn.profile)
            .and_then(Option::as_ref)
            .map(|policy| launch::Boxed {
                sandbox: &self.sandbox,
                policy,
                home: &home,
                // A bridge's profiles send no calls through a model proxy (not yet).
                model: None,
            });
        launch::launch(Launch::Local(launch::LocalLaunch {
            runtime: spec,
            profile: &spawn.profile,
            cwd: &checked,
            boxed,
            processes: &self.processes,
            timeout: BOX_TIMEOUT,
        }))
        .await
        .map(|runtime| (runtime, spawn.profile.clone()))
    }
}

/// How long a box may take to be built on a bridge.
const BOX_TIMEOUT: Duration = Duration::from_secs(30);

/// The canonical cwd of a spawn: absolute, a directory, under an allowed root of its profile
/// (`{principal}` expanded for the session's owner) and clear of the bridge's own files.
fn check_cwd(
    config: &BridgeConfig,
    spawn: &SpawnRuntime,
    forbidden: &crate::acp::sandbox::ServerPaths,
) -> Result<PathBuf, String> {
    let Some(profile) = config.profiles.get(&spawn.profile) else {
        let known: Vec<&String> = config.profiles.keys().collect();
        return Err(format!(
            "this bridge has no profile {:?} (it has {known:?})",
            spawn.profile
        ));
    };
    let cwd = Path::new(&spawn.cwd);
    if !cwd.is_absolute() {
        return Err(format!("cwd {:?} is not absolute", spawn.cwd));
    }
    let canonical = std::fs::canonicalize(cwd)
        .map_err(|e| format!("cwd {:?} cannot be used here: {e}", spawn.cwd))?;
    if !canonical.is_dir() {
        return Err(format!("cwd {:?} is not a directory", spawn.cwd));
    }
    let roots = profile
        .allowed_cwd_roots
        .as_deref()
        .map(|roots| crate::acp::sandbox::workspace_roots(roots, &spawn.owner));
    let clear = !forbidden.clash_with(&canonical);
    let under_a_root = roots.as_ref().is_none_or(|roots| {
        roots
            .iter()
            .any(|root| std::fs::canonicalize(root).is_ok_and(|root| canonical.starts_with(root)))
    });
    if !clear || !under_a_root {
        return Err(format!(
            "cwd {:?} is not under an allowed root of profile {}",
            spawn.cwd, spawn.profile
        ));
    }
    Ok(canonical)
}

/// One runtime's side of the bridge (module doc).
struct RuntimeTask {
    key: String,
    out: Option<mpsc::Sender<ConnectRequest>>,
    next_stdout_seq: u64,
    unacked: VecDeque<(u64, Vec<u8>)>,
    last_stdin_seq: u64,
    seqs: Arc<Seqs>,
    grace: Duration,
    detached_until: Option<Instant>,
}

impl RuntimeTask {
    async fn send(&mut self, message: ConnectRequest) {
        if let Some(out) = &self.out
            && out.send(message).await.is_err()
        {
            self.out = None;
        }
    }

    async fn run(mut self, child: launch::Runtime, mut events: mpsc::Receiver<Event>) {
        let launch::Runtime {
            stdin,
            stdout,
            stderr,
            mut killer,
            mut exited,
            ..
        } = child;
        let mut stdin = Some(stdin);
        let mut stdout = BufReader::with_capacity(64 * 1024, stdout);
        let mut line = Vec::new();
        let mut stdout_done = false;
        let mut exit_message: Option<ConnectRequest> = None;
        // Set by a graceful stop: when to give up waiting for the runtime's exit to report.
        let mut stop_deadline: Option<Instant> = None;
        loop {
            let can_read = self.out.is_some() && self.unacked.len() < MAX_UNACKED_LINES;
            let grace_end = self.detached_until;
            tokio::select! {
                event = events.recv() => {
                    let Some(event) = event else { break };
                    match event {
                        Event::Kill(None) => break,
                        Event::Kill(Some(grace)) => {
                            if stop_deadline.is_none() {
                                // Stdin closed and SIGTERM now; the exit is reported as any exit
                                // is, once the runtime (SIGKILLed after the grace) is gone.
                                stdin = None;
                                killer.stop(grace);
                                stop_deadline = Some(Instant::now() + grace + STOP_REPORT_MARGIN);
                            }
                        }
                        Event::Stdin { seq, line } => self.on_stdin(&mut stdin, seq, line).await,
                        Event::Ack { seq } => {
                            while self.unacked.front().is_some_and(|(s, _)| *s <= seq) {
                                self.unacked.pop_front();
                            }
                        }
                        Event::Attached(out) => {
                            self.out = Some(out);
                            self.detached_until = None;
                            let resend: Vec<(u64, Vec<u8>)> = self.unacked.iter().cloned().collect();
                            for (seq, line) in resend {
                                self.send(stdout_message(&self.key, seq, line)).await;
                            }
                            if let Some(exit) = exit_message.clone() {
                                self.send(exit).await;
                                if self.out.is_some() {
                                    break;
                                }
                            }
                        }
                        Event::Detached => {
                            self.out = None;
                            self.detached_until = Some(Instant::now() + self.grace);
                        }
                    }
                }
                read = read_line(&mut stdout, &mut line), if can_read && !stdout_done => {
                    match read {
                        Some(()) => {
                            let seq = self.next_stdout_seq;
                            self.next_stdout_seq += 1;
                            let text = std::mem::take(&mut line);
                            self.unacked.push_back((seq, text.clone()));
                            self.seqs.last_stdout.store(seq, Ordering::Release);
                            self.send(stdout_message(&self.key, seq, text)).await;
                        }
                        None => stdout_done = true,
                    }
                }
                status = &mut exited, if stdout_done && exit_message.is_none() => {
                    let exit = exit_of(&self.key, status.ok().and_then(Result::ok), &stderr).await;
                    exit_message = Some(exit.clone());
                    self.send(exit).await;
                    if self.out.is_some() {
                        break;
                    }
                }
                () = sleep_until(grace_end), if grace_end.is_some() => {
                    tracing::warn!(runtime = %self.key, "the harness did not come back within reconnect_grace: stopping the runtime");
                    break;
                }
                () = sleep_until(stop_deadline), if stop_deadline.is_some() => {
                    tracing::warn!(runtime = %self.key, "no exit to report after a graceful stop; giving up on it");
                    break;
                }
            }
        }
        // After a graceful stop this does nothing: the stop runs its course.
        killer.kill();
        drop(killer);
    }

    async fn on_stdin(
        &mut self,
        stdin: &mut Option<Box<dyn tokio::io::AsyncWrite + Unpin + Send>>,
        seq: u64,
        line: Vec<u8>,
    ) {
        if seq <= self.last_stdin_seq {
            return; // a duplicate of a resent line
        }
        if seq != self.last_stdin_seq + 1 {
            tracing::warn!(runtime = %self.key, seq, last = self.last_stdin_seq, "the harness skipped stdin lines; ignored");
            return;
        }
        self.last_stdin_seq = seq;
        self.seqs.last_stdin.store(seq, Ordering::Release);
        if let Some(pipe) = stdin {
            let written = async {
                pipe.write_all(&line).await?;
                pipe.write_all(b"\n").await?;
                pipe.flush().await
            };
            // An agent that stopped reading has exited or will: its exit is reported then.
            if written.await.is_err() {
                *stdin = None;
            }
        }
        self.send(ConnectRequest {
            frame: Some(Up::Ack(LineAck {
                runtime_key: self.key.clone(),
                seq,
            })),
        })
        .await;
    }
}

/// A duration from the wire; a negative one is none.
fn duration_from_pb(duration: prost_types::Duration) -> Duration {
    let seconds = u64::try_from(duration.seconds).unwrap_or(0);
    let nanos = u32::try_from(duration.nanos).unwrap_or(0).min(999_999_999);
    Duration::new(seconds, nanos).min(process::MAX_STOP_GRACE)
}

fn stdout_message(key: &str, seq: u64, line: Vec<u8>) -> ConnectRequest {
    ConnectRequest {
        frame: Some(Up::Stdout(RuntimeStdout {
            runtime_key: key.to_owned(),
            seq,
            line,
        })),
    }
}

async fn exit_of(
    key: &str,
    status: Option<std::process::ExitStatus>,
    stderr: &StderrTail,
) -> ConnectRequest {
    use std::os::unix::process::ExitStatusExt;
    stderr.closed(Duration::from_millis(500)).await;
    ConnectRequest {
        frame: Some(Up::Exited(RuntimeExited {
            runtime_key: key.to_owned(),
            code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| s.signal()),
            stderr_tail: stderr.text(2000),
        })),
    }
}

/// One line of the agent's stdout without its ending, cut at [`MAX_LINE_BYTES`]; `None` at the
/// end of the output.
async fn read_line(
    stdout: &mut BufReader<Box<dyn tokio::io::AsyncRead + Unpin + Send>>,
    line: &mut Vec<u8>,
) -> Option<()> {
    loop {
        let available = stdout.fill_buf().await.ok()?;
        if available.is_empty() {
            return (!line.is_empty()).then_some(());
        }
        let (take, found) = match available.iter().position(|b| *b == b'\n') {
            Some(i) => (i, true),
            None => (available.len(), false),
        };
        let room = MAX_LINE_BYTES.saturating_sub(line.len());
        line.extend_from_slice(&available[..take.min(room)]);
        stdout.consume(take + usize::from(found));
        if found {
            while line.last() == Some(&b'\r') {
                line.pop();
            }
            return Some(());
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_the_bridges_config_is_documented_with_its_default() {
        use crate::config::reference::{check, duration, fields_of, text};
        let profile: BridgeProfile = toml::from_str("command = \"agent\"").unwrap();
        let boxed = profile
            .box_policy("p", &Default::default(), &[])
            .unwrap()
            .is_some();
        let mut problems = check(
            "The bridge's config file",
            fields_of::<BridgeConfig>(),
            &[
                ("bridge_id", None),
                ("labels", None),
                ("reconnect_grace", duration(DEFAULT_RECONNECT_GRACE)),
                ("data_dir", None),
                ("sandbox", None),
                ("profiles", None),
            ]
            .into_iter()
            .collect(),
        );
        problems.extend(check(
            "A bridge's `[profiles.<name>]`",
            fields_of::<BridgeProfile>(),
            &[
                ("preset", None),
                ("command", None),
                ("args", None),
                ("env", None),
                ("env_passthrough", None),
                ("env_files", None),
                ("allowed_cwd_roots", None),
                ("stop_grace", duration(profile.stop_grace().unwrap())),
                ("sandbox", text("on").filter(|_| boxed)),
                ("egress", None),
            ]
            .into_iter()
            .collect(),
        ));
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_and_never_drops_below_half() {
        for attempt in 0..40 {
            let full = BACKOFF_FIRST
                .saturating_mul(1u32 << attempt.min(16))
                .min(BACKOFF_CAP);
            let delay = backoff(attempt);
            assert!(delay >= full / 2 && delay <= full, "{attempt}: {delay:?}");
        }
        assert!(backoff(30) <= BACKOFF_CAP);
    }

    #[test]
    fn a_bridge_config_reads_labels_and_profiles_and_refuses_unknown_keys() {
        let config: BridgeConfig = toml::from_str(
            r#"labels = { pool = "sandbox" }
               reconnect_grace = "5s"
               [profiles.mock]
               command = "/usr/bin/agent-harness"
               args = ["mock-agent", "--resume"]"#,
        )
        .unwrap();
        assert_eq!(config.labels["pool"], "sandbox");
        assert_eq!(
            config.profiles["mock"].launch("mock").unwrap().args.len(),
            2
        );
        let err = toml::from_str::<BridgeConfig>("bogus = 1").unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
    }

    #[test]
    fn a_bridge_profile_may_name_a_preset_and_pass_secrets_through_or_read_them_from_files() {
        let config: BridgeConfig = toml::from_str(
            r#"[profiles.claude]
               preset = "claude"
               env_files = { ANTHROPIC_API_KEY = "/run/secrets/anthropic" }"#,
        )
        .unwrap();
        let launch = config.profiles["claude"].launch("claude").unwrap();
        assert_eq!(launch.command, "npx");
        assert!(launch.args.iter().any(|a| a.ends_with("@0.101.0")));
        assert_eq!(launch.env["DISABLE_AUTOUPDATER"], "1");
        // The file replaces the preset's passthrough of the same variable.
        assert!(
            !launch
                .secrets
                .passthrough
                .contains(&"ANTHROPIC_API_KEY".to_owned())
        );
        assert!(launch.secrets.files.contains_key("ANTHROPIC_API_KEY"));
        let unknown: BridgeConfig = toml::from_str("[profiles.x]\npreset = \"nope\"").unwrap();
        let err = unknown.profiles["x"].launch("x").unwrap_err().to_string();
        assert!(
            err.contains("profiles.x.preset") && err.contains("claude"),
            "{err}"
        );
    }
}
