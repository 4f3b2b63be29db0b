//! The integration suite: one test binary (to save link time) that drives a real server over a
//! real loopback connection. `harness` starts servers and hands out clients; each other module
//! covers one area. Run with `cargo nextest run --test it` (or `scripts/test` for everything).

// The shared harness and session helpers live in the test kit (`crates/testkit`); imported here
// so the modules below reach them as `crate::harness` and `crate::support`.
use agent_harness_testkit::{harness, process, proxy, support};

mod acp_agent;
mod ambiguous_commits;
mod auth;
mod backup;
mod bridge;
mod bridge_relay;
mod bridge_replicas;
mod browser;
mod cannot_reopen;
mod cli;
mod cli_terminal;
mod crash;
mod create_crash;
mod export;
mod faults;
mod features;
mod first_action;
mod foreign_text;
mod graceful_stop;
mod health;
mod held_answers;
mod hostile;
mod interactions;
mod interop;
mod interrupts;
mod large_transcript;
mod log;
mod metering;
mod operations;
mod postgres;
mod postgres_outage;
mod presets;
mod private_files;
mod process_tree;
mod queue;
mod rebinding;
mod reflection;
mod reopen_defences;
mod replica_ownership;
mod replica_tls;
mod replicas;
mod resume;
mod retention;
mod sandbox;
mod scale;
mod secrets;
mod self_fencing;
mod services;
mod sessions;
mod signals;
mod smoke;
mod soak;
mod starting;
mod tls;
mod traces;
mod transcript;
mod translator;
mod turn_ended;
mod upgrades;
mod warm_pool;
