//! Claude Code through its ACP adapters, against the fake Anthropic Messages API:
//! `@zed-industries/claude-agent-acp` 0.23.1 (bundles the Claude Code CLI as JavaScript; preset
//! `claude-0.23.1`) and the newest `@agentclientprotocol/claude-agent-acp` (the SDK with a
//! native Claude Code binary; preset `claude`).
//!
//! The preset gives the switches that keep it from calling home and passes `ANTHROPIC_API_KEY`
//! through from the harness's environment; the rig adds `ANTHROPIC_BASE_URL` (the fake), a
//! private `HOME` (where it keeps its session files) and a dummy key in the harness's
//! environment. The harness gives a runtime only `PATH`, `HOME`, `LANG` and the profile's
//! variables, so `IS_SANDBOX` (with which the CLI refuses to run as root) never reaches it.

use std::path::Path;

use agent_harness_model_fakes::{Api, FakeServer};

use crate::kit::{Agent, ProfileSpec, agents_dir, installed, which};

/// The key the rig puts in the harness's environment for the preset to pass through.
const KEY: &str = "ANTHROPIC_API_KEY";

fn claude_profile(fake: &FakeServer, home: &Path) -> ProfileSpec {
    ProfileSpec {
        env: ProfileSpec::pairs(&[
            ("ANTHROPIC_BASE_URL", fake.base_url()),
            ("HOME", home.to_string_lossy().into_owned()),
        ]),
        harness_env: ProfileSpec::pairs(&[(KEY, "dummy-key-passed-through".to_owned())]),
        ..Default::default()
    }
}

fn without_key(spec: &mut ProfileSpec) {
    spec.harness_env.retain(|(k, _)| k != KEY);
}

/// `@zed-industries/claude-agent-acp` 0.23.1: its default mode (`default`) asks;
/// `acceptEdits` does not.
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
        preset: "claude-0.23.1",
        api: Api::Anthropic,
        command: which("node"),
        args: vec![entry.to_string_lossy().into_owned()],
        profile: claude_profile,
        unasked: ("config_options = { mode = \"acceptEdits\" }", |spec| {
            spec.keys
                .push_str("config_options = { mode = \"acceptEdits\" }\n")
        }),
        without_key: Some(without_key),
        switch_model: ("haiku", "haiku"),
        session_files: ".claude/projects",
    })
}

/// The newest `@agentclientprotocol/claude-agent-acp` (the version `scripts/test` pins and the
/// `claude` preset runs): it starts sessions in `auto` (it never asks); the preset chooses
/// `default` (Manual).
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
        preset: "claude",
        api: Api::Anthropic,
        command: which("node"),
        args: vec![entry.to_string_lossy().into_owned()],
        profile: claude_profile,
        unasked: ("config_options = { mode = \"auto\" }", |spec| {
            spec.keys.push_str("config_options = { mode = \"auto\" }\n")
        }),
        without_key: Some(without_key),
        switch_model: ("haiku", "haiku"),
        session_files: ".claude/projects",
    })
}

agent_scenarios!(claude_0_23_1, super::claude_0_23_1);
agent_scenarios!(claude_newest, super::claude_newest);
