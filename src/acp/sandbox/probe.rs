//! `agent-harness sandbox-probe`: what `agent-harness profiles --check` runs inside each
//! profile's box instead of its agent. It says, as one JSON line, whether the agent's command is
//! there to run, and whether HOME, the cwd and `/tmp` take writes; the check reads that line.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

/// What the probe found in a box.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeReport {
    /// Where the command was found (`None`: not in the box).
    pub command: Option<PathBuf>,
    /// Each place that should take writes, and the error when it did not.
    pub writable: Vec<(String, Option<String>)>,
    pub uid: u32,
}

impl ProbeReport {
    /// What is wrong, in words (empty: nothing).
    pub fn problems(&self, command: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if self.command.is_none() {
            problems.push(format!(
                "{command:?} is not in the box: put its directory under the profile's \
                 sandbox.read_only (or install it under /usr)"
            ));
        }
        for (place, error) in &self.writable {
            if let Some(error) = error {
                problems.push(format!("{place} does not take writes: {error}"));
            }
        }
        problems
    }
}

/// The probe's `main`: prints the report; exit code 0.
pub fn main(command: &str) -> i32 {
    let report = ProbeReport {
        command: find(command),
        writable: [
            ("HOME", std::env::var_os("HOME").map(PathBuf::from)),
            ("the cwd", std::env::current_dir().ok()),
            ("/tmp", Some(PathBuf::from("/tmp"))),
        ]
        .into_iter()
        .map(|(name, dir)| {
            let error = match dir {
                Some(dir) => write_test(&dir).err().map(|e| e.to_string()),
                None => Some("not set".to_owned()),
            };
            (name.to_owned(), error)
        })
        .collect(),
        // SAFETY: a plain getter.
        uid: unsafe { libc::getuid() },
    };
    println!(
        "{}",
        serde_json::to_string(&report).expect("a report serialises")
    );
    0
}

/// `command` as `execvp` would find it on PATH: an executable file.
fn find(command: &str) -> Option<PathBuf> {
    let executable = |path: &Path| {
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if command.contains('/') {
        let path = PathBuf::from(command);
        return executable(&path).then_some(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(command))
        .find(|candidate| executable(candidate))
}

fn write_test(dir: &Path) -> std::io::Result<()> {
    let file = dir.join(format!(".agent-harness-probe-{}", std::process::id()));
    std::fs::write(&file, b"probe")?;
    std::fs::remove_file(&file)
}
