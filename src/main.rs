//! The `agent-harness` command: `serve` runs the gRPC service; `mock-agent` runs the scripted
//! ACP agent of the built-in `mock` profile on stdin/stdout (the `agent-harness-mock-agent`
//! crate). The benchmark is a binary of its own (`crates/bench`).

use clap::{Parser, Subcommand};

use agent_harness::{
    app,
    config::{ServeArgs, ServeConfig},
};
use agent_harness_mock_agent::{self as mock_agent, MockAgentArgs};

#[derive(Parser)]
#[command(
    name = "agent-harness",
    version,
    about = "gRPC bridge to coding agents speaking ACP"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the gRPC API (SQLite in the data dir and the built-in `mock` profile by default).
    Serve(ServeArgs),
    /// Run the scripted ACP agent on stdin/stdout (the built-in `mock` profile; see docs/mock-agent.md).
    MockAgent(MockAgentArgs),
}

async fn wait_for_stop_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::MockAgent(args) => std::process::exit(mock_agent::main(args)),
        Command::Serve(args) => {
            let program = std::env::current_exe()?;
            let config = ServeConfig::resolve(args, program)?;
            agent_harness::telemetry::init_logging(config.log_format);
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let server = app::start(config).await?;
                let signal = wait_for_stop_signal().await;
                tracing::info!(signal, "stopping: draining first");
                server.drain_and_stop().await?;
                tracing::info!("stopped");
                Ok(())
            })
        }
    }
}
