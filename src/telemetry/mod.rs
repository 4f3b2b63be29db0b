//! Telemetry: Prometheus metrics on their own port, and logging set-up (text or JSON).

pub(crate) mod metrics;
pub(crate) mod traces;

use serde::Deserialize;

/// How logs are written: text for people, or one JSON object per line for collectors.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Deserialize, serde::Serialize,
)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Installs the global `tracing` subscriber: `RUST_LOG` filters (default `info`), logs go to
/// stderr as text (coloured only on a terminal) or as one JSON object per line.
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .init(),
    }
}
