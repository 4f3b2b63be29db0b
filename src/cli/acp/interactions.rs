//! Permission and elicitation requests the harness holds for a person, forwarded to the ACP
//! client as the agent's own requests; the client's answer goes back as a Control action. When
//! the request is settled elsewhere (another client, the CLI, the console, the turn's end), the
//! forwarded request is withdrawn with `$/cancel_request`.
//!
//! What is held comes from the transcript's pending parts, and only while the session says
//! AWAITING_INPUT: a request a permission rule or `auto_accept` answers at once is never shown.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};

use crate::cli::render::Pending;
use crate::pb::v1::{
    self as pb, InteractionOutcome, JsonRpcId, SessionStatus, control_request::Action, json_rpc_id,
    message_part::Kind,
};

/// The agent's request id as a map key (`7` and `"7"` stay apart).
fn key(id: Option<&JsonRpcId>) -> String {
    match id.and_then(|id| id.id.as_ref()) {
        Some(json_rpc_id::Id::Number(n)) => n.to_string(),
        Some(json_rpc_id::Id::Text(t)) => format!("{t:?}"),
        None => String::new(),
    }
}

/// A request we sent the client: our JSON-RPC id, and whether the client already answered.
struct Forwarded {
    ours: i64,
    answered: bool,
}

/// What to do on the wire after a change.
#[derive(Debug, PartialEq)]
pub(crate) enum Step {
    /// Send the client this request (method, params); `key` names the held request.
    Forward {
        key: String,
        method: &'static str,
        params: Value,
    },
    /// Withdraw our request `ours`.
    Withdraw { ours: i64 },
}

pub(crate) struct Interactions {
    session_id: String,
    /// The client said it handles `elicitation/create`.
    elicitation: bool,
    awaiting: bool,
    caught_up: bool,
    held: BTreeMap<String, Pending>,
    forwarded: HashMap<String, Forwarded>,
}

impl Interactions {
    pub(crate) fn new(session_id: &str, elicitation: bool) -> Self {
        Self {
            session_id: session_id.to_owned(),
            elicitation,
            awaiting: false,
            caught_up: false,
            held: BTreeMap::new(),
            forwarded: HashMap::new(),
        }
    }

    /// What the transcript shows held right now (at attach time, before the stream).
    pub(crate) fn seed(&mut self, held: Vec<Pending>, status: SessionStatus) {
        for h in held {
            self.held.insert(key(h.request_id()), h);
        }
        self.status(status);
    }

    pub(crate) fn status(&mut self, status: SessionStatus) {
        self.awaiting = status == SessionStatus::AwaitingInput;
    }

    pub(crate) fn caught_up(&mut self) {
        self.caught_up = true;
    }

    pub(crate) fn message(&mut self, message: &pb::TranscriptMessage) {
        for part in &message.parts {
            let (id, outcome, held) = match &part.kind {
                Some(Kind::Permission(p)) => (
                    p.request_id.as_ref(),
                    p.outcome(),
                    Pending::Permission(p.clone()),
                ),
                Some(Kind::Elicitation(e)) => (
                    e.request_id.as_ref(),
                    e.outcome(),
                    Pending::Elicitation(e.clone()),
                ),
                _ => continue,
            };
            if outcome == InteractionOutcome::Pending {
                self.held.insert(key(id), held);
            } else {
                self.held.remove(&key(id));
            }
        }
    }

    /// The client answered our request for `key` (so it is not withdrawn later).
    pub(crate) fn answered(&mut self, key: &str) {
        if let Some(f) = self.forwarded.get_mut(key) {
            f.answered = true;
        }
    }

    /// Records that `key` went out as our request `ours`.
    pub(crate) fn sent(&mut self, key: String, ours: i64) {
        self.forwarded.insert(
            key,
            Forwarded {
                ours,
                answered: false,
            },
        );
    }

    pub(crate) fn held(&self, key: &str) -> Option<&Pending> {
        self.held.get(key)
    }

    /// What must go out now: new held requests (once caught up, while the session awaits
    /// input), and withdrawals of ours that were settled elsewhere.
    pub(crate) fn steps(&mut self) -> Vec<Step> {
        let mut steps = Vec::new();
        self.forwarded.retain(|key, f| {
            if self.held.contains_key(key) {
                return true;
            }
            if !f.answered {
                steps.push(Step::Withdraw { ours: f.ours });
            }
            false
        });
        if !(self.caught_up && self.awaiting) {
            return steps;
        }
        for (key, held) in &self.held {
            if self.forwarded.contains_key(key) {
                continue;
            }
            let step = match held {
                Pending::Permission(p) => Step::Forward {
                    key: key.clone(),
                    method: "session/request_permission",
                    params: json!({
                        "sessionId": self.session_id,
                        "toolCall": serde_json::from_str::<Value>(&p.tool_call_json).unwrap_or_else(|_| json!({})),
                        "options": p.options.iter().map(|o| json!({
                            "optionId": o.option_id, "name": o.name, "kind": o.kind,
                        })).collect::<Vec<_>>(),
                    }),
                },
                Pending::Elicitation(e) if self.elicitation => {
                    let mut params = serde_json::from_str::<Value>(&e.request_json)
                        .unwrap_or_else(|_| json!({}));
                    if params.get("sessionId").is_some() {
                        params["sessionId"] = json!(self.session_id);
                    }
                    Step::Forward {
                        key: key.clone(),
                        method: "elicitation/create",
                        params,
                    }
                }
                Pending::Elicitation(_) => continue,
            };
            steps.push(step);
        }
        steps
    }
}

/// The Control action that carries the client's answer to `held`, if the answer is one.
pub(crate) fn answer_action(held: &Pending, result: &Value) -> Option<Action> {
    match held {
        Pending::Permission(p) => {
            use pb::respond_to_permission_action::Outcome;
            let outcome = &result["outcome"];
            let outcome = match outcome["outcome"].as_str()? {
                "selected" => Outcome::SelectedOptionId(outcome["optionId"].as_str()?.to_owned()),
                "cancelled" => Outcome::Cancelled(pb::PermissionCancelled {}),
                _ => return None,
            };
            Some(Action::RespondToPermission(pb::RespondToPermissionAction {
                request_id: p.request_id.clone(),
                outcome: Some(outcome),
            }))
        }
        Pending::Elicitation(e) => {
            use pb::respond_elicitation_action::Answer;
            let answer = match result["action"].as_str()? {
                "accept" => Answer::Accept(pb::ElicitationAccept {
                    content: result["content"]
                        .as_object()
                        .map(|fields| {
                            fields
                                .iter()
                                .filter_map(|(k, v)| Some((k.clone(), elicitation_value(v)?)))
                                .collect()
                        })
                        .unwrap_or_default(),
                }),
                "decline" => Answer::Decline(pb::ElicitationDecline {}),
                "cancel" => Answer::Cancel(pb::ElicitationCancel {}),
                _ => return None,
            };
            Some(Action::RespondElicitation(pb::RespondElicitationAction {
                request_id: e.request_id.clone(),
                answer: Some(answer),
            }))
        }
    }
}

fn elicitation_value(value: &Value) -> Option<pb::ElicitationValue> {
    use pb::elicitation_value::Kind;
    let kind = match value {
        Value::String(text) => Kind::Text(text.clone()),
        Value::Bool(flag) => Kind::Flag(*flag),
        Value::Number(n) if n.is_i64() => Kind::Integer(n.as_i64()?),
        Value::Number(n) => Kind::Number(n.as_f64()?),
        Value::Array(items) => Kind::Strings(pb::StringList {
            values: items
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<_>>()?,
        }),
        _ => return None,
    };
    Some(pb::ElicitationValue { kind: Some(kind) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permission(id: i64, outcome: InteractionOutcome) -> pb::TranscriptMessage {
        pb::TranscriptMessage {
            parts: vec![pb::MessagePart {
                kind: Some(Kind::Permission(pb::PermissionPart {
                    request_id: Some(JsonRpcId {
                        id: Some(json_rpc_id::Id::Number(id)),
                    }),
                    tool_call_json: r#"{"toolCallId":"t","title":"Run"}"#.into(),
                    options: vec![pb::PermissionOption {
                        option_id: "allow-once".into(),
                        name: "Allow once".into(),
                        kind: "allow_once".into(),
                    }],
                    outcome: outcome as i32,
                    selected_option_id: None,
                })),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_held_permission_goes_out_once_and_is_withdrawn_when_settled_elsewhere() {
        let mut i = Interactions::new("h-1", false);
        i.caught_up();
        i.message(&permission(3, InteractionOutcome::Pending));
        assert!(i.steps().is_empty(), "not before the session awaits input");
        i.status(SessionStatus::AwaitingInput);
        let steps = i.steps();
        let [
            Step::Forward {
                key,
                method,
                params,
            },
        ] = steps.as_slice()
        else {
            panic!("{steps:?}")
        };
        assert_eq!(*method, "session/request_permission");
        assert_eq!(params["sessionId"], "h-1");
        assert_eq!(params["options"][0]["optionId"], "allow-once");
        i.sent(key.clone(), 9);
        assert!(i.steps().is_empty(), "sent once");
        i.message(&permission(3, InteractionOutcome::Selected));
        assert_eq!(i.steps(), vec![Step::Withdraw { ours: 9 }]);
    }

    #[test]
    fn a_request_the_client_answered_is_not_withdrawn() {
        let mut i = Interactions::new("h-1", false);
        i.caught_up();
        i.status(SessionStatus::AwaitingInput);
        i.message(&permission(3, InteractionOutcome::Pending));
        let Step::Forward { key, .. } = i.steps().remove(0) else {
            panic!()
        };
        i.sent(key.clone(), 1);
        i.answered(&key);
        i.message(&permission(3, InteractionOutcome::Selected));
        assert!(i.steps().is_empty());
    }

    #[test]
    fn the_clients_answers_become_control_actions() {
        let held = Pending::Permission(pb::PermissionPart::default());
        let selected = json!({"outcome": {"outcome": "selected", "optionId": "allow-once"}});
        assert!(matches!(
            answer_action(&held, &selected),
            Some(Action::RespondToPermission(pb::RespondToPermissionAction {
                outcome: Some(pb::respond_to_permission_action::Outcome::SelectedOptionId(id)),
                ..
            })) if id == "allow-once"
        ));
        let elicitation = Pending::Elicitation(pb::ElicitationPart::default());
        let accepted = json!({"action": "accept", "content": {"name": "Ada", "n": 2}});
        let Some(Action::RespondElicitation(answer)) = answer_action(&elicitation, &accepted)
        else {
            panic!()
        };
        let Some(pb::respond_elicitation_action::Answer::Accept(accept)) = answer.answer else {
            panic!()
        };
        assert_eq!(accept.content.len(), 2);
        assert_eq!(answer_action(&held, &json!({"nonsense": 1})), None);
    }
}
