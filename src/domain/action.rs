//! The seven actions a caller can send to a session, in their plain-Rust form.
//! The serde form (`{"type":"prompt","prompt":"hi"}`) is the one stored in the queue and the
//! action-id table.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A file the agent may fetch; bytes never travel. Mirrors ACP's `resource_link` block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PromptAttachment {
    pub uri: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
}

impl PromptAttachment {
    pub fn new(uri: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            uri: uri.into(),
            name: name.into(),
            mime_type: None,
            size: None,
        }
    }

    pub fn mime_type(mut self, mime_type: impl Into<String>) -> Self {
        self.mime_type = Some(mime_type.into());
        self
    }

    pub fn size(mut self, size: i64) -> Self {
        self.size = Some(size);
        self
    }
}

/// A prompt and the files it refers to, in the order the user attached them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptAction {
    pub prompt: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<PromptAttachment>,
}

impl PromptAction {
    pub fn text(prompt: impl Into<String>) -> Self {
        Self {
            prompt: prompt.into(),
            attachments: Vec::new(),
        }
    }

    pub fn with_attachments(prompt: impl Into<String>, attachments: Vec<PromptAttachment>) -> Self {
        Self {
            prompt: prompt.into(),
            attachments,
        }
    }
}

/// The agent's own JSON-RPC request id, shape kept: `7` does not answer `"7"`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum JsonRpcId {
    Number(i64),
    Text(String),
}

impl JsonRpcId {
    /// Reads an id exactly as the agent wrote it; `None` for shapes ACP does not use (null, floats).
    pub fn from_json(value: &serde_json::Value) -> Option<Self> {
        match value {
            serde_json::Value::String(text) => Some(Self::Text(text.clone())),
            serde_json::Value::Number(n) => n.as_i64().map(Self::Number),
            _ => None,
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Self::Number(n) => serde_json::Value::from(*n),
            Self::Text(text) => serde_json::Value::from(text.as_str()),
        }
    }
}

impl std::fmt::Display for JsonRpcId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Number(n) => write!(f, "{n}"),
            Self::Text(text) => write!(f, "{text:?}"),
        }
    }
}

/// One value of an elicitation form; serialises to the plain JSON value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ElicitationValue {
    Text(String),
    Flag(bool),
    Integer(i64),
    Number(f64),
    Strings(Vec<String>),
}

/// An answer to an elicitation; serialises to exactly the ACP response result
/// (`{"action":"accept","content":{…}}`, `{"action":"decline"}`, `{"action":"cancel"}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "lowercase")]
pub enum ElicitationAnswer {
    Accept {
        content: BTreeMap<String, ElicitationValue>,
    },
    Decline,
    Cancel,
}

/// An answer to a permission request; serialises to the ACP `outcome` object
/// (`{"outcome":"selected","optionId":"…"}` or `{"outcome":"cancelled"}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub enum PermissionAnswer {
    Selected {
        #[serde(rename = "optionId")]
        option_id: String,
    },
    Cancelled,
}

/// The seven actions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Action {
    Prompt(PromptAction),
    #[serde(rename_all = "camelCase")]
    SetModel {
        model: String,
    },
    #[serde(rename_all = "camelCase")]
    SetConfigOption {
        config_id: String,
        value: String,
    },
    Compact,
    #[serde(rename_all = "camelCase")]
    Stop {
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        clear_queue: bool,
    },
    #[serde(rename_all = "camelCase")]
    RespondElicitation {
        request_id: JsonRpcId,
        answer: ElicitationAnswer,
    },
    #[serde(rename_all = "camelCase")]
    RespondToPermission {
        request_id: JsonRpcId,
        answer: PermissionAnswer,
    },
}

/// The kinds of action, for logs, metrics and errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActionKind {
    Prompt,
    SetModel,
    SetConfigOption,
    Compact,
    Stop,
    RespondElicitation,
    RespondToPermission,
}

impl ActionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prompt => "prompt",
            Self::SetModel => "setModel",
            Self::SetConfigOption => "setConfigOption",
            Self::Compact => "compact",
            Self::Stop => "stop",
            Self::RespondElicitation => "respondElicitation",
            Self::RespondToPermission => "respondToPermission",
        }
    }
}

impl Action {
    pub fn prompt(text: impl Into<String>) -> Self {
        Self::Prompt(PromptAction::text(text))
    }

    pub fn prompt_with_attachments(
        text: impl Into<String>,
        attachments: Vec<PromptAttachment>,
    ) -> Self {
        Self::Prompt(PromptAction::with_attachments(text, attachments))
    }

    pub fn kind(&self) -> ActionKind {
        match self {
            Self::Prompt(_) => ActionKind::Prompt,
            Self::SetModel { .. } => ActionKind::SetModel,
            Self::SetConfigOption { .. } => ActionKind::SetConfigOption,
            Self::Compact => ActionKind::Compact,
            Self::Stop { .. } => ActionKind::Stop,
            Self::RespondElicitation { .. } => ActionKind::RespondElicitation,
            Self::RespondToPermission { .. } => ActionKind::RespondToPermission,
        }
    }

    /// ACP runs one `session/prompt` at a time, so only prompt and compact take a turn (and are
    /// queued); everything else goes to the runtime beside a running turn.
    pub fn occupies_turn(&self) -> bool {
        matches!(self, Self::Prompt(_) | Self::Compact)
    }

    /// Answers to the agent's own requests; only a person may send them.
    pub fn is_answer(&self) -> bool {
        matches!(
            self,
            Self::RespondElicitation { .. } | Self::RespondToPermission { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_prompt_and_compact_occupy_a_turn() {
        let all = [
            (Action::prompt("hi"), true),
            (Action::Compact, true),
            (Action::SetModel { model: "m".into() }, false),
            (
                Action::SetConfigOption {
                    config_id: "c".into(),
                    value: "v".into(),
                },
                false,
            ),
            (Action::Stop { clear_queue: true }, false),
            (
                Action::RespondElicitation {
                    request_id: JsonRpcId::Number(1),
                    answer: ElicitationAnswer::Cancel,
                },
                false,
            ),
            (
                Action::RespondToPermission {
                    request_id: JsonRpcId::Text("p".into()),
                    answer: PermissionAnswer::Cancelled,
                },
                false,
            ),
        ];
        for (action, occupies) in all {
            assert_eq!(action.occupies_turn(), occupies, "{:?}", action.kind());
        }
    }

    #[test]
    fn empty_attachments_are_not_serialized_and_absent_ones_parse() {
        let plain = Action::prompt("hi");
        assert_eq!(
            serde_json::to_value(&plain).unwrap(),
            json!({"type": "prompt", "prompt": "hi"})
        );
        let parsed: Action =
            serde_json::from_value(json!({"type": "prompt", "prompt": "hi"})).unwrap();
        assert_eq!(parsed, plain);

        let with = Action::prompt_with_attachments(
            "look",
            vec![PromptAttachment::new("https://x/file/1", "a.png").mime_type("image/png")],
        );
        assert_eq!(
            serde_json::to_value(&with).unwrap(),
            json!({"type": "prompt", "prompt": "look",
                   "attachments": [{"uri": "https://x/file/1", "name": "a.png", "mimeType": "image/png"}]})
        );
    }

    #[test]
    fn a_stop_without_clear_queue_serializes_without_the_flag() {
        assert_eq!(
            serde_json::to_value(Action::Stop { clear_queue: false }).unwrap(),
            json!({"type": "stop"})
        );
        assert_eq!(
            serde_json::from_value::<Action>(json!({"type": "stop"})).unwrap(),
            Action::Stop { clear_queue: false }
        );
    }

    #[test]
    fn jsonrpc_ids_keep_their_shape() {
        assert_eq!(JsonRpcId::from_json(&json!(7)), Some(JsonRpcId::Number(7)));
        assert_eq!(
            JsonRpcId::from_json(&json!("7")),
            Some(JsonRpcId::Text("7".into()))
        );
        assert_ne!(JsonRpcId::Number(7), JsonRpcId::Text("7".into()));
        assert_eq!(JsonRpcId::from_json(&json!(null)), None);
        assert_eq!(JsonRpcId::from_json(&json!(1.5)), None);
    }

    #[test]
    fn answers_serialize_to_the_acp_result_shapes() {
        let mut content = BTreeMap::new();
        content.insert("name".into(), ElicitationValue::Text("ada".into()));
        content.insert("ok".into(), ElicitationValue::Flag(true));
        content.insert("n".into(), ElicitationValue::Integer(3));
        content.insert("tags".into(), ElicitationValue::Strings(vec!["a".into()]));
        assert_eq!(
            serde_json::to_value(ElicitationAnswer::Accept { content }).unwrap(),
            json!({"action": "accept", "content": {"n": 3, "name": "ada", "ok": true, "tags": ["a"]}})
        );
        assert_eq!(
            serde_json::to_value(ElicitationAnswer::Decline).unwrap(),
            json!({"action": "decline"})
        );
        assert_eq!(
            serde_json::to_value(PermissionAnswer::Selected {
                option_id: "allow".into()
            })
            .unwrap(),
            json!({"outcome": "selected", "optionId": "allow"})
        );
        assert_eq!(
            serde_json::to_value(PermissionAnswer::Cancelled).unwrap(),
            json!({"outcome": "cancelled"})
        );
    }
}
