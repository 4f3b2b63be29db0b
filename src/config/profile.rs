//! Runtime profiles (SPEC §8): how to start an ACP runtime. From `[profiles.<name>]` tables in
//! the config file, plus the built-in `mock` profile that runs our own scripted agent.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The built-in profile's name.
pub const MOCK_PROFILE: &str = "mock";

/// How permission requests are answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionPolicy {
    /// Hold the request for a person (status AWAITING_INPUT).
    #[default]
    Ask,
    /// Answer with the first `allow_always` option, else `allow_once`, else cancelled.
    AutoAccept,
}

/// A `[profiles.<name>]` table as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileFile {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub permission_policy: PermissionPolicy,
    pub allowed_cwd_roots: Option<Vec<PathBuf>>,
    pub startup_timeout: Option<String>,
    pub cancel_grace: Option<String>,
    pub idle_timeout: Option<String>,
}

/// A resolved profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub name: String,
    pub command: PathBuf,
    pub args: Vec<String>,
    /// Exactly what the runtime gets besides `PATH`, `HOME` and `LANG`.
    pub env: BTreeMap<String, String>,
    pub permission_policy: PermissionPolicy,
    /// `None`: any absolute path (allowed only in no-token mode).
    pub allowed_cwd_roots: Option<Vec<PathBuf>>,
    pub startup_timeout: Duration,
    pub cancel_grace: Duration,
    pub idle_timeout: Option<Duration>,
}

pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(10);

/// Parses a duration such as `"30s"`, `"500ms"`, `"2m"`.
pub fn parse_duration(field: &str, text: &str) -> anyhow::Result<Duration> {
    humantime::parse_duration(text)
        .map_err(|e| anyhow::anyhow!("{field} = {text:?} is not a duration such as \"30s\": {e}"))
}

impl Profile {
    pub fn from_file(name: &str, file: ProfileFile) -> anyhow::Result<Self> {
        let field = |key: &str| format!("profiles.{name}.{key}");
        if file.command.trim().is_empty() {
            anyhow::bail!("{} is empty", field("command"));
        }
        let duration = |key: &str, value: &Option<String>| {
            value
                .as_deref()
                .map(|text| parse_duration(&field(key), text))
                .transpose()
        };
        if let Some(roots) = &file.allowed_cwd_roots {
            for root in roots {
                if !root.is_absolute() {
                    anyhow::bail!(
                        "{} holds {root:?}, which is not an absolute path",
                        field("allowed_cwd_roots")
                    );
                }
            }
        }
        Ok(Self {
            name: name.to_owned(),
            command: PathBuf::from(file.command),
            args: file.args,
            env: file.env,
            permission_policy: file.permission_policy,
            allowed_cwd_roots: file.allowed_cwd_roots,
            startup_timeout: duration("startup_timeout", &file.startup_timeout)?
                .unwrap_or(DEFAULT_STARTUP_TIMEOUT),
            cancel_grace: duration("cancel_grace", &file.cancel_grace)?
                .unwrap_or(DEFAULT_CANCEL_GRACE),
            idle_timeout: duration("idle_timeout", &file.idle_timeout)?,
        })
    }

    /// The built-in `mock` profile: our own scripted agent (`agent-harness mock-agent`).
    pub fn builtin_mock(program: PathBuf) -> Self {
        Self {
            name: MOCK_PROFILE.to_owned(),
            command: program,
            args: vec!["mock-agent".to_owned()],
            env: BTreeMap::new(),
            permission_policy: PermissionPolicy::Ask,
            allowed_cwd_roots: None,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            cancel_grace: DEFAULT_CANCEL_GRACE,
            idle_timeout: None,
        }
    }

    /// A digest of everything that shapes the runtime, so a session records what it ran with.
    pub fn fingerprint(&self) -> String {
        let mut hasher = Sha256::new();
        let mut field = |label: &str, value: &[u8]| {
            hasher.update((label.len() as u64).to_le_bytes());
            hasher.update(label.as_bytes());
            hasher.update((value.len() as u64).to_le_bytes());
            hasher.update(value);
        };
        field("command", self.command.as_os_str().as_encoded_bytes());
        for arg in &self.args {
            field("arg", arg.as_bytes());
        }
        for (key, value) in &self.env {
            field("env.key", key.as_bytes());
            field("env.value", value.as_bytes());
        }
        field(
            "permission_policy",
            format!("{:?}", self.permission_policy).as_bytes(),
        );
        hex::encode(hasher.finalize())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(toml_text: &str) -> ProfileFile {
        toml::from_str(toml_text).unwrap()
    }

    #[test]
    fn a_profile_reads_its_durations_and_defaults_the_rest() {
        let profile = Profile::from_file(
            "claude",
            file(
                r#"command = "npx"
                   args = ["@agentclientprotocol/claude-agent-acp"]
                   env = { ANTHROPIC_API_KEY = "k" }
                   permission_policy = "auto_accept"
                   allowed_cwd_roots = ["/workspaces"]
                   startup_timeout = "5s"
                   idle_timeout = "10m""#,
            ),
        )
        .unwrap();
        assert_eq!(profile.startup_timeout, Duration::from_secs(5));
        assert_eq!(profile.cancel_grace, DEFAULT_CANCEL_GRACE);
        assert_eq!(profile.idle_timeout, Some(Duration::from_secs(600)));
        assert_eq!(profile.permission_policy, PermissionPolicy::AutoAccept);
    }

    #[test]
    fn unknown_keys_and_bad_durations_are_refused_by_name() {
        let err = toml::from_str::<ProfileFile>("command = \"x\"\nbogus = 1").unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
        let err =
            Profile::from_file("p", file("command = \"x\"\ncancel_grace = \"soon\"")).unwrap_err();
        assert!(err.to_string().contains("profiles.p.cancel_grace"), "{err}");
        let err = Profile::from_file("p", file("command = \"x\"\nallowed_cwd_roots = [\"rel\"]"))
            .unwrap_err();
        assert!(err.to_string().contains("allowed_cwd_roots"), "{err}");
    }

    #[test]
    fn the_fingerprint_changes_with_the_command_line_and_environment() {
        let base = Profile::builtin_mock("/bin/agent".into());
        let mut other = base.clone();
        other.env.insert("K".into(), "v".into());
        assert_ne!(base.fingerprint(), other.fingerprint());
        assert_eq!(base.fingerprint(), base.clone().fingerprint());
        assert_eq!(base.fingerprint().len(), 64);
    }
}
