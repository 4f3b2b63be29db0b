//! What the fold reads of a logged frame, as small lenient serde views over its parsed JSON
//! (built with `acp/lenient.rs`; the JSON-RPC envelope, content blocks and config options are
//! the shared views of `acp/views.rs`): a field that is missing or of another shape reads as
//! absent, so a sloppy or hostile agent can make the fold skip a field, never fail a frame. Each
//! view names only the fields the fold uses; everything else is ignored. JSON the transcript
//! keeps as it came (content blocks, tool calls, capabilities…) is read as a [`Value`].

use serde::Deserialize;
use serde_json::Value;
use serde_with::{DefaultOnError, serde_as};

use crate::acp::lenient::{object, objects, present};

/// What any reply may say that the fold keeps: `session/new`/`load`/`set_config_option` give
/// `configOptions`, `initialize` gives what the agent says about itself, `session/prompt` its
/// `stopReason`.
#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct ReplyResult<'a> {
    #[serde(deserialize_with = "present")]
    pub config_options: Option<Value>,
    #[serde(deserialize_with = "present")]
    pub agent_capabilities: Option<Value>,
    #[serde(borrow, deserialize_with = "object")]
    pub agent_info: Option<AgentInfo<'a>>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub stop_reason: Option<&'a str>,
}

/// `initialize` → `agentInfo`.
#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct AgentInfo<'a> {
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub name: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub version: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub title: Option<&'a str>,
}

/// `session/update` → `params`.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct UpdateParams<'a> {
    #[serde(borrow, deserialize_with = "object")]
    pub update: Option<Update<'a>>,
}

/// One `session/update`: the fields of every kind the fold reads, by `sessionUpdate`.
#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct Update<'a> {
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub session_update: Option<&'a str>,
    /// A chunk's content block; a tool call's content list.
    #[serde(deserialize_with = "present")]
    pub content: Option<Value>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub tool_call_id: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub title: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub kind: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub status: Option<&'a str>,
    /// A plan's entries, each read as a [`PlanEntry`].
    #[serde(deserialize_with = "present")]
    pub entries: Option<Value>,
    #[serde(deserialize_with = "present")]
    pub available_commands: Option<Value>,
    #[serde(deserialize_with = "present")]
    pub config_options: Option<Value>,
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub used: Option<u64>,
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub size: Option<u64>,
    #[serde(borrow, deserialize_with = "object")]
    pub cost: Option<Cost<'a>>,
}

/// A `usage_update`'s cost.
#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct Cost<'a> {
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub amount: Option<f64>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub currency: Option<&'a str>,
}

/// One entry of a `plan` update.
#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct PlanEntry<'a> {
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub content: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub priority: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub status: Option<&'a str>,
}

/// `session/request_permission` → `params`.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct PermissionParams<'a> {
    #[serde(deserialize_with = "present")]
    pub tool_call: Option<Value>,
    #[serde(borrow, deserialize_with = "objects")]
    pub options: Option<Vec<PermissionOption<'a>>>,
}

#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct PermissionOption<'a> {
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub option_id: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub name: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub kind: Option<&'a str>,
}

/// `elicitation/create` → `params` (what the fold shows; the whole request is kept as JSON), and
/// `elicitation/complete` → `params`.
#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct ElicitationParams<'a> {
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub message: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub elicitation_id: Option<&'a str>,
}

/// A harness event (`{"event": …}`): what closes a turn, and a fork's inherited log.
#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct Event<'a> {
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub event: Option<&'a str>,
    /// A `fault`'s reason.
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub detail: Option<&'a str>,
    /// The turn a `fault` failed, by its action id.
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub failed_turn: Option<&'a str>,
    /// Why a `context_rebuilt` happened.
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub reason: Option<&'a str>,
}

/// A `forked` event's parent entries.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct Forked<'a> {
    #[serde(borrow, deserialize_with = "objects")]
    pub entries: Option<Vec<ForkedEntry<'a>>>,
}

/// One parent entry of a `forked` event (written by `fold::forked_event`).
#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct ForkedEntry<'a> {
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub offset: Option<u64>,
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub direction: Option<i64>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub json: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub actor: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub action_id: Option<&'a str>,
    #[serde_as(deserialize_as = "DefaultOnError")]
    pub epoch: Option<u64>,
}
