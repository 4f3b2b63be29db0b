//! `follow` and `prompt --follow`: the MESSAGES view of Subscribe, rendered live, resumed from the
//! last event's offset when the connection drops (the resume rule), with interactive
//! answers on a terminal.

use std::{io::BufRead, time::Duration};

use serde_json::Value;
use tonic::{Code, Status};

use super::{
    Failure, Outcome,
    connect::Client,
    exit,
    json::{self, stop_reason_name},
    render::{Pending, Transcript, request_id_text},
};
use crate::pb::v1::{self as pb, control_request::Action, subscribe_response::Event};

pub(crate) struct Options {
    pub(crate) json: bool,
    /// Ask for permission and elicitation answers on the terminal.
    pub(crate) interactive: bool,
    /// Stop when the turn opened by this action ends (`prompt --follow`); `None` follows forever.
    pub(crate) until_turn: Option<String>,
}

/// How long to keep trying to resubscribe after the connection dropped, before giving up.
const RECONNECT_FOR: Duration = Duration::from_secs(60);

/// Errors after which resubscribing from the last offset can succeed: the server restarting,
/// draining, or the connection breaking.
fn retryable(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Aborted
    )
}

pub(crate) async fn run(
    client: &mut Client,
    session: &str,
    after: u64,
    options: Options,
) -> Outcome {
    let mut cursor = after;
    let mut transcript = Transcript::new();
    let mut spinner = tokio::time::interval(Duration::from_millis(100));
    let mut failing_since: Option<tokio::time::Instant> = None;
    let mut backoff = Duration::from_millis(100);
    loop {
        let subscribed = client
            .subscribe(pb::SubscribeRequest {
                session_id: session.to_owned(),
                after_offset: cursor,
                view: pb::SubscribeView::Messages as i32,
            })
            .await;
        let mut stream = match subscribed {
            Ok(response) => response.into_inner(),
            Err(status) if retryable(&status) => {
                wait_to_retry(&mut failing_since, &mut backoff, &status).await?;
                continue;
            }
            Err(status) => return Err(status.into()),
        };
        let dropped = loop {
            let next = tokio::select! {
                next = stream.message() => next,
                _ = spinner.tick(), if transcript.spinning() => {
                    transcript.tick();
                    continue;
                }
            };
            let event = match next {
                Ok(Some(event)) => event,
                Ok(None) => break Status::unavailable("the stream ended"),
                Err(status) if retryable(&status) => break status,
                Err(status) => return Err(status.into()),
            };
            failing_since = None;
            backoff = Duration::from_millis(100);
            // Every event's offset is a resume cursor.
            cursor = event.offset;
            if options.json {
                outln!("{}", json::event(&event));
            }
            match &event.event {
                Some(Event::Message(message)) => {
                    let pending = if options.json {
                        Vec::new()
                    } else {
                        transcript.message(message)
                    };
                    if options.interactive {
                        for request in pending {
                            transcript.set_working(false);
                            ask_and_answer(client, session, &request).await?;
                        }
                    }
                }
                Some(Event::Status(change)) if !options.json => transcript.status(change),
                Some(Event::TurnEnded(ended)) => {
                    if !options.json {
                        transcript.turn_ended(ended);
                    }
                    if options.until_turn.as_deref() == Some(ended.request_id.as_str()) {
                        return Ok(turn_exit_code(ended));
                    }
                }
                _ => {}
            }
        };
        wait_to_retry(&mut failing_since, &mut backoff, &dropped).await?;
    }
}

/// Waits before the next attempt (doubling up to 2 s), or fails once the server has been gone
/// for [`RECONNECT_FOR`].
async fn wait_to_retry(
    failing_since: &mut Option<tokio::time::Instant>,
    backoff: &mut Duration,
    status: &Status,
) -> Result<(), Failure> {
    let since = *failing_since.get_or_insert_with(tokio::time::Instant::now);
    if since.elapsed() > RECONNECT_FOR {
        return Err(status.clone().into());
    }
    super::render::clear_spinner();
    tokio::time::sleep(*backoff).await;
    *backoff = (*backoff * 2).min(Duration::from_secs(2));
    Ok(())
}

fn turn_exit_code(ended: &pb::TurnEnded) -> u8 {
    if ended.stop_reason() == pb::StopReason::EndTurn {
        0
    } else {
        if let Some(error) = &ended.error {
            eprintln!(
                "turn ended {}: {error}",
                stop_reason_name(ended.stop_reason())
            );
        }
        exit::TURN_NOT_ENDED_WELL
    }
}

/// The permission and elicitation requests the agent is waiting on, from the transcript.
pub(crate) async fn pending_interactions(
    client: &mut Client,
    session: &str,
) -> Result<Vec<Pending>, Failure> {
    let mut pending = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .get_transcript(pb::GetTranscriptRequest {
                session_id: session.to_owned(),
                page_size: 0,
                page_token: page_token.clone(),
            })
            .await?
            .into_inner();
        for message in &page.messages {
            for part in &message.parts {
                match &part.kind {
                    Some(pb::message_part::Kind::Permission(p))
                        if p.outcome() == pb::InteractionOutcome::Pending =>
                    {
                        pending.push(Pending::Permission(p.clone()));
                    }
                    Some(pb::message_part::Kind::Elicitation(e))
                        if e.outcome() == pb::InteractionOutcome::Pending =>
                    {
                        pending.push(Pending::Elicitation(e.clone()));
                    }
                    _ => {}
                }
            }
        }
        if page.next_page_token.is_empty() {
            return Ok(pending);
        }
        page_token = page.next_page_token;
    }
}

/// The answer action for a request, from `answer`'s flags.
pub(crate) fn answer_action(
    request: &Pending,
    option: Option<String>,
    accept: Vec<(String, String)>,
    decline: bool,
    cancel: bool,
) -> Result<Action, Failure> {
    let request_id = request.request_id().cloned();
    match request {
        Pending::Permission(p) => {
            let outcome = if cancel {
                pb::respond_to_permission_action::Outcome::Cancelled(pb::PermissionCancelled {})
            } else if let Some(option) = option {
                pb::respond_to_permission_action::Outcome::SelectedOptionId(option)
            } else {
                let offered: Vec<_> = p.options.iter().map(|o| o.option_id.as_str()).collect();
                return Err(Failure::new(
                    exit::USAGE,
                    format!(
                        "a permission needs --option ({}) or --cancel",
                        offered.join(", ")
                    ),
                ));
            };
            Ok(Action::RespondToPermission(pb::RespondToPermissionAction {
                request_id,
                outcome: Some(outcome),
            }))
        }
        Pending::Elicitation(_) => {
            let answer = if cancel {
                pb::respond_elicitation_action::Answer::Cancel(pb::ElicitationCancel {})
            } else if decline {
                pb::respond_elicitation_action::Answer::Decline(pb::ElicitationDecline {})
            } else if !accept.is_empty() || option.is_none() {
                pb::respond_elicitation_action::Answer::Accept(pb::ElicitationAccept {
                    content: accept
                        .into_iter()
                        .map(|(key, value)| (key, elicitation_value(&value)))
                        .collect(),
                })
            } else {
                return Err(Failure::new(
                    exit::USAGE,
                    "an elicitation takes --accept KEY=VALUE…, --decline or --cancel",
                ));
            };
            Ok(Action::RespondElicitation(pb::RespondElicitationAction {
                request_id,
                answer: Some(answer),
            }))
        }
    }
}

/// A typed elicitation value from what a person typed: JSON booleans, integers, numbers and
/// string arrays keep their type; anything else is text.
fn elicitation_value(text: &str) -> pb::ElicitationValue {
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

/// Reads one line from the terminal without blocking the runtime; `None` at end of input.
async fn read_line(question: String) -> Option<String> {
    tokio::task::spawn_blocking(move || {
        super::output::write(question.as_bytes());
        let mut line = String::new();
        match std::io::stdin().lock().read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(line.trim().to_owned()),
        }
    })
    .await
    .ok()
    .flatten()
}

/// Asks the person at the terminal how to answer `request` and sends the answer.
pub(crate) async fn ask_and_answer(
    client: &mut Client,
    session: &str,
    request: &Pending,
) -> Outcome {
    let id = request_id_text(request.request_id());
    let action = match request {
        Pending::Permission(p) => {
            for (n, option) in p.options.iter().enumerate() {
                outln!("  {}) {} [{}]", n + 1, option.name, option.option_id);
            }
            outln!("  c) cancel the request");
            loop {
                let Some(choice) = read_line(format!("choose for permission {id}: ")).await else {
                    return Ok(0);
                };
                let outcome = if choice.eq_ignore_ascii_case("c") {
                    Some(pb::respond_to_permission_action::Outcome::Cancelled(
                        pb::PermissionCancelled {},
                    ))
                } else {
                    choice
                        .parse::<usize>()
                        .ok()
                        .and_then(|n| n.checked_sub(1))
                        .and_then(|n| p.options.get(n))
                        .or_else(|| p.options.iter().find(|o| o.option_id == choice))
                        .map(|o| {
                            pb::respond_to_permission_action::Outcome::SelectedOptionId(
                                o.option_id.clone(),
                            )
                        })
                };
                if let Some(outcome) = outcome {
                    break Action::RespondToPermission(pb::RespondToPermissionAction {
                        request_id: request.request_id().cloned(),
                        outcome: Some(outcome),
                    });
                }
                outln!("  (type a number from 1 to {}, or c)", p.options.len());
            }
        }
        Pending::Elicitation(e) => {
            let choice = loop {
                let Some(choice) = read_line(format!(
                    "answer elicitation {id}? [a]ccept, [d]ecline, [c]ancel: "
                ))
                .await
                else {
                    return Ok(0);
                };
                match choice.to_ascii_lowercase().as_str() {
                    "a" | "accept" => break 'a',
                    "d" | "decline" => break 'd',
                    "c" | "cancel" => break 'c',
                    _ => {}
                }
            };
            let answer = match choice {
                'd' => pb::respond_elicitation_action::Answer::Decline(pb::ElicitationDecline {}),
                'c' => pb::respond_elicitation_action::Answer::Cancel(pb::ElicitationCancel {}),
                _ => {
                    let request: Value = serde_json::from_str(&e.request_json).unwrap_or_default();
                    let mut content = std::collections::HashMap::new();
                    if let Some(fields) = request["requestedSchema"]["properties"].as_object() {
                        for (key, schema) in fields {
                            let title = schema["title"].as_str().unwrap_or(key);
                            let Some(value) = read_line(format!("  {title}: ")).await else {
                                return Ok(0);
                            };
                            content.insert(key.clone(), elicitation_value(&value));
                        }
                    }
                    pb::respond_elicitation_action::Answer::Accept(pb::ElicitationAccept {
                        content,
                    })
                }
            };
            Action::RespondElicitation(pb::RespondElicitationAction {
                request_id: request.request_id().cloned(),
                answer: Some(answer),
            })
        }
    };
    let sent = client
        .control(pb::ControlRequest {
            session_id: session.to_owned(),
            action: Some(action),
            ..Default::default()
        })
        .await;
    match sent {
        Ok(_) => Ok(0),
        // Someone else answered first: the transcript will show their answer.
        Err(status) if status.code() == Code::FailedPrecondition => {
            outln!("  (already answered: {})", status.message());
            Ok(0)
        }
        Err(status) => Err(status.into()),
    }
}
