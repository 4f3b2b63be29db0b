//! Starting and stopping runtime processes: the session's cwd, an explicit environment,
//! its own process group, killed if the harness dies, stderr drained into a bounded tail, and a
//! record on disk so a later harness process can reap runtimes left over from a crash.
//!
//! # A runtime's whole process tree is the runtime
//!
//! Agents are often started through wrappers (`npx`, `sh -c`, `uvx`) whose children do the work,
//! and those children may leave the runtime's process group or ignore the end of their input.
//! Neither the leader's pid nor its group is therefore enough to find them. Instead every runtime
//! is started with one extra environment variable, [`MARKER_VAR`], whose value is
//! `<data dir id>/<harness instance>/<runtime number>`. The environment is inherited by every
//! descendant (unless one scrubs it on purpose), and `/proc/<pid>/environ` shows it to us
//! whatever became of the leader. Three sweeps use it:
//!
//! - **Stopping a runtime** (or its leader exiting) kills the process group and then every
//!   process carrying that runtime's exact marker. A stop on purpose is graceful
//!   ([`RuntimeKiller::stop`]): the caller closes the runtime's stdin, the group and every marked
//!   process get SIGTERM, and only what is still alive after the grace gets SIGKILL. Agents such
//!   as Claude Code write their own session files lazily, and a bare SIGKILL loses them (and with
//!   them the ability to reopen the session); a fault kill ([`RuntimeKiller::kill`]) is at once.
//! - **A harness killed with `kill -9`** cannot clean up itself, and the parent-death signal only
//!   reaches the leader. So each harness starts one tiny watchdog (`agent-harness
//!   runtime-watchdog`, its own session, not a runtime) that holds the read end of a pipe whose
//!   write end only the harness holds. When the harness dies, for whatever reason, the kernel
//!   closes that end; the watchdog wakes on end of input, sends SIGTERM to every process carrying
//!   this harness instance's marker, and SIGKILL to each one still alive once its grace (read
//!   from [`STOP_GRACE_VAR`] in its environment) has passed — again until none is left, as a
//!   dying wrapper may still fork — and exits. It needs no signal handling, and it cannot mistake
//!   a later harness's runtimes for this one's: the instance is part of the marker. With a
//!   watchdog running, the parent-death signal is SIGTERM too, so the leader hears of the
//!   harness's death at once and the watchdog enforces the grace; without one it is SIGKILL.
//! - **The next start** on the same data directory kills every process carrying the data
//!   directory's marker from any other instance, in case the watchdog itself was killed too
//!   (the older record of group leaders is still honoured as well).
//!
//! Signals go through a pidfd opened *before* the environment is checked, so a pid reused by an
//! unrelated process between the check and the kill is never hit.
//!
//! The watchdog runs only where the harness knows its own executable
//! ([`set_watchdog_program`], done by the `serve` command); embedded uses (tests) still get the
//! marker sweeps on stop and on start.

use std::{
    collections::{BTreeMap, VecDeque},
    ffi::OsString,
    io,
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::{
    io::AsyncReadExt,
    process::{Child, ChildStdin, ChildStdout, Command},
    sync::oneshot,
};

use super::RuntimeSpec;

/// Variables a runtime inherits from the harness; everything else comes from the profile.
pub const INHERITED_ENV: [&str; 3] = ["PATH", "HOME", "LANG"];

/// How many bytes of a runtime's stderr are kept.
pub const STDERR_TAIL_BYTES: usize = 8 * 1024;

/// The last bytes a runtime wrote to stderr.
#[derive(Debug, Default)]
pub struct StderrTail {
    bytes: Mutex<VecDeque<u8>>,
    closed: tokio::sync::Notify,
    is_closed: std::sync::atomic::AtomicBool,
}

impl StderrTail {
    pub(crate) fn mark_closed(&self) {
        self.is_closed
            .store(true, std::sync::atomic::Ordering::Release);
        self.closed.notify_waiters();
    }

    /// Waits (at most `limit`) until the runtime's stderr has ended, so the tail is complete.
    pub async fn closed(&self, limit: std::time::Duration) {
        let notified = self.closed.notified();
        if self.is_closed.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let _ = tokio::time::timeout(limit, notified).await;
    }

    pub(crate) fn push(&self, chunk: &[u8]) {
        let mut bytes = self.bytes.lock().expect("not poisoned");
        bytes.extend(chunk);
        let excess = bytes.len().saturating_sub(STDERR_TAIL_BYTES);
        bytes.drain(..excess);
    }

    /// The tail as text, at most `max_chars` characters from the end, trimmed.
    pub fn text(&self, max_chars: usize) -> String {
        let bytes = self.bytes.lock().expect("not poisoned");
        let (a, b) = bytes.as_slices();
        let text = String::from_utf8_lossy(&[a, b].concat()).into_owned();
        let chars: Vec<char> = text.trim().chars().collect();
        chars[chars.len().saturating_sub(max_chars)..]
            .iter()
            .collect()
    }
}

/// The environment a runtime gets: `PATH`, `HOME` and `LANG` from the harness (when set), then
/// exactly what the profile lists: its written `env`, then the variables it passes through and
/// reads from files (read now; an unreadable file is an error naming it, never a value). Never
/// anything else of the server's.
pub fn runtime_env(
    profile_env: &BTreeMap<String, String>,
    secrets: &super::env::EnvSources,
) -> io::Result<Vec<(OsString, OsString)>> {
    let mut env: Vec<(OsString, OsString)> = INHERITED_ENV
        .iter()
        .filter_map(|key| std::env::var_os(key).map(|value| (OsString::from(key), value)))
        .collect();
    let written = profile_env
        .iter()
        .map(|(key, value)| (OsString::from(key), OsString::from(value)));
    let secret = secrets.read().map_err(io::Error::other)?;
    for (key, value) in written.chain(secret) {
        env.retain(|(k, _)| *k != key);
        env.push((key, value));
    }
    Ok(env)
}

/// The environment variable that marks a runtime and all its descendants (module doc).
pub const MARKER_VAR: &str = "HARNESS_RUNTIME_MARKER";

/// The environment variable holding a runtime's stop grace in milliseconds, for the watchdog
/// (module doc).
pub const STOP_GRACE_VAR: &str = "HARNESS_RUNTIME_STOP_GRACE_MS";

/// The default of a profile's `stop_grace`: how long a runtime stopped on purpose has between
/// SIGTERM and SIGKILL.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(2);

/// The longest grace the watchdog grants, whatever a process's environment says, so a bogus
/// value cannot keep a runtime alive long after its harness died.
pub const MAX_STOP_GRACE: Duration = Duration::from_secs(600);

/// How often a graceful stop looks for what is left of a runtime's tree.
const STOP_POLL: Duration = Duration::from_millis(25);

/// The executable that can run `runtime-watchdog` (normally this very binary); unset in embedded
/// uses, which then go without a watchdog.
static WATCHDOG_PROGRAM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Names the executable whose `runtime-watchdog` subcommand guards runtimes against a harness
/// killed without warning. Call once, before the engine starts.
pub fn set_watchdog_program(program: PathBuf) {
    let _ = WATCHDOG_PROGRAM.set(program);
}

/// The first part of the marker of every runtime started on `data_dir` (which must exist): a
/// hash of its canonical path, so the marker carries no path and stays short.
pub fn data_dir_marker(data_dir: &Path) -> io::Result<String> {
    let canonical = std::fs::canonicalize(data_dir)?;
    // FNV-1a: stable across builds and processes, unlike std's hasher.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in canonical.as_os_str().as_encoded_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    Ok(format!("{hash:016x}"))
}

/// The table of the runtime processes this harness (or bridge) started: the marker they carry
/// (module doc), the watchdog of this harness instance, and a record on disk
/// (`<data_dir>/runtimes/<pid>` holding the process start time) of each group leader, so a
/// restarted harness can kill what a crashed one left behind without ever killing an unrelated
/// process that reused the pid.
#[derive(Debug, Clone)]
pub struct ProcessTable {
    dir: PathBuf,
    /// `<data dir id>/`: every runtime ever started on this data directory.
    data_dir_prefix: String,
    /// `<data dir id>/<instance>/`: every runtime of this harness instance.
    instance_prefix: String,
    next_runtime: Arc<std::sync::atomic::AtomicU64>,
    /// Dropped with the last clone: the watchdog then sweeps (by then nothing is left to kill).
    _watchdog: Option<Arc<Watchdog>>,
}

impl ProcessTable {
    pub fn open(data_dir: &Path) -> io::Result<Self> {
        let dir = data_dir.join("runtimes");
        std::fs::create_dir_all(&dir)?;
        let data_dir_prefix = format!("{}/", data_dir_marker(data_dir)?);
        let instance_prefix = format!("{data_dir_prefix}{}/", uuid::Uuid::now_v7().simple());
        // Without its watchdog the harness still works; only a `kill -9` then leaves descendants
        // for the next start to reap.
        let watchdog = WATCHDOG_PROGRAM.get().and_then(|program| {
            Watchdog::start(program, &instance_prefix)
                .inspect_err(|error| {
                    tracing::warn!(program = %program.display(), %error, "could not start the runtime watchdog");
                })
                .ok()
                .map(Arc::new)
        });
        Ok(Self {
            dir,
            data_dir_prefix,
            instance_prefix,
            next_runtime: Arc::default(),
            _watchdog: watchdog,
        })
    }

    /// Whether a watchdog guards this table's runtimes (then the parent-death signal is SIGTERM and
    /// the watchdog enforces the grace).
    pub(crate) fn has_watchdog(&self) -> bool {
        self._watchdog.is_some()
    }

    /// The marker prefixes of every runtime on this data dir, and of this instance's.
    pub(crate) fn marker_prefixes(&self) -> (&str, &str) {
        (&self.data_dir_prefix, &self.instance_prefix)
    }

    /// A fresh marker value for the next runtime.
    pub(crate) fn next_marker(&self) -> String {
        let n = self
            .next_runtime
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{}{n}", self.instance_prefix)
    }

    fn record(&self, pid: u32) {
        if let Some(start) = process_start_time(pid) {
            let _ = std::fs::write(self.dir.join(pid.to_string()), start.to_string());
        }
    }

    fn forget(&self, pid: u32) {
        let _ = std::fs::remove_file(self.dir.join(pid.to_string()));
    }

    /// Kills what earlier harness processes on this data directory left running: the process
    /// group of every recorded runtime that is still the same process, then every process that
    /// carries the data directory's marker from another instance. Returns how many were killed.
    pub fn reap_leftovers(&self) -> usize {
        let mut reaped = 0;
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for entry in entries.flatten() {
                let path = entry.path();
                let pid = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.parse::<u32>().ok());
                let recorded = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|t| t.trim().parse::<u64>().ok());
                if let (Some(pid), Some(recorded)) = (pid, recorded)
                    && process_start_time(pid) == Some(recorded)
                {
                    kill_group(pid);
                    reaped += 1;
                    tracing::warn!(
                        pid,
                        "reaped a runtime left over from a previous harness process"
                    );
                }
                let _ = std::fs::remove_file(&path);
            }
        }
        let descendants = sweep(|marker| {
            marker.starts_with(&self.data_dir_prefix) && !marker.starts_with(&self.instance_prefix)
        });
        if descendants > 0 {
            tracing::warn!(
                descendants,
                "killed runtime descendants left over from a previous harness process"
            );
        }
        reaped + descendants
    }
}

/// The watchdog child of one harness instance (module doc). Dropping it closes the pipe, which
/// makes the watchdog sweep and exit; a thread then collects its exit status.
#[derive(Debug)]
struct Watchdog {
    child: Mutex<Option<std::process::Child>>,
}

impl Watchdog {
    fn start(program: &Path, instance_prefix: &str) -> io::Result<Self> {
        use std::os::unix::process::CommandExt;
        let mut command = std::process::Command::new(program);
        command
            .args(["runtime-watchdog", "--marker-prefix", instance_prefix])
            .env_remove(MARKER_VAR)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls between fork and exec. Its own session keeps it out
        // of the harness's process group and terminal, so signals meant for those miss it.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(Self {
            child: Mutex::new(Some(command.spawn()?)),
        })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.lock().expect("not poisoned").take() {
            drop(child.stdin.take());
            std::thread::spawn(move || child.wait());
        }
    }
}

/// `agent-harness runtime-watchdog`: waits for the end of its input (its harness is gone), then
/// stops every process whose marker starts with `marker_prefix`: SIGTERM, and SIGKILL once its
/// grace has passed. Returns the exit code.
pub fn watchdog_main(marker_prefix: &str) -> i32 {
    use std::io::Read;
    if marker_prefix.is_empty() {
        return 2;
    }
    let mut stdin = io::stdin().lock();
    let mut buf = [0u8; 64];
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    stop_marked(|marker| marker.starts_with(marker_prefix));
    0
}

/// What a process's initial environment says of it: its [`MARKER_VAR`] and [`STOP_GRACE_VAR`]
/// values, when it has a marker we can read (a zombie has no readable environment).
fn marks_of(pid: u32) -> Option<(String, Option<Duration>)> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let value_of = |key: &str| {
        environ.split(|b| *b == 0).find_map(|entry| {
            let value = entry.strip_prefix(key.as_bytes())?.strip_prefix(b"=")?;
            String::from_utf8(value.to_vec()).ok()
        })
    };
    let marker = value_of(MARKER_VAR)?;
    let grace = value_of(STOP_GRACE_VAR)
        .and_then(|ms| ms.parse::<u64>().ok())
        .map(Duration::from_millis);
    Some((marker, grace))
}

/// Calls `visit` with the pid, a pidfd pinning it (when the kernel has them) and the grace of
/// every other process whose marker matches. Returns how many there were.
fn each_marked(
    matches: &impl Fn(&str) -> bool,
    mut visit: impl FnMut(u32, Option<&std::os::fd::OwnedFd>, Option<Duration>),
) -> usize {
    let own = std::process::id();
    let mut found = 0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == own {
            continue;
        }
        // The pidfd pins the process: if the pid is reused after this, signalling fails
        // instead of hitting the newcomer.
        let pidfd = pidfd_open(pid);
        if let Some((marker, grace)) = marks_of(pid)
            && matches(&marker)
        {
            found += 1;
            visit(pid, pidfd.as_ref(), grace);
        }
    }
    found
}

/// Kills every process whose marker matches, again and again until a pass finds none (a process
/// being killed may still have forked), within a bound. Returns how many kills were sent.
fn sweep(matches: impl Fn(&str) -> bool) -> usize {
    let mut killed = 0;
    for _ in 0..100 {
        let mut found = 0;
        each_marked(&matches, |pid, pidfd, _| {
            if signal(pid, pidfd, libc::SIGKILL) {
                found += 1;
            }
        });
        if found == 0 {
            break;
        }
        killed += found;
        std::thread::sleep(Duration::from_millis(10));
    }
    killed
}

/// Stops every process whose marker matches, gracefully: SIGTERM when first seen, SIGKILL once
/// its own grace (from its environment, [`DEFAULT_STOP_GRACE`] when it names none, at most
/// [`MAX_STOP_GRACE`]) has passed since the stop began; until a pass finds none.
fn stop_marked(matches: impl Fn(&str) -> bool) {
    let began = Instant::now();
    let mut terminated = std::collections::HashSet::new();
    // Past every grace, a pass SIGKILLs whatever it finds: the bound of `sweep` then applies.
    let mut passes_past_grace = 0;
    loop {
        let mut waiting = false;
        let found = each_marked(&matches, |pid, pidfd, grace| {
            let grace = grace.unwrap_or(DEFAULT_STOP_GRACE).min(MAX_STOP_GRACE);
            if began.elapsed() >= grace {
                signal(pid, pidfd, libc::SIGKILL);
            } else {
                waiting = true;
                if terminated.insert(pid) {
                    signal(pid, pidfd, libc::SIGTERM);
                }
            }
        });
        if found == 0 {
            return;
        }
        if !waiting {
            passes_past_grace += 1;
            if passes_past_grace > 100 {
                return;
            }
        }
        std::thread::sleep(STOP_POLL);
    }
}

/// Whether any other process carries exactly this marker.
fn any_marked(marker: &str) -> bool {
    each_marked(&|m: &str| m == marker, |_, _, _| {}) > 0
}

fn pidfd_open(pid: u32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a non-negative result is a fresh fd that we own.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Sends `signal` through the pidfd when there is one (kernels before 5.3 have none: plain
/// kill).
fn signal(pid: u32, pidfd: Option<&std::os::fd::OwnedFd>, signal: libc::c_int) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: both calls only send a signal.
    let sent = unsafe {
        match pidfd {
            Some(fd) => libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            ),
            None => libc::kill(pid as libc::pid_t, signal) as libc::c_long,
        }
    };
    sent == 0
}

/// Field 22 of `/proc/<pid>/stat`: the process start time in clock ticks since boot.
fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses; fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn kill_group(pgid: u32) {
    signal_group(pgid, libc::SIGKILL);
}

fn signal_group(pgid: u32, signal: libc::c_int) {
    // SAFETY: killpg only sends a signal; a stale pgid yields ESRCH, which is fine.
    unsafe {
        libc::killpg(pgid as libc::pid_t, signal);
    }
}

/// A started runtime: its pipes, its stderr tail, and a handle that kills it.
pub struct SpawnedRuntime {
    pub pid: u32,
    pub stdin: ChildStdin,
    pub stdout: ChildStdout,
    pub stderr: Arc<StderrTail>,
    pub killer: RuntimeKiller,
    /// Resolves with the exit status once the process has exited and been reaped.
    pub exited: oneshot::Receiver<io::Result<ExitStatus>>,
    /// Set when a limit of the runtime's box ended it ("memory limit 2 GiB reached"), before
    /// `exited` resolves.
    pub limit: Arc<std::sync::OnceLock<String>>,
}

/// How a runtime is to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopRequest {
    /// SIGKILL to the whole tree at once (a fault, a fenced-off session).
    Now,
    /// SIGTERM to the whole tree, then SIGKILL to what is left after the grace.
    Gracefully(Duration),
}

/// Ends a runtime's whole process tree (agents launched through `npx` have children): at once,
/// or gracefully. Dropping it without either kills at once.
pub struct RuntimeKiller(KillSwitch);

/// Kills a runtime at once from outside the task that owns its [`RuntimeKiller`] (which may be
/// busy): the first of the two to act decides how the runtime ends. Dropping one does nothing.
#[derive(Clone)]
pub struct KillSwitch {
    stop: Arc<Mutex<Option<oneshot::Sender<StopRequest>>>>,
    /// `None` for a remote runtime: its bridge ends the tree.
    pgid: Option<u32>,
    /// Set once the leader is reaped: its pid (and so the group id) may then be reused.
    reaped: Arc<std::sync::atomic::AtomicBool>,
}

impl KillSwitch {
    /// SIGKILL to the tree at once, a tree being stopped gracefully included.
    pub fn kill(&self) {
        let stop = self.take();
        self.kill_group();
        if let Some(stop) = stop {
            let _ = stop.send(StopRequest::Now);
        }
    }

    fn take(&self) -> Option<oneshot::Sender<StopRequest>> {
        self.stop.lock().expect("not poisoned").take()
    }

    /// The group at once, so the runtime is dead by the time its fault is reported; the
    /// supervisor then reaps it and sweeps descendants that left the group.
    fn kill_group(&self) {
        if let Some(pgid) = self.pgid
            && !self.reaped.load(std::sync::atomic::Ordering::Acquire)
        {
            kill_group(pgid);
        }
    }
}

impl RuntimeKiller {
    fn new(
        stop: oneshot::Sender<StopRequest>,
        pgid: Option<u32>,
        reaped: Arc<std::sync::atomic::AtomicBool>,
    ) -> Self {
        Self(KillSwitch {
            stop: Arc::new(Mutex::new(Some(stop))),
            pgid,
            reaped,
        })
    }

    /// A killer of a remote runtime: its task is told how to end it, and asks the bridge.
    pub(crate) fn remote(stop: oneshot::Sender<StopRequest>) -> Self {
        Self::new(stop, None, Default::default())
    }

    /// A switch that kills this runtime at once, for whoever must be able to stop it while the
    /// killer's owner is busy.
    pub fn switch(&self) -> KillSwitch {
        self.0.clone()
    }

    /// SIGKILL to the tree, at once (unless it is being stopped gracefully).
    pub fn kill(&mut self) {
        if let Some(stop) = self.0.take() {
            self.0.kill_group();
            let _ = stop.send(StopRequest::Now);
        }
    }

    /// SIGTERM to the tree, and SIGKILL to whatever is left of it after `grace`. The caller closes
    /// the runtime's stdin (by dropping its writer) at the same time; the runtime's `exited`
    /// resolves once nothing of it is left.
    pub fn stop(&mut self, grace: Duration) {
        if let Some(stop) = self.0.take() {
            let _ = stop.send(StopRequest::Gracefully(grace));
        }
    }
}

impl Drop for RuntimeKiller {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts a runtime in `cwd`, unboxed: the profile's program with its environment.
pub fn spawn(
    profile: RuntimeSpec<'_>,
    cwd: &Path,
    processes: &ProcessTable,
) -> io::Result<SpawnedRuntime> {
    let env = runtime_env(profile.env, profile.secrets)?;
    let marker = processes.next_marker();
    start(
        Program {
            path: profile.command,
            args: profile.args,
            env,
            cwd,
            marker,
            stop_grace: profile.stop_grace,
            control: None,
        },
        processes,
        None,
    )
}

/// One process to start as a runtime's leader.
pub(crate) struct Program<'a> {
    pub path: &'a Path,
    pub args: &'a [String],
    /// Its whole environment but the marker and the grace, which are added.
    pub env: Vec<(OsString, OsString)>,
    pub cwd: &'a Path,
    /// From [`ProcessTable::next_marker`].
    pub marker: String,
    pub stop_grace: Duration,
    /// A descriptor the program gets as descriptor 3 (the sandbox launcher's control socket).
    pub control: Option<std::os::fd::RawFd>,
}

/// What runs once nothing of a runtime is left, before its exit is reported: the box's cleanup,
/// which returns the limit that ended the runtime, if one did.
pub(crate) type Aftercare = Box<dyn FnOnce() -> Option<String> + Send>;

/// Starts `program` as a runtime: its own process group, marked, killed with the harness.
pub(crate) fn start(
    program: Program<'_>,
    processes: &ProcessTable,
    aftercare: Option<Aftercare>,
) -> io::Result<SpawnedRuntime> {
    let marker = program.marker;
    let mut command = Command::new(program.path);
    command
        .args(program.args)
        .current_dir(program.cwd)
        .env_clear()
        .envs(program.env)
        .env(MARKER_VAR, &marker)
        .env(STOP_GRACE_VAR, program.stop_grace.as_millis().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        // With a watchdog, a harness going away without stopping its runtimes (its tasks
        // dropped) leaves them to the watchdog's graceful stop rather than SIGKILL.
        .kill_on_drop(!processes.has_watchdog());
    let parent = std::process::id();
    // With a watchdog the leader hears of the harness's death by SIGTERM, and the watchdog
    // SIGKILLs it after its grace; without one, SIGKILL is the only guarantee.
    let parent_death = match processes.has_watchdog() {
        true => libc::SIGTERM,
        false => libc::SIGKILL,
    };
    let control = program.control;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(move || {
            // Die with the harness. The signal is tied to the spawning thread, which is a
            // runtime worker living as long as the harness.
            if libc::prctl(libc::PR_SET_PDEATHSIG, parent_death as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The harness may have died before prctl took effect.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            // The control socket at descriptor 3, kept across the exec (dup2 clears
            // close-on-exec; a socket already at 3 has it cleared by hand).
            if let Some(fd) = control {
                if fd == 3 {
                    let flags = libc::fcntl(3, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                } else if libc::dup2(fd, 3) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = command.spawn()?;
    let pid = child
        .id()
        .ok_or_else(|| io::Error::other("runtime exited at once"))?;
    processes.record(pid);

    let stdin = child.stdin.take().expect("piped");
    let stdout = child.stdout.take().expect("piped");
    let mut stderr_pipe = child.stderr.take().expect("piped");
    let stderr = Arc::new(StderrTail::default());
    let tail = stderr.clone();
    tokio::spawn(async move {
        // Small: it lives in the task of every runtime, idle or not, and stderr is rarely busy.
        let mut buf = [0u8; 1024];
        while let Ok(n) = stderr_pipe.read(&mut buf).await {
            if n == 0 {
                break;
            }
            tail.push(&buf[..n]);
        }
        tail.mark_closed();
    });

    let (kill_tx, kill_rx) = oneshot::channel();
    let (exit_tx, exit_rx) = oneshot::channel();
    let processes = processes.clone();
    let reaped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let limit = Arc::new(std::sync::OnceLock::new());
    tokio::spawn(supervise(
        child,
        pid,
        marker,
        kill_rx,
        exit_tx,
        processes,
        reaped.clone(),
        aftercare.map(|aftercare| (aftercare, limit.clone())),
    ));
    Ok(SpawnedRuntime {
        pid,
        stdin,
        stdout,
        stderr,
        killer: RuntimeKiller::new(kill_tx, Some(pid), reaped.clone()),
        exited: exit_rx,
        limit,
    })
}

/// Owns the child: reports its exit, or ends its tree when asked (at once when the killer is
/// dropped), and always reaps it.
#[allow(clippy::too_many_arguments)]
async fn supervise(
    mut child: Child,
    pid: u32,
    marker: String,
    stop: oneshot::Receiver<StopRequest>,
    exited: oneshot::Sender<io::Result<ExitStatus>>,
    processes: ProcessTable,
    reaped: Arc<std::sync::atomic::AtomicBool>,
    aftercare: Option<(Aftercare, Arc<std::sync::OnceLock<String>>)>,
) {
    let status = tokio::select! {
        status = child.wait() => {
            // The leader is gone; take down anything it left in its group.
            kill_group(pid);
            status
        }
        request = stop => match request {
            Ok(StopRequest::Gracefully(grace)) => terminate(&mut child, pid, &marker, grace).await,
            _ => {
                kill_group(pid);
                child.wait().await
            }
        },
    };
    reaped.store(true, std::sync::atomic::Ordering::Release);
    // Descendants that left the group (or outlived a wrapper) still carry the marker.
    let _ = tokio::task::spawn_blocking(move || {
        sweep(|m| m == marker);
        if let Some((aftercare, limit)) = aftercare
            && let Some(reason) = aftercare()
        {
            let _ = limit.set(reason);
        }
    })
    .await;
    processes.forget(pid);
    let _ = exited.send(status);
}

/// A graceful stop of a local runtime whose stdin its owner has closed: SIGTERM to its group and
/// to every process with its marker (a descendant that left the group), then wait — for the
/// leader, then for the rest of the tree — until `grace` has passed, then SIGKILL to the group
/// (the sweep after this catches the rest). The leader's exit status.
async fn terminate(
    child: &mut Child,
    pid: u32,
    marker: &str,
    grace: Duration,
) -> io::Result<ExitStatus> {
    let deadline = tokio::time::Instant::now() + grace;
    signal_group(pid, libc::SIGTERM);
    let owned = marker.to_owned();
    let _ = tokio::task::spawn_blocking(move || {
        each_marked(&|m: &str| m == owned, |pid, pidfd, _| {
            signal(pid, pidfd, libc::SIGTERM);
        })
    })
    .await;
    let exited = tokio::time::timeout_at(deadline, child.wait()).await.ok();
    // The leader is gone, but a wrapper's children may still be writing their state.
    let mut left = true;
    while exited.is_some() && tokio::time::Instant::now() < deadline {
        left = still_marked(marker).await;
        if !left {
            break;
        }
        tokio::time::sleep(STOP_POLL).await;
    }
    if exited.is_none() || (left && still_marked(marker).await) {
        tracing::info!(pid, ?grace, "a runtime outlived its stop grace; killing it");
    }
    kill_group(pid);
    match exited {
        Some(status) => status,
        None => child.wait().await,
    }
}

async fn still_marked(marker: &str) -> bool {
    let owned = marker.to_owned();
    tokio::task::spawn_blocking(move || any_marked(&owned))
        .await
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_kill_switch_ends_a_runtime_being_stopped_gracefully_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let table = ProcessTable::open(dir.path()).unwrap();
        let command = PathBuf::from("/bin/sh");
        // Deaf to SIGTERM, its child too: only SIGKILL ends it before the grace.
        let args = vec!["-c".to_owned(), "trap '' TERM; sleep 60".to_owned()];
        let env = BTreeMap::new();
        let secrets = crate::acp::env::EnvSources::default();
        let grace = Duration::from_secs(30);
        let spec = RuntimeSpec {
            command: &command,
            args: &args,
            env: &env,
            secrets: &secrets,
            stop_grace: grace,
        };
        let mut runtime = spawn(spec, dir.path(), &table).expect("sh starts");
        let switch = runtime.killer.switch();
        runtime.killer.stop(grace);
        switch.kill();
        let status = tokio::time::timeout(Duration::from_secs(10), runtime.exited)
            .await
            .expect("killed at once, not after its grace")
            .expect("an exit")
            .expect("a status");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
    }

    #[test]
    fn the_stderr_tail_keeps_only_the_last_bytes() {
        let tail = StderrTail::default();
        tail.push(&vec![b'a'; STDERR_TAIL_BYTES]);
        tail.push(b"\nthe end\n");
        assert!(tail.text(100).ends_with("the end"));
        assert_eq!(tail.text(7), "the end");
        assert!(tail.bytes.lock().unwrap().len() <= STDERR_TAIL_BYTES);
    }

    #[test]
    fn a_runtime_gets_only_path_home_lang_and_its_profile_env() {
        let mut profile_env = BTreeMap::new();
        profile_env.insert("API_KEY".to_owned(), "k".to_owned());
        let env = runtime_env(&profile_env, &Default::default()).unwrap();
        let keys: Vec<String> = env
            .iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        for key in &keys {
            assert!(
                INHERITED_ENV.contains(&key.as_str()) || key == "API_KEY",
                "unexpected {key}"
            );
        }
        assert!(keys.contains(&"API_KEY".to_owned()));
    }

    #[test]
    fn the_start_time_of_this_process_is_readable_and_unknown_pids_have_none() {
        assert!(process_start_time(std::process::id()).is_some());
        assert_eq!(process_start_time(u32::MAX - 1), None);
    }
}
