//! ACP runtimes: starting the agent process ([`process`]), the JSON-RPC line connection over its
//! stdio ([`connection`]), the wire format of the frames ([`frames`]) and the fold of a logged
//! frame sequence ([`fold`]) into a transcript ([`transcript`]); what the harness reads of a frame,
//! as lenient views (`views`). What to do with the frames lives in the session actor.

pub mod connection;
pub mod env;
pub mod fold;
pub mod frames;
pub mod launch;
mod lenient;
pub mod primer;
pub mod process;
pub mod remote;
pub mod sandbox;
pub mod transcript;
pub(crate) mod views;

use std::{collections::BTreeMap, path::Path, time::Duration};

/// How to launch one runtime: the program, its arguments, exactly the environment it gets
/// besides `PATH`, `HOME` and `LANG` (written values, and the names of secrets read at the
/// spawn), and how long it has to exit once asked to stop (told to the watchdog through its
/// environment). Whoever owns the profile lends it for the spawn.
#[derive(Debug, Clone, Copy)]
pub struct RuntimeSpec<'a> {
    pub command: &'a Path,
    pub args: &'a [String],
    pub env: &'a BTreeMap<String, String>,
    pub secrets: &'a env::EnvSources,
    pub stop_grace: Duration,
}
