//! What the engine is asked to do, in its own terms: the transport decodes its messages into
//! these, so the engine never depends on the wire format of its callers.

use serde_json::{Map, Value};

use crate::domain::{Action, ActionId};

/// One Control call: an action for a session, with how to deliver it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ControlInput {
    pub session_id: String,
    pub action_id: Option<ActionId>,
    pub context: Option<Map<String, Value>>,
    pub interrupt: bool,
    /// Admit a prompt or compact only when the session is idle with an empty queue.
    pub expect_idle: bool,
    pub action: Action,
}
