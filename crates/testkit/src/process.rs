//! A real `agent-harness serve` process, for the tests that need the binary itself: `kill -9`,
//! `SIGSTOP`/`SIGCONT`, signals, several replicas.
//!
//! ```ignore
//! let mut server = Serve::on(&data, &config).start();
//! let client = server.client().await;
//! server.kill_9();
//! server.restart(); // same arguments, a new port
//! server.restart_on_the_same_address();
//! ```
//!
//! The child listens on `127.0.0.1:0` (or [`Serve::listen`]) and logs JSON; it is ready once
//! it logged the address it bound ("serving gRPC"). Every line it logs is kept: a test may wait
//! for one, and the lines are printed when the test panics. The child is killed (and reaped)
//! when dropped.

use std::{
    ffi::{OsStr, OsString},
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use agent_harness::pb::v1::agent_session_service_client::AgentSessionServiceClient;
use tokio::sync::Notify;
use tonic::transport::{Channel, Endpoint};

/// How many of the last logged lines a failing test prints.
const LINES_SHOWN_ON_FAILURE: usize = 60;

/// How to start a `serve` process: the arguments after `serve --listen 127.0.0.1:0 --log-format
/// json`, and extra environment variables.
#[derive(Debug, Clone, Default)]
pub struct Serve {
    /// The executable; this build's `agent-harness` unless [`Serve::program`] names another.
    program: Option<PathBuf>,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    /// Variables of the test's environment the process does not inherit.
    env_removed: Vec<OsString>,
    /// A command the server is started through (`setpriv … --`), with its arguments.
    wrapper: Vec<OsString>,
    /// The address to listen on (`127.0.0.1:0` unless set).
    listen: Option<SocketAddr>,
    /// The file mode creation mask it starts with (the test's own unless set).
    umask: Option<libc::mode_t>,
}

impl Serve {
    pub fn new() -> Self {
        Self::default()
    }

    /// `serve` on `data_dir` with the profiles of the config file `config`: what most
    /// real-process tests start.
    pub fn on(data_dir: impl AsRef<Path>, config: impl AsRef<Path>) -> Self {
        Self::new()
            .arg("--data-dir")
            .arg(data_dir.as_ref())
            .arg("--config")
            .arg(config.as_ref())
    }

    /// A replica on the shared PostgreSQL store at `database_url`, its leases lasting
    /// `lease_ttl` (e.g. `"2s"`).
    pub fn replica(self, database_url: &str, lease_ttl: &str) -> Self {
        self.args(["--database-url", database_url, "--lease-ttl", lease_ttl])
    }

    /// Runs `program` (another build of `agent-harness`, e.g. the release binary) instead of
    /// this build's.
    pub fn program(mut self, program: impl Into<PathBuf>) -> Self {
        self.program = Some(program.into());
        self
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Runs the server as `uid` and `gid` with no supplementary groups (through `setpriv`, which
    /// execs it: its pid stays the server's). The test must be root.
    pub fn run_as(mut self, uid: u32, gid: u32) -> Self {
        self.wrapper = [
            "setpriv",
            "--reuid",
            &uid.to_string(),
            "--regid",
            &gid.to_string(),
        ]
        .into_iter()
        .chain(["--clear-groups", "--"])
        .map(OsString::from)
        .collect();
        self
    }

    /// The process does not inherit `key` from the test's environment (unless [`Serve::env`]
    /// sets it).
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Self {
        self.env_removed.push(key.as_ref().to_owned());
        self
    }

    /// Listens on `addr` instead of a free port (a restart on the same address, as a pod
    /// restarted in place keeps its IP).
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = Some(addr);
        self
    }

    /// Starts with this umask (e.g. `0o022`, the usual one that lets everyone read new files).
    pub fn umask(mut self, mask: libc::mode_t) -> Self {
        self.umask = Some(mask);
        self
    }

    /// Starts the process and waits until it serves; panics (with its log) if it exits first.
    pub fn start(&self) -> ServeProcess {
        let (child, addr, log) = self.spawn();
        ServeProcess {
            serve: self.clone(),
            child,
            addr,
            log,
            cursor: 0,
        }
    }

    fn spawn(&self) -> (Child, SocketAddr, Arc<Log>) {
        let program = self.program.clone().unwrap_or_else(crate::service_bin);
        let mut command = match self.wrapper.split_first() {
            Some((wrapper, args)) => {
                let mut command = Command::new(wrapper);
                command.args(args).arg(program);
                command
            }
            None => Command::new(program),
        };
        for key in &self.env_removed {
            command.env_remove(key);
        }
        if let Some(mask) = self.umask {
            use std::os::unix::process::CommandExt;
            // SAFETY: umask(2) is async-signal-safe and touches nothing of the parent.
            unsafe {
                command.pre_exec(move || {
                    libc::umask(mask);
                    Ok(())
                });
            }
        }
        let listen = self
            .listen
            .map_or_else(|| "127.0.0.1:0".to_owned(), |addr| addr.to_string());
        let mut child = command
            .args(["serve", "--listen", &listen, "--log-format", "json"])
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("agent-harness serve starts");
        let log = Arc::new(Log::default());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let lines = BufReader::new(child.stderr.take().expect("piped stderr")).lines();
        let sink = log.clone();
        // Reads every line (so the child never blocks on a full pipe) until the child exits.
        std::thread::spawn(move || {
            let mut ready = Some(ready_tx);
            for line in lines.map_while(Result::ok) {
                if let Some(tx) = &ready
                    && let Some(addr) = served_address(&line)
                {
                    let _ = tx.send(addr);
                    ready = None;
                }
                sink.push(line);
            }
            sink.close();
        });
        match ready_rx.recv() {
            Ok(addr) => (child, addr, log),
            Err(_) => {
                let status = child.wait().ok();
                panic!(
                    "agent-harness serve exited ({status:?}) before serving; its log:\n{}",
                    log.tail(LINES_SHOWN_ON_FAILURE)
                );
            }
        }
    }
}

/// The address of a "serving gRPC" JSON log line.
fn served_address(line: &str) -> Option<SocketAddr> {
    let event: serde_json::Value = serde_json::from_str(line).ok()?;
    if event["message"] != "serving gRPC" {
        return None;
    }
    event["local_addr"].as_str()?.parse().ok()
}

/// Every line a process logged, and a wake-up for whoever waits on the next one.
#[derive(Default)]
struct Log {
    lines: Mutex<(Vec<String>, bool)>,
    changed: Notify,
}

impl Log {
    fn push(&self, line: String) {
        self.lines.lock().expect("not poisoned").0.push(line);
        self.changed.notify_waiters();
    }

    fn close(&self) {
        self.lines.lock().expect("not poisoned").1 = true;
        self.changed.notify_waiters();
    }

    fn tail(&self, n: usize) -> String {
        let lines = self.lines.lock().expect("not poisoned");
        let start = lines.0.len().saturating_sub(n);
        lines.0[start..].join("\n")
    }
}

/// A running `serve` process (see the module docs).
pub struct ServeProcess {
    serve: Serve,
    child: Child,
    addr: SocketAddr,
    log: Arc<Log>,
    /// The next line [`ServeProcess::next_logged`] looks at.
    cursor: usize,
}

impl ServeProcess {
    /// The address it serves on (a new one after each restart).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub async fn channel(&self) -> Channel {
        Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("a valid endpoint")
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("a connection to the server process")
    }

    pub async fn client(&self) -> AgentSessionServiceClient<Channel> {
        AgentSessionServiceClient::new(self.channel().await)
    }

    /// Whether any line it logged (since its last start) contains `text`.
    pub fn logged(&self, text: &str) -> bool {
        let lines = self.log.lines.lock().expect("not poisoned");
        lines.0.iter().any(|l| l.contains(text))
    }

    /// Every line it logged since its last start.
    pub fn log_lines(&self) -> Vec<String> {
        self.log.lines.lock().expect("not poisoned").0.clone()
    }

    /// Waits for the next JSON log event (after those this method returned before) whose
    /// `message` is `message`; `None` once the log ends (the process died).
    pub async fn next_logged(&mut self, message: &str) -> Option<serde_json::Value> {
        loop {
            let changed = self.log.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let lines = self.log.lines.lock().expect("not poisoned");
                while self.cursor < lines.0.len() {
                    let line = &lines.0[self.cursor];
                    self.cursor += 1;
                    if let Ok(event) = serde_json::from_str::<serde_json::Value>(line)
                        && event["message"] == message
                    {
                        return Some(event);
                    }
                }
                if lines.1 {
                    return None;
                }
            }
            changed.await;
        }
    }

    /// Sends a signal (`libc::SIGTERM`, `SIGHUP`, …) to the process.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: only sends a signal, to a child this process started and has not reaped.
        let sent = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(sent, 0, "signal {signal} to {}", self.child.id());
    }

    /// `SIGSTOP`: the process stays, frozen.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// `SIGCONT` after [`ServeProcess::pause`].
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// `kill -9`, and waits until the process is gone.
    pub fn kill_9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Kills the process if it still runs, then starts it again with the same arguments.
    pub fn restart(&mut self) {
        self.kill_9();
        let (child, addr, log) = self.serve.spawn();
        self.child = child;
        self.addr = addr;
        self.log = log;
        self.cursor = 0;
    }

    /// `kill -9`, then starts it again with the same arguments on the same address (its
    /// leases, bridge publications and advertised address outlive the killed process).
    pub fn restart_on_the_same_address(&mut self) {
        self.kill_9();
        let serve = self.serve.clone().listen(self.addr);
        let (child, addr, log) = serve.spawn();
        self.child = child;
        self.addr = addr;
        self.log = log;
        self.cursor = 0;
    }

    /// Its exit status if it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("the child's status")
    }

    /// Waits until it exits (without blocking the runtime's other tasks).
    pub async fn wait(&mut self) -> ExitStatus {
        tokio::task::block_in_place(|| self.child.wait()).expect("the child's status")
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- the last lines agent-harness serve (pid {}, {}) logged ---\n{}",
                self.child.id(),
                self.addr,
                self.log.tail(LINES_SHOWN_ON_FAILURE)
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
