//! Runtime profiles: how to start an ACP runtime. From `[profiles.<name>]` tables in
//! the config file, plus the built-in `mock` profile that runs our own scripted agent.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use anyhow::Context;
use serde::Deserialize;

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
    /// Required for local profiles; remote ones name a `bridge_profile` instead.
    #[serde(default)]
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
    /// Stop the runtime after a cancelled turn; the next turn reopens it.
    #[serde(default)]
    pub restart_after_cancel: bool,
    /// `"disconnect"` (default) or `"fresh"`.
    #[serde(default)]
    pub on_reopen_failure: OnReopenFailure,
    /// Bytes of the transcript a fresh session is primed with (default 32768).
    pub reopen_context_bytes: Option<usize>,
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
    /// The profile this table describes, named `name`; durations parsed, paths checked.
    pub fn resolve(self, name: &str) -> anyhow::Result<Profile> {
        let file = self;
        let field = |key: &str| format!("profiles.{name}.{key}");
        let duration = |key: &str, value: &Option<String>| {
            value
                .as_deref()
                .map(|text| parse_duration(&field(key), text))
                .transpose()
        };
        let remote = match file.kind {
            ProfileKind::Local => {
                if file.command.trim().is_empty() {
                    anyhow::bail!("{} is empty", field("command"));
                }
                for key in ["bridge_profile", "reconnect_grace", "bridge_principals"] {
                    let set = match key {
                        "bridge_profile" => file.bridge_profile.is_some(),
                        "bridge_principals" => file.bridge_principals.is_some(),
                        _ => file.reconnect_grace.is_some(),
                    };
                    if set {
                        anyhow::bail!("{} is only for kind = \"remote\"", field(key));
                    }
                }
                if !file.bridge_labels.is_empty() {
                    anyhow::bail!("{} is only for kind = \"remote\"", field("bridge_labels"));
                }
                None
            }
            ProfileKind::Remote => {
                if !file.command.is_empty() || !file.args.is_empty() || !file.env.is_empty() {
                    anyhow::bail!(
                        "profiles.{name} is remote: the bridge's own profile holds command, args \
                         and env"
                    );
                }
                let Some(bridge_profile) = file.bridge_profile.clone().filter(|p| !p.is_empty())
                else {
                    anyhow::bail!(
                        "{} is required for kind = \"remote\"",
                        field("bridge_profile")
                    );
                };
                if let Some(principals) = &file.bridge_principals {
                    if principals.is_empty() {
                        anyhow::bail!(
                            "{} is empty: no bridge could run this profile (leave it out to allow \
                             any)",
                            field("bridge_principals")
                        );
                    }
                    for (i, principal) in principals.iter().enumerate() {
                        crate::auth::tokens::check_principal(principal)
                            .with_context(|| format!("{}[{i}]", field("bridge_principals")))?;
                    }
                }
                Some(RemoteTarget {
                    bridge_labels: file.bridge_labels.clone(),
                    bridge_principals: file.bridge_principals.clone(),
                    bridge_profile,
                    reconnect_grace: duration("reconnect_grace", &file.reconnect_grace)?
                        .unwrap_or(crate::acp::remote::DEFAULT_RECONNECT_GRACE),
                })
            }
        };
        if file.warm_pool > 0 && remote.is_some() {
            anyhow::bail!(
                "{} is only for local profiles: a remote runtime starts on a bridge when asked",
                field("warm_pool")
            );
        }
        if file.warm_pool > MAX_WARM_POOL {
            anyhow::bail!(
                "{} = {} is over the maximum of {MAX_WARM_POOL}",
                field("warm_pool"),
                file.warm_pool
            );
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
        let mut permission_rules = Vec::with_capacity(file.permission_rules.len());
        for (i, rule) in file.permission_rules.iter().enumerate() {
            let key = |k: &str| field(&format!("permission_rules[{i}].{k}"));
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
            permission_rules.push(PermissionRule {
                kind: rule.kind.clone(),
                title_regex,
                decision,
            });
        }
        let reopen_context_bytes = file
            .reopen_context_bytes
            .unwrap_or(DEFAULT_REOPEN_CONTEXT_BYTES);
        if reopen_context_bytes > MAX_REOPEN_CONTEXT_BYTES {
            anyhow::bail!(
                "{} = {reopen_context_bytes} is over the maximum of {MAX_REOPEN_CONTEXT_BYTES}",
                field("reopen_context_bytes")
            );
        }
        let stop_grace =
            duration("stop_grace", &file.stop_grace)?.unwrap_or(Resilience::default().stop_grace);
        if stop_grace > crate::acp::process::MAX_STOP_GRACE {
            anyhow::bail!(
                "{} is over the maximum of {}",
                field("stop_grace"),
                humantime::format_duration(crate::acp::process::MAX_STOP_GRACE)
            );
        }
        let resilience = Resilience {
            stop_grace,
            restart_after_cancel: file.restart_after_cancel,
            on_reopen_failure: file.on_reopen_failure,
            reopen_context_bytes,
        };
        Ok(Profile {
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
            permission_rules,
            permission_timeout: duration("permission_timeout", &file.permission_timeout)?,
            remote,
            warm_pool: file.warm_pool,
            resilience,
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
    fn a_warm_pool_is_read_for_local_profiles_and_refused_for_remote_ones_or_when_too_big() {
        let profile = file("command = \"x\"\nwarm_pool = 2").resolve("p").unwrap();
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
