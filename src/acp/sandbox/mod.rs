//! The box every local runtime runs in (docs/security.md, "The sandbox"): its own user, mount,
//! PID, IPC, UTS, cgroup and network namespaces; the system read-only; the session's cwd and
//! its owner's HOME read-write; a private `/tmp`; nothing of the server's or of other sessions';
//! no capabilities, `no_new_privs` and a seccomp filter; memory and process limits by cgroups;
//! out to the network only through the harness.
//!
//! - [`policy`]: what a profile's box holds and may reach (checked when the config is read);
//! - [`host`]: the harness's side — what goes in a box, starting it, serving its network;
//! - [`spec`]: what the harness tells the launcher, and its answer;
//! - [`launcher`]: `agent-harness sandbox-exec`, which builds the box and starts the agent;
//! - [`homes`]: the agents' HOMEs, one per owner and profile;
//! - `cgroup`: resource limits; `egress`: the proxy and forwards; `seccomp`: the filter;
//!   `sys`: the system calls `std` lacks.

mod cgroup;
mod egress;
pub mod homes;
mod host;
pub mod launcher;
pub mod policy;
pub mod probe;
mod seccomp;
pub mod spec;
mod sys;

pub use egress::PROXY_PORT;
pub use host::{BOX_VARIABLES, BoxLaunch, DEFAULT_AGENT_ID, Sandbox, SandboxSettings};
pub use policy::{
    BoxPolicy, Egress, EgressRule, Limits, format_size, overlaps, parse_cpu, parse_size,
};

/// Makes this process non-dumpable: no other process of its uid (an unboxed agent among them)
/// can read its memory, environment or command line through `/proc` or attach to it; and it
/// leaves no core dump holding its secrets. The server and the bridge do this first thing.
pub fn make_non_dumpable() -> std::io::Result<()> {
    // SAFETY: a plain prctl.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The placeholder of an allowed cwd root that stands for the session's owner.
pub const PRINCIPAL_PLACEHOLDER: &str = "{principal}";

/// The server's own paths, which no cwd may lie in: its files (config, tokens file, TLS keys,
/// secrets) and directories (the data dir where it exists, the agents' HOMEs).
#[derive(Debug, Clone, Default)]
pub struct ServerPaths {
    /// Canonical where they exist.
    pub protected: Vec<std::path::PathBuf>,
    /// A directory whether or not it exists yet.
    pub homes_dir: std::path::PathBuf,
}

impl ServerPaths {
    /// Whether a (canonical) cwd clashes with them: it lies in one, or holds one that is a file
    /// (or is not there: it may become one). A cwd may hold the server's *directories* — a
    /// server started in a project keeps `./data` there — because the box covers them over; a
    /// file under a read-write cwd could be swapped on the host by a rename, past any cover, so
    /// a cwd never holds one.
    pub fn clash_with(&self, cwd: &std::path::Path) -> bool {
        let directory = |p: &std::path::Path| p == self.homes_dir || p.is_dir();
        self.protected
            .iter()
            .chain(std::iter::once(&self.homes_dir))
            .any(|p| cwd.starts_with(p) || (p.starts_with(cwd) && !directory(p)))
    }
}

/// Allowed cwd roots as they apply to `owner` (a harness's sessions and a bridge's runtimes
/// alike): `{principal}` replaced by the owner's name, and a root that holds it left out when
/// the name cannot stand as a path component (`..`, `/`, spaces), so no name reaches another
/// place.
pub fn workspace_roots(roots: &[std::path::PathBuf], owner: &str) -> Vec<std::path::PathBuf> {
    roots
        .iter()
        .filter_map(|root| {
            let text = root.to_string_lossy();
            if !text.contains(PRINCIPAL_PLACEHOLDER) {
                return Some(root.clone());
            }
            let name = crate::domain::principal::path_segment(owner)?;
            Some(std::path::PathBuf::from(
                text.replace(PRINCIPAL_PLACEHOLDER, name),
            ))
        })
        .collect()
}
