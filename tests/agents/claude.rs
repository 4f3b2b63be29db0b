//! Claude Code through its ACP adapters, against the fake Anthropic Messages API:
//! `@zed-industries/claude-agent-acp` 0.23.1 (bundles the Claude Code CLI as JavaScript; preset
//! `claude-0.23.1`) and the newest `@agentclientprotocol/claude-agent-acp` (the SDK with a
//! native Claude Code binary; preset `claude`).
//!
//! The preset gives the switches that keep it from calling home and passes `ANTHROPIC_API_KEY`
//! through from the harness's environment to its model proxy; the rig adds `ANTHROPIC_BASE_URL`
//! (the fake: the proxy's upstream), a private `HOME` (where it keeps its session files) and a
//! dummy key in the harness's environment. The harness gives a runtime only `PATH`, `HOME`, `LANG` and the profile's
//! variables, so `IS_SANDBOX` (with which the CLI refuses to run as root) never reaches it.

use std::path::Path;

use agent_harness_model_fakes::{Api, FakeServer};

use crate::kit::{Agent, ProfileSpec, agents_dir, installed, which};

/// The key the rig puts in the harness's environment for the preset to pass through.
const KEY: &str = "ANTHROPIC_API_KEY";

/// The preset sends it through the model proxy: the key passed through stays with the proxy (the
/// agent gets a token), and the base URL the profile sets becomes the proxy's upstream.
fn claude_profile(fake: &FakeServer, _seed: &Path) -> ProfileSpec {
    ProfileSpec {
        env: ProfileSpec::pairs(&[("ANTHROPIC_BASE_URL", fake.base_url())]),
        harness_env: ProfileSpec::pairs(&[(KEY, PASSED_KEY.to_owned())]),
        key: PASSED_KEY.to_owned(),
        ..Default::default()
    }
}

/// The key the rig passes through.
const PASSED_KEY: &str = "dummy-key-passed-through";

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
        default_retries: None,
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
        default_retries: None,
    })
}

agent_scenarios!(claude_0_23_1, super::claude_0_23_1);
agent_scenarios!(claude_newest, super::claude_newest);

/// Stopping the harness right after a short first turn (a drain, or `kill -9`; ten times
/// each) loses no Claude session: the runtimes are stopped gracefully, so Claude Code flushes
/// its lazily written session file.
mod stops {
    use std::time::Duration;

    use crate::{
        kit::scenario_within,
        stops::{Stop, stopped_right_after_a_turn},
    };

    /// Each round starts Claude twice (before and after the stop).
    const TIMEOUT: Duration = Duration::from_secs(600);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_drain_right_after_a_turn_loses_no_claude_session() {
        let Some(agent) = super::claude_0_23_1("stops::drain") else {
            return;
        };
        let body = stopped_right_after_a_turn(agent.clone(), Stop::Drain);
        scenario_within(&agent, "drained_right_after_a_turn", TIMEOUT, body).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kill_9_right_after_a_turn_loses_no_claude_session() {
        let Some(agent) = super::claude_0_23_1("stops::kill_9") else {
            return;
        };
        let body = stopped_right_after_a_turn(agent.clone(), Stop::Kill9);
        scenario_within(&agent, "killed_right_after_a_turn", TIMEOUT, body).await;
    }
}

/// Two replicas on PostgreSQL: the owner killed while the session is idle, the next prompt
/// through the other replica continues the conversation.
mod replicas {
    use crate::{
        kit::scenario,
        replicas::{Homes, owner_killed_while_idle},
    };

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_a_shared_home_the_claiming_replica_resumes_the_agents_session() {
        let Some(agent) = super::claude_0_23_1("replicas::shared_home") else {
            return;
        };
        scenario(
            &agent,
            "owner_killed_shared_home",
            owner_killed_while_idle(agent.clone(), Homes::Shared),
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_a_home_per_replica_the_claiming_replica_rebuilds_the_context() {
        let Some(agent) = super::claude_0_23_1("replicas::home_per_replica") else {
            return;
        };
        scenario(
            &agent,
            "owner_killed_home_per_replica",
            owner_killed_while_idle(agent.clone(), Homes::PerReplica),
        )
        .await;
    }
}
