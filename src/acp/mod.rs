//! ACP runtimes: starting the agent process ([`process`]) and the JSON-RPC line connection over
//! its stdio ([`connection`]). What the frames mean lives in `domain::acp_frames`; what to do
//! with them lives in the session actor.

pub mod connection;
pub mod process;
