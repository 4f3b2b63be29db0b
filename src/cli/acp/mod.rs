//! `agent-harness acp`: the harness as an ACP **agent**. An ACP client (an editor, acpx, an
//! SDK's client) starts it as a child process and speaks ACP on its stdin/stdout; each ACP method
//! becomes a call of the harness's gRPC API, like any other client's, and the session's log comes
//! back as `session/update`s. Logs go to stderr only: stdout carries nothing but ACP.
//!
//! - `wire`: JSON-RPC lines in and out;
//! - `methods`: what each ACP method does with the harness;
//! - `attachment`: one attached session's stream, prompts and interactions;
//! - `updates`: log entries read as `session/update`s;
//! - `interactions`: permission and elicitation requests forwarded and answered;
//! - `errors`: JSON-RPC errors, with the harness's reason code in `data`.

mod attachment;
mod errors;
mod interactions;
mod methods;
mod updates;
mod wire;

use std::sync::Arc;

use clap::Args;
use tokio::io::BufReader;

use super::{Outcome, ServerArgs};
use wire::{Incoming, Line};

pub(crate) const ACP_HELP: &str =
    "Speaks ACP (JSON-RPC 2.0, one message per line) on stdin/stdout as an agent, and drives
harness sessions over gRPC. An ACP client starts it as its agent command; each ACP session is
a harness session, so it keeps its durable log and queue, survives the client going away, and
may have other clients (ACP, the CLI, the console) attached at the same time.

  initialize            capabilities, and agentInfo naming the harness and the agent behind it
  session/new           a new harness session (profile from --profile, or
                        _meta {\"agent-harness\": {\"profile\": NAME}}; the client's cwd)
  session/load          attach to a harness session by id, its transcript replayed first
  session/resume        attach without replay
  session/prompt        a prompt (queued behind a running turn); answered when its turn ends
  session/cancel        this client's queued prompts leave the queue; its running turn stops
  session/set_config_option, session/set_mode, session/list, session/close

Permission and elicitation requests are forwarded to the client; one answered elsewhere first
(another client, `agent-harness answer`, the console) is withdrawn with $/cancel_request.

Examples:
  acpx --agent 'agent-harness acp --profile mock' exec 'hello'
  # Zed, settings.json:
  #   \"agent_servers\": {\"harness\": {\"command\": \"agent-harness\",
  #                                 \"args\": [\"acp\", \"--profile\", \"claude\"]}}

Server: --server or AGENT_HARNESS_SERVER (default http://127.0.0.1:50051).
TLS:    --ca-file, --cert/--key as for the other subcommands.
Token:  AGENT_HARNESS_TOKEN (sent as `authorization: Bearer <token>`).
Lines:  at most --max-line-bytes (16 MiB); a longer one, or one that is not UTF-8, is answered
        with a JSON-RPC error and skipped.
Exit:   0 when the client closes stdin; turns still running go on in the harness.";

#[derive(Args, Clone)]
pub struct AcpArgs {
    /// The runtime profile of sessions made by `session/new`.
    #[arg(long)]
    profile: Option<String>,
    /// Pin this process to one existing harness session: `session/new` attaches to it (its
    /// history replayed) instead of creating one.
    #[arg(long, value_name = "ID")]
    session: Option<String>,
    /// The longest line taken from the client, in bytes; a longer one is answered with an
    /// error and skipped (never held whole).
    #[arg(long, value_name = "BYTES", default_value_t = wire::DEFAULT_MAX_LINE_BYTES,
          value_parser = clap::value_parser!(usize))]
    max_line_bytes: usize,
    #[command(flatten)]
    server: ServerArgs,
}

/// Serves ACP on stdin/stdout until stdin ends.
pub(crate) async fn run(args: AcpArgs) -> Outcome {
    let (outbox, writer) = wire::Outbox::new(tokio::io::stdout());
    tokio::spawn(writer);
    let max_line = args.max_line_bytes.max(1);
    let bridge = Arc::new(methods::Bridge::new(args, outbox.clone()));
    let mut lines = wire::LineReader::new(BufReader::new(tokio::io::stdin()), max_line);
    loop {
        let line = match lines.next().await {
            Ok(Line::Text(line)) => line,
            Ok(Line::End) => break,
            // A line that is no message is answered, and serving goes on.
            Ok(refused @ (Line::NotUtf8 | Line::TooLong { .. })) => {
                if let Some(error) = wire::refused_line(&refused, max_line) {
                    eprintln!("agent-harness acp: stdin: {}", error.message);
                    outbox.fail(serde_json::Value::Null, error);
                }
                continue;
            }
            Err(error) => {
                eprintln!("agent-harness acp: stdin: {error}");
                break;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        match wire::parse(&line) {
            Err(refused) => outbox.fail(refused.id, refused.error),
            Ok(Incoming::Response { id, outcome }) => outbox.answered(&id, outcome),
            Ok(Incoming::Request { id, method, params }) => {
                let bridge = bridge.clone();
                tokio::spawn(async move {
                    let outcome = bridge.request(&method, params).await;
                    if let Err(error) = &outcome {
                        eprintln!("agent-harness acp: {method}: {}", error.message);
                    }
                    bridge.outbox.answer(id, outcome);
                });
            }
            Ok(Incoming::Notification { method, params }) => {
                let bridge = bridge.clone();
                tokio::spawn(async move { bridge.notification(&method, params).await });
            }
        }
    }
    Ok(0)
}
