//! The test kit of agent-harness: what the integration tests (`tests/`) and the fuzz targets
//! (`fuzz/`) share, outside the shipped library.
//!
//! - [`harness`]: a real server in-process on `127.0.0.1:0` with typed clients for each service,
//!   and the assertions on error statuses;
//! - [`support`]: session helpers — mock-agent profiles, sessions, actions, and waiting on a
//!   session's own stream (never on the clock);
//! - [`process`]: a real `agent-harness serve` child process (kill -9, SIGSTOP, restart), for
//!   the tests that need the binary itself;
//! - [`proxy`]: a TCP proxy that black-holes, resets or delays connections, for the tests of
//!   network faults;
//! - [`fuzzing`]: the invariants of the code that reads hostile runtime output, driven by the
//!   property tests and by `cargo fuzz`;
//! - [`within`] / [`bounded`]: the one timeout every test body runs under, so a hang fails the
//!   test instead of the run.

pub mod fuzzing;
pub mod harness;
pub mod otlp;
pub mod process;
pub mod proxy;
pub mod support;

use std::{future::Future, path::PathBuf, time::Duration};

/// How long one test may take before it fails as hung, unless it names its own limit.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `body`, failing the test if it takes longer than `limit`.
pub async fn within<F: Future>(limit: Duration, body: F) -> F::Output {
    match tokio::time::timeout(limit, body).await {
        Ok(output) => output,
        Err(_) => panic!("test did not finish within {limit:?}"),
    }
}

/// [`within`] the default [`TEST_TIMEOUT`].
pub async fn bounded<F: Future>(body: F) -> F::Output {
    within(TEST_TIMEOUT, body).await
}

/// A workspace for sessions in `dir`, beside a data dir there (`dir/work`, made if missing): no
/// session's cwd may hold or lie in its server's data dir.
pub fn workspace_in(dir: &std::path::Path) -> PathBuf {
    let work = dir.join("work");
    std::fs::create_dir_all(&work).expect("the workspace is made");
    work
}

/// `hostile-agent` of this build (`src/bin/hostile_agent.rs`): the test-only agent that does what
/// its prompt says, for the sandbox tests.
pub fn hostile_agent_bin() -> PathBuf {
    let bin = service_bin().with_file_name("hostile-agent");
    assert!(
        bin.is_file(),
        "{} not found: build it first (`cargo build -p agent-harness-testkit --bin hostile-agent`)",
        bin.display()
    );
    bin
}

/// The `agent-harness` executable of this build: the mock agent's program in the test profiles.
/// Cargo builds a package's binaries before its integration tests, into the directory above the
/// test executable's `deps/`.
pub fn service_bin() -> PathBuf {
    let test_exe = std::env::current_exe().expect("the test executable's path");
    let bin = test_exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test executable sits in <target>/<profile>/deps")
        .join("agent-harness");
    assert!(
        bin.is_file(),
        "{} not found: build it first (`cargo build --bin agent-harness`)",
        bin.display()
    );
    bin
}
