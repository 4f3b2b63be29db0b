//! `[model_proxy]`: what every box's model proxy shares (docs/model-proxy.md): how long it waits
//! for an upstream, and what each model costs, per million tokens, so it can charge each call it
//! meters. Prices are decimal strings, as budgets are: a float would not add up exactly.
//!
//! ```toml
//! [model_proxy]
//! timeout = "10m"
//!
//! [model_proxy.prices]
//! "claude-sonnet-4-5*" = { currency = "USD", input = "3", output = "15", cache_read = "0.30", cache_write = "3.75" }
//! "gpt-5.3-codex" = { currency = "USD", input = "1.25", output = "10" }
//! ```

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use serde::Deserialize;

use crate::domain::usage::{ModelPrice, PriceTable, decimal_to_micros};

/// The `[model_proxy]` table as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelProxyFile {
    /// The longest wait for an upstream's answer to start, and between two of its chunks.
    pub timeout: Option<String>,
    pub prices: Option<toml::Value>,
}

/// What every box's model proxy shares, as read.
#[derive(Debug, Clone, Default)]
pub struct ModelProxySettings {
    pub limits: crate::model_proxy::Limits,
    pub prices: Arc<PriceTable>,
}

/// Reads `[model_proxy]`; every error names the key.
pub fn settings(file: &ModelProxyFile) -> anyhow::Result<ModelProxySettings> {
    let mut limits = crate::model_proxy::Limits::default();
    if let Some(text) = &file.timeout {
        let timeout = humantime::parse_duration(text)
            .map_err(|e| anyhow::anyhow!("model_proxy.timeout = {text:?}: {e}"))?;
        if timeout < Duration::from_secs(1) {
            anyhow::bail!(
                "model_proxy.timeout = {text:?}: at least one second (a model's answer takes \
                 seconds to start)"
            );
        }
        limits.timeout = timeout;
    }
    Ok(ModelProxySettings {
        limits,
        prices: Arc::new(price_table(file.prices.as_ref())?),
    })
}

/// One model's entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceFile {
    currency: String,
    input: String,
    output: String,
    cache_read: Option<String>,
    cache_write: Option<String>,
}

/// Reads the table; every error names the entry and the field.
pub fn price_table(written: Option<&toml::Value>) -> anyhow::Result<PriceTable> {
    let mut table = PriceTable::default();
    let Some(written) = written else {
        return Ok(table);
    };
    let toml::Value::Table(models) = written else {
        anyhow::bail!(
            "model_proxy.prices = {written}: write a table of models, such as \
             [model_proxy.prices] \"claude-sonnet-4-5*\" = {{ currency = \"USD\", input = \"3\", output = \"15\" }}"
        );
    };
    for (model, value) in models {
        let key = format!("model_proxy.prices.{}", toml::Value::String(model.clone()));
        if model.is_empty() || model == "*" || model[..model.len() - 1].contains('*') {
            anyhow::bail!(
                "{key}: name a model, or a prefix of model names ending in one `*` \
                 (\"claude-sonnet-4-5*\")"
            );
        }
        let entry: PriceFile = value.clone().try_into().with_context(|| key.clone())?;
        if entry.currency.len() != 3 || !entry.currency.bytes().all(|b| b.is_ascii_uppercase()) {
            anyhow::bail!(
                "{key}.currency = {:?}: write a three-letter currency code such as \"USD\"",
                entry.currency
            );
        }
        let price = |field: &str, text: &str| {
            decimal_to_micros(text).ok_or_else(|| {
                anyhow::anyhow!(
                    "{key}.{field} = {text:?} is not a price: write a decimal string with at \
                     most six decimals, per million tokens (\"3\", \"0.30\")"
                )
            })
        };
        let input = price("input", &entry.input)?;
        let output = price("output", &entry.output)?;
        let cache_read = match &entry.cache_read {
            Some(text) => price("cache_read", text)?,
            None => input,
        };
        let cache_write = match &entry.cache_write {
            Some(text) => price("cache_write", text)?,
            None => input,
        };
        table.insert(
            model,
            ModelPrice {
                currency: entry.currency,
                input,
                output,
                cache_read,
                cache_write,
            },
        );
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> anyhow::Result<PriceTable> {
        let value: toml::Value = toml::from_str(text).unwrap();
        price_table(value.get("model_proxy").and_then(|m| m.get("prices")))
    }

    #[test]
    fn prices_are_read_per_million_tokens_with_cache_prices_defaulting_to_input() {
        let table = read(
            r#"[model_proxy.prices]
               "claude-sonnet-4-5*" = { currency = "USD", input = "3", output = "15", cache_read = "0.30" }
               "gpt-5.3-codex" = { currency = "EUR", input = "1.25", output = "10" }"#,
        )
        .unwrap();
        let sonnet = table.price_of("claude-sonnet-4-5-20250929").unwrap();
        assert_eq!(
            (
                sonnet.input,
                sonnet.output,
                sonnet.cache_read,
                sonnet.cache_write
            ),
            (3_000_000, 15_000_000, 300_000, 3_000_000)
        );
        let codex = table.price_of("gpt-5.3-codex").unwrap();
        assert_eq!((codex.currency.as_str(), codex.input), ("EUR", 1_250_000));
        assert!(read("").unwrap().is_empty());
    }

    #[test]
    fn a_malformed_price_is_refused_naming_the_entry_and_field() {
        for (entry, needle) in [
            (
                r#"m = { currency = "USD", input = "3,5", output = "1" }"#,
                "model_proxy.prices.\"m\".input = \"3,5\"",
            ),
            (
                r#"m = { currency = "USD", input = "-1", output = "1" }"#,
                ".input = \"-1\"",
            ),
            (
                r#"m = { currency = "USD", input = "1", output = "1e3" }"#,
                ".output = \"1e3\"",
            ),
            (
                r#"m = { currency = "USD", input = "1", output = "0.1234567" }"#,
                ".output",
            ),
            (
                r#"m = { currency = "USD", input = "1", output = "1", cache_read = "." }"#,
                ".cache_read",
            ),
            (
                r#"m = { currency = "usd", input = "1", output = "1" }"#,
                ".currency = \"usd\"",
            ),
            (
                r#"m = { currency = "USD", input = 3, output = "1" }"#,
                "model_proxy.prices.\"m\"",
            ),
            (
                r#"m = { currency = "USD", input = "1" }"#,
                "model_proxy.prices.\"m\"",
            ),
            (
                r#"m = { currency = "USD", input = "1", output = "1", bogus = "1" }"#,
                "model_proxy.prices.\"m\"",
            ),
            (
                r#""a*b*" = { currency = "USD", input = "1", output = "1" }"#,
                "a prefix of model names",
            ),
            (
                r#""*" = { currency = "USD", input = "1", output = "1" }"#,
                "a prefix of model names",
            ),
        ] {
            let err = format!(
                "{:#}",
                read(&format!("[model_proxy.prices]\n{entry}")).unwrap_err()
            );
            assert!(err.contains(needle), "{entry} → {err}");
        }
        let err = format!("{:#}", read("model_proxy = { prices = 3 }").unwrap_err());
        assert!(err.contains("write a table of models"), "{err}");
    }

    #[test]
    fn the_timeout_is_read_and_a_bad_one_refused() {
        let file = |text: &str| -> ModelProxyFile {
            let value: toml::Value = toml::from_str(text).unwrap();
            value["model_proxy"].clone().try_into().unwrap()
        };
        let read = settings(&file("[model_proxy]\ntimeout = \"90s\"")).unwrap();
        assert_eq!(read.limits.timeout, Duration::from_secs(90));
        assert_eq!(
            settings(&ModelProxyFile::default()).unwrap().limits.timeout,
            crate::model_proxy::Limits::default().timeout
        );
        for (text, needle) in [
            ("timeout = \"soon\"", "model_proxy.timeout = \"soon\""),
            ("timeout = \"10ms\"", "at least one second"),
        ] {
            let err = settings(&file(&format!("[model_proxy]\n{text}"))).unwrap_err();
            assert!(err.to_string().contains(needle), "{text} → {err}");
        }
    }
}
