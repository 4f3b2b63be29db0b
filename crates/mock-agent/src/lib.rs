//! `agent-harness mock-agent`: a deterministic, scripted ACP v1 **agent** on its own stdin/stdout.
//! A crate of its own that the service binary runs as a subcommand; it shares the ACP vocabulary
//! (stop reasons, JSON-RPC error codes) with the harness through `agent-client-protocol-schema`.
//!
//! It is the built-in `mock` runtime profile, the peer of the harness's tests and
//! the runtime its benchmarks measure against. Prompts are echoed back; lines of the user's text
//! that start with `@` are directives that make it stream, ask for permission, elicit, sleep,
//! misbehave or crash — see `docs/mock-agent.md` for the full contract.
//!
//! [`run`] is generic over the byte streams, so tests drive it in-process over
//! `tokio::io::duplex`; [`main`] runs it on the process's own stdio on a current-thread runtime.

mod agent;
pub mod args;
pub mod options;
pub mod script;
mod stdio;
mod store;
pub mod wire;

#[cfg(test)]
mod tests;

use std::io::{self, Write};

use tokio::{
    io::{AsyncBufReadExt, AsyncRead, AsyncWrite, BufReader},
    sync::mpsc,
};

pub use agent::CANCEL_PERMISSION_WAIT;
pub use args::MockAgentArgs;

use agent::{Agent, Incoming};

/// Runs the agent until `input` closes (`Ok(0)`) or a directive or flag ends it with an exit
/// code (`@crash`, `--exit-at-start`). Diagnostics go to the process's stderr.
pub async fn run<R, W>(args: &MockAgentArgs, input: R, output: W) -> io::Result<i32>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    run_with_stderr(args, input, output, io::stderr()).await
}

/// [`run`] with stderr (`--stderr-at-start`, `@stderr`, `@crash`) written to `stderr`.
pub async fn run_with_stderr<R, W, E>(
    args: &MockAgentArgs,
    input: R,
    output: W,
    stderr: E,
) -> io::Result<i32>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    E: Write,
{
    run_until(args, input, output, stderr, std::future::pending()).await
}

/// [`run_with_stderr`] that also ends (code 0, its sessions written) when `terminate` resolves:
/// the process's SIGTERM, when it runs as a process.
async fn run_until<R, W, E>(
    args: &MockAgentArgs,
    input: R,
    output: W,
    mut stderr: E,
    terminate: impl std::future::Future<Output = ()>,
) -> io::Result<i32>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    E: Write,
{
    if let Some(text) = &args.stderr_at_start {
        writeln!(stderr, "{text}")?;
        stderr.flush()?;
    }
    if let Some(code) = args.exit_at_start {
        return Ok(code);
    }
    args.validate()
        .map_err(|message| io::Error::new(io::ErrorKind::InvalidInput, message))?;

    let (sender, mut receiver) = mpsc::unbounded_channel();
    // The reader lives beside the agent in the same task, so stdin keeps being drained (cancels,
    // answers to the agent's own requests) whatever the agent is doing.
    let reader = async move {
        read_messages(input, sender).await;
        std::future::pending::<()>().await;
    };
    let agent = Agent::new(args.clone(), output, stderr).serve(&mut receiver, terminate);
    tokio::select! {
        code = agent => Ok(code),
        () = reader => unreachable!("the reader never finishes"),
    }
}

/// Reads one JSON message per line until end of input (or a read error, treated the same).
async fn read_messages<R: AsyncRead + Unpin>(input: R, sender: mpsc::UnboundedSender<Incoming>) {
    let mut reader = BufReader::with_capacity(64 * 1024, input);
    let mut line = Vec::with_capacity(4096);
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = line.trim_ascii();
        if text.is_empty() {
            continue;
        }
        let message = serde_json::from_slice(text).map_or(Incoming::Invalid, Incoming::Message);
        if sender.send(message).is_err() {
            return;
        }
        if line.capacity() > 1024 * 1024 {
            line = Vec::with_capacity(4096);
        }
    }
}

/// What SIGTERM does to the agent process: with `ignore`, nothing (the future never resolves);
/// otherwise it ends the agent with code 0, once the sessions of `--session-dir` not yet written
/// are (the returned future resolves).
fn terminated(
    ignore: bool,
) -> io::Result<std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>> {
    if ignore {
        // SAFETY: setting a signal's disposition to SIG_IGN has no other effect.
        unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
        return Ok(Box::pin(std::future::pending()));
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    Ok(Box::pin(async move {
        term.recv().await;
    }))
}

/// The `mock-agent` subcommand: runs on the process's stdin/stdout on a current-thread runtime
/// and returns the exit code (2 for invalid flags, 1 for an I/O failure).
pub fn main(args: MockAgentArgs) -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("mock-agent: cannot start a runtime: {error}");
            return 1;
        }
    };
    let outcome = runtime.block_on(async {
        let input = stdio::Input::stdin()?;
        let output = stdio::Output::stdout()?;
        let terminate = terminated(args.ignore_sigterm)?;
        run_until(&args, input, output, io::stderr(), terminate).await
    });
    // Blocking stdin (not a pipe) may still be parked in a read: do not wait for it.
    runtime.shutdown_background();
    match outcome {
        Ok(code) => code,
        Err(error) if error.kind() == io::ErrorKind::InvalidInput => {
            eprintln!("mock-agent: {error}");
            2
        }
        Err(error) => {
            eprintln!("mock-agent: {error}");
            1
        }
    }
}
