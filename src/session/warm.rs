//! Warm pools: a profile with `warm_pool = N` keeps N runtimes started and
//! initialized (ACP `initialize` answered), so a new session only sends `session/new`.
//!
//! One task per pool keeps it full: it starts runtimes one at a time, each holding a
//! live-runtime slot (so warm runtimes count against the cap), and starts a replacement whenever
//! one is handed out or dies. A warm runtime that dies is dropped from the pool at once and
//! logged, so it is never handed out; replacements after failures back off (doubling, at most
//! [`MAX_BACKOFF`]). Stopping the pool (draining, shutdown) kills every runtime in it.
//!
//! The handshake is not logged here (no session exists yet): the session that takes a warm
//! runtime logs the `initialize` request as its own first outbound frame, and the response is
//! still unread in the bytes handed over with the runtime, so the session reads and logs it
//! like any other frame before acting on it (log, then react).
//!
//! A warm runtime cannot start in its future session's cwd: it starts in the profile's first
//! `allowed_cwd_roots` entry, else the system's temporary directory, and learns the session's
//! cwd from `session/new` as ACP intends.

use std::{
    collections::VecDeque,
    io,
    path::PathBuf,
    process::ExitStatus,
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    time::Duration,
};

use serde_json::Value;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::{Notify, OwnedSemaphorePermit, oneshot},
};

use super::{EngineContext, Profile};
use crate::acp::{frames as acp_frames, process};

/// The epoch a new session's first runtime gets, whose first harness request id the warm
/// handshake uses so the session can take the handshake as its own.
pub(crate) const FIRST_EPOCH: u32 = 1;
/// The first wait after a failed start or a death; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Characters of stderr quoted when a warm start fails.
const STDERR_QUOTE_CHARS: usize = 500;

/// A started runtime whose `initialize` has been answered, not yet in a session.
pub(crate) struct WarmRuntime {
    pub spawned: process::SpawnedRuntime,
    /// Everything read from the runtime's output so far, the `initialize` response included:
    /// the session's reader reads these bytes before the rest of the output.
    pub unread: Vec<u8>,
    /// The `initialize` request as it was sent, for the session's log.
    pub initialize: String,
    /// Its live-runtime slot.
    pub permit: OwnedSemaphorePermit,
    id: u64,
    dead: Arc<AtomicBool>,
}

/// The warm runtimes of one profile.
pub(crate) struct WarmPool {
    profile: Arc<Profile>,
    ready: Mutex<VecDeque<WarmRuntime>>,
    /// Wakes the filler: a runtime was taken or died, or the pool stops.
    wake: Notify,
    stopped: AtomicBool,
    /// Failures (start failed, or a warm runtime died) since a runtime was last handed out.
    failures: AtomicU32,
    next_id: AtomicU64,
}

impl WarmPool {
    pub(crate) fn new(profile: Arc<Profile>) -> Arc<Self> {
        Arc::new(Self {
            profile,
            ready: Mutex::new(VecDeque::new()),
            wake: Notify::new(),
            stopped: AtomicBool::new(false),
            failures: AtomicU32::new(0),
            next_id: AtomicU64::new(0),
        })
    }

    /// The size the pool is kept at.
    pub(crate) fn size(&self) -> usize {
        self.profile.warm_pool
    }

    /// Warm runtimes ready to hand out now.
    pub(crate) fn ready(&self) -> usize {
        self.ready.lock().expect("not poisoned").len()
    }

    /// A live warm runtime, if one is ready; the filler starts its replacement.
    pub(crate) fn take(&self) -> Option<WarmRuntime> {
        let mut ready = self.ready.lock().expect("not poisoned");
        let taken =
            std::iter::from_fn(|| ready.pop_front()).find(|r| !r.dead.load(Ordering::Acquire));
        drop(ready);
        if taken.is_some() {
            self.failures.store(0, Ordering::Relaxed);
            self.wake.notify_one();
        }
        taken
    }

    /// Kills every warm runtime and stops refilling.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.ready.lock().expect("not poisoned").clear();
        self.wake.notify_one();
    }

    /// Starts the filler task; it holds the engine only weakly, and ends with the pool.
    pub(crate) fn start(self: &Arc<Self>, ctx: &Arc<EngineContext>) {
        tokio::spawn(fill(self.clone(), Arc::downgrade(ctx)));
    }

    fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// A warm runtime exited: out of the pool (never handed out), to be replaced.
    fn died(&self, id: u64, status: Option<&io::Result<ExitStatus>>) {
        let mut ready = self.ready.lock().expect("not poisoned");
        let Some(at) = ready.iter().position(|r| r.id == id) else {
            return; // handed out (its session sees the exit) or already dropped
        };
        let runtime = ready.remove(at).expect("found");
        drop(ready);
        if self.is_stopped() {
            return;
        }
        let status = match status {
            Some(Ok(status)) => status.to_string(),
            Some(Err(e)) => e.to_string(),
            None => "unknown".to_owned(),
        };
        tracing::warn!(
            profile = %self.profile.name,
            pid = runtime.spawned.pid,
            %status,
            stderr = %runtime.spawned.stderr.text(STDERR_QUOTE_CHARS),
            "a warm runtime died; it is replaced"
        );
        self.failures.fetch_add(1, Ordering::Relaxed);
        self.wake.notify_one();
    }
}

/// Keeps the pool full until it stops or the engine is gone.
async fn fill(pool: Arc<WarmPool>, ctx: Weak<EngineContext>) {
    loop {
        if pool.is_stopped() {
            return;
        }
        if pool.ready() >= pool.size() {
            pool.wake.notified().await;
            continue;
        }
        let failures = pool.failures.load(Ordering::Relaxed);
        if failures > 0 {
            let backoff = FIRST_BACKOFF
                .saturating_mul(1 << failures.min(16).saturating_sub(1))
                .min(MAX_BACKOFF);
            tokio::time::sleep(backoff).await;
            if pool.is_stopped() {
                return;
            }
        }
        let Some(engine) = ctx.upgrade() else { return };
        let started = start_one(&pool, &engine).await;
        drop(engine);
        match started {
            Ok(runtime) => {
                let mut ready = pool.ready.lock().expect("not poisoned");
                if pool.is_stopped() {
                    return; // dropping it kills it
                }
                ready.push_back(runtime);
            }
            Err(why) => {
                tracing::warn!(profile = %pool.profile.name, %why, "could not start a warm runtime");
                pool.failures.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Starts one runtime and does the `initialize` handshake.
async fn start_one(pool: &Arc<WarmPool>, ctx: &EngineContext) -> Result<WarmRuntime, String> {
    let profile = &pool.profile;
    let permit = ctx
        .runtime_slots
        .clone()
        .try_acquire_owned()
        .map_err(|_| "the harness runs its maximum of live runtimes".to_owned())?;
    let cwd = warm_cwd(profile).await;
    let mut spawned = process::spawn(profile.launch(), &cwd, &ctx.processes).map_err(|e| {
        format!(
            "could not start runtime {:?} in {}: {e}",
            profile.command,
            cwd.display()
        )
    })?;
    let id = acp_frames::harness_request_id(FIRST_EPOCH, 0);
    let initialize = acp_frames::initialize_request(id.clone()).to_string();
    let handshake = handshake(
        &mut spawned,
        &initialize,
        &id,
        ctx.limits.runtime_line_bytes,
    );
    let unread = match tokio::time::timeout(profile.startup_timeout, handshake).await {
        Ok(Ok(unread)) => unread,
        Ok(Err(why)) => {
            spawned.stderr.closed(Duration::from_millis(200)).await;
            return Err(format!(
                "{why}; stderr: {}",
                spawned.stderr.text(STDERR_QUOTE_CHARS)
            ));
        }
        Err(_) => {
            return Err(format!(
                "no answer to initialize within {:?}",
                profile.startup_timeout
            ));
        }
    };
    // Watch for its death while it waits; the session that takes it gets the exit instead.
    let runtime_id = pool.next_id.fetch_add(1, Ordering::Relaxed);
    let dead = Arc::new(AtomicBool::new(false));
    let (relay_tx, relay_rx) = oneshot::channel();
    let exited = std::mem::replace(&mut spawned.exited, relay_rx);
    let watcher = (Arc::downgrade(pool), dead.clone());
    tokio::spawn(async move {
        let status = exited.await.ok();
        watcher.1.store(true, Ordering::Release);
        if let Some(pool) = watcher.0.upgrade() {
            pool.died(runtime_id, status.as_ref());
        }
        if let Some(status) = status {
            let _ = relay_tx.send(status);
        }
    });
    Ok(WarmRuntime {
        spawned,
        unread,
        initialize,
        permit,
        id: runtime_id,
        dead,
    })
}

/// Sends `initialize` and reads until its successful response; returns every byte read.
async fn handshake(
    spawned: &mut process::SpawnedRuntime,
    initialize: &str,
    id: &Value,
    max_line: usize,
) -> Result<Vec<u8>, String> {
    let mut line = Vec::with_capacity(initialize.len() + 1);
    line.extend_from_slice(initialize.as_bytes());
    line.push(b'\n');
    let write = async {
        spawned.stdin.write_all(&line).await?;
        spawned.stdin.flush().await
    };
    write
        .await
        .map_err(|e| format!("could not write initialize: {e}"))?;
    let mut read = Vec::new();
    let mut scanned = 0;
    let mut chunk = [0u8; 8192];
    loop {
        let n = spawned
            .stdout
            .read(&mut chunk)
            .await
            .map_err(|e| format!("could not read the runtime's output: {e}"))?;
        if n == 0 {
            return Err("the runtime ended its output before answering initialize".into());
        }
        read.extend_from_slice(&chunk[..n]);
        while let Some(end) = read[scanned..].iter().position(|b| *b == b'\n') {
            let text = &read[scanned..scanned + end];
            scanned += end + 1;
            let Ok(frame) = serde_json::from_slice::<Value>(text) else {
                continue; // the session's reader judges it (a fault) when it reads it
            };
            if frame.get("method").is_none() && frame.get("id") == Some(id) {
                if let Some(error) = frame.get("error") {
                    return Err(format!("initialize failed: {error}"));
                }
                return Ok(read);
            }
        }
        if read.len() - scanned > max_line {
            return Err(format!(
                "the runtime wrote a line over the limit of {max_line} bytes"
            ));
        }
    }
}

/// Where a warm runtime starts (module doc).
async fn warm_cwd(profile: &Profile) -> PathBuf {
    for root in profile.allowed_cwd_roots.iter().flatten() {
        // Asked on a blocking thread: a slow mount must not stall the worker thread.
        if tokio::fs::metadata(root).await.is_ok_and(|m| m.is_dir()) {
            return root.clone();
        }
    }
    std::env::temp_dir()
}
