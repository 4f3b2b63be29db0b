//! The runtime's advertised config options: the model option, and what a setModel or a
//! setConfigOption may ask for (SPEC §4).

use super::*;

impl Actor {
    pub(super) fn adopt_config_options(&mut self, result: &Value) {
        if let Some(options) = result.get("configOptions").and_then(Value::as_array) {
            self.config_options = options.clone();
            if let Some(model) = self.current_model() {
                self.record.model = model;
            }
        }
    }

    pub(super) fn model_option(&self) -> Option<&Value> {
        let id = acp_frames::model_config_id(&self.config_options);
        self.config_options
            .iter()
            .find(|o| o.get("id").and_then(Value::as_str) == Some(id))
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
        let option = self
            .config_options
            .iter()
            .find(|o| o.get("id").and_then(Value::as_str) == Some(config_id))
            .ok_or_else(|| {
                let ids: Vec<&str> = self
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
    pub(super) fn collect(options: &Value, out: &mut Vec<String>) {
        for option in options.as_array().into_iter().flatten() {
            if let Some(value) = option.get("value").and_then(Value::as_str) {
                out.push(value.to_owned());
            } else if let Some(group) = option.get("options") {
                collect(group, out);
            }
        }
    }
    let mut values = Vec::new();
    if let Some(options) = option.get("options") {
        collect(options, &mut values);
    }
    values
}
