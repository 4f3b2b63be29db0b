//! The box's configuration: the top-level `[sandbox]` table (shared by every profile) and each
//! profile's `sandbox` and `egress` keys. Everything is checked here, when the config is read:
//! paths absolute, existing and clear of the server's own files, sizes and quotas that parse,
//! egress entries that are hosts.
//!
//! ```toml
//! [sandbox]
//! homes_dir = "/var/lib/agent-harness/homes"   # default: <data_dir>/homes
//! uid = 65532                                  # the agents' ids when the server is root
//! gid = 65532
//! memory = "4GiB"                              # per runtime; "none" for no limit
//! pids = 2048
//!
//! [profiles.claude]
//! preset = "claude"
//! sandbox = { memory = "2GiB", read_only = ["/opt/tools"], home_seed = "/etc/seeds/claude" }
//! egress = { allow = ["api.anthropic.com"] }   # or egress = "open"
//! # sandbox = "off" runs it unboxed (warned at start)
//! ```

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

use crate::acp::sandbox::{
    BoxPolicy, Egress, EgressRule, Limits, SandboxSettings, parse_cpu, parse_size,
};

/// The default memory limit of a runtime.
pub const DEFAULT_MEMORY: &str = "4GiB";
/// The default process (and thread) limit of a runtime.
pub const DEFAULT_PIDS: u64 = 2048;

/// The `[sandbox]` table as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxFile {
    pub homes_dir: Option<PathBuf>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub cgroup: Option<PathBuf>,
    pub npm_cache: Option<PathBuf>,
    pub memory: Option<String>,
    pub pids: Option<toml::Value>,
    pub cpu: Option<String>,
}

/// Limits every sandboxed profile gets unless it says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxDefaults {
    pub limits: Limits,
}

impl Default for SandboxDefaults {
    fn default() -> Self {
        Self {
            limits: Limits {
                memory: Some(parse_size(DEFAULT_MEMORY).expect("a valid default")),
                pids: Some(DEFAULT_PIDS),
                cpu_millis: None,
            },
        }
    }
}

impl SandboxFile {
    /// The limits profiles inherit.
    pub fn defaults(&self) -> anyhow::Result<SandboxDefaults> {
        let mut limits = SandboxDefaults::default().limits;
        apply_limits(
            "sandbox",
            &mut limits,
            self.memory.as_deref(),
            self.pids.as_ref(),
            self.cpu.as_deref(),
        )?;
        Ok(SandboxDefaults { limits })
    }

    /// The settings shared by every box; `protected` are the server's own files (canonical).
    pub fn settings(
        &self,
        data_dir: &Path,
        launcher: PathBuf,
        protected: Vec<PathBuf>,
    ) -> anyhow::Result<SandboxSettings> {
        let homes_dir = match &self.homes_dir {
            Some(dir) => {
                if !dir.is_absolute() {
                    anyhow::bail!("sandbox.homes_dir = {dir:?} is not an absolute path");
                }
                dir.clone()
            }
            None => absolute(data_dir)?.join("homes"),
        };
        // A HOME inside the data dir is fine (each box sees its own HOME only); a homes_dir that
        // holds the server's files is not.
        if let Some(inside) = protected
            .iter()
            .find(|p| p.starts_with(&homes_dir) && !homes_dir.starts_with(p))
        {
            anyhow::bail!(
                "sandbox.homes_dir = {} holds {}, a file of the server's: every HOME would sit \
                 beside it",
                homes_dir.display(),
                inside.display()
            );
        }
        for (key, id) in [("uid", self.uid), ("gid", self.gid)] {
            if id == Some(0) {
                anyhow::bail!("sandbox.{key} = 0: agents never run as root");
            }
        }
        let npm_cache = self
            .npm_cache
            .as_ref()
            .map(|path| checked_path("sandbox.npm_cache", path, &protected))
            .transpose()?;
        if let Some(cgroup) = &self.cgroup
            && (!cgroup.is_absolute()
                || cgroup
                    .components()
                    .any(|c| matches!(c, std::path::Component::ParentDir)))
        {
            anyhow::bail!(
                "sandbox.cgroup = {cgroup:?} must be an absolute path inside the cgroup \
                 hierarchy (e.g. \"/agent-harness\"), without .."
            );
        }
        Ok(SandboxSettings {
            launcher,
            homes_dir,
            uid: self.uid.unwrap_or(crate::acp::sandbox::DEFAULT_AGENT_ID),
            gid: self.gid.unwrap_or(crate::acp::sandbox::DEFAULT_AGENT_ID),
            cgroup: self.cgroup.clone(),
            npm_cache,
            protected,
            model_key_file: Some(data_dir.join("model-proxy.key")),
            model_limits: crate::model_proxy::Limits::default(),
        })
    }
}

fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    match path.is_absolute() {
        true => Ok(path.to_path_buf()),
        false => Ok(std::env::current_dir()
            .context("the current directory")?
            .join(path)),
    }
}

/// A path a box will show: absolute, existing, canonical, and neither inside nor around a file
/// of the server's.
pub fn checked_path(key: &str, path: &Path, protected: &[PathBuf]) -> anyhow::Result<PathBuf> {
    if !path.is_absolute() {
        anyhow::bail!("{key} holds {path:?}, which is not an absolute path");
    }
    let canonical = std::fs::canonicalize(path)
        .with_context(|| format!("{key} holds {}, which cannot be used", path.display()))?;
    if let Some(overlap) = protected
        .iter()
        .find(|p| crate::acp::sandbox::overlaps(&canonical, p))
    {
        anyhow::bail!(
            "{key} holds {}, which overlaps {}, a file of the server's (the data dir, config, \
             tokens file, TLS keys or a profile's env_files): a box must never show it",
            path.display(),
            overlap.display()
        );
    }
    Ok(canonical)
}

/// A profile's `sandbox` table as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileSandbox {
    #[serde(default)]
    read_only: Vec<PathBuf>,
    #[serde(default)]
    read_write: Vec<PathBuf>,
    memory: Option<String>,
    pids: Option<toml::Value>,
    cpu: Option<String>,
    home_seed: Option<PathBuf>,
    nested: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileEgress {
    #[serde(default)]
    allow: Vec<String>,
}

/// How a profile's runtimes are boxed, from its `sandbox` and `egress` keys over the preset's
/// egress (`None`: `sandbox = "off"`). Paths are checked when `protected` is given (the server
/// knows its own files; listing a config file alone does not).
pub fn box_policy(
    table: &str,
    sandbox: Option<&toml::Value>,
    egress: Option<&toml::Value>,
    preset: Option<&crate::config::Preset>,
    defaults: &SandboxDefaults,
    protected: Option<&[PathBuf]>,
) -> anyhow::Result<Option<BoxPolicy>> {
    let preset_egress = preset.map(|p| p.egress).unwrap_or_default();
    let written: ProfileSandbox = match sandbox {
        None => ProfileSandbox::default(),
        Some(toml::Value::String(word)) => match word.as_str() {
            "off" => {
                if egress.is_some() {
                    anyhow::bail!(
                        "{table}.egress is set but {table}.sandbox = \"off\": an unboxed runtime \
                         has the server's network"
                    );
                }
                return Ok(None);
            }
            "on" => ProfileSandbox::default(),
            other => anyhow::bail!(
                "{table}.sandbox = {other:?}: write \"on\", \"off\" or a table of settings"
            ),
        },
        Some(value @ toml::Value::Table(_)) => value
            .clone()
            .try_into()
            .with_context(|| format!("{table}.sandbox"))?,
        Some(other) => {
            anyhow::bail!("{table}.sandbox = {other}: write \"on\", \"off\" or a table of settings")
        }
    };
    let mut limits = defaults.limits;
    apply_limits(
        &format!("{table}.sandbox"),
        &mut limits,
        written.memory.as_deref(),
        written.pids.as_ref(),
        written.cpu.as_deref(),
    )?;
    let paths = |key: &str, list: &[PathBuf]| -> anyhow::Result<Vec<PathBuf>> {
        list.iter()
            .enumerate()
            .map(|(i, path)| {
                let key = format!("{table}.sandbox.{key}[{i}]");
                match protected {
                    Some(protected) => checked_path(&key, path, protected),
                    None if path.is_absolute() => Ok(path.clone()),
                    None => anyhow::bail!("{key} holds {path:?}, which is not an absolute path"),
                }
            })
            .collect()
    };
    let read_only = paths("read_only", &written.read_only)?;
    let read_write = paths("read_write", &written.read_write)?;
    let home_seed = written
        .home_seed
        .as_ref()
        .map(|seed| paths("home_seed", std::slice::from_ref(seed)).map(|mut p| p.remove(0)))
        .transpose()?;
    if let Some(seed) = &home_seed
        && !seed.is_dir()
    {
        anyhow::bail!(
            "{table}.sandbox.home_seed = {} is not a directory",
            seed.display()
        );
    }
    let egress = match egress {
        None => Egress::Allow(
            preset_egress
                .iter()
                .map(|entry| EgressRule::parse(entry).expect("presets name valid hosts"))
                .collect(),
        ),
        Some(toml::Value::String(word)) if word == "open" => Egress::Open,
        Some(toml::Value::String(word)) => anyhow::bail!(
            "{table}.egress = {word:?}: write \"open\" or {{ allow = [\"host[:port]\", …] }}"
        ),
        Some(value) => {
            let written: ProfileEgress = value
                .clone()
                .try_into()
                .with_context(|| format!("{table}.egress"))?;
            let rules = written
                .allow
                .iter()
                .enumerate()
                .map(|(i, entry)| {
                    EgressRule::parse(entry)
                        .map_err(|why| anyhow::anyhow!("{table}.egress.allow[{i}]: {why}"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            for (port, whose) in [
                (crate::acp::sandbox::PROXY_PORT, "proxy"),
                (crate::model_proxy::MODEL_PROXY_PORT, "model proxy"),
            ] {
                if rules
                    .iter()
                    .any(|r| r.loopback_forward().is_some_and(|(_, p)| p == port))
                {
                    anyhow::bail!(
                        "{table}.egress.allow forwards loopback port {port}, which is the box's \
                         own {whose}"
                    );
                }
            }
            Egress::Allow(rules)
        }
    };
    Ok(Some(BoxPolicy {
        read_only,
        read_write,
        limits,
        egress,
        home_seed,
        nested: written
            .nested
            .unwrap_or(preset.is_some_and(|p| p.nested_sandbox)),
        model: Vec::new(),
    }))
}

/// A profile's `model_proxy` table: per provider (`anthropic`, `openai`), the variable holding
/// its key — one the profile takes from the harness (`env_passthrough` or `env_files`) — and
/// optionally its upstream.
///
/// ```toml
/// [profiles.claude]
/// preset = "claude"
/// model_proxy = { anthropic = { key = "ANTHROPIC_API_KEY" } }   # upstream: the provider's own
/// ```
///
/// Unwritten, a preset's providers go through it (`Preset::model_proxy`), each at the starts
/// where its key variable is set; `model_proxy = false` turns that off.
pub fn model_routes(
    table: &str,
    written: Option<&toml::Value>,
    secrets: &crate::acp::env::EnvSources,
    preset: Option<&super::Preset>,
) -> anyhow::Result<Vec<crate::model_proxy::ModelRoute>> {
    use crate::model_proxy::{ModelRoute, Provider};
    let takes =
        |var: &str| secrets.passthrough.iter().any(|p| p == var) || secrets.files.contains_key(var);
    let providers = match written {
        None => {
            let from_preset = preset.map(|p| p.model_proxy).unwrap_or_default();
            return Ok(from_preset
                .iter()
                .filter(|provider| takes(provider.key_var()))
                .map(|&provider| ModelRoute {
                    provider,
                    key_var: provider.key_var().to_owned(),
                    upstream: None,
                    when_key_set: true,
                })
                .collect());
        }
        Some(toml::Value::Boolean(false)) => return Ok(Vec::new()),
        Some(toml::Value::Table(providers)) => providers,
        Some(written) => anyhow::bail!(
            "{table}.model_proxy = {written}: write a table such as \
             {{ anthropic = {{ key = \"ANTHROPIC_API_KEY\" }} }}, or false to keep a preset's \
             agent off it"
        ),
    };
    let mut routes = Vec::new();
    for (name, value) in providers {
        let key = format!("{table}.model_proxy.{name}");
        let Some(provider) = Provider::parse(name) else {
            anyhow::bail!(
                "{key}: no such provider; the model proxy serves \"anthropic\" and \"openai\""
            );
        };
        let route: ModelRouteFile = value.clone().try_into().with_context(|| key.clone())?;
        if !takes(&route.key) {
            anyhow::bail!(
                "{key}.key = {:?} is not a variable this profile takes from the harness: name it \
                 in env_passthrough or env_files (the proxy holds its value; the agent gets a \
                 token in its place)",
                route.key
            );
        }
        let upstream = route
            .upstream
            .as_deref()
            .map(ModelRoute::parse_upstream)
            .transpose()
            .map_err(|why| anyhow::anyhow!("{key}.upstream: {why}"))?;
        routes.push(ModelRoute {
            provider,
            key_var: route.key,
            upstream,
            when_key_set: false,
        });
    }
    Ok(routes)
}

/// One provider's entry in a profile's `model_proxy` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelRouteFile {
    key: String,
    upstream: Option<String>,
}

/// `memory`, `pids` and `cpu` written over `limits`; `"none"` lifts a limit.
fn apply_limits(
    table: &str,
    limits: &mut Limits,
    memory: Option<&str>,
    pids: Option<&toml::Value>,
    cpu: Option<&str>,
) -> anyhow::Result<()> {
    if let Some(memory) = memory {
        limits.memory = match memory {
            "none" => None,
            text => Some(parse_size(text).map_err(|why| anyhow::anyhow!("{table}.memory: {why}"))?),
        };
    }
    if let Some(pids) = pids {
        limits.pids = match pids {
            toml::Value::String(none) if none == "none" => None,
            toml::Value::Integer(n) if *n >= 8 => Some(*n as u64),
            other => anyhow::bail!(
                "{table}.pids = {other}: write a number of processes (at least 8) or \"none\""
            ),
        };
    }
    if let Some(cpu) = cpu {
        limits.cpu_millis = match cpu {
            "none" => None,
            text => Some(parse_cpu(text).map_err(|why| anyhow::anyhow!("{table}.cpu: {why}"))?),
        };
    }
    Ok(())
}

/// The keys of a profile's `sandbox`, `egress` and `model_proxy` tables, for the reference
/// page's test (config/reference.rs).
#[cfg(test)]
pub(super) fn profile_sandbox_fields() -> &'static [&'static str] {
    super::reference::fields_of::<ProfileSandbox>()
}

#[cfg(test)]
pub(super) fn profile_egress_fields() -> &'static [&'static str] {
    super::reference::fields_of::<ProfileEgress>()
}

#[cfg(test)]
pub(super) fn model_route_fields() -> &'static [&'static str] {
    super::reference::fields_of::<ModelRouteFile>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(text: &str, protected: &[PathBuf]) -> anyhow::Result<Option<BoxPolicy>> {
        let table: toml::Table = toml::from_str(text).unwrap();
        box_policy(
            "profiles.p",
            table.get("sandbox"),
            table.get("egress"),
            crate::config::preset::find("claude"),
            &SandboxDefaults::default(),
            Some(protected),
        )
    }

    #[test]
    fn a_profile_is_boxed_by_default_with_the_default_limits_and_its_presets_hosts() {
        let boxed = policy("", &[]).unwrap().expect("boxed");
        assert_eq!(boxed.limits.memory, Some(4 << 30));
        assert_eq!(boxed.limits.pids, Some(DEFAULT_PIDS));
        let Egress::Allow(rules) = &boxed.egress else {
            panic!("not open")
        };
        assert!(rules[0].admits("api.anthropic.com", 443));
        assert!(!boxed.nested, "claude builds no sandbox of its own");
        assert!(policy("sandbox = \"off\"", &[]).unwrap().is_none());
        let open = policy("egress = \"open\"", &[]).unwrap().unwrap();
        assert_eq!(open.egress, Egress::Open);
        let custom = policy(
            "sandbox = { memory = \"512MiB\", pids = \"none\", cpu = \"0.5\" }\n\
             egress = { allow = [\"127.0.0.1:8080\"] }",
            &[],
        )
        .unwrap()
        .unwrap();
        assert_eq!(custom.limits.memory, Some(512 << 20));
        assert_eq!(custom.limits.pids, None);
        assert_eq!(custom.limits.cpu_millis, Some(500));
    }

    #[test]
    fn bad_sandbox_keys_are_refused_naming_the_profile_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let protected = vec![std::fs::canonicalize(&data).unwrap()];
        let inside = data.join("runtimes");
        std::fs::create_dir(&inside).unwrap();
        for (text, needle) in [
            ("sandbox = \"maybe\"", "profiles.p.sandbox"),
            (
                "sandbox = { memory = \"lots\" }",
                "profiles.p.sandbox.memory",
            ),
            ("sandbox = { pids = -1 }", "profiles.p.sandbox.pids"),
            ("sandbox = { cpu = \"fast\" }", "profiles.p.sandbox.cpu"),
            ("sandbox = { read_only = [\"relative\"] }", "read_only[0]"),
            (
                "sandbox = { read_only = [\"/does/not/exist\"] }",
                "read_only[0]",
            ),
            ("sandbox = { bogus = 1 }", "bogus"),
            (
                "egress = { allow = [\"http://x\"] }",
                "profiles.p.egress.allow[0]",
            ),
            ("egress = \"closed\"", "profiles.p.egress"),
            ("sandbox = \"off\"\negress = \"open\"", "profiles.p.egress"),
            ("egress = { allow = [\"127.0.0.1:3128\"] }", "proxy"),
            ("egress = { allow = [\"127.0.0.1:3129\"] }", "model proxy"),
        ] {
            let err = format!("{:#}", policy(text, &protected).unwrap_err());
            assert!(err.contains(needle), "{text:?} → {err}");
        }
        for key in ["read_only", "read_write"] {
            for path in [&data, &inside, dir.path()] {
                let text = format!("sandbox = {{ {key} = [{:?}] }}", path.display().to_string());
                let err = format!("{:#}", policy(&text, &protected).unwrap_err());
                assert!(err.contains("overlaps"), "{text} → {err}");
            }
        }
    }
}
