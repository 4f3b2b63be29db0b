//! The harness's side of a box: it decides what the box holds (mounts, ids, limits, network),
//! prepares the HOME and the cgroup, starts the launcher as the runtime's process, tells it the
//! spec, waits for its answer, and serves the box's network (the egress proxy, forwards). What
//! is left once the runtime is gone (the cgroup, the network tasks) goes with it.

use crate::model_proxy::MODEL_PROXY_PORT;
use std::{
    ffi::OsString,
    io,
    net::SocketAddr,
    os::fd::{AsRawFd, OwnedFd},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::task::JoinHandle;

use super::{
    cgroup::{Cgroups, RuntimeCgroup},
    egress::{self, EgressPolicy, PROXY_PORT},
    homes,
    policy::{BoxPolicy, Egress},
    spec::{Access, BoxMount, BoxNetwork, BoxReply, BoxSpec, MAX_MESSAGE_BYTES},
    sys,
};
use crate::acp::{
    RuntimeSpec,
    process::{self, ProcessTable, SpawnedRuntime},
};

/// The system paths every box shows read-only, where the host has them.
const SYSTEM_PATHS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// What of `/etc` a box shows: what programs need to run (the loader, certificates, time zone,
/// name service switches, alternatives), never the host's users, keys or secrets.
const ETC_PATHS: &[&str] = &[
    "/etc/alternatives",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
    "/etc/crypto-policies",
    "/etc/debian_version",
    "/etc/gai.conf",
    "/etc/host.conf",
    "/etc/inputrc",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/mime.types",
    "/etc/nsswitch.conf",
    "/etc/os-release",
    "/etc/pki",
    "/etc/profile",
    "/etc/protocols",
    "/etc/services",
    "/etc/ssl",
    "/etc/terminfo",
    "/etc/timezone",
];

/// The variables a box adds to a runtime's environment besides its profile's (and `PATH`,
/// `HOME`, `LANG`): who the agent is, and where its proxy is.
pub const BOX_VARIABLES: &[&str] = &[
    "USER",
    "LOGNAME",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// The user and group the agents run as when the server is root (unless configured).
pub const DEFAULT_AGENT_ID: u32 = 65532;

/// How long a runtime's end waits for its box to empty after the launcher ended (the kernel
/// kills what is left at once; this bounds a stuck teardown, e.g. a process in uninterruptible
/// sleep on a hung mount).
const BOX_END_WAIT: Duration = Duration::from_secs(10);

/// The box settings shared by every profile of a server (or bridge).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSettings {
    /// The executable with the `sandbox-exec` subcommand (this very binary).
    pub launcher: PathBuf,
    /// Where HOMEs are kept (`<homes_dir>/<profile>/<owner>`).
    pub homes_dir: PathBuf,
    /// The agents' uid and gid when the server is root.
    pub uid: u32,
    pub gid: u32,
    /// The parent cgroup of the runtimes' cgroups, inside each hierarchy; `None`: under the
    /// server's own.
    pub cgroup: Option<PathBuf>,
    /// A shared npm cache every box shows read-only (where presets run `npx`).
    pub npm_cache: Option<PathBuf>,
    /// Paths no box may show: the data dir, the config and tokens files, TLS keys, every
    /// profile's `env_files`. Hidden where they lie under something a box shows.
    pub protected: Vec<PathBuf>,
    /// Where the model proxy keeps its tokens' key (in the data dir, which no box shows).
    pub model_key_file: Option<PathBuf>,
    /// The model proxy's timeout and body cap (`[model_proxy]`).
    pub model_limits: crate::model_proxy::Limits,
}

impl SandboxSettings {
    /// The paths no session's cwd may clash with.
    pub fn server_paths(&self) -> super::ServerPaths {
        super::ServerPaths {
            protected: self.protected.clone(),
            homes_dir: self.homes_dir.clone(),
        }
    }
}

/// The boxes of one server: its settings, the cgroup hierarchies found, and the addresses of
/// the harness itself (never reachable from a box).
#[derive(Debug)]
pub struct Sandbox {
    settings: SandboxSettings,
    cgroups: Cgroups,
    as_root: bool,
    harness: Mutex<Vec<SocketAddr>>,
    /// The model proxy's shared parts, for boxes whose profile sends calls through it.
    model: crate::model_proxy::Shared,
}

/// The routes of one box's model proxy at this start, with the providers' real keys it holds.
type ModelRoutes = Vec<crate::model_proxy::ActiveRoute>;

/// One runtime to start in a box.
#[derive(Debug, Clone, Copy)]
pub struct BoxLaunch<'a> {
    pub runtime: RuntimeSpec<'a>,
    pub policy: &'a BoxPolicy,
    pub profile: &'a str,
    /// Canonical and checked.
    pub cwd: &'a Path,
    pub home: &'a Path,
    /// How long the box may take to answer.
    pub timeout: Duration,
    /// The session whose model calls the box's model proxy serves (`None`: a box without one,
    /// as the probe's).
    pub model: Option<&'a crate::model_proxy::ModelCalls>,
}

impl Sandbox {
    pub fn new(settings: SandboxSettings) -> Self {
        let cgroups = Cgroups::detect(settings.cgroup.as_deref());
        // SAFETY: a plain getter.
        let as_root = unsafe { libc::geteuid() } == 0;
        let model =
            crate::model_proxy::Shared::new(settings.model_key_file.clone(), settings.model_limits);
        Self {
            settings,
            cgroups,
            as_root,
            harness: Mutex::new(Vec::new()),
            model,
        }
    }

    pub fn settings(&self) -> &SandboxSettings {
        &self.settings
    }

    /// The harness's own listening addresses, once it is bound.
    pub fn set_harness_addresses(&self, addresses: Vec<SocketAddr>) {
        *self.harness.lock().expect("not poisoned") = addresses;
    }

    /// The uid and gid agents run as.
    pub fn agent_ids(&self) -> (u32, u32) {
        if self.as_root {
            (self.settings.uid, self.settings.gid)
        } else {
            // SAFETY: plain getters.
            unsafe { (libc::geteuid(), libc::getegid()) }
        }
    }

    /// Where `owner`'s runtimes of `profile` keep their HOME.
    pub fn home_of(&self, profile: &str, owner: &str) -> PathBuf {
        homes::home_path(&self.settings.homes_dir, profile, owner)
    }

    /// Removes runtime cgroups an earlier process on this data dir left (empty ones), never
    /// another server's or this one's. How many.
    pub fn remove_leftovers(&self, processes: &ProcessTable) -> usize {
        let (ours, current) = processes.marker_prefixes();
        let (ours, current) = (ours.replace('/', "-"), current.replace('/', "-"));
        self.cgroups
            .remove_leftovers(|name| name.starts_with(&ours) && !name.starts_with(&current))
    }

    /// One line for the start log: what a box enforces on this machine.
    pub fn describe(&self) -> String {
        let (uid, gid) = self.agent_ids();
        format!(
            "user, mount, PID, IPC, UTS, cgroup and network namespaces; seccomp; no capabilities; \
             agents as uid {uid} gid {gid}{}; cgroups: {}",
            if self.as_root {
                " with their cwd id-mapped"
            } else {
                " (the server's own, in a user namespace)"
            },
            self.cgroups.describe()
        )
    }

    /// Whether `limits` can be enforced here; why not.
    pub fn check_limits(&self, policy: &BoxPolicy) -> Result<(), String> {
        self.cgroups.check(&policy.limits)
    }

    /// Starts `launch`'s program in a new box. The error says what could not be done.
    pub async fn spawn(
        &self,
        launch: BoxLaunch<'_>,
        processes: &ProcessTable,
    ) -> Result<SpawnedRuntime, String> {
        let marker = processes.next_marker();
        let policy = launch.policy;
        let owner_ids = self.as_root.then(|| self.agent_ids());
        // The HOME and the cgroup, on a blocking thread (a slow disk must not stall a worker).
        let prepared = {
            let home = launch.home.to_path_buf();
            let seed = policy.home_seed.clone();
            let cgroups = self.cgroups.clone();
            let limits = policy.limits;
            // Named by the runtime's marker (data dir, instance, number): a later start on the
            // same data dir knows its leftovers by it, and never touches another server's.
            let name = marker.replace('/', "-");
            tokio::task::spawn_blocking(move || {
                homes::prepare_home(&home, seed.as_deref(), owner_ids)
                    .map_err(|e| format!("could not prepare the agent's HOME: {e}"))?;
                cgroups
                    .create(&name, &limits)
                    .map_err(|e| format!("could not apply the profile's limits: {e}"))
            })
            .await
            .map_err(|e| e.to_string())??
        };
        let cgroup = prepared.map(Arc::new);
        let (spec, model_routes) = self.spec(&launch, &marker, cgroup.as_deref())?;
        let (ours, theirs) = sys::socket_pair().map_err(|e| e.to_string())?;
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let box_init: Arc<Mutex<Option<OwnedFd>>> = Arc::default();
        let aftercare: process::Aftercare = {
            let cgroup = cgroup.clone();
            let tasks = tasks.clone();
            let box_init = box_init.clone();
            Box::new(move || {
                for task in tasks.lock().expect("not poisoned").drain(..) {
                    task.abort();
                }
                // The launcher is gone; the runtime has ended only once its box has. When the
                // launcher was killed, init dies of that too (and takes the box with it): wait
                // for it, so nothing of the runtime outlives its reported end.
                if let Some(init) = box_init.lock().expect("not poisoned").take() {
                    sys::pidfd_kill(&init);
                    if !sys::pidfd_wait(&init, BOX_END_WAIT) {
                        tracing::warn!("a box outlived its launcher by over {BOX_END_WAIT:?}");
                    }
                }
                let cgroup = cgroup?;
                let reason = cgroup.memory_exceeded();
                cgroup.remove();
                reason
            })
        };
        let launcher_args = ["sandbox-exec".to_owned()];
        let path_env = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
        let spawned = process::start(
            process::Program {
                path: &self.settings.launcher,
                args: &launcher_args,
                env: vec![(OsString::from("PATH"), path_env)],
                cwd: Path::new("/"),
                marker,
                stop_grace: launch.runtime.stop_grace,
                control: Some(theirs.as_raw_fd()),
            },
            processes,
            Some(aftercare),
        )
        .map_err(|e| {
            format!(
                "could not start the sandbox launcher {}: {e}",
                self.settings.launcher.display()
            )
        })?;
        drop(theirs);
        let answer = tokio::time::timeout(launch.timeout, converse(ours, &spec)).await;
        let (reply, listeners) = match answer {
            Ok(Ok(answer)) => answer,
            Ok(Err(why)) => return Err(fail(spawned, why).await),
            Err(_) => {
                return Err(fail(
                    spawned,
                    format!(
                        "the box did not answer within {}",
                        humantime::format_duration(launch.timeout)
                    ),
                )
                .await);
            }
        };
        if let BoxReply::Failed { error } = reply {
            return Err(fail(spawned, format!("the box could not be built: {error}")).await);
        }
        let mut listeners = listeners;
        match listeners.pop() {
            Some(init) => *box_init.lock().expect("not poisoned") = Some(init),
            None => return Err(fail(spawned, "the box's init: pidfd missing".to_owned()).await),
        }
        if let Some(cgroup) = &cgroup {
            watch_memory(cgroup, &spawned, &tasks);
        }
        if let (Egress::Allow(rules), BoxNetwork::Own { listen }) = (&policy.egress, &spec.network)
        {
            let policy = Arc::new(EgressPolicy {
                profile: launch.profile.to_owned(),
                rules: rules.clone(),
                harness: self.harness.lock().expect("not poisoned").clone(),
            });
            if listeners.len() != listen.len() {
                return Err(fail(spawned, "the box's network: sockets missing".to_owned()).await);
            }
            let listeners = match listeners
                .into_iter()
                .map(tcp_listener)
                .collect::<io::Result<Vec<_>>>()
            {
                Ok(listeners) => listeners,
                Err(e) => return Err(fail(spawned, format!("the box's network: {e}")).await),
            };
            let model_client = match launch.model.filter(|_| !model_routes.is_empty()) {
                Some(_) => match self.model.client() {
                    Ok(client) => Some(client),
                    Err(why) => {
                        return Err(fail(spawned, format!("the model proxy: {why}")).await);
                    }
                },
                None => None,
            };
            if let Some(calls) = launch.model {
                calls
                    .proxied
                    .store(model_client.is_some(), std::sync::atomic::Ordering::SeqCst);
            }
            let mut tasks = tasks.lock().expect("not poisoned");
            for (port, listener) in listen.iter().zip(listeners) {
                if *port == PROXY_PORT {
                    tasks.push(egress::serve_proxy(listener, policy.clone()));
                } else if *port == MODEL_PROXY_PORT
                    && let (Some(calls), Some(client)) = (launch.model, model_client.clone())
                {
                    let upstreams = model_routes
                        .iter()
                        .map(|route| (route.provider, route.upstream.clone()))
                        .collect();
                    let proxy = crate::model_proxy::BoxProxy {
                        session: calls.session,
                        profile: launch.profile.to_owned(),
                        upstreams,
                        tokens: self.model.tokens(),
                        meter: calls.meter.clone(),
                        client,
                        limits: self.model.limits,
                    };
                    tasks.push(crate::model_proxy::serve(listener, Arc::new(proxy)));
                } else if let Some(target) = rules
                    .iter()
                    .filter_map(|r| r.loopback_forward())
                    .find(|(_, p)| p == port)
                {
                    tasks.push(egress::serve_forward(
                        listener,
                        SocketAddr::new(target.0, target.1),
                    ));
                }
            }
        }
        Ok(spawned)
    }

    /// Starts a box of `policy` once, with the probe (`sandbox-probe`) in place of `runtime`'s
    /// agent, in a throwaway cwd and HOME: what `agent-harness profiles --check` reports.
    pub async fn check(
        &self,
        profile: &str,
        runtime: RuntimeSpec<'_>,
        policy: &BoxPolicy,
        timeout: Duration,
    ) -> Result<super::probe::ProbeReport, String> {
        let base = std::env::temp_dir().join(format!(
            "agent-harness-check-{}",
            uuid::Uuid::now_v7().simple()
        ));
        let result = self
            .check_in(&base, profile, runtime, policy, timeout)
            .await;
        let _ = std::fs::remove_dir_all(&base);
        result
    }

    async fn check_in(
        &self,
        base: &Path,
        profile: &str,
        runtime: RuntimeSpec<'_>,
        policy: &BoxPolicy,
        timeout: Duration,
    ) -> Result<super::probe::ProbeReport, String> {
        use tokio::io::AsyncReadExt;
        let cwd = base.join("work");
        std::fs::create_dir_all(&cwd).map_err(|e| e.to_string())?;
        let cwd = std::fs::canonicalize(&cwd).map_err(|e| e.to_string())?;
        let home = cwd.with_file_name("home");
        let processes = ProcessTable::open(&base.join("state")).map_err(|e| e.to_string())?;
        let args = vec![
            "sandbox-probe".to_owned(),
            runtime.command.to_string_lossy().into_owned(),
        ];
        let probe = RuntimeSpec {
            command: &self.settings.launcher,
            args: &args,
            ..runtime
        };
        let launch = BoxLaunch {
            runtime: probe,
            policy,
            profile,
            cwd: &cwd,
            home: &home,
            timeout,
            model: None,
        };
        let mut spawned = self.spawn(launch, &processes).await?;
        drop(spawned.stdin);
        let mut output = Vec::new();
        let mut limited = (&mut spawned.stdout).take(64 * 1024);
        let read = limited.read_to_end(&mut output);
        if tokio::time::timeout(timeout, read).await.is_err() {
            spawned.killer.kill();
            return Err("the probe did not answer in time".into());
        }
        let _ = tokio::time::timeout(timeout, &mut spawned.exited).await;
        let text = String::from_utf8_lossy(&output);
        let line = text.lines().last().unwrap_or_default();
        serde_json::from_str(line).map_err(|_| {
            format!(
                "the probe said nothing understood ({line:?}); stderr: {}",
                spawned.stderr.text(500)
            )
        })
    }

    /// The spec of `launch`'s box.
    /// With it, the providers' real keys, which the model proxy holds and the box never sees.
    fn spec(
        &self,
        launch: &BoxLaunch<'_>,
        marker: &str,
        cgroup: Option<&RuntimeCgroup>,
    ) -> Result<(BoxSpec, ModelRoutes), String> {
        let policy = launch.policy;
        let runtime = launch.runtime;
        let mut env: Vec<(String, String)> = Vec::new();
        let mut set = |key: &str, value: String| {
            env.retain(|(k, _)| k != key);
            env.push((key.to_owned(), value));
        };
        let home = launch.home.to_string_lossy().into_owned();
        let resolved =
            process::runtime_env(runtime.env, runtime.secrets).map_err(|e| e.to_string())?;
        // The keys the model proxy holds (their variables get the session's token below), and
        // where each provider's calls go.
        let var = |name: &str| {
            resolved
                .iter()
                .find(|(k, _)| *k == *name)
                .map(|(_, v)| v.to_string_lossy().into_owned())
        };
        let mut model_routes = ModelRoutes::new();
        // Only a session's box has a proxy: a bridge's runtime (or the probe) keeps its key.
        if launch.model.is_some() && !matches!(policy.egress, Egress::Open) {
            for route in &policy.model {
                model_routes.extend(route.at_start(var)?);
            }
        }
        for (key, value) in resolved {
            let key = key.to_string_lossy().into_owned();
            let value = value.to_string_lossy().replace("{home}", &home);
            set(&key, value);
        }
        // What the box adds is listed in BOX_VARIABLES.
        set("HOME", home.clone());
        set("USER", "agent".to_owned());
        set("LOGNAME", "agent".to_owned());
        set(process::MARKER_VAR, marker.to_owned());
        set(
            process::STOP_GRACE_VAR,
            runtime.stop_grace.as_millis().to_string(),
        );
        let network = match &policy.egress {
            Egress::Open => BoxNetwork::Host,
            Egress::Allow(rules) => {
                let proxy = format!("http://127.0.0.1:{PROXY_PORT}");
                for key in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
                    set(key, proxy.clone());
                }
                for key in ["NO_PROXY", "no_proxy"] {
                    set(key, "localhost,127.0.0.1,::1".to_owned());
                }
                let mut listen = vec![PROXY_PORT];
                listen.extend(
                    rules
                        .iter()
                        .filter_map(|r| r.loopback_forward())
                        .map(|(_, p)| p),
                );
                listen.dedup();
                if !model_routes.is_empty() {
                    let token = launch
                        .model
                        .map(|calls| self.model.tokens().token(calls.session))
                        .expect("routes are taken only for a session's box");
                    let origin = format!("http://127.0.0.1:{MODEL_PROXY_PORT}");
                    for route in &model_routes {
                        // Never the real key: the session's token.
                        set(&route.key_var, token.clone());
                        set(route.provider.base_var(), route.provider.base_url(&origin));
                    }
                    listen.push(MODEL_PROXY_PORT);
                }
                BoxNetwork::Own { listen }
            }
        };
        let (uid, gid) = self.agent_ids();
        let spec = BoxSpec {
            program: runtime.command.to_string_lossy().into_owned(),
            args: runtime.args.to_vec(),
            env,
            cwd: launch.cwd.to_path_buf(),
            home: launch.home.to_path_buf(),
            mounts: self.mounts(launch),
            uid,
            gid,
            hostname: "agent".to_owned(),
            cgroups: cgroup.map(|c| c.dirs().to_vec()).unwrap_or_default(),
            network,
            nested: policy.nested,
        };
        Ok((spec, model_routes))
    }

    /// What of the host the box shows: the system read-only, the program itself when it lies
    /// outside that (this very binary for the built-in `mock`), the profile's paths, the shared
    /// npm cache; and hidden, every protected path that lies under one of them.
    fn mounts(&self, launch: &BoxLaunch<'_>) -> Vec<BoxMount> {
        let policy = launch.policy;
        let system = |path: &str| BoxMount {
            path: PathBuf::from(path),
            access: Access::ReadOnly,
            follow_links: true,
        };
        let mut mounts: Vec<BoxMount> = SYSTEM_PATHS
            .iter()
            .chain(ETC_PATHS)
            .filter(|p| std::fs::symlink_metadata(p).is_ok())
            .map(|p| system(p))
            .collect();
        let shown = |mounts: &[BoxMount], path: &Path| {
            mounts.iter().any(|m| {
                m.access != Access::Hidden
                    && path.starts_with(&m.path)
                    && !std::fs::symlink_metadata(&m.path).is_ok_and(|meta| meta.is_symlink())
            })
        };
        let named = |path: &Path, access| BoxMount {
            path: path.to_path_buf(),
            access,
            follow_links: false,
        };
        for path in &policy.read_only {
            mounts.push(named(path, Access::ReadOnly));
        }
        for path in &policy.read_write {
            mounts.push(named(path, Access::ReadWrite));
        }
        if let Some(cache) = &self.settings.npm_cache {
            // npm writes to its cache even to read it: the box writes to a layer of its own.
            mounts.push(named(cache, Access::Layered));
        }
        // The program itself when it lies outside what is shown, and this very binary (the
        // built-in `mock` agent, wrappers that run it): neither holds anything of the server's.
        let programs = [launch.runtime.command, self.settings.launcher.as_path()];
        for program in programs {
            if program.is_absolute()
                && let Ok(program) = std::fs::canonicalize(program)
                && !shown(&mounts, &program)
            {
                mounts.push(named(&program, Access::ReadOnly));
            }
        }
        // The server's own files stay out of sight even when they lie under something shown
        // (a data dir under /usr, a key under a tools folder, the data dir of a server started
        // in the project its sessions work in).
        let hidden: Vec<BoxMount> = self
            .settings
            .protected
            .iter()
            .chain(std::iter::once(&self.settings.homes_dir))
            .filter(|p| (shown(&mounts, p) || p.starts_with(launch.cwd)) && p.exists())
            .map(|p| BoxMount {
                path: p.clone(),
                access: Access::Hidden,
                follow_links: false,
            })
            .collect();
        mounts.extend(hidden);
        mounts
    }
}

/// Sends the spec and reads the one answer, with the listening sockets that travel with it.
async fn converse(socket: OwnedFd, spec: &BoxSpec) -> Result<(BoxReply, Vec<OwnedFd>), String> {
    let socket = std::os::unix::net::UnixStream::from(socket);
    socket.set_nonblocking(true).map_err(|e| e.to_string())?;
    let socket = tokio::net::UnixStream::from_std(socket).map_err(|e| e.to_string())?;
    let mut line = serde_json::to_vec(spec).map_err(|e| e.to_string())?;
    line.push(b'\n');
    let mut written = 0;
    while written < line.len() {
        socket.writable().await.map_err(|e| e.to_string())?;
        match socket.try_write(&line[written..]) {
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(format!("could not send the box's spec: {e}")),
        }
    }
    let mut bytes = Vec::new();
    let mut fds = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        socket.readable().await.map_err(|e| e.to_string())?;
        let received = socket.try_io(tokio::io::Interest::READABLE, || {
            sys::recv_with_fds(socket.as_raw_fd(), &mut buf)
        });
        let (n, more) = match received {
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(format!("reading the box's answer: {e}")),
        };
        fds.extend(more);
        if n == 0 {
            return Err("the sandbox launcher ended without answering".into());
        }
        bytes.extend_from_slice(&buf[..n]);
        if bytes.len() > MAX_MESSAGE_BYTES {
            return Err("the box's answer is over its size limit".into());
        }
        if let Some(end) = bytes.iter().position(|b| *b == b'\n') {
            let reply = serde_json::from_slice(&bytes[..end])
                .map_err(|e| format!("the box's answer is not understood: {e}"))?;
            return Ok((reply, fds));
        }
    }
}

fn tcp_listener(fd: OwnedFd) -> io::Result<tokio::net::TcpListener> {
    let listener = std::net::TcpListener::from(fd);
    listener.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(listener)
}

/// Stops a runtime whose box failed and says why, with what it wrote to stderr.
async fn fail(mut spawned: SpawnedRuntime, why: String) -> String {
    spawned.killer.kill();
    let _ = tokio::time::timeout(Duration::from_secs(5), &mut spawned.exited).await;
    spawned.stderr.closed(Duration::from_millis(200)).await;
    let tail = spawned.stderr.text(500);
    // The launcher's own last words repeat the answer; only other output adds anything.
    let tail: Vec<&str> = tail
        .lines()
        .filter(|line| !line.starts_with("sandbox: "))
        .collect();
    match tail.is_empty() {
        true => why,
        false => format!("{why}; stderr: {}", tail.join("\n")),
    }
}

/// Under cgroup v1 the OOM killer takes one process: when it acts, the rest of the runtime is
/// killed too, and the runtime's end names the limit.
fn watch_memory(
    cgroup: &Arc<RuntimeCgroup>,
    spawned: &SpawnedRuntime,
    tasks: &Arc<Mutex<Vec<JoinHandle<()>>>>,
) {
    let events = match cgroup.oom_events() {
        Ok(Some(events)) => events,
        Ok(None) => return,
        Err(error) => {
            tracing::warn!(%error, "cannot watch a runtime's memory limit: an OOM kill takes only one of its processes");
            return;
        }
    };
    // SAFETY: the eventfd is owned by the AsyncFd, which deregisters it before it is closed.
    let Ok(events) = (unsafe { tokio::io::unix::AsyncFd::register(events) }) else {
        return;
    };
    let switch = spawned.killer.switch();
    let limit = spawned.limit.clone();
    let reason = cgroup.memory_reason();
    tasks
        .lock()
        .expect("not poisoned")
        .push(tokio::spawn(async move {
            let Ok(mut ready) = events.readable().await else {
                return;
            };
            ready.clear_ready();
            tracing::warn!(%reason, "a runtime reached its memory limit; it is killed whole");
            let _ = limit.set(reason);
            switch.kill();
        }));
}
