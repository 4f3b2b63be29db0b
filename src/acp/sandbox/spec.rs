//! What the harness tells the launcher (`agent-harness sandbox-exec`) over its control socket,
//! and what the launcher answers: one JSON line each way. The harness decides everything (paths
//! canonical and checked, ids, limits); the launcher only builds what it is told.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The descriptor the launcher finds its control socket on.
pub const CONTROL_FD: i32 = 3;

/// The largest spec or answer accepted, so a confused peer cannot make either side hold much.
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;

/// One box and the program to start in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoxSpec {
    /// The program, looked up on the box's `PATH` when it holds no `/`.
    pub program: String,
    pub args: Vec<String>,
    /// The program's whole environment.
    pub env: Vec<(String, String)>,
    /// The working directory: canonical, mounted read-write at the same path.
    pub cwd: PathBuf,
    /// The agent's HOME: canonical, mounted read-write at the same path.
    pub home: PathBuf,
    /// What else of the host is visible, each at its own path. Parents come before children.
    pub mounts: Vec<BoxMount>,
    /// The agent's user and group ids on the host (and in the box).
    pub uid: u32,
    pub gid: u32,
    pub hostname: String,
    /// cgroup directories the launcher joins before it starts anything (one per hierarchy).
    pub cgroups: Vec<PathBuf>,
    pub network: BoxNetwork,
    /// The agent may build a sandbox of its own inside (new user namespaces and mounts in them).
    #[serde(default)]
    pub nested: bool,
}

/// A host path shown in the box at the same path (or hidden there).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoxMount {
    pub path: PathBuf,
    pub access: Access,
    /// System paths may be symbolic links (`/bin` → `usr/bin`): the box gets the same link.
    /// Paths the profile names must not be links on the way (they were canonical when checked).
    pub follow_links: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    ReadOnly,
    ReadWrite,
    /// Covered with an empty, unreadable mount: a path of the server's (its data dir, config,
    /// secrets) that lies under something the box shows.
    Hidden,
    /// Shared read-only, with a layer of the box's own on top (in its `/tmp`, gone with it): what
    /// the agent writes there stays in its box. For caches a program must write to read (npm's).
    Layered,
}

/// The box's network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BoxNetwork {
    /// The host's network, unfiltered (`egress = "open"`).
    Host,
    /// A network namespace of its own with only loopback; the launcher listens on these
    /// loopback ports inside it and hands the sockets to the harness, which serves them (the
    /// egress proxy, forwards to allowed loopback ports).
    Own { listen: Vec<u16> },
}

/// The launcher's one answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BoxReply {
    /// The program runs in its box; the listening sockets of `BoxNetwork::Own` travel with this
    /// message, in the order of `listen`, then a pidfd of the box's init: once init is gone, so
    /// is everything else in the box (the kernel empties a PID namespace before its init ends).
    Ready,
    /// Nothing runs; why, naming the feature that is missing and the fix where known.
    Failed { error: String },
}
