//! A runtime profile as the engine applies it: how to launch the runtime, how to answer
//! its permission requests, where its sessions may work, and how long to wait for it. `config`
//! builds these from the config file; the built-in `mock` profile runs our own scripted agent.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::acp::{RuntimeSpec, env::EnvSources};

/// The built-in profile's name.
pub const MOCK_PROFILE: &str = "mock";

/// How permission requests are answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionPolicy {
    /// Hold the request for a person (status AWAITING_INPUT).
    #[default]
    Ask,
    /// Answer with the first `allow_always` option, else `allow_once`, else cancelled.
    AutoAccept,
}

/// What a permission rule decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleDecision {
    AllowOnce,
    AllowAlways,
    RejectOnce,
    RejectAlways,
    /// Hold the request for a person, whatever the policy says.
    Ask,
}

impl RuleDecision {
    /// The ACP option kind this decision selects; `None` for `ask`.
    pub(crate) fn option_kind(self) -> Option<&'static str> {
        match self {
            Self::AllowOnce => Some("allow_once"),
            Self::AllowAlways => Some("allow_always"),
            Self::RejectOnce => Some("reject_once"),
            Self::RejectAlways => Some("reject_always"),
            Self::Ask => None,
        }
    }
}

/// One permission rule: it matches a request whose tool call has this `kind` (any kind when
/// unset) and a title matching `title_regex` (any title when unset).
#[derive(Debug, Clone)]
pub struct PermissionRule {
    pub kind: Option<String>,
    pub title_regex: Option<regex::Regex>,
    pub decision: RuleDecision,
}

impl PartialEq for PermissionRule {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && self.title_regex.as_ref().map(regex::Regex::as_str)
                == other.title_regex.as_ref().map(regex::Regex::as_str)
            && self.decision == other.decision
    }
}

impl Eq for PermissionRule {}

impl PermissionRule {
    pub(crate) fn matches(&self, kind: &str, title: &str) -> bool {
        self.kind.as_deref().is_none_or(|k| k == kind)
            && self.title_regex.as_ref().is_none_or(|r| r.is_match(title))
    }
}

/// A resolved profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub name: String,
    pub command: PathBuf,
    pub args: Vec<String>,
    /// Exactly what the runtime gets besides `PATH`, `HOME` and `LANG`, with `secrets`.
    pub env: BTreeMap<String, String>,
    /// Variables passed through from the harness's environment or read from files when a
    /// runtime starts: names and paths only, never values.
    pub secrets: EnvSources,
    /// Config options (id → value) asked for on every new session whose agent advertises the
    /// option with another value (e.g. the mode that asks before editing).
    pub config_options: BTreeMap<String, String>,
    /// A sign-in method the agent advertises (`authMethods[].id`), asked for with ACP
    /// `authenticate` before every session is opened (e.g. Codex's `openai-api-key`, which reads
    /// its variable). `None`: the harness never calls `authenticate`.
    pub auth_method: Option<String>,
    pub permission_policy: PermissionPolicy,
    /// `None`: any absolute path (allowed only in no-token mode).
    pub allowed_cwd_roots: Option<Vec<PathBuf>>,
    pub startup_timeout: Duration,
    /// The longest a turn may keep the agent busy, time AWAITING_INPUT not counted: past it the
    /// turn ends FAILED ("turn timed out after …") and the agent is asked to stop it.
    pub turn_timeout: Option<Duration>,
    pub cancel_grace: Duration,
    pub idle_timeout: Option<Duration>,
    /// Applied in order before `permission_policy`; the first match decides.
    pub permission_rules: Vec<PermissionRule>,
    /// A request held this long is answered with its first reject option, else `cancelled`.
    pub permission_timeout: Option<Duration>,
    /// `Some` for a profile of `kind = "remote"`: its runtimes run on a bridge, and
    /// `command`, `args` and `env` are unused (the bridge's own profile says what to run).
    pub remote: Option<RemoteTarget>,
    /// Runtimes kept started and initialized for new sessions; 0 for none. Local
    /// profiles only. Not part of the fingerprint: it changes when a runtime starts, not what
    /// it is.
    pub warm_pool: usize,
    /// How its runtimes are stopped and reopened. Not part of the fingerprint either: it changes
    /// how the harness treats a runtime, not what runs.
    pub resilience: Resilience,
    /// The box its local runtimes run in (`None`: `sandbox = "off"`, unboxed). Not part of the
    /// fingerprint: it changes where the agent runs, not what it is.
    pub sandbox: Option<crate::acp::sandbox::BoxPolicy>,
}

/// How a profile's runtimes are stopped and reopened, and the defences of their sessions
/// against an agent's own defects and lost state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resilience {
    /// Between SIGTERM (stdin closed) and SIGKILL when the harness stops a runtime on purpose.
    pub stop_grace: Duration,
    /// After a cancelled turn the runtime is stopped, and the next turn reopens it: a defence
    /// against agents that desync after a cancel.
    pub restart_after_cancel: bool,
    /// After a turn the agent answered with an error (e.g. its model API failed) the runtime
    /// is stopped likewise: a defence against agents that desync after a failed turn.
    pub restart_after_error: bool,
    /// What happens when a session cannot be reopened in its agent.
    pub on_reopen_failure: OnReopenFailure,
    /// At most this many bytes of the transcript prime a fresh session (`on_reopen_failure =
    /// "fresh"`).
    pub reopen_context_bytes: usize,
}

impl Default for Resilience {
    fn default() -> Self {
        Self {
            stop_grace: crate::acp::process::DEFAULT_STOP_GRACE,
            restart_after_cancel: false,
            restart_after_error: false,
            on_reopen_failure: OnReopenFailure::Disconnect,
            reopen_context_bytes: DEFAULT_REOPEN_CONTEXT_BYTES,
        }
    }
}

/// What a failed reopen (the agent advertises neither `session/resume` nor `session/load`, or
/// refuses them: its session is gone) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnReopenFailure {
    /// The session is DISCONNECTED (RUNTIME_CANNOT_REOPEN, or the agent's error).
    #[default]
    Disconnect,
    /// A new ACP session is started and primed with the end of the transcript; a
    /// `context_rebuilt` event says so.
    Fresh,
}

/// The default of `reopen_context_bytes`.
pub const DEFAULT_REOPEN_CONTEXT_BYTES: usize = 32 * 1024;
/// The most `reopen_context_bytes` may be.
pub const MAX_REOPEN_CONTEXT_BYTES: usize = 1024 * 1024;

/// Where a remote profile's runtimes run: a bridge whose labels include `bridge_labels`, from
/// its profile `bridge_profile`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteTarget {
    pub bridge_labels: BTreeMap<String, String>,
    pub bridge_profile: String,
    /// How long a runtime outlives a broken bridge stream before it is faulted.
    pub reconnect_grace: Duration,
    /// The principals whose bridges may run it (`None`: any bridge's).
    pub bridge_principals: Option<Vec<String>>,
}

pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(10);

impl Profile {
    /// What the runtime transport needs to start this profile's runtime.
    pub(crate) fn launch(&self) -> RuntimeSpec<'_> {
        RuntimeSpec {
            command: &self.command,
            args: &self.args,
            env: &self.env,
            secrets: &self.secrets,
            stop_grace: self.resilience.stop_grace,
        }
    }

    /// Whether a session of this profile can come back once its runtime is gone: its agent
    /// reopens it (`can_resume`, `can_load`), or a fresh session takes its place.
    pub(crate) fn can_come_back(&self, can_resume: bool, can_load: bool) -> bool {
        can_resume || can_load || self.resilience.on_reopen_failure == OnReopenFailure::Fresh
    }

    /// The built-in `mock` profile: our own scripted agent (`agent-harness mock-agent`).
    pub(crate) fn builtin_mock(program: PathBuf) -> Self {
        Self {
            name: MOCK_PROFILE.to_owned(),
            command: program,
            // It advertises resume so sessions on the embedded default survive a restart.
            args: vec!["mock-agent".to_owned(), "--resume".to_owned()],
            env: BTreeMap::new(),
            secrets: EnvSources::default(),
            config_options: BTreeMap::new(),
            auth_method: None,
            permission_policy: PermissionPolicy::Ask,
            allowed_cwd_roots: None,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            turn_timeout: None,
            cancel_grace: DEFAULT_CANCEL_GRACE,
            idle_timeout: None,
            permission_rules: Vec::new(),
            permission_timeout: None,
            remote: None,
            warm_pool: 0,
            resilience: Resilience::default(),
            sandbox: Some(crate::acp::sandbox::BoxPolicy::default()),
        }
    }

    /// A digest of everything that shapes the runtime, so a session records what it ran with.
    pub(crate) fn fingerprint(&self) -> String {
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
        // Names and paths only (the values are read at each start); only when set, so the
        // fingerprints of profiles without them stay as they were.
        for name in &self.secrets.passthrough {
            field("env_passthrough", name.as_bytes());
        }
        for (name, path) in &self.secrets.files {
            field("env_files.key", name.as_bytes());
            field("env_files.path", path.as_os_str().as_encoded_bytes());
        }
        for (id, value) in &self.config_options {
            field("config_options.key", id.as_bytes());
            field("config_options.value", value.as_bytes());
        }
        if let Some(method) = &self.auth_method {
            field("auth_method", method.as_bytes());
        }
        if let Some(remote) = &self.remote {
            for (key, value) in &remote.bridge_labels {
                field("bridge_labels.key", key.as_bytes());
                field("bridge_labels.value", value.as_bytes());
            }
            field("bridge_profile", remote.bridge_profile.as_bytes());
        }
        field(
            "permission_policy",
            format!("{:?}", self.permission_policy).as_bytes(),
        );
        // Only when set, so the fingerprints of profiles without rules stay as they were.
        for rule in &self.permission_rules {
            field(
                "permission_rule.kind",
                rule.kind.as_deref().unwrap_or("").as_bytes(),
            );
            field(
                "permission_rule.title_regex",
                rule.title_regex
                    .as_ref()
                    .map_or("", |r| r.as_str())
                    .as_bytes(),
            );
            field(
                "permission_rule.decision",
                format!("{:?}", rule.decision).as_bytes(),
            );
        }
        if let Some(timeout) = self.permission_timeout {
            field(
                "permission_timeout",
                timeout.as_millis().to_string().as_bytes(),
            );
        }
        hex::encode(hasher.finalize())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
