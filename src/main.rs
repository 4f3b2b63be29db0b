//! The `agent-harness` command: `serve` runs the gRPC service; `mock-agent` runs the scripted
//! ACP agent of the built-in `mock` profile on stdin/stdout (the `agent-harness-mock-agent`
//! crate); `profiles` lists the presets and a config file's profiles; `backup` copies the embedded store
//! while the server runs. The benchmark is a binary of its own (`crates/bench`).

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
    Serve(Box<ServeArgs>),
    /// Run agents here for a harness elsewhere: dial its RuntimeGatewayService.
    Bridge(agent_harness::bridge::BridgeArgs),
    /// Run the scripted ACP agent on stdin/stdout (the built-in `mock` profile; see docs/mock-agent.md).
    MockAgent(MockAgentArgs),
    /// Copy the embedded SQLite store to a new file while the server runs (a consistent
    /// online backup).
    Backup(agent_harness::backup::BackupArgs),
    /// List the built-in agent presets and a config file's profiles with what each resolves to
    /// (command, pinned version, variable names; never values). Reads the file, asks no server.
    #[command(after_help = agent_harness::config::listing::PROFILES_HELP)]
    Profiles(agent_harness::config::listing::ProfilesArgs),
    /// The people's subcommands (`sessions`, `prompt`, `follow`, `answer`, `log`): a client of a
    /// running server.
    #[command(flatten)]
    People(agent_harness::cli::Command),
    /// Internal: started by `serve`; kills its runtimes' process trees when `serve` dies.
    #[command(hide = true)]
    RuntimeWatchdog {
        #[arg(long)]
        marker_prefix: String,
    },
    /// Internal: started by `serve` (and `bridge`) as a runtime's process; builds its box and
    /// starts the agent in it, as told over descriptor 3.
    #[command(hide = true)]
    SandboxExec,
    /// Internal: run by `profiles --check` inside a profile's box; says whether the agent's
    /// command is there and its directories take writes.
    #[command(hide = true)]
    SandboxProbe { command: String },
}

/// Waits for SIGTERM or SIGINT. SIGHUP never stops the server: with a tokens file the token
/// watcher reloads it (each handler gets the signal); without one it is logged and ignored.
/// Both handlers are installed before the server starts, so no signal finds the default action.
async fn wait_for_stop_signal(
    mut term: tokio::signal::unix::Signal,
    mut interrupt: tokio::signal::unix::Signal,
    mut hangup: tokio::signal::unix::Signal,
    tokens_configured: bool,
) -> &'static str {
    loop {
        tokio::select! {
            _ = term.recv() => return "SIGTERM",
            _ = interrupt.recv() => return "SIGINT",
            _ = hangup.recv() => {
                if !tokens_configured {
                    tracing::info!("SIGHUP: no tokens file to reload; ignored");
                }
            }
        }
    }
}

/// A failure is one line naming its causes (`error: what: why`), never `Debug` output: with
/// `RUST_BACKTRACE` set in a person's shell, that would be a backtrace of forty lines.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::MockAgent(args) => std::process::exit(mock_agent::main(args)),
        Command::Profiles(args) => {
            std::process::exit(agent_harness::config::listing::run(args).into())
        }
        Command::Backup(args) => std::process::exit(agent_harness::backup::run(args).into()),
        Command::People(command) => std::process::exit(agent_harness::cli::main(command).into()),
        Command::SandboxExec => std::process::exit(agent_harness::acp::sandbox::launcher::main()),
        Command::SandboxProbe { command } => {
            std::process::exit(agent_harness::acp::sandbox::probe::main(&command))
        }
        Command::RuntimeWatchdog { marker_prefix } => {
            std::process::exit(agent_harness::acp::process::watchdog_main(&marker_prefix))
        }
        Command::Bridge(args) => {
            agent_harness::acp::sandbox::make_non_dumpable()?;
            agent_harness::acp::process::set_watchdog_program(std::env::current_exe()?);
            agent_harness::telemetry::init_logging(Default::default());
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(agent_harness::bridge::run(args))
        }
        Command::Serve(args) => {
            agent_harness::acp::sandbox::make_non_dumpable()?;
            let program = std::env::current_exe()?;
            agent_harness::acp::process::set_watchdog_program(program.clone());
            let config = ServeConfig::resolve(*args, program)?;
            agent_harness::telemetry::init_logging(config.log_format);
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                use tokio::signal::unix::{SignalKind, signal};
                let term = signal(SignalKind::terminate())?;
                let interrupt = signal(SignalKind::interrupt())?;
                let hangup = signal(SignalKind::hangup())?;
                let tokens_configured = config.tokens_file.is_some();
                let server = app::start(config).await?;
                let signal = wait_for_stop_signal(term, interrupt, hangup, tokens_configured).await;
                tracing::info!(signal, "stopping: draining first");
                server.drain_and_stop().await?;
                tracing::info!("stopped");
                Ok(())
            })
        }
    }
}
