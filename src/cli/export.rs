//! `agent-harness export`: a session's metadata and whole transcript, for an audit or a bug
//! report, as JSON (the v1 messages in the proto3 JSON mapping, so any client's generated types
//! read it back) or as Markdown for a person.

use std::{io::Write, path::PathBuf};

use clap::{Args, ValueEnum};
use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};
use serde_json::{Value, json};

use super::{Failure, Outcome, ServerArgs, json::enum_name};
use crate::pb::{self, v1 as v1pb};

/// The `format` field of the JSON form; a later incompatible layout gets a new one.
pub(crate) const JSON_FORMAT: &str = "agent-harness.export.v1";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Json,
    Markdown,
}

#[derive(Args)]
pub struct ExportArgs {
    /// The session id.
    session: String,
    /// json (the v1 messages, for programs) or markdown (for people).
    #[arg(long, value_enum, default_value_t = Format::Json)]
    format: Format,
    /// Write here instead of stdout (replaced if it exists).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    #[command(flatten)]
    server: ServerArgs,
}

/// A session and its whole transcript, as the server gave them.
pub(crate) struct Export {
    pub session: v1pb::AgentSession,
    pub transcript: v1pb::GetTranscriptResponse,
}

pub(crate) async fn run(args: ExportArgs) -> Outcome {
    let mut client = args.server.connect().await?;
    let session = client
        .get_session(v1pb::GetSessionRequest {
            session_id: args.session.clone(),
        })
        .await?
        .into_inner()
        .session
        .unwrap_or_default();
    let mut transcript = v1pb::GetTranscriptResponse::default();
    let mut page_token = String::new();
    loop {
        let page = client
            .get_transcript(v1pb::GetTranscriptRequest {
                session_id: args.session.clone(),
                page_size: 500,
                page_token: page_token.clone(),
            })
            .await?
            .into_inner();
        transcript.messages.extend(page.messages);
        transcript.metadata = page.metadata;
        transcript.head_offset = page.head_offset;
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    let export = Export {
        session,
        transcript,
    };
    let text = match args.format {
        Format::Json => {
            let mut text = serde_json::to_string_pretty(&to_json(&export)?)
                .map_err(|e| Failure::new(1, format!("cannot write JSON: {e}")))?;
            text.push('\n');
            text
        }
        Format::Markdown => markdown(&export),
    };
    match &args.out {
        Some(path) => write_private(path, text.as_bytes())
            .map_err(|e| Failure::new(1, format!("cannot write {}: {e}", path.display())))?,
        None => {
            let mut out = std::io::stdout().lock();
            // A reader that went away (`| head`) is no failure of ours.
            let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
        }
    }
    Ok(0)
}

/// Writes `bytes` to `path` (replaced if it exists), readable by its owner only whatever the
/// umask: an export holds a whole transcript.
fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(bytes)?;
    file.flush()
}

/// The JSON form: each part in the proto3 JSON mapping of its v1 message.
pub(crate) fn to_json(export: &Export) -> Result<Value, Failure> {
    Ok(json!({
        "format": JSON_FORMAT,
        "session": message_json(&export.session, "agent_harness.v1.AgentSession")?,
        "transcript": message_json(&export.transcript, "agent_harness.v1.GetTranscriptResponse")?,
    }))
}

/// A generated message in the proto3 JSON mapping, through the contract's descriptors.
fn message_json(message: &impl prost::Message, name: &str) -> Result<Value, Failure> {
    let failed = |e: &dyn std::fmt::Display| Failure::new(1, format!("cannot export {name}: {e}"));
    let pool = DescriptorPool::decode(pb::FILE_DESCRIPTOR_SET).map_err(|e| failed(&e))?;
    let descriptor = pool
        .get_message_by_name(name)
        .ok_or_else(|| failed(&"not in the contract"))?;
    let dynamic = DynamicMessage::decode(descriptor, message.encode_to_vec().as_slice())
        .map_err(|e| failed(&e))?;
    dynamic
        .serialize_with_options(
            serde_json::value::Serializer,
            &SerializeOptions::new().stringify_64_bit_integers(true),
        )
        .map_err(|e| failed(&e))
}

fn timestamp(ts: &Option<prost_types::Timestamp>) -> String {
    ts.as_ref()
        .map_or_else(|| "—".to_owned(), |ts| ts.to_string())
}

// Everything an agent (or a caller) wrote is foreign to the page: Markdown or HTML in it must
// not become the page's own structure — a forged `### User — admin` turn, a live
// `<img onerror=…>`. Multi-line text is fenced (shown exactly as written); text inside a line
// of ours is escaped, or put in a code span.

/// Foreign text inside a line of the page: one line, HTML and Markdown punctuation escaped, so
/// it reads as the characters it holds and never as markup.
fn inline(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' | '\r' => out.push(' '),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\\' | '`' | '*' | '_' | '[' | ']' | '#' | '|' | '~' | '!' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// Foreign text as a code span: one line, no backtick to end it early.
fn code(text: &str) -> String {
    format!("`{}`", text.replace('`', "'").replace(['\n', '\r'], " "))
}

/// A value for a table cell (one line, pipes escaped, like any inline text).
fn cell(text: &str) -> String {
    inline(text)
}

/// Text shown exactly as written, in a fence longer than any run of backticks inside it.
fn fenced(text: &str) -> String {
    fenced_as(text, "text")
}

/// [`fenced`], its fence labelled `info` (the language a reader may highlight it as).
fn fenced_as(text: &str, info: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    format!(
        "{fence}{info}\n{}\n{fence}\n\n",
        text.trim_end_matches('\n')
    )
}

/// JSON from the contract, pretty in a fenced block, cut at about `max` characters.
fn json_block(text: &str, max: usize) -> String {
    let pretty = serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| text.to_owned());
    let shown: String = pretty.chars().take(max).collect();
    let cut = if shown.len() < pretty.len() {
        "\n… (cut; the JSON export has it whole)"
    } else {
        ""
    };
    let block = fenced_as(&format!("{shown}{cut}"), "json");
    block.trim_end_matches('\n').to_owned() + "\n"
}

/// An attachment as a link when its URI is a web address, else as code.
fn link(name: &str, uri: &str) -> String {
    let web = uri.starts_with("https://") || uri.starts_with("http://");
    if web && !uri.contains(|c: char| c.is_whitespace() || c.is_control() || c == '<' || c == '>') {
        // Parentheses would end the destination early.
        let uri = uri.replace('(', "%28").replace(')', "%29");
        format!("[{}]({uri})", inline(name))
    } else {
        format!("{} {}", inline(name), code(uri))
    }
}

/// The Markdown form: a header of metadata, then each turn's messages in order.
pub(crate) fn markdown(export: &Export) -> String {
    let s = &export.session;
    let mut md = String::new();
    let title = if s.name.is_empty() { &s.id } else { &s.name };
    md.push_str(&format!("# Session transcript: {}\n\n", cell(title)));
    md.push_str("| | |\n|---|---|\n");
    let status = enum_name(s.status().as_str_name(), "SESSION_STATUS_");
    let status = if s.status_reason.is_empty() || s.status_reason == status {
        status
    } else {
        format!("{status} ({})", s.status_reason)
    };
    let labels = s
        .labels
        .iter()
        .map(|(k, v)| code(&format!("{k}={v}")))
        .collect::<Vec<_>>()
        .join(", ");
    let agent = s
        .agent_info
        .as_ref()
        .map(|a| format!("{} {}", a.name, a.version))
        .unwrap_or_default();
    for (key, value) in [
        ("Session", code(&s.id)),
        ("Name", s.name.clone()),
        ("Owner", s.owner.clone()),
        ("Editors", s.editors.join(", ")),
        ("Profile", s.profile.clone()),
        ("Agent", agent),
        ("Model", s.model.clone()),
        ("Working directory", code(&s.cwd)),
        ("Status", status),
        ("Created", timestamp(&s.created_at)),
        ("Last change", timestamp(&s.updated_at)),
        ("Labels", labels),
        ("Log offset", export.transcript.head_offset.to_string()),
    ] {
        if !value.is_empty() {
            // Values already made safe (code spans) are kept as they are.
            let shown = if value.starts_with('`') && value.ends_with('`') {
                value.replace('|', "\\|")
            } else {
                cell(&value)
            };
            md.push_str(&format!("| {key} | {shown} |\n"));
        }
    }
    md.push('\n');
    if export.transcript.messages.is_empty() {
        md.push_str("_No turns yet._\n");
    }
    let mut turn = None;
    for message in &export.transcript.messages {
        if turn != Some(message.turn) {
            turn = Some(message.turn);
            md.push_str(&format!("## Turn {}\n\n", message.turn));
        }
        message_markdown(&mut md, message);
    }
    md
}

fn message_markdown(md: &mut String, message: &v1pb::TranscriptMessage) {
    let who = match message.role() {
        v1pb::MessageRole::User => "User",
        v1pb::MessageRole::Agent => "Agent",
        v1pb::MessageRole::Unspecified => "Message",
    };
    let user = message.role() == v1pb::MessageRole::User;
    let mut heading = format!("### {who}");
    if user && !message.actor.is_empty() {
        heading.push_str(&format!(" — {}", inline(&message.actor)));
    }
    if message.inherited {
        heading.push_str(" (from the parent session)");
    }
    md.push_str(&heading);
    md.push_str("\n\n");
    let mut attachments = Vec::new();
    for part in &message.parts {
        use v1pb::message_part::Kind;
        match &part.kind {
            // A person's prompt as typed, line for line; an agent's text as its Markdown
            // source, fenced: rendered, it could forge a turn heading or carry live HTML.
            Some(Kind::Text(text)) if user => md.push_str(&fenced(&text.text)),
            Some(Kind::Text(text)) => md.push_str(&fenced_as(&text.text, "markdown")),
            Some(Kind::Thought(text)) => {
                md.push_str("_Thinking:_\n\n");
                md.push_str(&fenced_as(&text.text, "markdown"));
            }
            Some(Kind::Attachment(a)) => attachments.push(a),
            Some(Kind::Tool(tool)) => {
                let title = if tool.title.is_empty() {
                    &tool.tool_call_id
                } else {
                    &tool.title
                };
                md.push_str(&format!("**Tool call** {}", code(title)));
                if !tool.kind.is_empty() {
                    md.push_str(&format!(" ({})", inline(&tool.kind)));
                }
                let status = if tool.status.is_empty() {
                    "pending"
                } else {
                    &tool.status
                };
                md.push_str(&format!(" — **{}**\n\n", inline(status)));
                if !tool.content_json.is_empty() && tool.content_json != "[]" {
                    md.push_str(&json_block(&tool.content_json, 2000));
                    md.push('\n');
                }
            }
            Some(Kind::Plan(plan)) => {
                md.push_str("**Plan**\n\n");
                for entry in &plan.entries {
                    let mark = if entry.status == "completed" {
                        "x"
                    } else {
                        " "
                    };
                    md.push_str(&format!(
                        "- [{mark}] {} ({})\n",
                        inline(&entry.content),
                        inline(&entry.status)
                    ));
                }
                md.push('\n');
            }
            Some(Kind::Permission(p)) => {
                let tool = serde_json::from_str::<Value>(&p.tool_call_json)
                    .ok()
                    .and_then(|v| v.get("title").and_then(Value::as_str).map(str::to_owned))
                    .unwrap_or_else(|| "a tool call".to_owned());
                let options = p
                    .options
                    .iter()
                    .map(|o| format!("{} ({})", code(&o.option_id), inline(&o.name)))
                    .collect::<Vec<_>>()
                    .join(", ");
                let outcome = enum_name(p.outcome().as_str_name(), "INTERACTION_OUTCOME_");
                let answer = match &p.selected_option_id {
                    Some(option) => format!("{outcome}: {}", code(option)),
                    None => outcome,
                };
                md.push_str(&format!(
                    "**Permission asked** for {}; options {options} — answer: **{answer}**\n\n",
                    inline(&tool)
                ));
            }
            Some(Kind::Elicitation(e)) => {
                let outcome = enum_name(e.outcome().as_str_name(), "INTERACTION_OUTCOME_");
                md.push_str(&format!(
                    "**Question** {} — answer: **{outcome}**",
                    inline(&e.message)
                ));
                if !e.answer_json.is_empty() {
                    md.push_str(&format!(" {}", code(&e.answer_json)));
                }
                md.push_str("\n\n");
            }
            Some(Kind::Control(c)) => {
                let kind = enum_name(c.kind().as_str_name(), "CONTROL_KIND_");
                let outcome = enum_name(c.outcome().as_str_name(), "INTERACTION_OUTCOME_");
                let value = if c.value.is_empty() {
                    String::new()
                } else {
                    format!(" {}", code(&c.value))
                };
                md.push_str(&format!("_Control:_ {kind}{value} — {outcome}\n\n"));
            }
            Some(Kind::Content(c)) => {
                md.push_str(&format!("_Content ({}):_\n\n", inline(&c.r#type)));
                md.push_str(&json_block(&c.json, 2000));
                md.push('\n');
            }
            Some(Kind::ContextRebuilt(c)) => {
                md.push_str(&format!(
                    "_Context rebuilt ({}): {} turns, {} bytes replayed._\n\n",
                    inline(&c.reason),
                    c.turns,
                    c.bytes
                ));
            }
            None => {}
        }
    }
    if !attachments.is_empty() {
        md.push_str("Attachments:\n\n");
        for a in attachments {
            let mut line = format!("- {}", link(&a.name, &a.uri));
            let mut about = Vec::new();
            if let Some(mime) = &a.mime_type {
                about.push(inline(mime));
            }
            if let Some(size) = a.size {
                about.push(format!("{size} bytes"));
            }
            if !about.is_empty() {
                line.push_str(&format!(" ({})", about.join(", ")));
            }
            md.push_str(&line);
            md.push('\n');
        }
        md.push('\n');
    }
    if let Some(reason) = message.stop_reason {
        let reason = v1pb::StopReason::try_from(reason)
            .map(|r| enum_name(r.as_str_name(), "STOP_REASON_"))
            .unwrap_or_else(|_| reason.to_string());
        md.push_str(&format!("_Turn ended: {reason}._\n\n"));
    }
    if let Some(error) = &message.error {
        md.push_str(&format!("_Error:_ {}\n\n", inline(error)));
    }
}
