//! The session config options the mock agent advertises, and `session/set_config_option`.

use serde_json::{Map, Value, json};

use super::args::MockAgentArgs;

/// The id of the model option.
pub const MODEL_OPTION_ID: &str = "model";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Select { values: Vec<String>, current: usize },
    Boolean { current: bool },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ConfigOption {
    id: String,
    name: String,
    category: Option<&'static str>,
    kind: Kind,
}

impl ConfigOption {
    fn to_json(&self) -> Value {
        let mut option = Map::new();
        option.insert("id".into(), self.id.clone().into());
        option.insert("name".into(), self.name.clone().into());
        if let Some(category) = self.category {
            option.insert("category".into(), category.into());
        }
        match &self.kind {
            Kind::Select { values, current } => {
                option.insert("type".into(), "select".into());
                option.insert("currentValue".into(), values[*current].clone().into());
                option.insert(
                    "options".into(),
                    values
                        .iter()
                        .map(|value| json!({"value": value, "name": value}))
                        .collect(),
                );
            }
            Kind::Boolean { current } => {
                option.insert("type".into(), "boolean".into());
                option.insert("currentValue".into(), (*current).into());
            }
        }
        Value::Object(option)
    }
}

/// One session's config options, in advertised order: the model option, the `--config-option`s,
/// then the `--bool-option`s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigOptions(Vec<ConfigOption>);

/// Why a `session/set_config_option` was refused (the JSON-RPC -32602 message).
pub type Refusal = String;

impl ConfigOptions {
    pub fn from_args(args: &MockAgentArgs) -> Self {
        let mut options = Vec::new();
        if !args.no_models {
            options.push(ConfigOption {
                id: MODEL_OPTION_ID.to_owned(),
                name: "Model".to_owned(),
                category: Some("model"),
                kind: Kind::Select {
                    values: args.models.clone(),
                    current: 0,
                },
            });
        }
        for spec in &args.config_options {
            options.push(ConfigOption {
                id: spec.id.clone(),
                name: spec.id.clone(),
                category: None,
                kind: Kind::Select {
                    values: spec.values.clone(),
                    current: 0,
                },
            });
        }
        for id in &args.bool_options {
            options.push(ConfigOption {
                id: id.clone(),
                name: id.clone(),
                category: None,
                kind: Kind::Boolean { current: false },
            });
        }
        Self(options)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The full list as ACP `SessionConfigOption`s.
    pub fn to_json(&self) -> Value {
        Value::Array(self.0.iter().map(ConfigOption::to_json).collect())
    }

    /// Applies `session/set_config_option` params (`configId`, `value`, and `type: "boolean"` for
    /// booleans); nothing changes on a refusal.
    pub fn set(&mut self, params: &Value) -> Result<(), Refusal> {
        let config_id = params
            .get("configId")
            .and_then(Value::as_str)
            .ok_or("params.configId must be a string")?;
        let option = self
            .0
            .iter_mut()
            .find(|option| option.id == config_id)
            .ok_or_else(|| format!("unknown config option {config_id:?}"))?;
        let typ = params.get("type").and_then(Value::as_str);
        let value = params.get("value");
        match &mut option.kind {
            Kind::Select { values, current } => {
                let value = match (typ, value) {
                    (None, Some(Value::String(value))) => value,
                    _ => {
                        return Err(format!(
                            "config option {config_id:?} is a select option: value must be one of {values:?}"
                        ));
                    }
                };
                *current = values.iter().position(|v| v == value).ok_or_else(|| {
                    format!(
                        "value {value:?} is not advertised for config option {config_id:?} (one of {values:?})"
                    )
                })?;
            }
            Kind::Boolean { current } => match (typ, value) {
                (Some("boolean"), Some(Value::Bool(value))) => *current = *value,
                _ => {
                    return Err(format!(
                        "config option {config_id:?} is a boolean option: send type \"boolean\" and a boolean value"
                    ));
                }
            },
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(flags: &[&str]) -> ConfigOptions {
        ConfigOptions::from_args(&MockAgentArgs::from_flags(flags).unwrap())
    }

    #[test]
    fn the_default_options_are_one_model_select_with_the_first_model_current() {
        assert_eq!(
            options(&[]).to_json(),
            json!([{"id": "model", "name": "Model", "category": "model", "type": "select",
                    "currentValue": "mock-fast",
                    "options": [{"value": "mock-fast", "name": "mock-fast"},
                                {"value": "mock-smart", "name": "mock-smart"}]}])
        );
    }

    #[test]
    fn extra_select_and_boolean_options_follow_the_model_option_in_flag_order() {
        let all = options(&[
            "--models",
            "x",
            "--config-option",
            "effort=low|high",
            "--bool-option",
            "web",
        ])
        .to_json();
        assert_eq!(all.as_array().unwrap().len(), 3);
        assert_eq!(
            all[1],
            json!({"id": "effort", "name": "effort", "type": "select", "currentValue": "low",
                   "options": [{"value": "low", "name": "low"}, {"value": "high", "name": "high"}]})
        );
        assert_eq!(
            all[2],
            json!({"id": "web", "name": "web", "type": "boolean", "currentValue": false})
        );
        assert!(options(&["--no-models"]).is_empty());
    }

    #[test]
    fn setting_an_advertised_value_changes_only_that_option() {
        let mut opts = options(&["--config-option", "effort=low|high", "--bool-option", "web"]);
        opts.set(&json!({"sessionId": "s", "configId": "model", "value": "mock-smart"}))
            .unwrap();
        opts.set(&json!({"configId": "web", "type": "boolean", "value": true}))
            .unwrap();
        let all = opts.to_json();
        assert_eq!(all[0]["currentValue"], "mock-smart");
        assert_eq!(all[1]["currentValue"], "low");
        assert_eq!(all[2]["currentValue"], true);
    }

    #[test]
    fn unknown_ids_values_and_mismatched_types_are_refused_with_a_reason_and_change_nothing() {
        let mut opts = options(&["--bool-option", "web"]);
        let before = opts.clone();
        let cases = [
            (json!({"configId": "nope", "value": "x"}), "nope"),
            (json!({"configId": "model", "value": "gpt"}), "gpt"),
            (
                json!({"configId": "model", "type": "boolean", "value": true}),
                "select",
            ),
            (json!({"configId": "web", "value": "true"}), "boolean"),
            (
                json!({"configId": "web", "type": "boolean", "value": "yes"}),
                "boolean",
            ),
            (json!({"value": "x"}), "configId"),
        ];
        for (params, needle) in cases {
            let refusal = opts.set(&params).unwrap_err();
            assert!(refusal.contains(needle), "{refusal} should name {needle}");
        }
        assert_eq!(opts, before);
    }
}
