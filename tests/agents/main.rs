//! Real coding agents, end to end and offline: each test starts a scripted fake model server
//! (`crates/model-fakes`) and a real `agent-harness serve` process whose profile runs a real agent
//! pointed at the fake, then drives one scenario through gRPC (docs/agents.md lists them).
//!
//! The agents are not part of the machine: `scripts/test agents` installs them (pinned) into
//! `.tools/agents` and runs this target inside a network namespace that has only loopback, with
//! `AGENT_HARNESS_AGENTS_DIR` naming that folder. Without the variable every test says loudly
//! that it skipped, and passes; with it, every test runs (a missing agent fails).
//!
//! Each scenario's outcome is written to `AGENT_HARNESS_AGENTS_RESULTS` (when set) for the
//! stage's compatibility matrix. A scenario that an agent is known to get wrong is listed in
//! [`kit::KNOWN_DEFECTS`]: its test still asserts the right behaviour, reports the deviation as
//! that defect, and fails once the agent gets it right (so the list cannot go stale).
//!
//! The scenarios are written once (`scenarios.rs`); each agent's file says how to run it and
//! makes its tests with `agent_scenarios!`.

mod kit;
#[macro_use]
mod scenarios;

mod acp_client;
mod claude;
mod codex;
mod opencode;
mod qwen;
mod replicas;
mod stops;
