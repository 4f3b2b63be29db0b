//! The runtime's advertised config options: the model option, and what a setModel or a
//! setConfigOption may ask for.

use std::collections::{BTreeMap, HashMap};

use serde::de::IgnoredAny;
use serde_json::Value;

use super::Actor;
use crate::{
    acp::{
        frames::{self as acp_frames, ConfigValue},
        views::{ConfigOption, Envelope, Params, Reply, SetConfigParams, view},
    },
    domain::{Error, ErrorCode, Result, log::Direction},
};

/// Log entries read at a time when looking for the config options the harness chose.
const LOG_PAGE: usize = 512;

impl Actor {
    /// The config options the harness set and the agent accepted, last value per option id,
    /// read back from the log (the session record keeps only the model). A log that cannot be
    /// read gives none: the reopen goes on without re-applying them.
    pub(super) async fn chosen_config_options(&self) -> BTreeMap<String, Value> {
        let mut chosen = BTreeMap::new();
        // Requests sent and not yet answered, by their JSON-RPC id.
        let mut asked: HashMap<String, (String, Value)> = HashMap::new();
        let mut after = 0;
        loop {
            let page = match self
                .ctx
                .store
                .read_log(self.record.id, after, LOG_PAGE)
                .await
            {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(session = %self.record.id, error = %e.message,
                        "cannot read the log for the config options to re-apply");
                    return BTreeMap::new();
                }
            };
            let Some(last) = page.last() else { break };
            after = last.offset;
            for entry in &page {
                match entry.direction {
                    Direction::ToRuntime if entry.json.contains("session/set_config_option") => {
                        let Ok(frame) = serde_json::from_str::<Value>(&entry.json) else {
                            continue;
                        };
                        if let Some(SetConfigParams {
                            config_id: Some(config_id),
                            value: Some(value),
                        }) = view::<Params<SetConfigParams>>(&frame).params
                        {
                            asked.insert(
                                id_text(view::<Envelope>(&frame).id),
                                (config_id.to_owned(), value),
                            );
                        }
                    }
                    // Only answers (no "method") can settle a request.
                    Direction::FromRuntime
                        if !asked.is_empty() && !entry.json.contains("\"method\"") =>
                    {
                        let Ok(frame) = serde_json::from_str::<Value>(&entry.json) else {
                            continue;
                        };
                        let reply: Reply<IgnoredAny> = view(&frame);
                        if let Some((config_id, value)) = asked.remove(&id_text(reply.id))
                            && reply.result.is_some()
                        {
                            chosen.insert(config_id, value);
                        }
                    }
                    _ => {}
                }
            }
            if page.len() < LOG_PAGE {
                break;
            }
        }
        chosen
    }

    /// Takes the config options an answer or an update advertised (when it held an array).
    pub(super) fn adopt_config_options(&mut self, options: Option<Vec<Value>>) {
        if let Some(options) = options {
            self.runtime.config_options = options;
            match self.current_model() {
                // A model id is stored and shown: one past the cap is not taken as the model.
                Some(model) if model.len() > crate::domain::text::MAX_FOREIGN_TEXT_BYTES => {
                    tracing::warn!(session = %self.record.id, bytes = model.len(),
                        "the runtime reported a current model id over the cap; kept the previous one");
                }
                Some(model) => self.record.model = model,
                None => {}
            }
        }
    }

    pub(super) fn model_option(&self) -> Option<&Value> {
        acp_frames::model_option(&self.runtime.config_options)
    }

    pub(super) fn current_model(&self) -> Option<String> {
        view::<ConfigOption>(self.model_option()?)
            .current_id()
            .map(str::to_owned)
    }

    pub(super) fn check_model(&self, model: &str) -> Result<()> {
        check_model(&self.runtime.config_options, model)
    }

    pub(super) fn check_config_option(&self, config_id: &str, value: &str) -> Result<ConfigValue> {
        check_config_option(&self.runtime.config_options, config_id, value)
    }
}

/// A JSON-RPC id as text, the key of a request awaiting its answer (a missing id reads as
/// `null`, as a missing field reads in JSON).
fn id_text(id: Option<Value>) -> String {
    id.unwrap_or(Value::Null).to_string()
}

/// Whether the runtime advertises `model` among the values of its model option.
pub(super) fn check_model(config_options: &[Value], model: &str) -> Result<()> {
    let advertised = acp_frames::model_option(config_options)
        .map(select_values)
        .unwrap_or_default();
    if advertised.iter().any(|v| v == model) {
        return Ok(());
    }
    let list = advertised.join(", ");
    let shown = if list.is_empty() { "none" } else { &list };
    Err(Error::new(
        ErrorCode::ModelNotAdvertised,
        format!("model {model:?} is not advertised by the runtime; advertised: {shown}"),
    )
    .with("advertised", &list))
}

/// The value to send for config option `config_id` set to `value` (as a caller writes it),
/// when the runtime advertises both.
pub(super) fn check_config_option(
    config_options: &[Value],
    config_id: &str,
    value: &str,
) -> Result<ConfigValue> {
    let option = acp_frames::config_option(config_options, config_id).ok_or_else(|| {
        let ids: Vec<&str> = config_options
            .iter()
            .filter_map(|o| view::<ConfigOption>(o).id)
            .collect();
        Error::new(
            ErrorCode::ConfigOptionUnknown,
            format!(
                "config option {config_id:?} is not advertised; advertised: {}",
                if ids.is_empty() {
                    "none".to_owned()
                } else {
                    ids.join(", ")
                }
            ),
        )
    })?;
    match view::<ConfigOption>(option).kind {
        Some("boolean") => match value {
            "true" => Ok(ConfigValue::Bool(true)),
            "false" => Ok(ConfigValue::Bool(false)),
            _ => Err(Error::new(
                ErrorCode::ConfigOptionUnknown,
                format!("config option {config_id:?} is a boolean: use \"true\" or \"false\""),
            )),
        },
        _ => {
            let values = select_values(option);
            if values.iter().any(|v| v == value) {
                Ok(ConfigValue::Id(value.to_owned()))
            } else {
                Err(Error::new(
                    ErrorCode::ConfigOptionUnknown,
                    format!(
                        "value {value:?} is not advertised for config option {config_id:?}; advertised: {}",
                        values.join(", ")
                    ),
                ))
            }
        }
    }
}

/// The values of a select config option, flattening groups.
pub(super) fn select_values(option: &Value) -> Vec<String> {
    acp_frames::select_choices(option)
        .into_iter()
        .filter_map(|choice| choice.value)
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// What a sloppy agent may advertise: odd entries around a usable model select and a
    /// boolean.
    fn sloppy() -> Vec<Value> {
        vec![
            json!("model"),
            json!({"id": 7, "type": "boolean"}),
            json!({"id": "llm", "category": "model", "type": 1, "currentValue": ["fast"],
                   "options": [{"value": "fast"}, "smart", {"value": 2},
                               {"options": [{"value": "smart"}]}]}),
            json!({"id": "thinking", "type": "boolean", "currentValue": "yes"}),
            json!({"id": "mode", "type": "select", "options": {"value": "ask"}}),
        ]
    }

    #[test]
    fn a_model_is_checked_against_the_values_that_can_be_read_of_the_model_option() {
        let options = sloppy();
        assert!(check_model(&options, "fast").is_ok());
        assert!(check_model(&options, "smart").is_ok());
        let error = check_model(&options, "2").expect_err("a number is no value");
        assert_eq!(error.code, ErrorCode::ModelNotAdvertised);
        assert_eq!(
            error.message,
            "model \"2\" is not advertised by the runtime; advertised: fast, smart"
        );
        let error = check_model(&[json!([1]), json!(null)], "fast").expect_err("no model option");
        assert_eq!(
            error.message,
            "model \"fast\" is not advertised by the runtime; advertised: none"
        );
    }

    #[test]
    fn a_config_option_is_found_by_a_string_id_and_typed_by_a_string_type() {
        let options = sloppy();
        let error = check_config_option(&options, "7", "true").expect_err("7 is no id");
        assert_eq!(error.code, ErrorCode::ConfigOptionUnknown);
        assert_eq!(
            error.message,
            "config option \"7\" is not advertised; advertised: llm, thinking, mode"
        );
        assert_eq!(
            check_config_option(&options, "thinking", "false").expect("a boolean"),
            ConfigValue::Bool(false)
        );
        // A type that is not a string reads as a select.
        assert_eq!(
            check_config_option(&options, "llm", "smart").expect("a select value"),
            ConfigValue::Id("smart".into())
        );
        let error = check_config_option(&options, "mode", "ask").expect_err("no choices");
        assert_eq!(
            error.message,
            "value \"ask\" is not advertised for config option \"mode\"; advertised: "
        );
    }

    #[test]
    fn the_values_of_an_option_of_garbage_are_none() {
        for option in [
            json!(null),
            json!("fast"),
            json!([{"value": "fast"}]),
            json!({}),
        ] {
            assert!(select_values(&option).is_empty(), "{option}");
        }
    }
}
