//! Runtime profiles: how to start an ACP runtime. From `[profiles.<name>]` tables in
//! the config file, plus the built-in `mock` profile that runs our own scripted agent.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use anyhow::Context;
use serde::Deserialize;

use super::preset::{self, Preset};
use crate::acp::env::EnvSources;

pub use crate::session::profile::{
    DEFAULT_CANCEL_GRACE, DEFAULT_REOPEN_CONTEXT_BYTES, DEFAULT_STARTUP_TIMEOUT,
    MAX_REOPEN_CONTEXT_BYTES, MOCK_PROFILE, OnReopenFailure, PermissionPolicy, PermissionRule,
    Profile, RemoteTarget, Resilience, RuleDecision,
};

/// Where a profile's runtimes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProfileKind {
    /// A child process of the harness.
    #[default]
    Local,
    /// On a bridge that dialled in.
    Remote,
}

/// A `[profiles.<name>]` table as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileFile {
    #[serde(default)]
    pub kind: ProfileKind,
    /// A tested agent (`claude`, `codex`, … — `agent-harness profiles` lists them) whose
    /// command, environment and defences fill in what this table leaves out.
    pub preset: Option<String>,
    /// Required for local profiles without a preset; remote ones name a `bridge_profile`.
    pub command: Option<String>,
    /// With `command`: its arguments (none when unset); without: the preset's, or these.
    pub args: Option<Vec<String>>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Variables of the harness's own environment the runtime gets, when set there (API keys
    /// that must not sit in this file).
    #[serde(default)]
    pub env_passthrough: Vec<String>,
    /// Variables whose value is read from a file when a runtime starts (a mounted Secret).
    #[serde(default)]
    pub env_files: BTreeMap<String, PathBuf>,
    /// Config options asked for on every new session (e.g. `mode = "default"`).
    #[serde(default)]
    pub config_options: BTreeMap<String, String>,
    /// A sign-in method of the agent asked for with ACP `authenticate` before each session is
    /// opened (`""`: none, whatever the preset says).
    pub auth_method: Option<String>,
    #[serde(default)]
    pub permission_policy: PermissionPolicy,
    pub allowed_cwd_roots: Option<Vec<PathBuf>>,
    pub startup_timeout: Option<String>,
    /// The longest a turn may keep the agent busy, time waiting on a person not counted
    /// (default: the preset's, else none).
    pub turn_timeout: Option<String>,
    pub cancel_grace: Option<String>,
    pub idle_timeout: Option<String>,
    #[serde(default)]
    pub permission_rules: Vec<PermissionRuleFile>,
    pub permission_timeout: Option<String>,
    /// Remote: labels a bridge must carry (all of them) to run this profile's runtimes.
    #[serde(default)]
    pub bridge_labels: BTreeMap<String, String>,
    /// Remote: the name of the bridge's own profile to start.
    pub bridge_profile: Option<String>,
    /// Remote: how long a runtime waits for its bridge to redial (default "30s").
    pub reconnect_grace: Option<String>,
    /// Remote: the principals (of their runtime tokens) whose bridges may run this profile's
    /// runtimes; unset, any bridge with the labels may.
    pub bridge_principals: Option<Vec<String>>,
    /// Local: runtimes kept started and initialized for new sessions.
    #[serde(default)]
    pub warm_pool: usize,
    /// Between SIGTERM and SIGKILL when a runtime is stopped on purpose (default "2s").
    pub stop_grace: Option<String>,
    /// Stop the runtime after a cancelled turn; the next turn reopens it (default: the
    /// preset's, else false).
    pub restart_after_cancel: Option<bool>,
    /// Stop the runtime after a turn its agent answered with an error; the next turn reopens
    /// it (default: the preset's, else false).
    pub restart_after_error: Option<bool>,
    /// `"disconnect"` (default) or `"fresh"`.
    #[serde(default)]
    pub on_reopen_failure: OnReopenFailure,
    /// Bytes of the transcript a fresh session is primed with (default 32768).
    pub reopen_context_bytes: Option<usize>,
    /// Local: `"off"`, `"on"` (the default) or a table of the box's settings (config/sandbox.rs).
    pub sandbox: Option<toml::Value>,
    /// Local, boxed: `"open"` or `{ allow = ["host[:port]", …] }` (default: the preset's hosts).
    pub egress: Option<toml::Value>,
    /// Local, boxed: the providers whose calls go through the model proxy, and the variable
    /// holding each one's key (config/sandbox.rs, `model_routes`; docs/model-proxy.md).
    pub model_proxy: Option<toml::Value>,
}

/// What a runtime runs, from a profile's keys over its preset's (a harness profile and a
/// bridge profile alike).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Launch {
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub secrets: EnvSources,
}

/// The keys of a profile that say what runs, as written.
#[derive(Debug, Clone, Default)]
pub struct LaunchKeys {
    pub command: Option<String>,
    pub args: Option<Vec<String>>,
    pub env: BTreeMap<String, String>,
    pub env_passthrough: Vec<String>,
    pub env_files: BTreeMap<String, PathBuf>,
}

impl LaunchKeys {
    /// Whether any of them is written.
    fn any(&self) -> bool {
        self.command.is_some()
            || self.args.is_some()
            || !self.env.is_empty()
            || !self.env_passthrough.is_empty()
            || !self.env_files.is_empty()
    }

    /// The launch these keys say over `preset`'s. `table` prefixes the keys in errors
    /// (`profiles.claude`). A variable is named once among `env`, `env_passthrough` and
    /// `env_files`; naming it drops the preset's source of it.
    pub fn resolve(self, table: &str, preset: Option<&Preset>) -> anyhow::Result<Launch> {
        let mut sources: BTreeMap<&str, &str> = BTreeMap::new();
        let names = self.env.keys().map(|n| (n, "env"));
        let names = names.chain(self.env_passthrough.iter().map(|n| (n, "env_passthrough")));
        for (name, key) in names.chain(self.env_files.keys().map(|n| (n, "env_files"))) {
            if name.is_empty() || name.contains(['=', '\0']) {
                anyhow::bail!("{table}.{key} names {name:?}, which is not a variable name");
            }
            if let Some(other) = sources.insert(name, key) {
                anyhow::bail!("{table}: {name} is in both {other} and {key}; name it once");
            }
        }
        for (name, path) in &self.env_files {
            if !path.is_absolute() {
                anyhow::bail!("{table}.env_files.{name} = {path:?} is not an absolute path");
            }
        }
        let (command, args) = match (self.command, preset) {
            (Some(command), _) => (command, self.args.unwrap_or_default()),
            (None, Some(preset)) => (
                preset.command.to_owned(),
                self.args
                    .unwrap_or_else(|| preset.args.iter().map(|a| (*a).to_owned()).collect()),
            ),
            (None, None) => (String::new(), self.args.unwrap_or_default()),
        };
        if command.trim().is_empty() {
            anyhow::bail!(
                "{table}.command is empty (write one, or name a preset: {})",
                preset::all_names().join(", ")
            );
        }
        let mut env = preset.map(Preset::env_map).unwrap_or_default();
        let mut passthrough: Vec<String> = preset
            .iter()
            .flat_map(|p| p.env_passthrough.iter().map(|n| (*n).to_owned()))
            .collect();
        env.retain(|name, _| !sources.contains_key(name.as_str()));
        passthrough.retain(|name| !sources.contains_key(name.as_str()));
        env.extend(self.env);
        passthrough.extend(self.env_passthrough);
        Ok(Launch {
            command,
            args,
            env,
            secrets: EnvSources {
                passthrough,
                files: self.env_files,
            },
        })
    }
}

/// The preset a profile names, or an error listing the known ones.
pub fn named_preset(table: &str, name: Option<&str>) -> anyhow::Result<Option<&'static Preset>> {
    let Some(name) = name else {
        return Ok(None);
    };
    preset::find(name).map(Some).ok_or_else(|| {
        anyhow::anyhow!(
            "{table}.preset = {name:?} is not a preset; known: {}",
            preset::all_names().join(", ")
        )
    })
}

/// What a boxed profile may not say: its own HOME (the box gives each owner one), and a warm
/// pool (a warm runtime starts before its session's owner and cwd are known, so its box could
/// not hold them).
fn check_boxed(table: &str, launch: &Launch, warm_pool: usize) -> anyhow::Result<()> {
    let names_home = launch.env.contains_key("HOME")
        || launch.secrets.passthrough.iter().any(|n| n == "HOME")
        || launch.secrets.files.contains_key("HOME");
    if names_home {
        anyhow::bail!(
            "{table} sets HOME, but a boxed runtime's HOME is its owner's under \
             sandbox.homes_dir; remove it (other variables may name \"{{home}}\", e.g. \
             CODEX_HOME = \"{{home}}/.codex\"), or set sandbox = \"off\""
        );
    }
    if warm_pool > 0 {
        anyhow::bail!(
            "{table}.warm_pool needs sandbox = \"off\": a warm runtime starts before its \
             session's owner and cwd are known, so its box could not hold that cwd and HOME"
        );
    }
    Ok(())
}

/// The most runtimes one profile may keep warm (each is a live process that counts against
/// `limits.live_runtimes`).
pub const MAX_WARM_POOL: usize = 64;

/// One `[[profiles.<name>.permission_rules]]` entry as written; the decision is checked in
/// [`ProfileFile::resolve`] so that an unknown one is reported with the rule's place.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PermissionRuleFile {
    pub kind: Option<String>,
    pub title_regex: Option<String>,
    pub decision: String,
}

/// Parses a duration such as `"30s"`, `"500ms"`, `"2m"`.
pub(crate) fn parse_duration(field: &str, text: &str) -> anyhow::Result<Duration> {
    humantime::parse_duration(text)
        .map_err(|e| anyhow::anyhow!("{field} = {text:?} is not a duration such as \"30s\": {e}"))
}

impl ProfileFile {
    /// The profile this table describes, named `name`, over its preset; durations parsed,
    /// paths checked; boxed with the default limits, its sandbox paths checked for form only.
    pub fn resolve(self, name: &str) -> anyhow::Result<Profile> {
        self.resolve_with(name, &super::sandbox::SandboxDefaults::default(), None)
    }

    /// [`Self::resolve`] with the `[sandbox]` table's defaults, and the server's own files that
    /// no sandbox path may overlap (`None`: not checked, as when a config file is only listed).
    pub fn resolve_with(
        self,
        name: &str,
        defaults: &super::sandbox::SandboxDefaults,
        protected: Option<&[PathBuf]>,
    ) -> anyhow::Result<Profile> {
        let file = self;
        let table = format!("profiles.{name}");
        let field = |key: &str| format!("{table}.{key}");
        let duration = |key: &str, value: &Option<String>| {
            value
                .as_deref()
                .map(|text| parse_duration(&field(key), text))
                .transpose()
        };
        let preset = named_preset(&table, file.preset.as_deref())?;
        let (launch, remote) = match file.kind {
            ProfileKind::Local => (file.local_launch(&table, preset)?, None),
            ProfileKind::Remote => (Launch::default(), Some(file.remote_target(&table)?)),
        };
        file.check_warm_pool(&table, remote.is_some())?;
        let sandbox = match file.kind {
            ProfileKind::Remote => {
                // The bridge boxes its runtimes by its own profile's settings.
                for (key, set) in [
                    ("sandbox", file.sandbox.is_some()),
                    ("egress", file.egress.is_some()),
                ] {
                    if set {
                        anyhow::bail!(
                            "{table}.{key} is for local profiles: a bridge boxes its runtimes by \
                             its own profile's {key}"
                        );
                    }
                }
                None
            }
            ProfileKind::Local => super::sandbox::box_policy(
                &table,
                file.sandbox.as_ref(),
                file.egress.as_ref(),
                preset,
                defaults,
                protected,
            )?,
        };
        if sandbox.is_some() {
            check_boxed(&table, &launch, file.warm_pool)?;
        }
        let mut sandbox = sandbox;
        // Written as a table, it needs a box of the box's own network; a preset's default (or
        // `false`) asks nothing.
        if matches!(file.model_proxy, Some(toml::Value::Table(_))) {
            match &sandbox {
                None => anyhow::bail!(
                    "{table}.model_proxy is for boxed local profiles: the proxy listens inside \
                     the box (this profile is remote, or has sandbox = \"off\")"
                ),
                Some(policy) if policy.egress == crate::acp::sandbox::Egress::Open => {
                    anyhow::bail!(
                        "{table}.model_proxy needs the box's own network, and egress = \"open\" \
                         gives it the server's"
                    )
                }
                Some(_) => {}
            }
        }
        let model = super::sandbox::model_routes(
            &table,
            file.model_proxy.as_ref(),
            &launch.secrets,
            preset,
        )?;
        if let Some(policy) = &mut sandbox
            && policy.egress != crate::acp::sandbox::Egress::Open
        {
            policy.model = model;
        }
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
        let permission_rules = file.permission_rules(&table)?;
        let resilience = file.resilience(&table, preset)?;
        let startup_timeout = match duration("startup_timeout", &file.startup_timeout)? {
            Some(timeout) => timeout,
            None => match preset {
                Some(preset) => parse_duration(&field("preset"), preset.startup_timeout)?,
                None => DEFAULT_STARTUP_TIMEOUT,
            },
        };
        let turn_timeout = match duration("turn_timeout", &file.turn_timeout)? {
            Some(limit) => Some(limit),
            None => preset
                .and_then(|p| p.turn_timeout)
                .map(|text| parse_duration(&field("preset"), text))
                .transpose()?,
        };
        if turn_timeout.is_some_and(|t| t.is_zero()) {
            anyhow::bail!(
                "{} = {:?} must be more than zero (leave it out for no limit)",
                field("turn_timeout"),
                file.turn_timeout.as_deref().unwrap_or_default()
            );
        }
        let mut config_options = preset.map(Preset::config_options_map).unwrap_or_default();
        config_options.extend(file.config_options);
        let auth_method = match file.auth_method {
            Some(method) => Some(method).filter(|m| !m.is_empty()),
            None => preset.and_then(|p| p.auth_method).map(str::to_owned),
        };
        Ok(Profile {
            name: name.to_owned(),
            command: PathBuf::from(launch.command),
            args: launch.args,
            env: launch.env,
            secrets: launch.secrets,
            config_options,
            auth_method,
            permission_policy: file.permission_policy,
            allowed_cwd_roots: file.allowed_cwd_roots,
            startup_timeout,
            turn_timeout,
            cancel_grace: duration("cancel_grace", &file.cancel_grace)?
                .unwrap_or(DEFAULT_CANCEL_GRACE),
            idle_timeout: duration("idle_timeout", &file.idle_timeout)?,
            permission_rules,
            permission_timeout: duration("permission_timeout", &file.permission_timeout)?,
            remote,
            warm_pool: file.warm_pool,
            resilience,
            sandbox,
        })
    }

    /// What a local profile runs; the keys only remote profiles have are refused.
    fn local_launch(&self, table: &str, preset: Option<&Preset>) -> anyhow::Result<Launch> {
        for (key, set) in [
            ("bridge_profile", self.bridge_profile.is_some()),
            ("reconnect_grace", self.reconnect_grace.is_some()),
            ("bridge_principals", self.bridge_principals.is_some()),
            ("bridge_labels", !self.bridge_labels.is_empty()),
        ] {
            if set {
                anyhow::bail!("{table}.{key} is only for kind = \"remote\"");
            }
        }
        self.launch_keys().resolve(table, preset)
    }

    fn launch_keys(&self) -> LaunchKeys {
        LaunchKeys {
            command: self.command.clone(),
            args: self.args.clone(),
            env: self.env.clone(),
            env_passthrough: self.env_passthrough.clone(),
            env_files: self.env_files.clone(),
        }
    }

    /// Where a remote profile's runtimes run. What runs there is the bridge's own profile's.
    fn remote_target(&self, table: &str) -> anyhow::Result<RemoteTarget> {
        if self.launch_keys().any() {
            anyhow::bail!(
                "{table} is remote: the bridge's own profile holds command, args, env, \
                 env_passthrough and env_files"
            );
        }
        let Some(bridge_profile) = self.bridge_profile.clone().filter(|p| !p.is_empty()) else {
            anyhow::bail!("{table}.bridge_profile is required for kind = \"remote\"");
        };
        if let Some(principals) = &self.bridge_principals {
            if principals.is_empty() {
                anyhow::bail!(
                    "{table}.bridge_principals is empty: no bridge could run this profile \
                     (leave it out to allow any)"
                );
            }
            for (i, principal) in principals.iter().enumerate() {
                crate::auth::tokens::check_principal(principal)
                    .with_context(|| format!("{table}.bridge_principals[{i}]"))?;
            }
        }
        let reconnect_grace = match &self.reconnect_grace {
            Some(text) => parse_duration(&format!("{table}.reconnect_grace"), text)?,
            None => crate::acp::remote::DEFAULT_RECONNECT_GRACE,
        };
        Ok(RemoteTarget {
            bridge_labels: self.bridge_labels.clone(),
            bridge_principals: self.bridge_principals.clone(),
            bridge_profile,
            reconnect_grace,
        })
    }

    fn check_warm_pool(&self, table: &str, remote: bool) -> anyhow::Result<()> {
        if self.warm_pool > 0 && remote {
            anyhow::bail!(
                "{table}.warm_pool is only for local profiles: a remote runtime starts on a \
                 bridge when asked"
            );
        }
        if self.warm_pool > MAX_WARM_POOL {
            anyhow::bail!(
                "{table}.warm_pool = {} is over the maximum of {MAX_WARM_POOL}",
                self.warm_pool
            );
        }
        Ok(())
    }

    /// The rules in order; an unknown decision or a bad regex is refused with the rule's place.
    fn permission_rules(&self, table: &str) -> anyhow::Result<Vec<PermissionRule>> {
        let mut rules = Vec::with_capacity(self.permission_rules.len());
        for (i, rule) in self.permission_rules.iter().enumerate() {
            let key = |k: &str| format!("{table}.permission_rules[{i}].{k}");
            let decision: RuleDecision =
                serde::Deserialize::deserialize(serde::de::value::StrDeserializer::<
                    serde::de::value::Error,
                >::new(&rule.decision))
                .map_err(|_| {
                    anyhow::anyhow!(
                        "{} = {:?} is not a decision; use allow_once, allow_always, \
                         reject_once, reject_always or ask",
                        key("decision"),
                        rule.decision
                    )
                })?;
            let title_regex = rule
                .title_regex
                .as_deref()
                .map(|text| {
                    regex::Regex::new(text).map_err(|e| {
                        anyhow::anyhow!(
                            "{} = {text:?} is not a valid regular expression: {e}",
                            key("title_regex")
                        )
                    })
                })
                .transpose()?;
            rules.push(PermissionRule {
                kind: rule.kind.clone(),
                title_regex,
                decision,
            });
        }
        Ok(rules)
    }

    fn resilience(&self, table: &str, preset: Option<&Preset>) -> anyhow::Result<Resilience> {
        let reopen_context_bytes = self
            .reopen_context_bytes
            .unwrap_or(DEFAULT_REOPEN_CONTEXT_BYTES);
        if reopen_context_bytes > MAX_REOPEN_CONTEXT_BYTES {
            anyhow::bail!(
                "{table}.reopen_context_bytes = {reopen_context_bytes} is over the maximum of \
                 {MAX_REOPEN_CONTEXT_BYTES}"
            );
        }
        let stop_grace = match &self.stop_grace {
            Some(text) => parse_duration(&format!("{table}.stop_grace"), text)?,
            None => Resilience::default().stop_grace,
        };
        if stop_grace > crate::acp::process::MAX_STOP_GRACE {
            anyhow::bail!(
                "{table}.stop_grace is over the maximum of {}",
                humantime::format_duration(crate::acp::process::MAX_STOP_GRACE)
            );
        }
        Ok(Resilience {
            stop_grace,
            restart_after_cancel: self
                .restart_after_cancel
                .unwrap_or(preset.is_some_and(|p| p.restart_after_cancel)),
            restart_after_error: self
                .restart_after_error
                .unwrap_or(preset.is_some_and(|p| p.restart_after_error)),
            on_reopen_failure: self.on_reopen_failure,
            reopen_context_bytes,
        })
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
        let profile = file(
            r#"command = "npx"
                   args = ["@agentclientprotocol/claude-agent-acp"]
                   env = { ANTHROPIC_API_KEY = "k" }
                   permission_policy = "auto_accept"
                   allowed_cwd_roots = ["/workspaces"]
                   startup_timeout = "5s"
                   idle_timeout = "10m""#,
        )
        .resolve("claude")
        .unwrap();
        assert_eq!(profile.startup_timeout, Duration::from_secs(5));
        assert_eq!(profile.cancel_grace, DEFAULT_CANCEL_GRACE);
        assert_eq!(profile.idle_timeout, Some(Duration::from_secs(600)));
        assert_eq!(profile.permission_policy, PermissionPolicy::AutoAccept);
    }

    #[test]
    fn a_turn_timeout_that_is_zero_negative_or_no_duration_is_refused_naming_profile_and_key() {
        for bad in ["0s", "-5s", "soon", ""] {
            let error = file(&format!("command = \"agent\"\nturn_timeout = {bad:?}"))
                .resolve("slow")
                .expect_err(bad)
                .to_string();
            assert!(
                error.contains("profiles.slow.turn_timeout"),
                "{bad:?}: {error}"
            );
        }
        let set = file("command = \"agent\"\nturn_timeout = \"90s\"")
            .resolve("slow")
            .unwrap();
        assert_eq!(set.turn_timeout, Some(Duration::from_secs(90)));
        // A preset's own limit applies unless the profile writes one.
        let opencode = file("preset = \"opencode\"").resolve("o").unwrap();
        assert_eq!(opencode.turn_timeout, Some(Duration::from_secs(30 * 60)));
        let claude = file("preset = \"claude\"").resolve("c").unwrap();
        assert_eq!(claude.turn_timeout, None);
    }

    #[test]
    fn a_remote_profile_may_name_the_principals_whose_bridges_run_it_and_a_local_one_may_not() {
        let profile = file(
            r#"kind = "remote"
               bridge_profile = "claude"
               bridge_principals = ["sandbox-7", "ci-bridges"]"#,
        )
        .resolve("far")
        .unwrap();
        let remote = profile.remote.expect("remote");
        assert_eq!(
            remote.bridge_principals.as_deref(),
            Some(&["sandbox-7".to_owned(), "ci-bridges".to_owned()][..])
        );
        let unset = file("kind = \"remote\"\nbridge_profile = \"x\"")
            .resolve("far")
            .unwrap();
        assert_eq!(unset.remote.unwrap().bridge_principals, None);
        for (text, needle) in [
            (
                "kind = \"remote\"\nbridge_profile = \"x\"\nbridge_principals = []",
                "bridge_principals is empty",
            ),
            (
                "kind = \"remote\"\nbridge_profile = \"x\"\nbridge_principals = [\"\"]",
                "bridge_principals[0]",
            ),
            (
                "command = \"sh\"\nbridge_principals = [\"a\"]",
                "only for kind = \"remote\"",
            ),
        ] {
            let err = format!("{:#}", file(text).resolve("far").unwrap_err());
            assert!(err.contains(needle), "{text:?} → {err}");
        }
    }

    #[test]
    fn a_remote_profile_names_a_bridge_profile_and_labels_and_no_command() {
        let profile = file(
            r#"kind = "remote"
               bridge_labels = { pool = "sandbox" }
               bridge_profile = "claude"
               reconnect_grace = "5s""#,
        )
        .resolve("far")
        .unwrap();
        let remote = profile.remote.expect("remote");
        assert_eq!(remote.bridge_profile, "claude");
        assert_eq!(remote.bridge_labels["pool"], "sandbox");
        assert_eq!(remote.reconnect_grace, Duration::from_secs(5));
        let err = file("kind = \"remote\"").resolve("far").unwrap_err();
        assert!(err.to_string().contains("bridge_profile"), "{err}");
        let err = file("kind = \"remote\"\nbridge_profile = \"x\"\ncommand = \"sh\"")
            .resolve("far")
            .unwrap_err();
        assert!(err.to_string().contains("remote"), "{err}");
        let err = file("command = \"x\"\nbridge_profile = \"y\"")
            .resolve("p")
            .unwrap_err();
        assert!(err.to_string().contains("bridge_profile"), "{err}");
    }

    #[test]
    fn unknown_keys_and_bad_durations_are_refused_by_name() {
        let err = toml::from_str::<ProfileFile>("command = \"x\"\nbogus = 1").unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
        let err = file("command = \"x\"\ncancel_grace = \"soon\"")
            .resolve("p")
            .unwrap_err();
        assert!(err.to_string().contains("profiles.p.cancel_grace"), "{err}");
        let err = file("command = \"x\"\nallowed_cwd_roots = [\"rel\"]")
            .resolve("p")
            .unwrap_err();
        assert!(err.to_string().contains("allowed_cwd_roots"), "{err}");
    }

    #[test]
    fn permission_rules_are_read_in_order_with_their_timeout() {
        let profile = file(
            r#"command = "x"
               permission_timeout = "2m"
               [[permission_rules]]
               kind = "read"
               decision = "allow_always"
               [[permission_rules]]
               title_regex = "^rm "
               decision = "reject_once""#,
        )
        .resolve("p")
        .unwrap();
        assert_eq!(profile.permission_timeout, Some(Duration::from_secs(120)));
        assert_eq!(profile.permission_rules.len(), 2);
        assert_eq!(
            profile.permission_rules[0].decision,
            RuleDecision::AllowAlways
        );
        assert!(profile.permission_rules[1].matches("execute", "rm -rf /"));
        assert!(!profile.permission_rules[0].matches("execute", "cat"));
    }

    #[test]
    fn a_warm_pool_is_read_for_unboxed_local_profiles_and_refused_for_boxed_or_remote_ones_or_when_too_big()
     {
        let profile = file("command = \"x\"\nwarm_pool = 2\nsandbox = \"off\"")
            .resolve("p")
            .unwrap();
        assert_eq!(profile.warm_pool, 2);
        assert_eq!(file("command = \"x\"").resolve("p").unwrap().warm_pool, 0);
        let err = file("kind = \"remote\"\nbridge_profile = \"b\"\nwarm_pool = 1")
            .resolve("far")
            .unwrap_err();
        assert!(err.to_string().contains("profiles.far.warm_pool"), "{err}");
        let err = file("command = \"x\"\nwarm_pool = 65")
            .resolve("p")
            .unwrap_err();
        assert!(err.to_string().contains("profiles.p.warm_pool"), "{err}");
        let err = toml::from_str::<ProfileFile>("command = \"x\"\nwarm_pool = -1").unwrap_err();
        assert!(err.to_string().contains("warm_pool"), "{err}");
        let err = file("command = \"x\"\nwarm_pool = 1")
            .resolve("p")
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("profiles.p.warm_pool needs sandbox = \"off\""),
            "{err}"
        );
    }

    #[test]
    fn a_boxed_profile_may_not_set_its_own_home() {
        for text in [
            "command = \"x\"\nenv = { HOME = \"/root\" }",
            "command = \"x\"\nenv_passthrough = [\"HOME\"]",
        ] {
            let err = file(text).resolve("p").unwrap_err();
            assert!(err.to_string().contains("sets HOME"), "{text}: {err}");
        }
        let unboxed = file("command = \"x\"\nenv = { HOME = \"/root\" }\nsandbox = \"off\"")
            .resolve("p")
            .unwrap();
        assert!(unboxed.sandbox.is_none());
    }

    #[test]
    fn a_model_proxy_is_read_for_boxed_profiles_and_bad_entries_are_refused_naming_the_key() {
        let profile = file(
            r#"command = "x"
               env_passthrough = ["ANTHROPIC_API_KEY"]
               env_files = { OPENAI_API_KEY = "/run/secrets/openai" }
               model_proxy = { anthropic = { key = "ANTHROPIC_API_KEY" }, openai = { key = "OPENAI_API_KEY", upstream = "http://127.0.0.1:9/base" } }"#,
        )
        .resolve("p")
        .unwrap();
        let routes = &profile.sandbox.expect("boxed").model;
        assert_eq!(routes.len(), 2);
        assert_eq!(
            routes[0].upstream, None,
            "the base URL variable's, else the provider's"
        );
        assert_eq!(
            routes[1].upstream.as_ref().map(|u| u.to_string()),
            Some("http://127.0.0.1:9/base".to_owned())
        );
        assert!(!routes[0].when_key_set && !routes[1].when_key_set);
        let keys = "command = \"x\"\nenv_passthrough = [\"K\"]\n";
        for (text, needle) in [
            ("model_proxy = \"on\"", "profiles.p.model_proxy"),
            (
                "model_proxy = { gemini = { key = \"K\" } }",
                "profiles.p.model_proxy.gemini: no such provider",
            ),
            (
                "model_proxy = { anthropic = { key = \"OTHER\" } }",
                "profiles.p.model_proxy.anthropic.key",
            ),
            (
                "model_proxy = { anthropic = { key = \"K\", upstream = \"ftp://x\" } }",
                "profiles.p.model_proxy.anthropic.upstream",
            ),
            (
                "model_proxy = { anthropic = { key = \"K\", upstream = \"https://x/?a=b\" } }",
                "has a query",
            ),
            (
                "model_proxy = { anthropic = { key = \"K\", bogus = 1 } }",
                "profiles.p.model_proxy.anthropic",
            ),
            (
                "model_proxy = { anthropic = { key = \"K\" } }\nsandbox = \"off\"",
                "for boxed local profiles",
            ),
            (
                "model_proxy = { anthropic = { key = \"K\" } }\negress = \"open\"",
                "the box's own network",
            ),
        ] {
            let text = format!("{keys}{text}");
            let err = format!("{:#}", file(&text).resolve("p").unwrap_err());
            assert!(err.contains(needle), "{text:?} → {err}");
        }
        let remote = file(
            "kind = \"remote\"\nbridge_profile = \"b\"\nmodel_proxy = { anthropic = { key = \"K\" } }",
        )
        .resolve("p")
        .unwrap_err();
        assert!(
            remote.to_string().contains("for boxed local profiles"),
            "{remote}"
        );
    }

    #[test]
    fn a_presets_agent_goes_through_the_model_proxy_where_its_key_is_passed_unless_turned_off() {
        use crate::model_proxy::Provider;
        let routes = |text: &str| {
            file(text)
                .resolve("p")
                .unwrap()
                .sandbox
                .map(|policy| policy.model)
                .unwrap_or_default()
        };
        let claude = routes("preset = \"claude\"");
        assert_eq!(claude.len(), 1);
        assert_eq!(claude[0].provider, Provider::Anthropic);
        assert_eq!(claude[0].key_var, "ANTHROPIC_API_KEY");
        assert!(claude[0].when_key_set);
        assert_eq!(routes("preset = \"codex\"")[0].provider, Provider::OpenAi);
        // A key from a file counts as the preset's key.
        assert_eq!(
            routes(
                "preset = \"codex\"\nenv_passthrough = []\nenv_files = { OPENAI_API_KEY = \"/k\" }"
            )
            .len(),
            1
        );
        for off in [
            "preset = \"claude\"\nmodel_proxy = false",
            "preset = \"claude\"\negress = \"open\"",
            "preset = \"claude\"\nsandbox = \"off\"",
            "preset = \"opencode\"",
        ] {
            assert!(routes(off).is_empty(), "{off}");
        }
    }

    #[test]
    fn a_route_at_start_takes_the_base_url_the_agent_would_have_had_as_its_upstream() {
        use crate::model_proxy::{ModelRoute, Provider};
        let route = |provider: Provider| ModelRoute {
            provider,
            key_var: provider.key_var().to_owned(),
            upstream: None,
            when_key_set: true,
        };
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let anthropic = route(Provider::Anthropic);
        assert!(
            anthropic.at_start(env(&[])).unwrap().is_none(),
            "no key, no route"
        );
        let active = anthropic
            .at_start(env(&[
                ("ANTHROPIC_API_KEY", "k"),
                ("ANTHROPIC_BASE_URL", "http://127.0.0.1:7/"),
            ]))
            .unwrap()
            .unwrap();
        assert_eq!(active.upstream.base.to_string(), "http://127.0.0.1:7/");
        assert_eq!(active.upstream.key, "k");
        let active = anthropic
            .at_start(env(&[("ANTHROPIC_API_KEY", "k")]))
            .unwrap()
            .unwrap();
        assert_eq!(
            active.upstream.base.to_string(),
            "https://api.anthropic.com/"
        );
        let openai = route(Provider::OpenAi);
        let active = openai
            .at_start(env(&[
                ("OPENAI_API_KEY", "k"),
                ("OPENAI_BASE_URL", "https://gw.example/openai/v1"),
            ]))
            .unwrap()
            .unwrap();
        assert_eq!(
            active.upstream.base.to_string(),
            "https://gw.example/openai"
        );
        let refused = openai
            .at_start(env(&[
                ("OPENAI_API_KEY", "k"),
                ("OPENAI_BASE_URL", "https://gw.example/openai"),
            ]))
            .unwrap_err();
        assert!(
            refused.contains("OPENAI_BASE_URL") && refused.contains("/v1"),
            "{refused}"
        );
        assert!(
            !refused.contains("gw.example"),
            "the value is never quoted: {refused}"
        );
        let refused = anthropic
            .at_start(env(&[
                ("ANTHROPIC_API_KEY", "k"),
                ("ANTHROPIC_BASE_URL", "ftp://user:secret@x"),
            ]))
            .unwrap_err();
        assert!(
            refused.contains("ANTHROPIC_BASE_URL") && !refused.contains("secret"),
            "{refused}"
        );
    }

    #[test]
    fn stop_grace_restart_after_cancel_and_the_reopen_fallback_are_read_with_their_defaults() {
        let profile = file(
            r#"command = "x"
               stop_grace = "5s"
               restart_after_cancel = true
               on_reopen_failure = "fresh"
               reopen_context_bytes = 1000"#,
        )
        .resolve("p")
        .unwrap();
        assert_eq!(
            profile.resilience,
            Resilience {
                stop_grace: Duration::from_secs(5),
                restart_after_cancel: true,
                restart_after_error: false,
                on_reopen_failure: OnReopenFailure::Fresh,
                reopen_context_bytes: 1000,
            }
        );
        let defaults = file("command = \"x\"").resolve("p").unwrap().resilience;
        assert_eq!(defaults.stop_grace, Duration::from_secs(2));
        assert!(!defaults.restart_after_cancel);
        assert_eq!(defaults.on_reopen_failure, OnReopenFailure::Disconnect);
        assert_eq!(defaults.reopen_context_bytes, 32 * 1024);
        for (text, needle) in [
            ("stop_grace = \"soon\"", "profiles.p.stop_grace"),
            ("stop_grace = \"11m\"", "profiles.p.stop_grace"),
            (
                "reopen_context_bytes = 2000000",
                "profiles.p.reopen_context_bytes",
            ),
        ] {
            let err = format!(
                "{:#}",
                file(&format!("command = \"x\"\n{text}"))
                    .resolve("p")
                    .unwrap_err()
            );
            assert!(err.contains(needle), "{text} → {err}");
        }
        let err = toml::from_str::<ProfileFile>("command = \"x\"\non_reopen_failure = \"retry\"")
            .unwrap_err();
        assert!(err.to_string().contains("on_reopen_failure"), "{err}");
    }

    #[test]
    fn a_preset_fills_in_what_the_profile_leaves_out_and_every_written_key_wins() {
        let plain = file("preset = \"claude-0.23.1\"").resolve("c").unwrap();
        assert_eq!(plain.command, PathBuf::from("npx"));
        assert_eq!(
            plain.args,
            ["-y", "@zed-industries/claude-agent-acp@0.23.1"]
        );
        assert_eq!(plain.env["DISABLE_TELEMETRY"], "1");
        assert_eq!(
            plain.secrets.passthrough,
            ["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"]
        );
        assert!(plain.resilience.restart_after_cancel && plain.resilience.restart_after_error);
        assert_eq!(plain.startup_timeout, Duration::from_secs(120));
        let newest = file("preset = \"claude\"").resolve("c").unwrap();
        assert_eq!(newest.config_options["mode"], "default");
        assert!(!newest.resilience.restart_after_cancel);

        let own = file(
            r#"preset = "claude-0.23.1"
               command = "node"
               args = ["/opt/claude/dist/index.js"]
               env = { DISABLE_TELEMETRY = "0", ANTHROPIC_BASE_URL = "http://127.0.0.1:9" }
               env_files = { ANTHROPIC_API_KEY = "/run/secrets/anthropic" }
               config_options = { mode = "acceptEdits" }
               restart_after_cancel = false
               restart_after_error = false
               startup_timeout = "5s""#,
        )
        .resolve("c")
        .unwrap();
        assert_eq!(own.command, PathBuf::from("node"));
        assert_eq!(own.args, ["/opt/claude/dist/index.js"]);
        assert_eq!(own.env["DISABLE_TELEMETRY"], "0");
        assert_eq!(own.env["DISABLE_AUTOUPDATER"], "1");
        // A variable the profile names itself is no longer the preset's to pass through.
        assert!(own.secrets.passthrough.is_empty(), "{:?}", own.secrets);
        assert_eq!(
            own.secrets.files["ANTHROPIC_API_KEY"],
            PathBuf::from("/run/secrets/anthropic")
        );
        assert_eq!(own.config_options["mode"], "acceptEdits");
        assert!(!own.resilience.restart_after_cancel && !own.resilience.restart_after_error);
        assert_eq!(own.startup_timeout, Duration::from_secs(5));
        let auto = file("preset = \"claude\"\nconfig_options = { mode = \"auto\" }")
            .resolve("c")
            .unwrap();
        assert_eq!(auto.config_options["mode"], "auto");
        let codex = file("preset = \"codex\"").resolve("c").unwrap();
        assert_eq!(codex.auth_method.as_deref(), Some("openai-api-key"));
        let custom = file("preset = \"codex\"\nauth_method = \"\"")
            .resolve("c")
            .unwrap();
        assert_eq!(custom.auth_method, None);
    }

    #[test]
    fn secrets_are_named_once_files_are_absolute_and_an_unknown_preset_lists_the_known() {
        for (text, needle) in [
            (
                "command = \"x\"\nenv = { K = \"v\" }\nenv_passthrough = [\"K\"]",
                "K is in both env and env_passthrough",
            ),
            (
                "command = \"x\"\nenv_passthrough = [\"K\"]\nenv_files = { K = \"/k\" }",
                "K is in both env_passthrough and env_files",
            ),
            (
                "command = \"x\"\nenv_files = { K = \"k.txt\" }",
                "profiles.p.env_files.K",
            ),
            (
                "command = \"x\"\nenv_passthrough = [\"A=B\"]",
                "not a variable name",
            ),
            (
                "preset = \"gemini\"",
                "profiles.p.preset = \"gemini\" is not a preset",
            ),
            ("args = [\"x\"]", "profiles.p.command is empty"),
        ] {
            let err = format!("{:#}", file(text).resolve("p").unwrap_err());
            assert!(err.contains(needle), "{text:?} → {err}");
        }
        let err = format!(
            "{:#}",
            file("preset = \"gemini\"").resolve("p").unwrap_err()
        );
        assert!(err.contains("claude") && err.contains("opencode"), "{err}");
        let passed = file("command = \"x\"\nenv_passthrough = [\"OPENAI_API_KEY\"]")
            .resolve("p")
            .unwrap();
        assert_eq!(passed.secrets.passthrough, ["OPENAI_API_KEY"]);
    }

    #[test]
    fn a_remote_profile_takes_a_presets_defences_but_not_its_command_or_secrets() {
        let remote =
            file("kind = \"remote\"\nbridge_profile = \"claude\"\npreset = \"claude-0.23.1\"")
                .resolve("far")
                .unwrap();
        assert!(remote.resilience.restart_after_cancel);
        assert!(remote.env.is_empty() && remote.secrets.is_empty());
        let err = file(
            "kind = \"remote\"\nbridge_profile = \"b\"\nenv_passthrough = [\"ANTHROPIC_API_KEY\"]",
        )
        .resolve("far")
        .unwrap_err();
        assert!(err.to_string().contains("env_passthrough"), "{err}");
    }

    #[test]
    fn a_bad_rule_is_refused_naming_its_key() {
        let err = file("command = \"x\"\n[[permission_rules]]\ndecision = \"maybe\"")
            .resolve("p")
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("profiles.p.permission_rules[0].decision"),
            "{err}"
        );
        let err = file(
            "command = \"x\"\n[[permission_rules]]\ndecision = \"ask\"\n\
             [[permission_rules]]\ntitle_regex = \"(\"\ndecision = \"ask\"",
        )
        .resolve("p")
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("profiles.p.permission_rules[1].title_regex"),
            "{err}"
        );
        let err = file("command = \"x\"\npermission_timeout = \"later\"")
            .resolve("p")
            .unwrap_err();
        assert!(
            err.to_string().contains("profiles.p.permission_timeout"),
            "{err}"
        );
    }
}
