//! The server under test: a real `agent-harness serve` child process on a loopback port with a
//! data dir and config of its own, so its memory and CPU are its own; the mock agent runtimes
//! are its children. Also the bare echo server used as the translator's baseline.

use std::{
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::Stdio,
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use super::machine::{self, Resident};
use super::report::Usage;

/// How long a child server may take to answer its first health check.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a child server may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// A scratch directory removed when dropped.
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    pub fn new(label: &str) -> anyhow::Result<Self> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "agent-harness-bench-{}-{}-{label}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loopback port that was free a moment ago (the child binds it; a clash is retried).
pub fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// Opens `n` separate HTTP/2 connections to `addr`.
pub async fn connect_pool(addr: SocketAddr, n: usize) -> anyhow::Result<Vec<Channel>> {
    let mut pool = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        pool.push(connect(addr).await?);
    }
    Ok(pool)
}

pub async fn connect(addr: SocketAddr) -> anyhow::Result<Channel> {
    Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("connecting to {addr}"))
}

/// A child process serving gRPC on a loopback port.
pub struct ServerProcess {
    child: Child,
    pid: u32,
    addr: SocketAddr,
    log: PathBuf,
    // Last, so the directory outlives the process's use of it.
    dir: ScratchDir,
}

impl ServerProcess {
    /// Starts `agent-harness serve` with `config` (TOML) on a fresh data dir and waits until it
    /// answers health checks as SERVING.
    pub async fn serve(bin: &Path, label: &str, config: &str) -> anyhow::Result<Self> {
        Self::serve_in(bin, ScratchDir::new(label)?, config).await
    }

    /// Stops the server (as [`ServerProcess::stop`]) and starts a fresh process on the same data
    /// dir with `config`: the sessions stay, the new process has touched none of them yet.
    pub async fn restart(mut self, bin: &Path, config: &str) -> anyhow::Result<Self> {
        self.halt().await?;
        let ServerProcess { dir, .. } = self;
        Self::serve_in(bin, dir, config).await
    }

    async fn serve_in(bin: &Path, dir: ScratchDir, config: &str) -> anyhow::Result<Self> {
        let config_path = dir.path().join("config.toml");
        std::fs::write(&config_path, config).context("writing the server config")?;
        std::fs::create_dir_all(dir.path().join("work")).context("the sessions' workspace")?;
        let data_dir = dir.path().join("data");
        Self::start(dir, "serve", health_serving, |addr| {
            let mut command = Command::new(bin);
            command
                .arg("serve")
                .arg("--listen")
                .arg(addr.to_string())
                .arg("--data-dir")
                .arg(&data_dir)
                .arg("--config")
                .arg(&config_path)
                .arg("--sqlite-synchronous")
                .arg("normal")
                // Nothing runs when the bench stops a server; a draining server need not wait.
                .arg("--drain-grace")
                .arg("2s")
                // Warnings only: the figures are not about log formatting.
                .env("RUST_LOG", "warn");
            command
        })
        .await
    }

    /// Starts the bare echo server (`agent-harness-bench --serve-echo ADDR`).
    pub async fn echo() -> anyhow::Result<Self> {
        // The echo is this benchmark binary itself, so its build matches the bench's.
        let bin = std::env::current_exe().context("finding this executable")?;
        let dir = ScratchDir::new("echo")?;
        Self::start(dir, "echo", super::echo::answers, |addr| {
            let mut command = Command::new(&bin);
            command.arg("--serve-echo").arg(addr.to_string());
            command
        })
        .await
    }

    /// Starts a server on a free port (retrying, since a free port may be taken before the
    /// server binds it), logging to `<name>-<port>.log` in `dir`, until `ready` answers.
    async fn start<F, Fut>(
        dir: ScratchDir,
        name: &str,
        ready: F,
        command: impl Fn(SocketAddr) -> Command,
    ) -> anyhow::Result<Self>
    where
        F: Fn(SocketAddr) -> Fut + Copy,
        Fut: std::future::Future<Output = bool>,
    {
        let mut last_error = None;
        for _ in 0..3 {
            let port = free_port()?;
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            let log = dir.path().join(format!("{name}-{port}.log"));
            match Self::spawn(command(addr), addr, log, ready).await {
                Ok((child, pid, log)) => {
                    return Ok(Self {
                        child,
                        pid,
                        addr,
                        log,
                        dir,
                    });
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.expect("tried at least once"))
    }

    async fn spawn<F, Fut>(
        mut command: Command,
        addr: SocketAddr,
        log: PathBuf,
        ready: F,
    ) -> anyhow::Result<(Child, u32, PathBuf)>
    where
        F: Fn(SocketAddr) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let log_file = std::fs::File::create(&log).context("creating the server log")?;
        command
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .kill_on_drop(true);
        let mut child = command.spawn().context("spawning the server")?;
        let pid = child.id().context("the server has a pid")?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "the server exited ({status}) before serving: {}",
                    tail(&log)
                );
            }
            if ready(addr).await {
                return Ok((child, pid, log));
            }
            if Instant::now() > deadline {
                let _ = child.kill().await;
                bail!(
                    "the server did not serve within {START_TIMEOUT:?}: {}",
                    tail(&log)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A directory that exists for the server's lifetime (its config, the data dir, files of
    /// the phase).
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }

    /// The sessions' working directory: beside the data dir and the config, since a cwd may
    /// never hold the server's files.
    pub fn workspace(&self) -> std::path::PathBuf {
        self.dir.path().join("work")
    }

    pub fn resident(&self) -> Option<Resident> {
        machine::resident(self.pid)
    }

    /// CPU counters now, to take differences over a measured window.
    pub fn counters(&self) -> Counters {
        let (runtimes_cpu, runtimes) = machine::children_cpu_time(self.pid);
        Counters {
            at: Instant::now(),
            server_cpu: machine::cpu_time(self.pid).unwrap_or_default(),
            runtimes_cpu,
            runtimes,
            bench_cpu: machine::own_cpu_time(),
        }
    }

    /// SIGTERM, then waits for a clean exit (SIGKILL after [`STOP_TIMEOUT`]).
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.halt().await
    }

    async fn halt(&mut self) -> anyhow::Result<()> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.pid as libc::pid_t, libc::SIGTERM);
        }
        match tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                if !status.success() {
                    bail!("the server exited with {status}: {}", tail(&self.log));
                }
                Ok(())
            }
            Err(_) => {
                let _ = self.child.kill().await;
                bail!("the server did not stop within {STOP_TIMEOUT:?} of SIGTERM")
            }
        }
    }
}

/// CPU counters at one moment.
#[derive(Debug, Clone)]
pub struct Counters {
    at: Instant,
    server_cpu: Duration,
    runtimes_cpu: Duration,
    runtimes: usize,
    bench_cpu: Duration,
}

impl Counters {
    /// What was used between `self` and `later`. Runtimes that exited in between are not
    /// counted, so the runtimes' share is a lower bound.
    pub fn until(&self, later: &Counters) -> Usage {
        Usage {
            wall: later.at - self.at,
            server_cpu: later.server_cpu.saturating_sub(self.server_cpu),
            runtimes_cpu: later.runtimes_cpu.saturating_sub(self.runtimes_cpu),
            runtimes: later.runtimes,
            bench_cpu: later.bench_cpu.saturating_sub(self.bench_cpu),
        }
    }
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join(" | ")
}

async fn health_serving(addr: SocketAddr) -> bool {
    let Ok(channel) = Endpoint::from_shared(format!("http://{addr}"))
        .expect("valid")
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
    else {
        return false;
    };
    let answer = tokio::time::timeout(
        Duration::from_secs(2),
        HealthClient::new(channel).check(HealthCheckRequest {
            service: String::new(),
        }),
    )
    .await;
    matches!(answer, Ok(Ok(reply)) if reply.get_ref().status == ServingStatus::Serving as i32)
}
