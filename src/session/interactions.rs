//! Requests the agent made of a person, held until answered: permission requests (any
//! number) and at most one session-scoped elicitation. Pure bookkeeping; the actor does the I/O.

use std::time::Instant;

use serde_json::Value;

use crate::domain::{
    Error, ErrorCode, JsonRpcId, PermissionAnswer, Result, action::ElicitationAnswer,
};
use crate::session::profile::{PermissionRule, RuleDecision};

/// A permission option as the agent offered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OfferedOption {
    pub option_id: String,
    pub kind: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeldPermission {
    pub id: JsonRpcId,
    pub options: Vec<OfferedOption>,
    /// When the profile's `permission_timeout` answers it.
    pub deadline: Option<Instant>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeldElicitation {
    pub id: JsonRpcId,
}

/// Everything currently held for a person, in arrival order.
#[derive(Debug, Default, Clone)]
pub(crate) struct Held {
    pub permissions: Vec<HeldPermission>,
    pub elicitation: Option<HeldElicitation>,
}

impl Held {
    pub(crate) fn is_empty(&self) -> bool {
        self.permissions.is_empty() && self.elicitation.is_none()
    }

    pub(crate) fn clear(&mut self) {
        self.permissions.clear();
        self.elicitation = None;
    }

    /// Checks an answer to a permission request against what is held and offered.
    pub(crate) fn check_permission_answer(
        &self,
        id: &JsonRpcId,
        answer: &PermissionAnswer,
    ) -> Result<()> {
        let held = self
            .permissions
            .iter()
            .find(|p| &p.id == id)
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::PermissionNotPending,
                    format!("no permission request {id} is pending"),
                )
            })?;
        if let PermissionAnswer::Selected { option_id } = answer
            && !held.options.iter().any(|o| &o.option_id == option_id)
        {
            let offered: Vec<&str> = held.options.iter().map(|o| o.option_id.as_str()).collect();
            return Err(Error::new(
                ErrorCode::PermissionOptionUnknown,
                format!(
                    "option {option_id:?} was not offered for permission request {id}; offered: {}",
                    offered.join(", ")
                ),
            ));
        }
        Ok(())
    }

    pub(crate) fn check_elicitation_answer(
        &self,
        id: &JsonRpcId,
        _answer: &ElicitationAnswer,
    ) -> Result<()> {
        match &self.elicitation {
            Some(held) if &held.id == id => Ok(()),
            _ => Err(Error::new(
                ErrorCode::ElicitationNotPending,
                format!("no elicitation {id} is pending"),
            )),
        }
    }

    /// Releases a held request by id; whether it was held, and as what.
    pub(crate) fn release(&mut self, id: &JsonRpcId) -> Option<Released> {
        if let Some(index) = self.permissions.iter().position(|p| &p.id == id) {
            self.permissions.remove(index);
            return Some(Released::Permission);
        }
        if self.elicitation.as_ref().is_some_and(|e| &e.id == id) {
            self.elicitation = None;
            return Some(Released::Elicitation);
        }
        None
    }
}

/// What kind of request was released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    Permission,
    Elicitation,
}

/// Reads the options of a `session/request_permission`.
pub(crate) fn offered_options(params: &Value) -> Vec<OfferedOption> {
    params
        .get("options")
        .and_then(Value::as_array)
        .map(|options| {
            options
                .iter()
                .filter_map(|o| {
                    Some(OfferedOption {
                        option_id: o.get("optionId")?.as_str()?.to_owned(),
                        kind: o
                            .get("kind")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The auto-accept policy's answer: the first `allow_always` option, else `allow_once`, else
/// cancelled.
pub(crate) fn auto_accept(options: &[OfferedOption]) -> PermissionAnswer {
    ["allow_always", "allow_once"]
        .iter()
        .find_map(|kind| options.iter().find(|o| o.kind == *kind))
        .map(|o| PermissionAnswer::Selected {
            option_id: o.option_id.clone(),
        })
        .unwrap_or(PermissionAnswer::Cancelled)
}

/// What a matching permission rule decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RuleMatch {
    /// The rule's place in the profile's list, from 0.
    pub index: usize,
    pub decision: RuleDecision,
    /// The answer to send; `None`: hold the request for a person (`ask`, or no option of the
    /// decided kind was offered).
    pub answer: Option<PermissionAnswer>,
}

/// The first rule matching a `session/request_permission` (its tool call's `kind` and
/// `title`), and the option it selects: the offered option of the decided kind, else of the
/// other kind that allows or rejects alike (`allow_once` for `allow_always`, …).
pub(crate) fn apply_rules(
    rules: &[PermissionRule],
    params: &Value,
    options: &[OfferedOption],
) -> Option<RuleMatch> {
    let tool = params.get("toolCall");
    let field = |name: &str| {
        tool.and_then(|t| t.get(name))
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let (kind, title) = (field("kind"), field("title"));
    let (index, rule) = rules
        .iter()
        .enumerate()
        .find(|(_, rule)| rule.matches(kind, title))?;
    let answer = rule.decision.option_kind().and_then(|wanted| {
        let alike = match wanted {
            "allow_once" => "allow_always",
            "allow_always" => "allow_once",
            "reject_once" => "reject_always",
            _ => "reject_once",
        };
        [wanted, alike]
            .iter()
            .find_map(|k| options.iter().find(|o| o.kind == *k))
            .map(|o| PermissionAnswer::Selected {
                option_id: o.option_id.clone(),
            })
    });
    Some(RuleMatch {
        index,
        decision: rule.decision,
        answer,
    })
}

/// The answer when `permission_timeout` runs out: the first reject option offered, else
/// cancelled.
pub(crate) fn timeout_answer(options: &[OfferedOption]) -> PermissionAnswer {
    options
        .iter()
        .find(|o| o.kind.starts_with("reject"))
        .map(|o| PermissionAnswer::Selected {
            option_id: o.option_id.clone(),
        })
        .unwrap_or(PermissionAnswer::Cancelled)
}

/// How a harness event names an answer it sent.
pub(crate) fn answer_json(answer: &PermissionAnswer) -> Value {
    match answer {
        PermissionAnswer::Selected { option_id } => serde_json::json!({"selected": option_id}),
        PermissionAnswer::Cancelled => Value::from("cancelled"),
    }
}

/// Why an elicitation is refused at once, if it is.
pub(crate) fn elicitation_refusal(params: &Value, held: &Held) -> Option<&'static str> {
    if params.get("sessionId").is_none() || params.get("requestId").is_some() {
        return Some("request-scoped elicitation is not supported; use session scope");
    }
    if held.elicitation.is_some() {
        return Some("another elicitation is already pending for this session");
    }
    match params.get("mode").and_then(Value::as_str) {
        Some("form" | "url") => None,
        _ => Some("unsupported elicitation mode; use form or url"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn options() -> Vec<OfferedOption> {
        offered_options(&json!({"options": [
            {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
            {"optionId": "always", "name": "Always", "kind": "allow_always"},
            {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
        ]}))
    }

    #[test]
    fn auto_accept_prefers_allow_always_then_allow_once_then_cancels() {
        assert_eq!(
            auto_accept(&options()),
            PermissionAnswer::Selected {
                option_id: "always".into()
            }
        );
        let once: Vec<_> = options()
            .into_iter()
            .filter(|o| o.kind != "allow_always")
            .collect();
        assert_eq!(
            auto_accept(&once),
            PermissionAnswer::Selected {
                option_id: "allow".into()
            }
        );
        let rejects: Vec<_> = options()
            .into_iter()
            .filter(|o| o.kind.starts_with("reject"))
            .collect();
        assert_eq!(auto_accept(&rejects), PermissionAnswer::Cancelled);
    }

    #[test]
    fn an_answer_must_name_a_held_request_and_an_offered_option() {
        let mut held = Held::default();
        held.permissions.push(HeldPermission {
            id: JsonRpcId::Number(7),
            options: options(),
            deadline: None,
        });
        let select = |o: &str| PermissionAnswer::Selected {
            option_id: o.into(),
        };
        held.check_permission_answer(&JsonRpcId::Number(7), &select("allow"))
            .unwrap();
        assert_eq!(
            held.check_permission_answer(&JsonRpcId::Text("7".into()), &select("allow"))
                .unwrap_err()
                .code,
            ErrorCode::PermissionNotPending
        );
        assert_eq!(
            held.check_permission_answer(&JsonRpcId::Number(7), &select("nope"))
                .unwrap_err()
                .code,
            ErrorCode::PermissionOptionUnknown
        );
        assert_eq!(
            held.release(&JsonRpcId::Number(7)),
            Some(Released::Permission)
        );
        assert_eq!(held.release(&JsonRpcId::Number(7)), None);
    }

    fn rule(kind: Option<&str>, title: Option<&str>, decision: RuleDecision) -> PermissionRule {
        PermissionRule {
            kind: kind.map(str::to_owned),
            title_regex: title.map(|t| regex::Regex::new(t).unwrap()),
            decision,
        }
    }

    #[test]
    fn the_first_matching_rule_selects_an_offered_option_of_its_kind() {
        let rules = [
            rule(Some("read"), None, RuleDecision::AllowOnce),
            rule(None, Some("^rm "), RuleDecision::RejectAlways),
            rule(None, None, RuleDecision::Ask),
        ];
        let request = |kind: &str, title: &str| json!({"toolCall": {"toolCallId": "t", "kind": kind, "title": title}});
        let read = apply_rules(&rules, &request("read", "rm x"), &options()).unwrap();
        assert_eq!(read.index, 0);
        assert_eq!(
            read.answer,
            Some(PermissionAnswer::Selected {
                option_id: "allow".into()
            })
        );
        // No `reject_always` offered: the alike `reject_once` is chosen.
        let rm = apply_rules(&rules, &request("execute", "rm -rf /"), &options()).unwrap();
        assert_eq!(rm.index, 1);
        assert_eq!(
            rm.answer,
            Some(PermissionAnswer::Selected {
                option_id: "reject".into()
            })
        );
        let other = apply_rules(&rules, &request("edit", "x"), &options()).unwrap();
        assert_eq!((other.index, other.answer), (2, None));
        assert_eq!(
            apply_rules(&rules[..1], &request("edit", "x"), &options()),
            None
        );
    }

    #[test]
    fn a_timeout_answers_with_the_first_reject_option_else_cancels() {
        assert_eq!(
            timeout_answer(&options()),
            PermissionAnswer::Selected {
                option_id: "reject".into()
            }
        );
        assert_eq!(timeout_answer(&options()[..2]), PermissionAnswer::Cancelled);
    }

    #[test]
    fn request_scoped_and_second_elicitations_are_refused() {
        let mut held = Held::default();
        let form = json!({"sessionId": "s", "mode": "form", "message": "m", "requestedSchema": {}});
        assert_eq!(elicitation_refusal(&form, &held), None);
        assert!(elicitation_refusal(&json!({"requestId": 1, "mode": "form"}), &held).is_some());
        held.elicitation = Some(HeldElicitation {
            id: JsonRpcId::Number(1),
        });
        assert!(
            elicitation_refusal(&form, &held)
                .unwrap()
                .contains("already pending")
        );
    }
}
