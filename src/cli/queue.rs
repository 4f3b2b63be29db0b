//! `stop` and `queue`: ending the running turn, and the prompts waiting behind it.

use clap::{Args, Subcommand};

use super::{Outcome, ServerArgs, json};
use crate::pb::v1::{self as pb, control_request::Action};

#[derive(Args)]
pub struct StopArgs {
    /// The session id.
    session: String,
    /// Also drop every queued prompt (otherwise the next one starts when the turn ends).
    #[arg(long)]
    clear_queue: bool,
    /// One JSON object.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    server: ServerArgs,
}

#[derive(Args)]
pub struct QueueArgs {
    /// The session id.
    session: String,
    #[command(subcommand)]
    action: Option<QueueAction>,
    /// One JSON object per line (per queued action; or the edit's or removal's outcome).
    #[arg(long, global = true)]
    json: bool,
    #[command(flatten)]
    server: ServerArgs,
}

#[derive(Subcommand)]
enum QueueAction {
    /// What waits, first to run first (the default).
    List,
    /// Replace a queued prompt's text (it keeps its place and attachments).
    Edit {
        /// The queued action's id (as `list` shows it).
        action_id: String,
        /// The new text.
        text: String,
    },
    /// Remove a queued prompt or compact before it runs.
    Rm {
        /// The queued action's id (as `list` shows it).
        action_id: String,
    },
}

pub(crate) async fn stop(args: StopArgs) -> Outcome {
    let mut client = args.server.connect().await?;
    let response = client
        .control(pb::ControlRequest {
            session_id: args.session.clone(),
            action: Some(Action::Stop(pb::StopAction {
                clear_queue: args.clear_queue,
            })),
            ..Default::default()
        })
        .await?
        .into_inner();
    if args.json {
        outln!("{}", json::control(&response));
    } else if args.clear_queue {
        outln!("stop sent to {} (queue cleared)", args.session);
    } else {
        outln!("stop sent to {}", args.session);
    }
    Ok(0)
}

pub(crate) async fn queue(args: QueueArgs) -> Outcome {
    let mut client = args.server.connect().await?;
    let session = args.session;
    let json = args.json;
    match args.action.unwrap_or(QueueAction::List) {
        QueueAction::List => {
            let entries = client
                .get_queue(pb::GetQueueRequest {
                    session_id: session.clone(),
                })
                .await?
                .into_inner()
                .entries;
            if json {
                for entry in &entries {
                    outln!("{}", queued_json(entry));
                }
            } else if entries.is_empty() {
                outln!("nothing is queued in {session}");
            } else {
                for (n, entry) in entries.iter().enumerate() {
                    outln!("{}", queued_line(n + 1, entry));
                }
            }
        }
        QueueAction::Edit { action_id, text } => {
            client
                .edit_queued_prompt(pb::EditQueuedPromptRequest {
                    session_id: session,
                    action_id: action_id.clone(),
                    prompt: text,
                })
                .await?;
            if json {
                outln!("{}", serde_json::json!({"edited": action_id}));
            } else {
                outln!("edited {action_id}");
            }
        }
        QueueAction::Rm { action_id } => {
            client
                .remove_queued_action(pb::RemoveQueuedActionRequest {
                    session_id: session,
                    action_id: action_id.clone(),
                })
                .await?;
            if json {
                outln!("{}", serde_json::json!({"removed": action_id}));
            } else {
                outln!("removed {action_id}");
            }
        }
    }
    Ok(0)
}

fn kind_name(entry: &pb::QueuedAction) -> String {
    json::enum_name(entry.kind().as_str_name(), "QUEUED_ACTION_KIND_")
}

fn queued_line(position: usize, entry: &pb::QueuedAction) -> String {
    let text = entry.prompt.as_deref().unwrap_or_default();
    let first_line = text.lines().next().unwrap_or_default();
    let more = if text.lines().count() > 1 { " …" } else { "" };
    format!(
        "{position}. {}  {}  {first_line}{more}  (by {})",
        entry.action_id,
        kind_name(entry),
        entry.actor
    )
}

fn queued_json(entry: &pb::QueuedAction) -> serde_json::Value {
    serde_json::json!({
        "action_id": entry.action_id,
        "kind": kind_name(entry),
        "prompt": entry.prompt,
        "attachments": entry.attachments.iter().map(|a| serde_json::json!({"name": a.name, "uri": a.uri})).collect::<Vec<_>>(),
        "actor": entry.actor,
    })
}
