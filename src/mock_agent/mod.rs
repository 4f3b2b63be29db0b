//! `agent-harness mock-agent`: a deterministic, scripted ACP v1 **agent** on its own stdin/stdout.
//!
//! This commit holds its pure parts: flags, config options, the directive mini-language and the
//! frame writers.

pub mod args;
pub mod options;
pub mod script;
pub mod wire;
