//! The subcommands for people at a terminal: `sessions`, `prompt`, `follow`, `answer`,
//! `stop`, `queue`, `log` and `export`, and `acp` for ACP clients. They are a gRPC *client* of the service: they speak only the generated `pb` types
//! over a tonic channel, exactly as any other caller would, and never reach into the engine.

#[macro_use]
mod output;
mod acp;
mod connect;
mod export;
mod follow;
mod json;
mod question;
mod queue;
mod render;
mod usage;

use std::io::IsTerminal;

use clap::{Args, Subcommand};
use tonic::{Code, Status};
use tonic_types::StatusExt;

use crate::pb::v1 as pb;

pub use connect::ServerArgs;
pub(crate) use connect::{cleartext_token_warning, redacted_url};

/// Exit codes, documented in `--help` so scripts can branch on them.
pub(crate) mod exit {
    /// The request was refused as malformed (INVALID_ARGUMENT, OUT_OF_RANGE) or clap refused the
    /// command line.
    pub const USAGE: u8 = 2;
    /// The server could not be reached, or is draining (UNAVAILABLE).
    pub const UNAVAILABLE: u8 = 3;
    /// No or bad token (UNAUTHENTICATED), or the act is forbidden (PERMISSION_DENIED).
    pub const AUTH: u8 = 4;
    /// The session, queued action or profile does not exist (NOT_FOUND).
    pub const NOT_FOUND: u8 = 5;
    /// The session is in the wrong state for this (FAILED_PRECONDITION, ALREADY_EXISTS,
    /// RESOURCE_EXHAUSTED).
    pub const REFUSED: u8 = 6;
    /// A followed turn ended with a stop reason other than `end_turn`.
    pub const TURN_NOT_ENDED_WELL: u8 = 7;
    /// The TLS handshake failed: the server's certificate is not trusted (or not for that
    /// name), or the server refused ours.
    pub const TLS: u8 = 8;
    /// Ctrl-C left `prompt --follow`; the turn goes on.
    pub const INTERRUPTED: u8 = 130;
}

/// The exit codes and where the server and token come from, ending every subcommand's help.
macro_rules! exit_codes {
    () => {
        "
Exit codes:
  0  done (for --follow: the turn ended with end_turn)
  1  any other failure
  2  bad command line or request (INVALID_ARGUMENT, OUT_OF_RANGE)
  3  server unreachable or draining (UNAVAILABLE)
  4  no or wrong token, or forbidden (UNAUTHENTICATED, PERMISSION_DENIED)
  5  not found (SESSION_NOT_FOUND, PROFILE_NOT_FOUND, ...)
  6  refused in this state (SESSION_CLOSED, QUEUE_FULL, PERMISSION_NOT_PENDING, ...)
  7  the followed turn ended otherwise (cancelled, refusal, max_tokens, failed)
  8  TLS failed: the server's certificate is not trusted, or the server refused ours
  130  Ctrl-C left `prompt --follow`; the turn goes on (`agent-harness stop` stops it)

Server: --server or AGENT_HARNESS_SERVER (default http://127.0.0.1:50051).
TLS:    an https:// server is trusted by the system's roots and --ca-file (AGENT_HARNESS_CA_FILE);
        --cert/--key (AGENT_HARNESS_CERT/AGENT_HARNESS_KEY) answer a server asking for mutual TLS.
Token:  AGENT_HARNESS_TOKEN (sent as `authorization: Bearer <token>`).
Guide:  docs/cli.md"
    };
}

const SESSIONS_HELP: &str = concat!(
    "Examples:
  id=$(agent-harness sessions create --profile mock --cwd \"$PWD\")
  agent-harness sessions list --status running
  agent-harness sessions show \"$id\" --json
  agent-harness sessions close \"$id\"
  agent-harness sessions list --server https://harness.example:50051 --ca-file ca.pem
",
    exit_codes!()
);

const PROMPT_HELP: &str = concat!(
    "Examples:
  id=$(agent-harness sessions create --profile mock --cwd \"$PWD\")
  agent-harness prompt \"$id\" 'explain src/main.rs' --follow
  agent-harness prompt \"$id\" 'look at this' --attach https://files.example/a.png --follow
  agent-harness prompt \"$id\" 'stop that, do this instead' --interrupt
  agent-harness prompt \"$id\" 'hello' --follow --json | jq -c 'select(.type == \"turn_ended\")'

Ctrl-C during --follow leaves the turn running and says so; `agent-harness stop \"$id\"` stops it.
",
    exit_codes!()
);

const FOLLOW_HELP: &str = concat!(
    "Examples:
  agent-harness follow \"$id\"                # from the start, then live; Ctrl-C to leave
  agent-harness follow \"$id\" --after 120    # resume after offset 120
  agent-harness follow \"$id\" --tail 3       # the last 3 messages, then live
  agent-harness follow \"$id\" --from-now     # only what happens from now on
  agent-harness follow \"$id\" --json         # one JSON object per event, for scripts

On a terminal, a permission or elicitation request asks you for the answer in place
(--no-interactive only shows it); a request answered elsewhere meanwhile (another client,
the console) is dropped from the terminal and the transcript goes on. The stream reconnects
and resumes by itself when the server restarts, and says so.
",
    exit_codes!()
);

const ANSWER_HELP: &str = concat!(
    "Examples:
  agent-harness answer \"$id\"                          # pick from what is pending (terminal)
  agent-harness answer \"$id\" 3 --option allow-once    # permission request 3
  agent-harness answer \"$id\" 3 --cancel               # dismiss it
  agent-harness answer \"$id\" 4 --accept name=Ada      # elicitation 4: accept with content
  agent-harness answer \"$id\" 4 --decline
",
    exit_codes!()
);

const STOP_HELP: &str = concat!(
    "Examples:
  agent-harness stop \"$id\"                 # cancel the running turn; queued prompts still run
  agent-harness stop \"$id\" --clear-queue   # cancel it and drop what is queued
",
    exit_codes!()
);

const QUEUE_HELP: &str = concat!(
    "Examples:
  agent-harness queue \"$id\"                         # what waits behind the running turn
  agent-harness queue \"$id\" list --json
  agent-harness queue \"$id\" edit \"$action\" 'new text'  # a queued prompt's text
  agent-harness queue \"$id\" rm \"$action\"               # remove it before it runs
",
    exit_codes!()
);

const USAGE_HELP: &str = concat!(
    "Examples:
  agent-harness usage                       # your own (for `local`: everyone's)
  agent-harness usage --since 24h           # the last day
  agent-harness usage --principal ada --sessions
  agent-harness usage --json | jq .budget

Sources: `agent` (what agents reported), `model_proxy` (what the model proxy read from the
provider's answers; see docs/model-proxy.md).
",
    exit_codes!()
);

const LOG_HELP: &str = concat!(
    "Examples:
  agent-harness log \"$id\"                 # every entry
  agent-harness log \"$id\" --after 40      # entries after offset 40
  agent-harness log \"$id\" --json | jq .   # one JSON object per entry
",
    exit_codes!()
);

const EXPORT_HELP: &str = concat!(
    "Examples:
  agent-harness export \"$id\" > session.json
  agent-harness export \"$id\" --format markdown --out session.md

JSON: {\"format\": \"agent-harness.export.v1\", \"session\": AgentSession, \"transcript\":
GetTranscriptResponse}, each in the proto3 JSON mapping, so any client's generated types read them
back: transcript.messages holds every turn's messages, oldest first.
",
    exit_codes!()
);

/// The people's subcommands, flattened into `agent-harness`'s own.
#[derive(Subcommand)]
pub enum Command {
    /// List, create, show, close and delete sessions.
    #[command(after_help = SESSIONS_HELP)]
    Sessions(SessionsArgs),
    /// Send a prompt to a session (queued behind a running turn unless --interrupt).
    #[command(after_help = PROMPT_HELP)]
    Prompt(PromptArgs),
    /// Show a session's transcript live: agent text as it streams, tool calls, plans, and on a
    /// terminal, interactive answers to permission and elicitation requests.
    #[command(after_help = FOLLOW_HELP)]
    Follow(FollowArgs),
    /// Answer a permission or elicitation request the agent is waiting on.
    #[command(after_help = ANSWER_HELP)]
    Answer(AnswerArgs),
    /// Stop the running turn (the agent is asked to cancel it); the queue keeps draining unless
    /// --clear-queue.
    #[command(after_help = STOP_HELP)]
    Stop(queue::StopArgs),
    /// List, edit and remove the prompts waiting behind a running turn.
    #[command(after_help = QUEUE_HELP)]
    Queue(queue::QueueArgs),
    /// Print a session's raw log (the ACP frames and harness events), oldest first.
    #[command(after_help = LOG_HELP)]
    Log(LogArgs),
    /// Be an ACP agent on stdin/stdout for an ACP client (an editor, acpx), backed by harness
    /// sessions: their durable log, queue, policy and other attached clients.
    #[command(after_help = acp::ACP_HELP)]
    Acp(acp::AcpArgs),
    /// Write a session's metadata and whole transcript as JSON (the v1 messages) or Markdown.
    #[command(after_help = EXPORT_HELP)]
    Export(export::ExportArgs),
    /// What sessions used (tokens, cost), per principal, profile and source, and your budget.
    #[command(after_help = USAGE_HELP)]
    Usage(usage::UsageArgs),
}

#[derive(Args)]
pub struct SessionsArgs {
    #[command(subcommand)]
    action: SessionsAction,
    #[command(flatten)]
    server: ServerArgs,
}

#[derive(Subcommand)]
enum SessionsAction {
    /// Sessions visible to you, newest first.
    List {
        /// Only sessions in these states (idle, running, awaiting-input, suspended, …).
        #[arg(long = "status", value_name = "STATUS")]
        statuses: Vec<String>,
        /// Only sessions with this label (KEY=VALUE; repeatable, ANDed).
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = key_value)]
        labels: Vec<(String, String)>,
        /// One JSON object per session.
        #[arg(long)]
        json: bool,
    },
    /// Start a session; prints its id.
    Create {
        /// The runtime profile (`mock` is built in).
        #[arg(long, default_value = "mock")]
        profile: String,
        /// The agent's working directory (absolute; default: the current directory).
        #[arg(long)]
        cwd: Option<std::path::PathBuf>,
        /// A model the runtime advertises.
        #[arg(long)]
        model: Option<String>,
        /// A display name.
        #[arg(long)]
        name: Option<String>,
        /// A label (KEY=VALUE; repeatable).
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = key_value)]
        labels: Vec<(String, String)>,
        /// Print the whole session as JSON.
        #[arg(long)]
        json: bool,
    },
    /// One session's details.
    Show {
        session: String,
        #[arg(long)]
        json: bool,
    },
    /// Stop the runtime; the transcript stays readable.
    Close {
        session: String,
        #[arg(long)]
        json: bool,
    },
    /// Stop the runtime and delete everything.
    Delete { session: String },
}

#[derive(Args)]
pub struct PromptArgs {
    /// The session id.
    session: String,
    /// The prompt text; `-` reads it from stdin.
    text: String,
    /// A file the agent may fetch (repeatable).
    #[arg(long = "attach", value_name = "URI")]
    attachments: Vec<String>,
    /// Cancel the running turn and run this prompt next.
    #[arg(long)]
    interrupt: bool,
    /// Stream the turn and exit when it ends (with the stop reason's exit code).
    #[arg(long)]
    follow: bool,
    /// With --follow: do not ask for permission/elicitation answers on the terminal.
    #[arg(long)]
    no_interactive: bool,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    server: ServerArgs,
}

#[derive(Args)]
pub struct FollowArgs {
    /// The session id.
    session: String,
    /// Start after this log offset (0 = from the beginning).
    #[arg(long, default_value_t = 0, conflicts_with_all = ["tail", "from_now"])]
    after: u64,
    /// Start with the last N messages of the transcript, then live.
    #[arg(long, value_name = "N", conflicts_with = "from_now")]
    tail: Option<usize>,
    /// Show only what happens from now on.
    #[arg(long)]
    from_now: bool,
    /// Do not ask for permission/elicitation answers on the terminal.
    #[arg(long)]
    no_interactive: bool,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    server: ServerArgs,
}

#[derive(Args)]
pub struct AnswerArgs {
    /// The session id.
    session: String,
    /// The agent's request id (as `follow` shows it). Without it, you pick on the terminal.
    request_id: Option<String>,
    /// Permission: the option id to select (e.g. allow-once).
    #[arg(long, conflicts_with_all = ["accept", "decline"])]
    option: Option<String>,
    /// Elicitation: accept with these fields (KEY=VALUE; repeatable; values that parse as JSON
    /// numbers or booleans are sent as such).
    #[arg(long, value_name = "KEY=VALUE", value_parser = key_value)]
    accept: Vec<(String, String)>,
    /// Elicitation: decline.
    #[arg(long)]
    decline: bool,
    /// Dismiss the request (permission or elicitation) without an answer.
    #[arg(long, conflicts_with_all = ["option", "decline"])]
    cancel: bool,
    #[command(flatten)]
    server: ServerArgs,
}

#[derive(Args)]
pub struct LogArgs {
    /// The session id.
    session: String,
    /// Only entries after this offset.
    #[arg(long, default_value_t = 0)]
    after: u64,
    /// One JSON object per entry.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    server: ServerArgs,
}

fn key_value(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {text:?}"))
}

/// Why a command failed, and which exit code says so.
pub(crate) struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<Status> for Failure {
    fn from(status: Status) -> Self {
        // A status made here from a broken connection, not one the server sent: whatever
        // answered is no gRPC server (a web server, a proxy's redirect, plain HTTP/1).
        if matches!(status.code(), Code::Internal | Code::Unknown)
            && let Some(cause) = std::error::Error::source(&status)
        {
            return Self::new(
                exit::UNAVAILABLE,
                format!(
                    "{} does not answer as a gRPC server (over HTTP/2): {}; check --server",
                    connect::server_shown(),
                    connect::chain(cause)
                ),
            );
        }
        let code = match status.code() {
            Code::InvalidArgument | Code::OutOfRange => exit::USAGE,
            Code::Unavailable => exit::UNAVAILABLE,
            Code::Unauthenticated | Code::PermissionDenied => exit::AUTH,
            Code::NotFound => exit::NOT_FOUND,
            Code::FailedPrecondition | Code::AlreadyExists | Code::ResourceExhausted => {
                exit::REFUSED
            }
            _ => 1,
        };
        // The reason is the stable part a person can search for; the message says the rest.
        let reason = status
            .get_details_error_info()
            .map(|info| info.reason)
            .unwrap_or_else(|| format!("{:?}", status.code()));
        let hint = if status.code() != Code::Unauthenticated {
            ""
        } else if std::env::var_os("AGENT_HARNESS_TOKEN").is_some() {
            " (the token in AGENT_HARNESS_TOKEN was refused: check it is this server's)"
        } else {
            " (set AGENT_HARNESS_TOKEN to your token)"
        };
        Self::new(code, format!("{reason}: {}{hint}", status.message()))
    }
}

pub(crate) type Outcome = Result<u8, Failure>;

/// Runs one subcommand to its exit code, printing a failure to stderr.
pub fn main(command: Command) -> u8 {
    // SIGPIPE stays ignored: restoring its default would let a server that closes the
    // connection kill us mid-write with no word; `output` ends quietly when stdout's reader goes.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start: {error}");
            return 1;
        }
    };
    let outcome = runtime.block_on(run(command));
    match outcome {
        Ok(code) => code,
        Err(failure) => {
            render::clear_spinner();
            eprintln!("error: {}", failure.message);
            failure.code
        }
    }
}

async fn run(command: Command) -> Outcome {
    match command {
        Command::Sessions(args) => sessions(args).await,
        Command::Prompt(args) => prompt(args).await,
        Command::Follow(args) => {
            let mut client = args.server.connect().await?;
            let after = if args.from_now {
                let head = follow::head_offset(&mut client, &args.session).await?;
                if !args.json {
                    eprintln!(
                        "· following {} from now (after offset {head}); Ctrl-C to leave",
                        args.session
                    );
                }
                head
            } else if let Some(n) = args.tail {
                follow::offset_before_last_messages(&mut client, &args.session, n).await?
            } else {
                args.after
            };
            let options = follow::Options {
                json: args.json,
                interactive: !args.no_interactive && !args.json && std::io::stdin().is_terminal(),
                until_turn: None,
            };
            follow::run(&mut client, &args.session, after, options).await
        }
        Command::Answer(args) => answer(args).await,
        Command::Stop(args) => queue::stop(args).await,
        Command::Queue(args) => queue::queue(args).await,
        Command::Log(args) => log(args).await,
        Command::Acp(args) => acp::run(args).await,
        Command::Export(args) => export::run(args).await,
        Command::Usage(args) => usage::run(args).await,
    }
}

fn status_from_name(name: &str) -> Result<pb::SessionStatus, Failure> {
    let wanted = format!(
        "SESSION_STATUS_{}",
        name.trim().to_ascii_uppercase().replace('-', "_")
    );
    pb::SessionStatus::from_str_name(&wanted)
        .ok_or_else(|| Failure::new(exit::USAGE, format!("unknown status {name:?}")))
}

async fn sessions(args: SessionsArgs) -> Outcome {
    let mut client = args.server.connect().await?;
    match args.action {
        SessionsAction::List {
            statuses,
            labels,
            json,
        } => {
            let statuses = statuses
                .iter()
                .map(|name| status_from_name(name).map(|s| s as i32))
                .collect::<Result<Vec<_>, _>>()?;
            let mut page_token = String::new();
            let mut rows = Vec::new();
            loop {
                let page = client
                    .list_sessions(pb::ListSessionsRequest {
                        page_size: 100,
                        page_token: page_token.clone(),
                        statuses: statuses.clone(),
                        labels: labels.iter().cloned().collect(),
                    })
                    .await?
                    .into_inner();
                rows.extend(page.sessions);
                if page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
            if json {
                for session in &rows {
                    outln!("{}", json::session(session));
                }
            } else {
                render::sessions_table(&rows);
            }
        }
        SessionsAction::Create {
            profile,
            cwd,
            model,
            name,
            labels,
            json,
        } => {
            let cwd = match cwd {
                Some(cwd) => cwd,
                None => std::env::current_dir()
                    .map_err(|e| Failure::new(1, format!("no current directory: {e}")))?,
            };
            let created = client
                .create_session(pb::CreateSessionRequest {
                    profile,
                    cwd: cwd.to_string_lossy().into_owned(),
                    model,
                    name,
                    labels: labels.into_iter().collect(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            let session = created.session.unwrap_or_default();
            if json {
                outln!("{}", json::session(&session));
            } else {
                // Just the id, so `id=$(agent-harness sessions create)` works.
                outln!("{}", session.id);
            }
        }
        SessionsAction::Show { session, json } => {
            let session = client
                .get_session(pb::GetSessionRequest {
                    session_id: session,
                })
                .await?
                .into_inner()
                .session
                .unwrap_or_default();
            if json {
                outln!("{}", json::session(&session));
            } else {
                render::session_details(&session);
            }
        }
        SessionsAction::Close { session, json } => {
            let session = client
                .close_session(pb::CloseSessionRequest {
                    session_id: session,
                })
                .await?
                .into_inner()
                .session
                .unwrap_or_default();
            if json {
                outln!("{}", json::session(&session));
            } else {
                outln!("closed {}", session.id);
            }
        }
        SessionsAction::Delete { session } => {
            client
                .delete_session(pb::DeleteSessionRequest {
                    session_id: session.clone(),
                })
                .await?;
            outln!("deleted {session}");
        }
    }
    Ok(0)
}

async fn prompt(mut args: PromptArgs) -> Outcome {
    if args.text == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map_err(|e| {
            Failure::new(exit::USAGE, format!("reading the prompt from stdin: {e}"))
        })?;
        if text.trim().is_empty() {
            return Err(Failure::new(
                exit::USAGE,
                "the prompt read from stdin is empty: pipe the text in (`echo hello | agent-harness prompt ID -`)",
            ));
        }
        args.text = text;
    }
    let mut client = args.server.connect().await?;
    // Where the stream starts: the head before the prompt, so nothing of its turn is missed
    // and no earlier turn is replayed.
    let head = if args.follow {
        follow::head_offset(&mut client, &args.session).await?
    } else {
        0
    };
    let attachments = args
        .attachments
        .iter()
        .map(|uri| pb::PromptAttachment {
            name: attachment_name(uri),
            uri: uri.clone(),
            ..Default::default()
        })
        .collect();
    let delivery = if args.interrupt {
        pb::Delivery::Interrupt
    } else {
        pb::Delivery::Queue
    };
    let response = client
        .control(pb::ControlRequest {
            session_id: args.session.clone(),
            delivery: delivery as i32,
            action: Some(pb::control_request::Action::Prompt(pb::PromptAction {
                prompt: args.text,
                attachments,
            })),
            ..Default::default()
        })
        .await?
        .into_inner();
    if args.json {
        outln!("{}", json::control(&response));
    } else if !args.follow || response.status() == pb::ControlStatus::Queued {
        render::control(&response);
    }
    if !args.follow {
        return Ok(0);
    }
    let options = follow::Options {
        json: args.json,
        interactive: !args.no_interactive && !args.json && std::io::stdin().is_terminal(),
        until_turn: Some(response.action_id),
    };
    follow::run(&mut client, &args.session, head, options).await
}

/// The last path segment of a URI, as the attachment's display name.
pub(crate) fn attachment_name(uri: &str) -> String {
    let path = uri.split(['?', '#']).next().unwrap_or(uri);
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|name| !name.is_empty())
        .unwrap_or(uri)
        .to_owned()
}

async fn answer(args: AnswerArgs) -> Outcome {
    let mut client = args.server.connect().await?;
    let pending = follow::pending_interactions(&mut client, &args.session).await?;
    let interaction = match &args.request_id {
        Some(id) => pending
            .into_iter()
            .find(|p| render::request_id_text(p.request_id()) == *id)
            .ok_or_else(|| {
                Failure::new(
                    exit::REFUSED,
                    format!("no pending permission or elicitation with request id {id}"),
                )
            })?,
        None => {
            if pending.is_empty() {
                return Err(Failure::new(
                    exit::REFUSED,
                    "nothing is pending in this session",
                ));
            }
            if !std::io::stdin().is_terminal() {
                let waiting: Vec<String> = pending
                    .iter()
                    .map(|request| follow::answer_hint(&args.session, request))
                    .collect();
                return Err(Failure::new(
                    exit::USAGE,
                    format!(
                        "name the request id (stdin is not a terminal to choose on); waiting:\n{}",
                        waiting.join("\n")
                    ),
                ));
            }
            return follow::answer_on_terminal(&mut client, &args.session, &pending[0]).await;
        }
    };
    let chosen = if args.cancel {
        "cancelled".to_owned()
    } else if args.decline {
        "declined".to_owned()
    } else if let Some(option) = &args.option {
        option.clone()
    } else {
        "accepted".to_owned()
    };
    let action = follow::answer_action(
        &interaction,
        args.option,
        args.accept,
        args.decline,
        args.cancel,
    )?;
    client
        .control(pb::ControlRequest {
            session_id: args.session,
            action: Some(action),
            ..Default::default()
        })
        .await?;
    outln!(
        "answered {}: {chosen}",
        render::request_id_text(interaction.request_id())
    );
    Ok(0)
}

async fn log(args: LogArgs) -> Outcome {
    let mut client = args.server.connect().await?;
    let mut after = args.after;
    loop {
        let page = client
            .read_log(pb::ReadLogRequest {
                session_id: args.session.clone(),
                after_offset: after,
                limit: 500,
            })
            .await?
            .into_inner();
        for entry in &page.entries {
            if args.json {
                outln!("{}", json::log_entry(entry));
            } else {
                render::log_entry(entry);
            }
            after = entry.offset;
        }
        if page.entries.is_empty() || after >= page.head_offset {
            return Ok(0);
        }
    }
}
