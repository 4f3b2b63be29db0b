//! Asking the person at the terminal how to answer a permission or elicitation request.
//!
//! The terminal is read on a thread of its own, one line at a time, into a channel: a question
//! waits on that channel beside the transcript's stream, so `follow` can drop a question that
//! another client answered meanwhile and go on, instead of blocking on a read until a key.

use std::{collections::HashMap, io::BufRead};

use serde_json::Value;
use tokio::sync::mpsc;

use super::render::{Pending, request_id_text};
use crate::pb::v1::{self as pb, control_request::Action};

/// Lines typed at the terminal; `None` once input has ended.
pub(crate) struct Terminal {
    lines: mpsc::UnboundedReceiver<String>,
}

impl Terminal {
    /// Starts reading stdin. The thread is never joined: it ends with the process (a read on a
    /// terminal cannot be cancelled).
    pub(crate) fn start() -> Self {
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            let stdin = std::io::stdin();
            let mut line = String::new();
            loop {
                line.clear();
                match stdin.lock().read_line(&mut line) {
                    Ok(1..) if tx.send(line.trim().to_owned()).is_ok() => {}
                    _ => return,
                }
            }
        });
        Self { lines }
    }

    /// The next line typed; `None` at end of input.
    pub(crate) async fn next(&mut self) -> Option<String> {
        self.lines.recv().await
    }

    /// Forgets lines typed before a question was asked, so a keypress meant for an earlier one
    /// never answers the next.
    pub(crate) fn forget_typed_ahead(&mut self) {
        while self.lines.try_recv().is_ok() {}
    }
}

/// The next line from `terminal`, or never when there is none (so a `select!` branch on it
/// simply waits).
pub(crate) async fn next_line(terminal: &mut Option<Terminal>) -> Option<String> {
    match terminal {
        Some(terminal) => terminal.next().await,
        None => std::future::pending().await,
    }
}

/// Where a question stands.
enum Step {
    /// A permission: which option.
    Option,
    /// An elicitation: accept, decline or cancel.
    Choice,
    /// An elicitation being accepted: the value of field `n`.
    Field(usize),
}

/// One question about one request, fed a line at a time.
pub(crate) struct Question {
    pub(crate) request: Pending,
    step: Step,
    /// An elicitation's fields: key and title, in the schema's order.
    fields: Vec<(String, String)>,
    content: HashMap<String, pb::ElicitationValue>,
}

/// What a line typed in answer leads to.
pub(crate) enum Reply {
    /// Ask this (again, or the next field).
    Ask(String),
    /// Send this action; the text says what was chosen.
    Answer(Action, String),
}

impl Question {
    pub(crate) fn new(request: Pending) -> Self {
        let (step, fields) = match &request {
            Pending::Permission(_) => (Step::Option, Vec::new()),
            Pending::Elicitation(e) => (Step::Choice, elicitation_fields(&e.request_json)),
        };
        Self {
            request,
            step,
            fields,
            content: HashMap::new(),
        }
    }

    pub(crate) fn id(&self) -> String {
        request_id_text(self.request.request_id())
    }

    /// What the request asks, for a person who has not seen it in a transcript.
    pub(crate) fn heading(&self) -> String {
        match &self.request {
            Pending::Permission(p) => format!(
                "permission {}: {}",
                self.id(),
                permission_title(&p.tool_call_json)
            ),
            Pending::Elicitation(e) => format!("elicitation {}: {}", self.id(), e.message),
        }
    }

    /// The choices and the first prompt, one string of lines.
    pub(crate) fn first_prompt(&self) -> String {
        match &self.request {
            Pending::Permission(p) => {
                let mut text = String::new();
                for (n, option) in p.options.iter().enumerate() {
                    text.push_str(&format!(
                        "  {}) {} [{}]\n",
                        n + 1,
                        option.name,
                        option.option_id
                    ));
                }
                text.push_str("  c) cancel the request\n");
                text.push_str(&self.prompt());
                text
            }
            Pending::Elicitation(_) => self.prompt(),
        }
    }

    fn prompt(&self) -> String {
        match self.step {
            Step::Option => format!("choose for permission {}: ", self.id()),
            Step::Choice => format!(
                "answer elicitation {}? [a]ccept, [d]ecline, [c]ancel: ",
                self.id()
            ),
            Step::Field(n) => format!("  {}: ", self.fields[n].1),
        }
    }

    /// Takes one typed line.
    pub(crate) fn feed(&mut self, line: &str) -> Reply {
        let request_id = self.request.request_id().cloned();
        match (&self.step, &self.request) {
            (Step::Option, Pending::Permission(p)) => {
                let outcome = if line.eq_ignore_ascii_case("c") {
                    Some((
                        pb::respond_to_permission_action::Outcome::Cancelled(
                            pb::PermissionCancelled {},
                        ),
                        "cancelled".to_owned(),
                    ))
                } else {
                    line.parse::<usize>()
                        .ok()
                        .and_then(|n| n.checked_sub(1))
                        .and_then(|n| p.options.get(n))
                        .or_else(|| p.options.iter().find(|o| o.option_id == line))
                        .map(|o| {
                            (
                                pb::respond_to_permission_action::Outcome::SelectedOptionId(
                                    o.option_id.clone(),
                                ),
                                format!("{} [{}]", o.name, o.option_id),
                            )
                        })
                };
                match outcome {
                    Some((outcome, chosen)) => Reply::Answer(
                        Action::RespondToPermission(pb::RespondToPermissionAction {
                            request_id,
                            outcome: Some(outcome),
                        }),
                        chosen,
                    ),
                    None => Reply::Ask(format!(
                        "  (type a number from 1 to {}, or c)\n{}",
                        p.options.len(),
                        self.prompt()
                    )),
                }
            }
            (Step::Choice, _) => {
                let answer = match line.to_ascii_lowercase().as_str() {
                    "a" | "accept" if self.fields.is_empty() => self.accept(),
                    "a" | "accept" => {
                        self.step = Step::Field(0);
                        return Reply::Ask(self.prompt());
                    }
                    "d" | "decline" => (
                        pb::respond_elicitation_action::Answer::Decline(pb::ElicitationDecline {}),
                        "declined".to_owned(),
                    ),
                    "c" | "cancel" => (
                        pb::respond_elicitation_action::Answer::Cancel(pb::ElicitationCancel {}),
                        "cancelled".to_owned(),
                    ),
                    _ => return Reply::Ask(self.prompt()),
                };
                Reply::Answer(
                    Action::RespondElicitation(pb::RespondElicitationAction {
                        request_id,
                        answer: Some(answer.0),
                    }),
                    answer.1,
                )
            }
            (Step::Field(n), _) => {
                let n = *n;
                let key = self.fields[n].0.clone();
                self.content.insert(key, elicitation_value(line));
                if n + 1 < self.fields.len() {
                    self.step = Step::Field(n + 1);
                    return Reply::Ask(self.prompt());
                }
                let (answer, chosen) = self.accept();
                Reply::Answer(
                    Action::RespondElicitation(pb::RespondElicitationAction {
                        request_id,
                        answer: Some(answer),
                    }),
                    chosen,
                )
            }
            (Step::Option, Pending::Elicitation(_)) => Reply::Ask(self.prompt()),
        }
    }

    fn accept(&mut self) -> (pb::respond_elicitation_action::Answer, String) {
        let shown = self
            .fields
            .iter()
            .filter_map(|(key, title)| {
                let value = self.content.get(key)?;
                Some(format!("{title}={}", shown_value(value)))
            })
            .collect::<Vec<_>>()
            .join(", ");
        let chosen = if shown.is_empty() {
            "accepted".to_owned()
        } else {
            format!("accepted ({shown})")
        };
        (
            pb::respond_elicitation_action::Answer::Accept(pb::ElicitationAccept {
                content: std::mem::take(&mut self.content),
            }),
            chosen,
        )
    }
}

fn shown_value(value: &pb::ElicitationValue) -> String {
    use pb::elicitation_value::Kind;
    match &value.kind {
        Some(Kind::Text(text)) => text.clone(),
        Some(Kind::Flag(flag)) => flag.to_string(),
        Some(Kind::Integer(n)) => n.to_string(),
        Some(Kind::Number(n)) => n.to_string(),
        Some(Kind::Strings(list)) => list.values.join("|"),
        None => String::new(),
    }
}

/// The title of the tool call a permission is about.
pub(crate) fn permission_title(tool_call_json: &str) -> String {
    serde_json::from_str::<Value>(tool_call_json)
        .ok()
        .and_then(|v| v["title"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "a tool call".to_owned())
}

/// The fields an elicitation's schema asks for: key and title.
fn elicitation_fields(request_json: &str) -> Vec<(String, String)> {
    let request: Value = serde_json::from_str(request_json).unwrap_or_default();
    request["requestedSchema"]["properties"]
        .as_object()
        .map(|fields| {
            fields
                .iter()
                .map(|(key, schema)| {
                    let title = schema["title"].as_str().unwrap_or(key).to_owned();
                    (key.clone(), title)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// How `request` stands in `message`, if the message holds it.
pub(crate) fn outcome_in(
    message: &pb::TranscriptMessage,
    request: &Pending,
) -> Option<pb::InteractionOutcome> {
    let wanted = request.request_id()?;
    message.parts.iter().find_map(|part| match &part.kind {
        Some(pb::message_part::Kind::Permission(p)) if p.request_id.as_ref() == Some(wanted) => {
            Some(p.outcome())
        }
        Some(pb::message_part::Kind::Elicitation(e)) if e.request_id.as_ref() == Some(wanted) => {
            Some(e.outcome())
        }
        _ => None,
    })
}

/// A typed elicitation value from what a person typed: JSON booleans, integers, numbers and
/// string arrays keep their type; anything else is text.
pub(crate) fn elicitation_value(text: &str) -> pb::ElicitationValue {
    use pb::elicitation_value::Kind;
    let kind = match serde_json::from_str::<Value>(text) {
        Ok(Value::Bool(flag)) => Kind::Flag(flag),
        Ok(Value::Number(n)) if n.is_i64() => Kind::Integer(n.as_i64().unwrap_or_default()),
        Ok(Value::Number(n)) => Kind::Number(n.as_f64().unwrap_or_default()),
        Ok(Value::Array(items)) if items.iter().all(Value::is_string) => {
            Kind::Strings(pb::StringList {
                values: items
                    .into_iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect(),
            })
        }
        _ => Kind::Text(text.to_owned()),
    };
    pb::ElicitationValue { kind: Some(kind) }
}
