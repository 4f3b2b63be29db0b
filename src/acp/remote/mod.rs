//! Remote runtimes: agents a bridge runs elsewhere, reached over the bridge's one
//! `Connect` stream. To the session actor a remote runtime looks exactly like a local child: a
//! byte pipe of JSON-RPC lines each way (an in-memory duplex), a stderr tail, an exit, a killer.
//! So the actor, log-before-act, faults and reopen are the same code for both.
//!
//! The [`Gateway`] knows the connected bridges (labels, profiles, load) and places new runtimes
//! on the least-loaded one that matches. Each remote runtime has one task that numbers the
//! harness's lines (keeping the ones the bridge has not acknowledged, bounded), drops duplicate
//! and refuses out-of-order bridge lines, and survives a broken stream for `reconnect_grace`:
//! when the bridge dials again and lists the runtime in its hello, both sides resend what the
//! other did not take and the session goes on with no fault and no gap.
//!
//! Flow control: every channel is bounded. A slow actor stops the runtime task writing into the
//! pipe, which stops the bridge stream being read; a bridge that does not acknowledge stops the
//! runtime task taking the actor's lines, whose own bounded queue then faults the runtime as
//! "not reading its input".
//!
//! The files: `wire.rs` holds what a bridge and the harness say to each other (and the bounds of
//! a hello); `gateway.rs` the connected bridges, admission, placement and the serving of a
//! stream; `runtime.rs` the task of one remote runtime. The gateway starts runtimes and feeds
//! them; a runtime knows the wire, never the gateway.

mod gateway;
mod runtime;
#[cfg(test)]
mod tests;
mod wire;

pub use gateway::{
    Admitted, BridgeSummary, Gateway, RemoteSpec, labels_match, labels_text, principal_allowed,
};
pub use runtime::{DEFAULT_RECONNECT_GRACE, MAX_UNACKED_LINES, SpawnedRemote};
pub use wire::{
    FromBridge, Hello, MAX_HELLO_LABELS, MAX_HELLO_PROFILES, MAX_HELLO_RUNNING, MAX_HELLO_TEXT,
    OUTBOUND_MESSAGES, Refused, StillRunning, ToBridge, check_hello, held_by_another,
};

// The bridges' metrics, named once for the gateway, the engine and the relay.
pub(crate) const BRIDGES_CONNECTED: &str = "agent_harness_bridges_connected";
pub(crate) const BRIDGE_RUNTIMES: &str = "agent_harness_bridge_runtimes";
pub(crate) const BRIDGE_RECONNECTS: &str = "agent_harness_bridge_reconnects_total";
/// Sessions whose lease this replica gave up because their bridge serves another replica.
pub(crate) const BRIDGE_LEASE_MOVES: &str = "agent_harness_bridge_lease_moves_total";
/// Runtimes of a redialled bridge relayed to the replica owning their sessions.
pub(crate) const BRIDGE_RELAYED_RUNTIMES: &str = "agent_harness_bridge_relayed_runtimes_total";
/// Relayed routes cut because their owner replica fell too far behind.
pub(crate) const BRIDGE_RELAY_CUTS: &str = "agent_harness_bridge_relay_cuts_total";
pub(crate) const BRIDGE_UNKNOWN_KEYS: &str = "agent_harness_bridge_unknown_runtime_messages_total";
