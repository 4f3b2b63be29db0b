//! Bringing a runtime up: the one path every runtime takes, whether it starts here (in its box,
//! or unboxed when its profile says `sandbox = "off"`), on a bridge, or comes from a warm pool.
//! Whatever the way, the session gets the same [`Runtime`]: a pipe of JSON-RPC lines each way, a
//! stderr tail, an exit, a killer, and what its log's `runtime_started` event says of it.

use std::{
    io,
    path::Path,
    process::ExitStatus,
    sync::{Arc, OnceLock},
    time::Duration,
};

use serde_json::{Map, Value, json};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite},
    sync::oneshot,
};

use super::{
    RuntimeSpec,
    process::{self, ProcessTable, RuntimeKiller, SpawnedRuntime, StderrTail},
    remote::{Gateway, RemoteSpec},
    sandbox::{BoxLaunch, BoxPolicy, Sandbox},
};

/// How a runtime comes up.
pub enum Launch<'a> {
    /// A child process of the harness (or bridge).
    Local(LocalLaunch<'a>),
    /// On a bridge that dialled in.
    Bridge {
        gateway: &'a Arc<Gateway>,
        spec: RemoteSpec<'a>,
    },
    /// A runtime a warm pool started and initialized: `unread` is what it wrote so far (its
    /// `initialize` response among it), read again by the session before the rest.
    Warm {
        spawned: SpawnedRuntime,
        unread: Vec<u8>,
    },
}

/// A runtime started here.
pub struct LocalLaunch<'a> {
    pub runtime: RuntimeSpec<'a>,
    pub profile: &'a str,
    /// Canonical and checked.
    pub cwd: &'a Path,
    /// The box, and what goes in it; `None`: unboxed (`sandbox = "off"`).
    pub boxed: Option<Boxed<'a>>,
    pub processes: &'a ProcessTable,
    /// How long a box may take to be built.
    pub timeout: Duration,
}

/// The box of a local runtime.
pub struct Boxed<'a> {
    pub sandbox: &'a Sandbox,
    pub policy: &'a BoxPolicy,
    /// The owner's HOME for this profile.
    pub home: &'a Path,
    /// Whose model calls its model proxy serves, when the profile has one.
    pub model: Option<&'a crate::model_proxy::ModelCalls>,
}

/// A started runtime, however it came up.
pub struct Runtime {
    pub stdin: Box<dyn AsyncWrite + Unpin + Send>,
    pub stdout: Box<dyn AsyncRead + Unpin + Send>,
    pub stderr: Arc<StderrTail>,
    pub killer: RuntimeKiller,
    pub exited: oneshot::Receiver<io::Result<ExitStatus>>,
    /// Set when a limit of its box ended it ("memory limit 2 GiB reached").
    pub limit: Arc<OnceLock<String>>,
    /// What the log's `runtime_started` event says of it (`pid`, `bridge` and `runtime_key`,
    /// `warm`, `sandboxed`).
    pub described: Map<String, Value>,
    /// The bridge it runs on.
    pub bridge: Option<String>,
}

/// Brings a runtime up. The error says what could not be done, in words.
pub async fn launch(launch: Launch<'_>) -> Result<Runtime, String> {
    match launch {
        Launch::Local(local) => {
            let boxed = local.boxed.is_some();
            let spawned = match local.boxed {
                Some(boxed) => {
                    let launch = BoxLaunch {
                        runtime: local.runtime,
                        policy: boxed.policy,
                        profile: local.profile,
                        cwd: local.cwd,
                        home: boxed.home,
                        timeout: local.timeout,
                        model: boxed.model,
                    };
                    boxed
                        .sandbox
                        .spawn(launch, local.processes)
                        .await
                        .map_err(|why| {
                            format!(
                                "could not start a sandboxed runtime of profile {}: {why}",
                                local.profile
                            )
                        })?
                }
                None => process::spawn(local.runtime, local.cwd, local.processes).map_err(|e| {
                    format!(
                        "could not start runtime {:?} of profile {}: {e}",
                        local.runtime.command, local.profile
                    )
                })?,
            };
            let mut runtime = local_runtime(spawned, Box::new(tokio::io::empty()));
            runtime.described.insert("sandboxed".into(), boxed.into());
            Ok(runtime)
        }
        Launch::Warm { spawned, unread } => {
            let mut runtime = local_runtime(spawned, Box::new(std::io::Cursor::new(unread)));
            runtime.described.insert("warm".into(), true.into());
            runtime.described.insert("sandboxed".into(), false.into());
            Ok(runtime)
        }
        Launch::Bridge { gateway, spec } => {
            let profile = spec.bridge_profile.to_owned();
            let remote = gateway.spawn(spec).await.map_err(|why| {
                // `why` may hold the bridge's text; whoever stores or shows it caps it.
                format!("could not start a remote runtime of bridge profile {profile}: {why}")
            })?;
            let described = json!({"bridge": remote.bridge_id, "runtime_key": remote.key});
            Ok(Runtime {
                stdin: Box::new(remote.stdin),
                stdout: Box::new(remote.stdout),
                stderr: remote.stderr,
                killer: remote.killer,
                exited: remote.exited,
                limit: Arc::default(),
                described: described.as_object().cloned().unwrap_or_default(),
                bridge: Some(remote.bridge_id),
            })
        }
    }
}

/// A local process as a [`Runtime`]; `before` is read ahead of its output.
fn local_runtime(spawned: SpawnedRuntime, before: Box<dyn AsyncRead + Unpin + Send>) -> Runtime {
    let mut described = Map::new();
    described.insert("pid".into(), spawned.pid.into());
    Runtime {
        stdin: Box::new(spawned.stdin),
        stdout: Box::new(before.chain(spawned.stdout)),
        stderr: spawned.stderr,
        killer: spawned.killer,
        exited: spawned.exited,
        limit: spawned.limit,
        described,
        bridge: None,
    }
}
