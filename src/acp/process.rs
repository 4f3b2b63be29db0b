//! Starting and stopping runtime processes (SPEC §8): the session's cwd, an explicit environment,
//! its own process group, killed if the harness dies, stderr drained into a bounded tail, and a
//! record on disk so a later harness process can reap runtimes left over from a crash.

use std::{
    collections::{BTreeMap, VecDeque},
    ffi::OsString,
    io,
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    sync::{Arc, Mutex},
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
    fn mark_closed(&self) {
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

    fn push(&self, chunk: &[u8]) {
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
/// exactly what the profile lists. Never anything else of the server's.
pub fn runtime_env(profile_env: &BTreeMap<String, String>) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = INHERITED_ENV
        .iter()
        .filter_map(|key| std::env::var_os(key).map(|value| (OsString::from(key), value)))
        .collect();
    for (key, value) in profile_env {
        env.retain(|(k, _)| k != key.as_str());
        env.push((key.into(), value.into()));
    }
    env
}

/// Bookkeeping of live runtimes on disk (`<data_dir>/runtimes/<pid>` holding the process start
/// time), so a restarted harness can kill what a crashed one left behind without ever killing an
/// unrelated process that reused the pid.
#[derive(Debug, Clone)]
pub struct RuntimeRegistry {
    dir: PathBuf,
}

impl RuntimeRegistry {
    pub fn open(data_dir: &Path) -> io::Result<Self> {
        let dir = data_dir.join("runtimes");
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }

    fn record(&self, pid: u32) {
        if let Some(start) = process_start_time(pid) {
            let _ = std::fs::write(self.dir.join(pid.to_string()), start.to_string());
        }
    }

    fn forget(&self, pid: u32) {
        let _ = std::fs::remove_file(self.dir.join(pid.to_string()));
    }

    /// Kills the process group of every recorded runtime that is still the same process; returns
    /// how many were reaped.
    pub fn reap_leftovers(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut reaped = 0;
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
        reaped
    }
}

/// Field 22 of `/proc/<pid>/stat`: the process start time in clock ticks since boot.
fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses; fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn kill_group(pgid: u32) {
    // SAFETY: killpg only sends a signal; a stale pgid yields ESRCH, which is fine.
    unsafe {
        libc::killpg(pgid as libc::pid_t, libc::SIGKILL);
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
}

/// Kills a runtime's whole process group (agents launched through `npx` have children).
pub struct RuntimeKiller {
    kill: Option<oneshot::Sender<()>>,
}

impl RuntimeKiller {
    pub fn kill(&mut self) {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
    }
}

impl Drop for RuntimeKiller {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts a runtime in `cwd`.
pub fn spawn(
    profile: RuntimeSpec<'_>,
    cwd: &Path,
    registry: &RuntimeRegistry,
) -> io::Result<SpawnedRuntime> {
    let mut command = Command::new(profile.command);
    command
        .args(profile.args)
        .current_dir(cwd)
        .env_clear()
        .envs(runtime_env(profile.env))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let parent = std::process::id();
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(move || {
            // Die with the harness. The signal is tied to the spawning thread, which is a
            // runtime worker living as long as the harness.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The harness may have died before prctl took effect.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let mut child = command.spawn()?;
    let pid = child
        .id()
        .ok_or_else(|| io::Error::other("runtime exited at once"))?;
    registry.record(pid);

    let stdin = child.stdin.take().expect("piped");
    let stdout = child.stdout.take().expect("piped");
    let mut stderr_pipe = child.stderr.take().expect("piped");
    let stderr = Arc::new(StderrTail::default());
    let tail = stderr.clone();
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
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
    let registry = registry.clone();
    tokio::spawn(supervise(child, pid, kill_rx, exit_tx, registry));
    Ok(SpawnedRuntime {
        pid,
        stdin,
        stdout,
        stderr,
        killer: RuntimeKiller {
            kill: Some(kill_tx),
        },
        exited: exit_rx,
    })
}

/// Owns the child: reports its exit, or kills its group when asked (or when the killer is
/// dropped), and always reaps it.
async fn supervise(
    mut child: Child,
    pid: u32,
    kill: oneshot::Receiver<()>,
    exited: oneshot::Sender<io::Result<ExitStatus>>,
    registry: RuntimeRegistry,
) {
    let status = tokio::select! {
        status = child.wait() => {
            // The leader is gone; take down anything it left in its group.
            kill_group(pid);
            status
        }
        _ = kill => {
            kill_group(pid);
            child.wait().await
        }
    };
    registry.forget(pid);
    let _ = exited.send(status);
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let env = runtime_env(&profile_env);
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
