//! Settings after a reopen: agents do not always keep a session's model and config options
//! across `session/resume` or `session/load`, so what the harness chose before is asked
//! for again when the agent reports another value. The plan is pure: the actor sends it.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::config_options::{check_config_option, check_model};
use crate::{
    acp::{
        frames::{self as acp_frames, ConfigValue},
        views::{ConfigOption, view},
    },
    domain::Action,
};

/// One setting to ask the agent for again.
#[derive(Debug, PartialEq)]
pub(super) struct SettingRequest {
    pub config_id: String,
    pub value: ConfigValue,
    /// The action it is recorded as (its fingerprint).
    pub action: Action,
}

/// What to do about the settings once a reopened session's agent has reported its own.
#[derive(Debug, Default, PartialEq)]
pub(super) struct ReapplyPlan {
    /// The requests to send, the model first; the session is ready once all are answered.
    pub requests: Vec<SettingRequest>,
    /// The `settings_reapplied` event to log, when anything was re-applied or skipped.
    pub event: Option<Value>,
}

/// Plans the re-application of the settings chosen before a reopen. `chosen_model`: the model
/// the session had; `reported_model`: the one the agent reports now (empty if it reports none);
/// `chosen_options`: the config options the harness set and the agent accepted; `offered`: the
/// config options the agent advertises now. A chosen value the agent no longer offers is skipped
/// (said so in the event, except for a model, which is kept silently as it was).
pub(super) fn plan_reapply(
    chosen_model: &str,
    reported_model: &str,
    chosen_options: BTreeMap<String, Value>,
    offered: &[Value],
) -> ReapplyPlan {
    let mut event = Map::new();
    let mut requests = Vec::new();
    let model_config_id = acp_frames::model_config_id(offered).to_owned();
    if !chosen_model.is_empty()
        && !reported_model.is_empty()
        && chosen_model != reported_model
        && check_model(offered, chosen_model).is_ok()
    {
        event.insert("model".into(), json!(chosen_model));
        event.insert("reported_model".into(), json!(reported_model));
        requests.push(SettingRequest {
            config_id: model_config_id.clone(),
            value: ConfigValue::Id(chosen_model.to_owned()),
            action: Action::SetModel {
                model: chosen_model.to_owned(),
            },
        });
    }
    let (mut reapplied, mut skipped) = (Vec::new(), Vec::new());
    for (config_id, value) in chosen_options {
        if config_id == model_config_id {
            continue; // the model is handled above
        }
        let Some(reported) = acp_frames::config_option(offered, &config_id)
            .and_then(|o| view::<ConfigOption>(o).current_value)
        else {
            skipped.push(json!({"config_id": config_id, "value": value,
                                "reason": "no longer offered by the agent"}));
            continue;
        };
        if reported == value {
            continue;
        }
        let text = match &value {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        match check_config_option(offered, &config_id, &text) {
            Ok(config_value) => {
                reapplied.push(json!({"config_id": config_id, "value": value,
                                      "reported_value": reported}));
                requests.push(SettingRequest {
                    config_id: config_id.clone(),
                    value: config_value,
                    action: Action::SetConfigOption {
                        config_id,
                        value: text,
                    },
                });
            }
            Err(e) => {
                skipped.push(json!({"config_id": config_id, "value": value, "reason": e.message}))
            }
        }
    }
    if !reapplied.is_empty() {
        event.insert("config_options".into(), Value::Array(reapplied));
    }
    if !skipped.is_empty() {
        event.insert("skipped".into(), Value::Array(skipped));
    }
    let event = (!event.is_empty()).then(|| {
        event.insert("event".into(), json!("settings_reapplied"));
        Value::Object(event)
    });
    ReapplyPlan { requests, event }
}

/// The profile's `config_options` a new session asks for: each one the agent advertises with
/// another current value (requests), and each one it does not offer or that is not one of its
/// values (skipped, with why, for a `config_options_skipped` event).
pub(super) fn plan_profile_options(
    wanted: &BTreeMap<String, String>,
    offered: &[Value],
) -> (Vec<SettingRequest>, Vec<Value>) {
    let (mut requests, mut skipped) = (Vec::new(), Vec::new());
    for (config_id, value) in wanted {
        let current = acp_frames::config_option(offered, config_id)
            .and_then(|o| view::<ConfigOption>(o).current_value);
        let same = match &current {
            Some(Value::String(current)) => current == value,
            Some(other) => serde_json::from_str::<Value>(value).is_ok_and(|v| v == *other),
            None => false,
        };
        if same {
            continue;
        }
        match check_config_option(offered, config_id, value) {
            Ok(config_value) => requests.push(SettingRequest {
                config_id: config_id.clone(),
                value: config_value,
                action: Action::SetConfigOption {
                    config_id: config_id.clone(),
                    value: value.clone(),
                },
            }),
            Err(e) => {
                skipped.push(json!({"config_id": config_id, "value": value, "reason": e.message}))
            }
        }
    }
    (requests, skipped)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an agent advertises: a model select, a mode select and a boolean.
    fn offered(model: &str, mode: &str, thinking: bool) -> Vec<Value> {
        vec![
            json!({"id": "model", "category": "model", "type": "select", "currentValue": model,
                   "options": [{"value": "fast"}, {"value": "smart"}]}),
            json!({"id": "mode", "type": "select", "currentValue": mode,
                   "options": [{"group": "g", "options": [{"value": "ask"}, {"value": "code"}]}]}),
            json!({"id": "thinking", "type": "boolean", "currentValue": thinking}),
        ]
    }

    fn chosen(pairs: &[(&str, Value)]) -> BTreeMap<String, Value> {
        pairs
            .iter()
            .map(|(id, value)| (id.to_string(), value.clone()))
            .collect()
    }

    #[test]
    fn a_profiles_options_are_asked_for_where_they_differ_and_skipped_where_not_offered() {
        let wanted: BTreeMap<String, String> = [
            ("mode", "code"),
            ("thinking", "true"),
            ("effort", "high"),
            ("model", "turbo"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let (requests, skipped) = plan_profile_options(&wanted, &offered("fast", "ask", true));
        assert_eq!(
            requests,
            vec![SettingRequest {
                config_id: "mode".into(),
                value: ConfigValue::Id("code".into()),
                action: Action::SetConfigOption {
                    config_id: "mode".into(),
                    value: "code".into()
                },
            }],
            "thinking is already true"
        );
        let skipped_ids: Vec<&str> = skipped
            .iter()
            .map(|s| s["config_id"].as_str().unwrap())
            .collect();
        assert_eq!(skipped_ids, ["effort", "model"]);
    }

    #[test]
    fn settings_the_agent_kept_are_not_asked_for_and_nothing_is_logged() {
        let plan = plan_reapply(
            "smart",
            "smart",
            chosen(&[("mode", json!("code")), ("thinking", json!(true))]),
            &offered("smart", "code", true),
        );
        assert_eq!(plan, ReapplyPlan::default());
    }

    #[test]
    fn a_model_the_agent_reports_differently_is_asked_for_again_first() {
        let plan = plan_reapply(
            "smart",
            "fast",
            chosen(&[("mode", json!("code"))]),
            &offered("fast", "ask", false),
        );
        assert_eq!(
            plan.requests,
            vec![
                SettingRequest {
                    config_id: "model".into(),
                    value: ConfigValue::Id("smart".into()),
                    action: Action::SetModel {
                        model: "smart".into()
                    },
                },
                SettingRequest {
                    config_id: "mode".into(),
                    value: ConfigValue::Id("code".into()),
                    action: Action::SetConfigOption {
                        config_id: "mode".into(),
                        value: "code".into()
                    },
                },
            ]
        );
        assert_eq!(
            plan.event,
            Some(json!({"model": "smart", "reported_model": "fast",
                        "config_options": [{"config_id": "mode", "value": "code",
                                            "reported_value": "ask"}],
                        "event": "settings_reapplied"}))
        );
    }

    #[test]
    fn a_model_is_not_asked_for_when_none_was_chosen_none_is_reported_or_it_is_no_longer_advertised()
     {
        for (chosen_model, reported) in [("", "fast"), ("smart", ""), ("retired", "fast")] {
            let plan = plan_reapply(
                chosen_model,
                reported,
                BTreeMap::new(),
                &offered("fast", "ask", false),
            );
            assert_eq!(
                plan,
                ReapplyPlan::default(),
                "{chosen_model:?} / {reported:?}"
            );
        }
    }

    #[test]
    fn a_boolean_option_is_asked_for_as_a_boolean_and_recorded_as_its_text() {
        let plan = plan_reapply(
            "",
            "",
            chosen(&[("thinking", json!(true))]),
            &offered("fast", "ask", false),
        );
        assert_eq!(
            plan.requests,
            vec![SettingRequest {
                config_id: "thinking".into(),
                value: ConfigValue::Bool(true),
                action: Action::SetConfigOption {
                    config_id: "thinking".into(),
                    value: "true".into()
                },
            }]
        );
    }

    #[test]
    fn an_option_no_longer_offered_or_a_value_no_longer_advertised_is_skipped_with_its_reason() {
        let plan = plan_reapply(
            "",
            "",
            chosen(&[("gone", json!("x")), ("mode", json!("architect"))]),
            &offered("fast", "ask", false),
        );
        assert!(plan.requests.is_empty());
        let event = plan.event.expect("an event");
        assert_eq!(event["event"], "settings_reapplied");
        assert!(
            !event
                .as_object()
                .expect("an object")
                .contains_key("config_options")
        );
        let skipped = event["skipped"].as_array().expect("skipped");
        assert_eq!(skipped.len(), 2);
        assert_eq!(
            skipped[0],
            json!({"config_id": "gone", "value": "x", "reason": "no longer offered by the agent"})
        );
        assert_eq!(skipped[1]["config_id"], "mode");
        let reason = skipped[1]["reason"].as_str().expect("a reason");
        assert!(reason.contains("\"architect\""), "{reason}");
    }

    #[test]
    fn a_chosen_model_option_is_left_to_the_model_rule() {
        // The agent reports no model (nothing to compare), so nothing is asked for, even though
        // the option log holds another value for the model option.
        let plan = plan_reapply(
            "",
            "",
            chosen(&[("model", json!("smart"))]),
            &offered("fast", "ask", false),
        );
        assert_eq!(plan, ReapplyPlan::default());
    }
}
