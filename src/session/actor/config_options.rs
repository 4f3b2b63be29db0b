//! The runtime's advertised config options: the model option, and what a setModel or a
//! setConfigOption may ask for (SPEC §4).

use serde_json::Value;

use super::Actor;
use crate::{
    acp::frames::{self as acp_frames, ConfigValue},
    domain::{Error, ErrorCode, Result},
};

impl Actor {
    pub(super) fn adopt_config_options(&mut self, result: &Value) {
        if let Some(options) = result.get("configOptions").and_then(Value::as_array) {
            self.runtime.config_options = options.clone();
            if let Some(model) = self.current_model() {
                self.record.model = model;
            }
        }
    }

    pub(super) fn model_option(&self) -> Option<&Value> {
        acp_frames::model_option(&self.runtime.config_options)
    }

    pub(super) fn current_model(&self) -> Option<String> {
        self.model_option()?
            .get("currentValue")
            .and_then(Value::as_str)
            .map(str::to_owned)
    }

    pub(super) fn check_model(&self, model: &str) -> Result<()> {
        let advertised = self.model_option().map(select_values).unwrap_or_default();
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

    pub(super) fn check_config_option(&self, config_id: &str, value: &str) -> Result<ConfigValue> {
        let option = acp_frames::config_option(&self.runtime.config_options, config_id)
            .ok_or_else(|| {
                let ids: Vec<&str> = self
                    .runtime
                    .config_options
                    .iter()
                    .filter_map(|o| o.get("id").and_then(Value::as_str))
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
        match option.get("type").and_then(Value::as_str) {
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
}

/// The values of a select config option, flattening groups.
pub(super) fn select_values(option: &Value) -> Vec<String> {
    acp_frames::select_choices(option)
        .into_iter()
        .filter_map(|choice| choice.get("value").and_then(Value::as_str))
        .map(str::to_owned)
        .collect()
}
