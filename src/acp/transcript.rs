//! The transcript people read, as the fold (`acp/fold.rs`) builds it from a session's log:
//! numbered turns of user and agent messages made of parts (text, thoughts, attachments, tool
//! calls, plans, permissions, elicitations, controls), the session metadata the agent reports, and
//! the end of each turn — with its logged form, the `turn_ended` harness event.

use serde::Deserialize;
use serde_json::Value;
use serde_with::{DefaultOnError, serde_as};

use super::lenient::view;
use crate::domain::{
    ActionId, JsonRpcId, PromptAttachment,
    log::{Direction, LogEntry},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Agent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    EndTurn,
    MaxTokens,
    MaxTurnRequests,
    Refusal,
    Cancelled,
    Failed,
}

impl StopReason {
    /// The stop reason a `session/prompt` result names, in ACP's own vocabulary (`failed` is
    /// the harness's own, never sent by an agent).
    pub(super) fn parse(text: &str) -> Option<Self> {
        use agent_client_protocol_schema::v1::StopReason as Wire;
        let wire: Wire = serde_json::from_value(Value::String(text.to_owned())).ok()?;
        Some(match wire {
            Wire::EndTurn => Self::EndTurn,
            Wire::MaxTokens => Self::MaxTokens,
            Wire::MaxTurnRequests => Self::MaxTurnRequests,
            Wire::Refusal => Self::Refusal,
            Wire::Cancelled => Self::Cancelled,
            // A reason newer than this harness knows reads as unknown, as any other text does.
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::EndTurn => "end_turn",
            Self::MaxTokens => "max_tokens",
            Self::MaxTurnRequests => "max_turn_requests",
            Self::Refusal => "refusal",
            Self::Cancelled => "cancelled",
            Self::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Pending,
    Accepted,
    Rejected,
    Selected,
    Cancelled,
    Declined,
    Completed,
    Errored,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlKind {
    SetModel,
    SetConfigOption,
    Compact,
    Stop,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolPart {
    pub tool_call_id: String,
    pub title: String,
    pub kind: String,
    pub status: String,
    pub content_json: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanEntry {
    pub content: String,
    pub priority: String,
    pub status: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermissionOption {
    pub option_id: String,
    pub name: String,
    pub kind: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermissionPart {
    pub request_id: JsonRpcId,
    pub tool_call_json: String,
    pub options: Vec<PermissionOption>,
    pub outcome: Outcome,
    pub selected_option_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElicitationPart {
    pub request_id: JsonRpcId,
    pub message: String,
    pub request_json: String,
    pub outcome: Outcome,
    pub answer_json: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPart {
    pub kind: ControlKind,
    pub value: String,
    pub outcome: Outcome,
}

/// A session continued in a new ACP session because its agent could not reopen it
/// (`on_reopen_failure = "fresh"`): why, and how much of the transcript the agent was given
/// with the prompt whose message holds this part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextRebuiltPart {
    pub reason: String,
    pub turns: u32,
    pub bytes: u64,
}

/// The `event` name of a session continued in a new ACP session (`on_reopen_failure =
/// "fresh"`): `{"event": "context_rebuilt", "reason", "previous_acp_session_id",
/// "acp_session_id", …}`. The next prompt carries the transcript and shows the part.
pub const CONTEXT_REBUILT_EVENT: &str = "context_rebuilt";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Text(String),
    Thought(String),
    Attachment(PromptAttachment),
    Tool(ToolPart),
    Plan(Vec<PlanEntry>),
    Permission(PermissionPart),
    Elicitation(ElicitationPart),
    Control(ControlPart),
    /// The agent's session was rebuilt from the transcript before this prompt.
    ContextRebuilt(ContextRebuiltPart),
    /// Any other ACP content block: its type and its whole JSON.
    Content {
        kind: String,
        json: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub id: String,
    pub turn: u32,
    pub role: Role,
    pub request_id: Option<ActionId>,
    pub parts: Vec<Part>,
    pub stop_reason: Option<StopReason>,
    pub error: Option<String>,
    pub actor: String,
    pub first_offset: u64,
    pub last_offset: u64,
    /// From the parent of a fork, up to the fork point; offsets are the parent's.
    pub inherited: bool,
}

impl Message {
    /// About how many bytes the message takes (its texts and JSON; not the exact encoding): what
    /// a stream counts a snapshot of it as.
    pub fn approx_bytes(&self) -> usize {
        let parts: usize = self
            .parts
            .iter()
            .map(|part| match part {
                Part::Text(text) | Part::Thought(text) => text.len(),
                Part::Attachment(a) => a.uri.len() + a.name.len(),
                Part::Tool(t) => t.title.len() + t.content_json.len() + t.tool_call_id.len(),
                Part::Plan(entries) => entries.iter().map(|e| e.content.len() + 16).sum(),
                Part::Permission(p) => {
                    p.tool_call_json.len()
                        + p.options
                            .iter()
                            .map(|o| o.option_id.len() + o.name.len() + 8)
                            .sum::<usize>()
                }
                Part::Elicitation(e) => e.message.len() + e.request_json.len() + e.answer_json.len(),
                Part::Control(c) => c.value.len(),
                Part::ContextRebuilt(c) => c.reason.len(),
                Part::Content { kind, json } => kind.len() + json.len(),
            } + 16)
            .sum();
        parts + self.id.len() + self.actor.len() + self.error.as_ref().map_or(0, String::len)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelOption {
    pub value: String,
    pub name: String,
    pub description: Option<String>,
}

/// Session metadata derived from the log (the live status comes from the session itself).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    pub model: String,
    pub models: Vec<ModelOption>,
    pub config_options_json: String,
    pub available_commands_json: String,
    pub pending_interactions: Vec<JsonRpcId>,
    /// What the agent says it is (`initialize` → `agentInfo`), when it says.
    pub agent_info: Option<AgentInfo>,
    /// `initialize` → `agentCapabilities`, as JSON; empty before the handshake.
    pub agent_capabilities_json: String,
    /// The latest `plan` update's entries, as a JSON array; empty before any plan.
    pub plan_json: String,
    /// The latest `usage_update`.
    pub usage: Option<Usage>,
}

/// An agent's `agentInfo`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentInfo {
    pub name: String,
    pub version: String,
    pub title: Option<String>,
}

/// An ACP `usage_update`: tokens in the context, the context's size, the cumulative cost.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    pub used: u64,
    pub size: u64,
    /// Amount and currency, when sent.
    pub cost: Option<(f64, String)>,
}

/// A turn that ended: its prompt's or compact's response arrived, or a fault, restart, close or
/// drain closed it. Reported once per turn, when the turn's agent message first gets its stop
/// reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnEnd {
    pub turn: u32,
    /// The action id of the prompt or compact that opened the turn.
    pub request_id: Option<ActionId>,
    pub stop_reason: StopReason,
    pub error: Option<String>,
}

/// The `event` name of the harness event that records a turn's end in the log.
pub const TURN_ENDED_EVENT: &str = "turn_ended";

/// The `event` name of the harness event that fails a running turn for a reason of the
/// harness's own (`detail`, e.g. a spent budget) while the runtime goes on: the turn ends there,
/// FAILED, whatever the agent answers afterwards.
pub const TURN_FAILED_EVENT: &str = "turn_failed";

impl TurnEnd {
    /// The logged form: `{"event":"turn_ended","turn":…,"request_id":…,"stop_reason":…,"error":…}`.
    pub fn to_event(&self) -> Value {
        let mut event = serde_json::json!({
            "event": TURN_ENDED_EVENT,
            "turn": self.turn,
            "request_id": self.request_id.map(|id| id.to_string()),
            "stop_reason": self.stop_reason.as_str(),
        });
        if let Some(error) = &self.error {
            event["error"] = Value::from(error.as_str());
        }
        event
    }

    /// Reads a logged turn end back; `None` for any other entry. Cheap for other entries: only
    /// harness events that mention the name are parsed.
    pub fn from_entry(entry: &LogEntry) -> Option<Self> {
        if entry.direction != Direction::Event || !entry.json.contains(TURN_ENDED_EVENT) {
            return None;
        }
        let event: Value = serde_json::from_str(&entry.json).ok()?;
        let event: TurnEndedEvent = view(&event);
        if event.event != Some(TURN_ENDED_EVENT) {
            return None;
        }
        let stop_reason = match event.stop_reason? {
            "failed" => StopReason::Failed,
            other => StopReason::parse(other)?,
        };
        Some(Self {
            turn: u32::try_from(event.turn?).ok()?,
            request_id: event.request_id.and_then(ActionId::from_stored),
            stop_reason,
            error: event.error.map(str::to_owned),
        })
    }
}

/// A logged `turn_ended` event, as [`TurnEnd::from_entry`] reads it.
#[serde_as]
#[derive(Deserialize, Default)]
#[serde(default)]
struct TurnEndedEvent<'a> {
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    event: Option<&'a str>,
    #[serde_as(deserialize_as = "DefaultOnError")]
    turn: Option<u64>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    request_id: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    stop_reason: Option<&'a str>,
    #[serde(borrow)]
    #[serde_as(deserialize_as = "DefaultOnError")]
    error: Option<&'a str>,
}
