//! Presets: the agents the `agents` test stage drives end to end (docs/agents.md), each at the
//! version it tested, with the command line, environment and defences that made it work. A
//! profile names one (`preset = "claude"`) and writes only what differs: every key the profile
//! sets wins over the preset's (env, passthrough and config options key by key).

use std::collections::BTreeMap;

use crate::model_proxy::Provider;

/// One tested agent at one version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    /// The versioned name (`claude-0.101.0`); it never changes what it runs.
    pub name: &'static str,
    /// Short names for it (`claude`): they move to the newest tested version when the harness
    /// is upgraded.
    pub aliases: &'static [&'static str],
    /// Who the agent is, for people.
    pub agent: &'static str,
    /// The npm package and version the command runs.
    pub package: &'static str,
    pub version: &'static str,
    pub command: &'static str,
    pub args: &'static [&'static str],
    /// Environment values (switches, never secrets).
    pub env: &'static [(&'static str, &'static str)],
    /// The harness's variables passed through when set (the agent's API keys).
    pub env_passthrough: &'static [&'static str],
    /// Config options asked for on every new session.
    pub config_options: &'static [(&'static str, &'static str)],
    /// The sign-in method asked for with `authenticate` before a session is opened.
    pub auth_method: Option<&'static str>,
    /// Stop the runtime after a cancelled turn (the agent desyncs after one).
    pub restart_after_cancel: bool,
    /// Stop the runtime after a turn the agent answered with an error (likewise).
    pub restart_after_error: bool,
    /// A first start through `npx` downloads the package.
    pub startup_timeout: &'static str,
    /// The longest a turn may keep the agent busy (time waiting on a person not counted): a
    /// defence against an agent that retries a failing model API without end.
    pub turn_timeout: Option<&'static str>,
    /// The hosts its box may reach (`egress.allow` unless the profile names its own): the
    /// model API, and the npm registry its `npx` command downloads from.
    pub egress: &'static [&'static str],
    /// The agent runs its tools in a sandbox of its own (new user namespaces and mounts), which
    /// its box then allows (`sandbox.nested`).
    pub nested_sandbox: bool,
    /// The providers whose calls go through the model proxy when its box has one (the
    /// provider's key variable set, `egress` not open): the agent reads its key and base URL
    /// from the variables the proxy fills (docs/model-proxy.md).
    pub model_proxy: &'static [Provider],
}

/// Claude Code's switches against calling home; the stage runs with them.
const CLAUDE_ENV: &[(&str, &str)] = &[
    ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
    ("DISABLE_AUTOUPDATER", "1"),
    ("DISABLE_ERROR_REPORTING", "1"),
    ("DISABLE_TELEMETRY", "1"),
];

/// Where the presets' `npx` commands download their package from.
const NPM_REGISTRY: &str = "registry.npmjs.org:443";

/// Every preset, newest first within an agent.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "claude-0.101.0",
        aliases: &["claude"],
        agent: "Claude Code (its ACP adapter on the Claude Agent SDK)",
        package: "@agentclientprotocol/claude-agent-acp",
        version: "0.101.0",
        command: "npx",
        args: &["-y", "@agentclientprotocol/claude-agent-acp@0.101.0"],
        env: CLAUDE_ENV,
        env_passthrough: &["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"],
        // It starts sessions in `auto` (no permission is ever asked); `default` asks.
        config_options: &[("mode", "default")],
        auth_method: None,
        restart_after_cancel: false,
        restart_after_error: false,
        startup_timeout: "120s",
        turn_timeout: None,
        egress: &["api.anthropic.com:443", NPM_REGISTRY],
        nested_sandbox: false,
        model_proxy: &[Provider::Anthropic],
    },
    Preset {
        name: "claude-0.23.1",
        aliases: &[],
        agent: "Claude Code 2.1.83 (the older ACP adapter, bundled as JavaScript)",
        package: "@zed-industries/claude-agent-acp",
        version: "0.23.1",
        command: "npx",
        args: &["-y", "@zed-industries/claude-agent-acp@0.23.1"],
        env: CLAUDE_ENV,
        env_passthrough: &["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"],
        config_options: &[],
        // After a cancel, or a turn that failed on a model API error, every later prompt in the
        // process gets the previous prompt's reply.
        auth_method: None,
        restart_after_cancel: true,
        restart_after_error: true,
        startup_timeout: "120s",
        turn_timeout: None,
        egress: &["api.anthropic.com:443", NPM_REGISTRY],
        nested_sandbox: false,
        model_proxy: &[Provider::Anthropic],
    },
    Preset {
        name: "codex-0.16.0",
        aliases: &["codex"],
        agent: "Codex (its ACP adapter, a native binary)",
        package: "@zed-industries/codex-acp",
        version: "0.16.0",
        command: "npx",
        args: &["-y", "@zed-industries/codex-acp@0.16.0"],
        env: &[],
        env_passthrough: &["OPENAI_API_KEY"],
        // In a git repository it starts in `auto` (edits the workspace without asking);
        // `read-only` asks before any edit.
        config_options: &[("mode", "read-only")],
        // It answers `session/new` with "Authentication required" until `authenticate` with
        // this method (which reads OPENAI_API_KEY) — also when the key is set.
        auth_method: Some("openai-api-key"),
        restart_after_cancel: false,
        restart_after_error: false,
        startup_timeout: "120s",
        turn_timeout: None,
        egress: &["api.openai.com:443", NPM_REGISTRY],
        // Codex runs its commands under its own sandbox (bundled bubblewrap: a user namespace
        // and mounts), inside the harness's box.
        nested_sandbox: true,
        // Its built-in provider reads OPENAI_BASE_URL; `authenticate` reads OPENAI_API_KEY.
        model_proxy: &[Provider::OpenAi],
    },
    Preset {
        name: "qwen-0.24.4",
        aliases: &["qwen"],
        agent: "Qwen Code (`qwen --acp`, on an OpenAI-compatible API)",
        package: "@qwen-code/qwen-code",
        version: "0.24.4",
        command: "npx",
        args: &[
            "-y",
            "@qwen-code/qwen-code@0.24.4",
            "--acp",
            "--auth-type",
            "openai",
        ],
        env: &[],
        // Its OpenAI-compatible provider reads these; OPENAI_MODEL names the model when no
        // settings file does.
        env_passthrough: &["OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL"],
        // It starts sessions in `auto` (a model classifier approves what it deems safe, edits
        // included); `default` asks before any edit or command.
        config_options: &[("mode", "default")],
        // `--auth-type openai` signs it in with OPENAI_API_KEY; it needs no `authenticate`.
        auth_method: None,
        restart_after_cancel: false,
        restart_after_error: false,
        startup_timeout: "120s",
        turn_timeout: None,
        egress: &["api.openai.com:443", NPM_REGISTRY],
        nested_sandbox: false,
        // Its provider reads OPENAI_BASE_URL and OPENAI_API_KEY, which the proxy fills.
        model_proxy: &[Provider::OpenAi],
    },
    Preset {
        name: "opencode-1.18.33",
        aliases: &["opencode"],
        agent: "opencode (`opencode acp`, a native binary)",
        package: "opencode-ai",
        version: "1.18.33",
        command: "npx",
        args: &["-y", "opencode-ai@1.18.33", "acp"],
        env: &[
            ("OPENCODE_DISABLE_AUTOUPDATE", "1"),
            // Without it opencode edits inside the working directory without asking.
            ("OPENCODE_PERMISSION", r#"{"edit":"ask"}"#),
        ],
        env_passthrough: &["ANTHROPIC_API_KEY", "OPENAI_API_KEY"],
        config_options: &[],
        auth_method: None,
        restart_after_cancel: false,
        restart_after_error: false,
        startup_timeout: "120s",
        // It retries a model API answer of 429 or 5xx without end (2 s, 4 s, … 30 s apart),
        // so such a turn would run until someone stopped it.
        turn_timeout: Some("30m"),
        // It reads its list of models from models.dev at start (and carries a copy offline).
        egress: &[
            "api.anthropic.com:443",
            "api.openai.com:443",
            "models.dev:443",
            NPM_REGISTRY,
        ],
        nested_sandbox: false,
        // Its providers (the AI SDK's) read their base URLs their own way: a provider in its
        // opencode.json names the proxy instead (docs/model-proxy.md).
        model_proxy: &[],
    },
];

/// The preset a name or alias names.
pub fn find(name: &str) -> Option<&'static Preset> {
    PRESETS
        .iter()
        .find(|p| p.name == name || p.aliases.contains(&name))
}

/// Every name a profile may write, for an error message.
pub fn all_names() -> Vec<&'static str> {
    PRESETS
        .iter()
        .flat_map(|p| p.aliases.iter().copied().chain([p.name]))
        .collect()
}

impl Preset {
    pub fn env_map(&self) -> BTreeMap<String, String> {
        pairs(self.env)
    }

    pub fn config_options_map(&self) -> BTreeMap<String, String> {
        pairs(self.config_options)
    }

    /// The command line as one would type it.
    pub fn command_line(&self) -> String {
        std::iter::once(self.command)
            .chain(self.args.iter().copied())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

fn pairs(list: &[(&str, &str)]) -> BTreeMap<String, String> {
    list.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_runs_its_pinned_package_version_and_names_are_unique() {
        let mut names = all_names();
        let count = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), count, "a name or alias names one preset");
        for preset in PRESETS {
            let pinned = format!("{}@{}", preset.package, preset.version);
            assert!(
                preset.args.contains(&pinned.as_str()),
                "{} runs {pinned}",
                preset.name
            );
            assert!(preset.name.ends_with(preset.version), "{}", preset.name);
            assert!(humantime::parse_duration(preset.startup_timeout).is_ok());
            if let Some(limit) = preset.turn_timeout {
                assert!(humantime::parse_duration(limit).is_ok_and(|d| !d.is_zero()));
            }
            for host in preset.egress {
                assert!(
                    crate::acp::sandbox::EgressRule::parse(host).is_ok(),
                    "{host}"
                );
            }
        }
        assert_eq!(find("claude").unwrap().version, "0.101.0");
        // The Helm chart's schema lists the same names.
        let schema: serde_json::Value =
            serde_json::from_str(include_str!("../../helm/agent-harness/values.schema.json"))
                .unwrap();
        let profile = &schema["properties"]["profiles"]["additionalProperties"];
        let mut charted: Vec<&str> = profile["properties"]["preset"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        charted.sort();
        assert_eq!(charted, names, "values.schema.json's preset enum");
        assert_eq!(
            find("claude-0.23.1").unwrap().package,
            "@zed-industries/claude-agent-acp"
        );
        assert!(find("gemini").is_none());
    }
}
