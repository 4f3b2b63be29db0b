//! Text output for people: tables, the live transcript and the spinner. Colors and the spinner
//! appear only on a terminal; piped output is plain text.

use std::{
    collections::HashMap,
    io::{IsTerminal, Write},
    sync::atomic::Ordering,
};

use super::json::{outcome_name, status_name, stop_reason_name};
use crate::pb::v1::{self as pb, message_part::Kind};

const SPINNER: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

use super::output::SPINNER_SHOWN;
pub(crate) use super::output::clear_spinner;

/// ANSI styles, or nothing when stdout is not a terminal.
#[derive(Clone, Copy)]
pub(crate) struct Style {
    color: bool,
}

impl Style {
    pub(crate) fn detect() -> Self {
        Self {
            color: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        }
    }

    fn paint(self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }

    pub(crate) fn dim(self, text: &str) -> String {
        self.paint("2", text)
    }
    pub(crate) fn bold(self, text: &str) -> String {
        self.paint("1", text)
    }
    pub(crate) fn green(self, text: &str) -> String {
        self.paint("32", text)
    }
    pub(crate) fn yellow(self, text: &str) -> String {
        self.paint("33", text)
    }
    pub(crate) fn red(self, text: &str) -> String {
        self.paint("31", text)
    }
    pub(crate) fn cyan(self, text: &str) -> String {
        self.paint("36", text)
    }
}

pub(crate) fn request_id_text(id: Option<&pb::JsonRpcId>) -> String {
    match id.and_then(|id| id.id.as_ref()) {
        Some(pb::json_rpc_id::Id::Number(n)) => n.to_string(),
        Some(pb::json_rpc_id::Id::Text(t)) => t.clone(),
        None => "?".to_owned(),
    }
}

pub(crate) fn sessions_table(sessions: &[pb::AgentSession]) {
    let style = Style::detect();
    if sessions.is_empty() {
        outln!("{}", style.dim("no sessions"));
        return;
    }
    outln!(
        "{}",
        style.bold(&format!(
            "{:<36}  {:<14}  {:<10}  {:<20}  NAME",
            "ID", "STATUS", "PROFILE", "UPDATED"
        ))
    );
    for s in sessions {
        let updated = s
            .updated_at
            .as_ref()
            .map(|t| t.to_string().chars().take(19).collect::<String>())
            .unwrap_or_default();
        outln!(
            "{:<36}  {:<14}  {:<10}  {:<20}  {}",
            s.id,
            status_name(s.status()),
            s.profile,
            updated,
            s.name
        );
    }
}

pub(crate) fn session_details(s: &pb::AgentSession) {
    let style = Style::detect();
    let rows = [
        ("id", s.id.clone()),
        ("name", s.name.clone()),
        ("status", {
            let status = status_name(s.status());
            if s.status_reason.is_empty() {
                status
            } else {
                format!("{status} ({})", s.status_reason)
            }
        }),
        ("owner", s.owner.clone()),
        ("profile", s.profile.clone()),
        ("model", s.model.clone()),
        ("cwd", s.cwd.clone()),
        ("head offset", s.head_offset.to_string()),
        (
            "created",
            s.created_at
                .as_ref()
                .map(|t| t.to_string())
                .unwrap_or_default(),
        ),
        (
            "updated",
            s.updated_at
                .as_ref()
                .map(|t| t.to_string())
                .unwrap_or_default(),
        ),
    ];
    for (key, value) in rows {
        if !value.is_empty() {
            outln!("{:<12} {value}", style.dim(&format!("{key}:")));
        }
    }
    for (key, value) in &s.labels {
        outln!("{:<12} {key}={value}", style.dim("label:"));
    }
}

pub(crate) fn control(response: &pb::ControlResponse) {
    match response.status() {
        pb::ControlStatus::Queued => outln!(
            "queued {} (position {})",
            response.action_id,
            response.queue_position
        ),
        _ => outln!("sent {}", response.action_id),
    }
}

pub(crate) fn log_entry(entry: &pb::LogEntry) {
    let style = Style::detect();
    let direction = match entry.direction() {
        pb::LogDirection::ToRuntime => "→",
        pb::LogDirection::FromRuntime => "←",
        pb::LogDirection::Event => "•",
        pb::LogDirection::Unspecified => "?",
    };
    outln!(
        "{} {direction} {} {}",
        style.dim(&format!("{:>6}", entry.offset)),
        style.dim(&format!("[{}]", entry.actor)),
        entry.json
    );
}

/// What was already shown of one part of a message.
enum Shown {
    Text(usize),
    Tool(String),
    Plan(String),
    Interaction(i32),
    Control(i32),
    Once,
}

/// A request the agent is waiting on, found in a message snapshot.
#[derive(Clone)]
pub(crate) enum Pending {
    Permission(pb::PermissionPart),
    Elicitation(pb::ElicitationPart),
}

impl Pending {
    pub(crate) fn request_id(&self) -> Option<&pb::JsonRpcId> {
        match self {
            Pending::Permission(p) => p.request_id.as_ref(),
            Pending::Elicitation(e) => e.request_id.as_ref(),
        }
    }
}

/// The live transcript: each message snapshot prints only what is new since the last one, so
/// text streams in place and a tool shows one line per status.
pub(crate) struct Transcript {
    style: Style,
    spinner: bool,
    frame: usize,
    at_line_start: bool,
    shown: HashMap<String, Vec<Shown>>,
    errors: HashMap<String, String>,
    working: bool,
}

impl Transcript {
    pub(crate) fn new() -> Self {
        Self {
            style: Style::detect(),
            spinner: std::io::stderr().is_terminal(),
            frame: 0,
            at_line_start: true,
            shown: HashMap::new(),
            errors: HashMap::new(),
            working: false,
        }
    }

    /// Whether the spinner should turn (the agent is working and stderr is a terminal).
    pub(crate) fn spinning(&self) -> bool {
        self.spinner && self.working
    }

    pub(crate) fn set_working(&mut self, working: bool) {
        self.working = working;
        if !working {
            clear_spinner();
        }
    }

    /// Draws the next spinner frame after the text, on stderr.
    pub(crate) fn tick(&mut self) {
        if !self.spinning() {
            return;
        }
        let _ = std::io::stdout().flush();
        self.frame = (self.frame + 1) % SPINNER.len();
        let mut err = std::io::stderr();
        let gap = if self.at_line_start { "" } else { " " };
        // Save the cursor, draw, restore: the frame sits after the streamed text and the next
        // text overwrites it.
        let _ = write!(
            err,
            "\x1b7{gap}{}\x1b8",
            self.style.cyan(&SPINNER[self.frame].to_string())
        );
        let _ = err.flush();
        SPINNER_SHOWN.store(true, Ordering::Relaxed);
    }

    fn erase_spinner(&self) {
        if SPINNER_SHOWN.swap(false, Ordering::Relaxed) {
            let mut err = std::io::stderr();
            let _ = write!(err, "\x1b7\x1b[K\x1b8");
            let _ = err.flush();
        }
    }

    fn out(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.erase_spinner();
        super::output::write(text.as_bytes());
        self.at_line_start = text.ends_with('\n');
    }

    /// Shows a question (its last line waits for the answer on the same line).
    pub(crate) fn ask(&mut self, prompt: &str) {
        if !self.at_line_start {
            self.out("\n");
        }
        self.out(prompt);
    }

    /// The person typed a line: the terminal's echo of it ended the line.
    pub(crate) fn typed(&mut self) {
        self.at_line_start = true;
    }

    /// A line about the connection or the command itself, on stderr, never inside the agent's
    /// text.
    pub(crate) fn notice(&mut self, text: &str) {
        if !self.at_line_start {
            self.out("\n");
        }
        self.erase_spinner();
        eprintln!("{}", self.style.dim(text));
    }

    /// Prints a whole line, starting a new one first if text is mid-line.
    pub(crate) fn line(&mut self, text: &str) {
        if !self.at_line_start {
            self.out("\n");
        }
        self.out(&format!("{text}\n"));
    }

    /// Shows what is new in a message snapshot; returns the requests that became pending.
    pub(crate) fn message(&mut self, message: &pb::TranscriptMessage) -> Vec<Pending> {
        let style = self.style;
        let user = message.role() == pb::MessageRole::User;
        let mut shown = self.shown.remove(&message.id).unwrap_or_default();
        let mut pending = Vec::new();
        for (i, part) in message.parts.iter().enumerate() {
            let Some(kind) = &part.kind else { continue };
            let fresh = i >= shown.len();
            match kind {
                Kind::Text(t) | Kind::Thought(t) => {
                    let thought = matches!(kind, Kind::Thought(_));
                    let printed = match shown.get(i) {
                        Some(Shown::Text(n)) => *n,
                        _ => 0,
                    };
                    if t.text.len() > printed && t.text.is_char_boundary(printed) {
                        let new = &t.text[printed..];
                        if user {
                            self.line(&style.bold(&format!("› {}", t.text)));
                        } else if thought {
                            if fresh {
                                self.line(&style.dim("(thinking)"));
                            }
                            self.out(&style.dim(new));
                        } else {
                            if fresh && !self.at_line_start {
                                self.out("\n");
                            }
                            self.out(new);
                        }
                    }
                    set(&mut shown, i, Shown::Text(t.text.len()));
                }
                Kind::Attachment(a) => {
                    if fresh {
                        self.line(&style.dim(&format!("  attached {} <{}>", a.name, a.uri)));
                    }
                    set(&mut shown, i, Shown::Once);
                }
                Kind::Tool(t) => {
                    let changed = !matches!(shown.get(i), Some(Shown::Tool(s)) if *s == t.status);
                    if changed {
                        let status = match t.status.as_str() {
                            "completed" => style.green(&t.status),
                            "failed" => style.red(&t.status),
                            _ => style.yellow(&t.status),
                        };
                        let title = if t.title.is_empty() {
                            &t.tool_call_id
                        } else {
                            &t.title
                        };
                        self.line(&format!("{} {title} [{status}]", style.cyan("⚙")));
                    }
                    set(&mut shown, i, Shown::Tool(t.status.clone()));
                }
                Kind::Plan(p) => {
                    let text = p
                        .entries
                        .iter()
                        .map(|e| {
                            let mark = match e.status.as_str() {
                                "completed" => "[x]",
                                "in_progress" => "[>]",
                                _ => "[ ]",
                            };
                            format!("  {mark} {}", e.content)
                        })
                        .collect::<Vec<_>>()
                        .join("\n");
                    if !matches!(shown.get(i), Some(Shown::Plan(s)) if *s == text) {
                        self.line(&style.bold("Plan:"));
                        self.line(&text);
                    }
                    set(&mut shown, i, Shown::Plan(text));
                }
                Kind::Permission(p) => {
                    if !matches!(shown.get(i), Some(Shown::Interaction(o)) if *o == p.outcome) {
                        let id = request_id_text(p.request_id.as_ref());
                        let title = serde_json::from_str::<serde_json::Value>(&p.tool_call_json)
                            .ok()
                            .and_then(|v| v["title"].as_str().map(str::to_owned))
                            .unwrap_or_else(|| "a tool call".to_owned());
                        if p.outcome() == pb::InteractionOutcome::Pending {
                            let options = p
                                .options
                                .iter()
                                .map(|o| o.option_id.as_str())
                                .collect::<Vec<_>>()
                                .join(", ");
                            self.line(&style.yellow(&format!(
                                "? permission {id}: {title} (options: {options})"
                            )));
                            pending.push(Pending::Permission(p.clone()));
                        } else {
                            let selected = p
                                .selected_option_id
                                .as_deref()
                                .map(|s| format!(" {s}"))
                                .unwrap_or_default();
                            self.line(&style.dim(&format!(
                                "  permission {id}: {}{selected}",
                                outcome_name(p.outcome())
                            )));
                        }
                    }
                    set(&mut shown, i, Shown::Interaction(p.outcome));
                }
                Kind::Elicitation(e) => {
                    if !matches!(shown.get(i), Some(Shown::Interaction(o)) if *o == e.outcome) {
                        let id = request_id_text(e.request_id.as_ref());
                        if e.outcome() == pb::InteractionOutcome::Pending {
                            self.line(&style.yellow(&format!("? elicitation {id}: {}", e.message)));
                            pending.push(Pending::Elicitation(e.clone()));
                        } else {
                            self.line(&style.dim(&format!(
                                "  elicitation {id}: {} {}",
                                outcome_name(e.outcome()),
                                e.answer_json
                            )));
                        }
                    }
                    set(&mut shown, i, Shown::Interaction(e.outcome));
                }
                Kind::Control(c) => {
                    if !matches!(shown.get(i), Some(Shown::Control(o)) if *o == c.outcome) {
                        let kind = super::json::enum_name(c.kind().as_str_name(), "CONTROL_KIND_");
                        self.line(&style.dim(&format!(
                            "· {kind} {} ({})",
                            c.value,
                            outcome_name(c.outcome())
                        )));
                    }
                    set(&mut shown, i, Shown::Control(c.outcome));
                }
                Kind::Content(c) => {
                    if fresh {
                        self.line(&style.dim(&format!("[{}]", c.r#type)));
                    }
                    set(&mut shown, i, Shown::Once);
                }
                Kind::ContextRebuilt(c) => {
                    if fresh {
                        self.line(&style.dim(&format!(
                            "· context rebuilt: a new agent session, given the last {} turns ({})",
                            c.turns, c.reason
                        )));
                    }
                    set(&mut shown, i, Shown::Once);
                }
            }
        }
        if let Some(error) = &message.error
            && self.errors.get(&message.id) != Some(error)
        {
            self.line(&style.red(&format!("error: {error}")));
            self.errors.insert(message.id.clone(), error.clone());
        }
        self.shown.insert(message.id.clone(), shown);
        pending
    }

    pub(crate) fn turn_ended(&mut self, ended: &pb::TurnEnded) {
        let style = self.style;
        let reason = stop_reason_name(ended.stop_reason());
        let painted = if ended.stop_reason() == pb::StopReason::EndTurn {
            style.green(&reason)
        } else {
            style.red(&reason)
        };
        self.set_working(false);
        self.line(&format!(
            "{}{painted}",
            style.dim(&format!("— turn {} ended: ", ended.turn))
        ));
    }

    pub(crate) fn status(&mut self, change: &pb::SessionStatusChange) {
        let status = change.status();
        self.set_working(status == pb::SessionStatus::Running);
        if matches!(
            status,
            pb::SessionStatus::Disconnected
                | pb::SessionStatus::Closed
                | pb::SessionStatus::Suspended
        ) {
            let reason = if change.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", change.reason)
            };
            let text = format!("· session {}{reason}", status_name(status));
            self.line(&self.style.dim(&text));
        }
    }
}

fn set(shown: &mut Vec<Shown>, i: usize, value: Shown) {
    if i < shown.len() {
        shown[i] = value;
    } else {
        shown.push(value);
    }
}
