//! Claude Code through its ACP adapters, against the fake Anthropic Messages API:
//! `@zed-industries/claude-agent-acp` 0.23.1 (bundles the Claude Code CLI as JavaScript) and the
//! newest `@agentclientprotocol/claude-agent-acp` (the SDK with a native Claude Code binary).
//!
//! The agent's environment: `ANTHROPIC_BASE_URL` (the fake), any `ANTHROPIC_API_KEY`, the
//! switches that keep it from calling home, and a private `HOME` (where it keeps its session
//! files). The harness gives a runtime only `PATH`, `HOME`, `LANG` and the profile's env, so
//! `IS_SANDBOX` (with which the CLI refuses to run as root) never reaches it.

use std::path::Path;

use agent_harness_model_fakes::{Api, FakeServer};

use crate::kit::{Agent, ProfileSpec, agents_dir, installed, which};

fn claude_profile(fake: &FakeServer, home: &Path) -> ProfileSpec {
    let env = [
        ("ANTHROPIC_BASE_URL", fake.base_url()),
        ("ANTHROPIC_API_KEY", "dummy".to_owned()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".to_owned()),
        ("DISABLE_TELEMETRY", "1".to_owned()),
        ("DISABLE_AUTOUPDATER", "1".to_owned()),
        ("DISABLE_ERROR_REPORTING", "1".to_owned()),
        ("HOME", home.to_string_lossy().into_owned()),
    ];
    ProfileSpec {
        env: env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        extra_toml: String::new(),
    }
}

/// `@zed-industries/claude-agent-acp` 0.23.1: its default mode (`default`) asks.
pub fn claude_0_23_1(test: &str) -> Option<Agent> {
    let dir = agents_dir(test)?;
    let entry = installed(
        &dir,
        "claude-agent-acp-0.23.1/node_modules/@zed-industries/claude-agent-acp/dist/index.js",
    );
    Some(Agent {
        name: "claude-agent-acp",
        package: "@zed-industries/claude-agent-acp",
        version: "0.23.1",
        api: Api::Anthropic,
        command: which("node"),
        args: vec![entry.to_string_lossy().into_owned()],
        profile: claude_profile,
        asking_mode: None,
        switch_model: ("haiku", "haiku"),
        session_files: ".claude/projects",
    })
}

/// The newest `@agentclientprotocol/claude-agent-acp` (the version `scripts/test` pins): it
/// starts sessions in `auto` (it never asks), so the scenarios choose `default` (Manual).
pub const CLAUDE_NEWEST_VERSION: &str = "0.101.0";

pub fn claude_newest(test: &str) -> Option<Agent> {
    let dir = agents_dir(test)?;
    let entry = installed(
        &dir,
        &format!(
            "claude-agent-acp-{CLAUDE_NEWEST_VERSION}/node_modules/@agentclientprotocol/\
             claude-agent-acp/dist/index.js"
        ),
    );
    Some(Agent {
        name: "claude-agent-acp",
        package: "@agentclientprotocol/claude-agent-acp",
        version: CLAUDE_NEWEST_VERSION,
        api: Api::Anthropic,
        command: which("node"),
        args: vec![entry.to_string_lossy().into_owned()],
        profile: claude_profile,
        asking_mode: Some(("mode", "default")),
        switch_model: ("haiku", "haiku"),
        session_files: ".claude/projects",
    })
}

agent_scenarios!(claude_0_23_1, super::claude_0_23_1);
agent_scenarios!(claude_newest, super::claude_newest);
