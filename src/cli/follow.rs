//! `follow` and `prompt --follow`: the MESSAGES view of Subscribe, rendered live, resumed from the
//! last event's offset when the connection drops (the resume rule), with interactive
//! answers on a terminal.

use std::{collections::VecDeque, time::Duration};

use tonic::{Code, Status};

use super::{
    Failure, Outcome,
    connect::Client,
    exit,
    json::{self, stop_reason_name},
    question::{Question, Reply, Terminal, elicitation_value, next_line, outcome_in},
    render::{Pending, Transcript},
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

/// How to answer `request` with `agent-harness answer`, for a follow that cannot ask.
pub(crate) fn answer_hint(session: &str, request: &Pending) -> String {
    let id = super::render::request_id_text(request.request_id());
    match request {
        Pending::Permission(p) => {
            let options: Vec<&str> = p.options.iter().map(|o| o.option_id.as_str()).collect();
            format!(
                "· the agent waits for a permission ({}): agent-harness answer {session} {id} \
                 --option {}",
                options.join(", "),
                options.first().copied().unwrap_or("OPTION")
            )
        }
        Pending::Elicitation(_) => format!(
            "· the agent waits for an answer: agent-harness answer {session} {id} \
             --accept KEY=VALUE (or --decline)"
        ),
    }
}

/// The questions of one follow: the one on screen and those waiting behind it.
#[derive(Default)]
struct Questions {
    terminal: Option<Terminal>,
    asking: Option<Question>,
    waiting: VecDeque<Pending>,
}

impl Questions {
    /// Takes a snapshot's news: new requests wait their turn; a request answered elsewhere
    /// (another client, the console, a rule) is no longer asked about.
    fn message(
        &mut self,
        transcript: &mut Transcript,
        message: &pb::TranscriptMessage,
        new: Vec<Pending>,
    ) {
        self.waiting.extend(new);
        self.waiting.retain(|p| {
            outcome_in(message, p).is_none_or(|o| o == pb::InteractionOutcome::Pending)
        });
        if let Some(question) = &self.asking
            && outcome_in(message, &question.request)
                .is_some_and(|o| o != pb::InteractionOutcome::Pending)
        {
            transcript.line(&format!(
                "  (permission or question {} was answered elsewhere; going on)",
                question.id()
            ));
            self.asking = None;
        }
        self.ask_next(transcript);
    }

    fn ask_next(&mut self, transcript: &mut Transcript) {
        if self.asking.is_some() {
            return;
        }
        let Some(request) = self.waiting.pop_front() else {
            return;
        };
        let terminal = self.terminal.get_or_insert_with(Terminal::start);
        terminal.forget_typed_ahead();
        let question = Question::new(request);
        transcript.set_working(false);
        transcript.ask(&question.first_prompt());
        self.asking = Some(question);
    }

    /// A typed line: answers the question on screen (sending the answer), or asks again.
    async fn typed(
        &mut self,
        transcript: &mut Transcript,
        client: &mut Client,
        session: &str,
        line: &str,
    ) -> Result<(), Failure> {
        transcript.typed();
        let Some(question) = &mut self.asking else {
            return Ok(());
        };
        match question.feed(line) {
            Reply::Ask(prompt) => transcript.ask(&prompt),
            Reply::Answer(action, chosen) => {
                let id = question.id();
                self.asking = None;
                if let Some(line) = send_answer(client, session, action, &id, &chosen).await? {
                    transcript.line(&line);
                }
                self.ask_next(transcript);
            }
        }
        Ok(())
    }
}

/// Sends an answer; says what was chosen, or that someone else answered first.
pub(crate) async fn send_answer(
    client: &mut Client,
    session: &str,
    action: Action,
    id: &str,
    chosen: &str,
) -> Result<Option<String>, Failure> {
    let sent = client
        .control(pb::ControlRequest {
            session_id: session.to_owned(),
            action: Some(action),
            ..Default::default()
        })
        .await;
    match sent {
        Ok(_) => Ok(Some(format!("  answered {id}: {chosen}"))),
        // Someone else answered first: the transcript shows their answer.
        Err(status) if status.code() == Code::FailedPrecondition => {
            Ok(Some(format!("  (already answered: {})", status.message())))
        }
        Err(status) => Err(status.into()),
    }
}

pub(crate) async fn run(
    client: &mut Client,
    session: &str,
    after: u64,
    options: Options,
) -> Outcome {
    let mut cursor = after;
    let mut transcript = Transcript::new();
    let mut questions = Questions::default();
    let mut spinner = tokio::time::interval(Duration::from_millis(100));
    let mut failing_since: Option<tokio::time::Instant> = None;
    let mut backoff = Duration::from_millis(100);
    // Ctrl-C during `prompt --follow` leaves the turn running; only then is it caught, to say so.
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let catch_ctrl_c = options.until_turn.is_some();
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
                wait_to_retry(&mut transcript, &mut failing_since, &mut backoff, &status).await?;
                continue;
            }
            Err(status) => return Err(status.into()),
        };
        if failing_since.take().is_some() {
            transcript.notice(&format!("· reconnected; resuming after offset {cursor}"));
        }
        let dropped = loop {
            let next = tokio::select! {
                next = stream.message() => next,
                _ = spinner.tick(), if transcript.spinning() && questions.asking.is_none() => {
                    transcript.tick();
                    continue;
                }
                line = next_line(&mut questions.terminal), if questions.asking.is_some() => {
                    match line {
                        Some(line) => questions.typed(&mut transcript, client, session, &line).await?,
                        // Input ended: nobody is there to answer; leave it to another client.
                        None => {
                            questions.asking = None;
                            questions.waiting.clear();
                            questions.terminal = None;
                            transcript.typed();
                        }
                    }
                    continue;
                }
                _ = &mut interrupted, if catch_ctrl_c => {
                    transcript.set_working(false);
                    transcript.notice(&format!(
                        "Left the turn running: it goes on in session {session}.\n  \
                         agent-harness follow {session}   # watch it again\n  \
                         agent-harness stop {session}     # stop it"
                    ));
                    return Ok(exit::INTERRUPTED);
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
                Some(Event::Message(message)) if !options.json => {
                    let new = transcript.message(message);
                    if options.interactive {
                        questions.message(&mut transcript, message, new);
                    } else {
                        // Nobody to ask here: say how to answer from another shell.
                        for request in &new {
                            transcript.notice(&answer_hint(session, request));
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
        wait_to_retry(&mut transcript, &mut failing_since, &mut backoff, &dropped).await?;
    }
}

/// Waits before the next attempt (doubling up to 2 s), or fails once the server has been gone
/// for [`RECONNECT_FOR`]. The first failure of an outage is said once.
async fn wait_to_retry(
    transcript: &mut Transcript,
    failing_since: &mut Option<tokio::time::Instant>,
    backoff: &mut Duration,
    status: &Status,
) -> Result<(), Failure> {
    if failing_since.is_none() {
        transcript.set_working(false);
        let why = status.message();
        let why = if why.is_empty() {
            "the connection dropped"
        } else {
            why
        };
        transcript.notice(&format!("· connection lost ({why}); reconnecting…"));
    }
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

/// The session's log head now: where `--from-now` (and `prompt --follow`) start.
pub(crate) async fn head_offset(client: &mut Client, session: &str) -> Result<u64, Failure> {
    Ok(client
        .get_session(pb::GetSessionRequest {
            session_id: session.to_owned(),
        })
        .await?
        .into_inner()
        .session
        .unwrap_or_default()
        .head_offset)
}

/// The offset to follow after so the stream starts with the transcript's last `n` messages
/// (snapshots are whole messages, so starting just before a message's first entry shows all
/// of it).
pub(crate) async fn offset_before_last_messages(
    client: &mut Client,
    session: &str,
    n: usize,
) -> Result<u64, Failure> {
    if n == 0 {
        return head_offset(client, session).await;
    }
    let mut firsts = VecDeque::with_capacity(n);
    each_transcript_message(client, session, |message| {
        if firsts.len() == n {
            firsts.pop_front();
        }
        firsts.push_back(message.first_offset);
    })
    .await?;
    Ok(match firsts.front() {
        Some(first) if firsts.len() == n => first.saturating_sub(1),
        _ => 0,
    })
}

/// The permission and elicitation requests the agent is waiting on, from the transcript.
pub(crate) async fn pending_interactions(
    client: &mut Client,
    session: &str,
) -> Result<Vec<Pending>, Failure> {
    let mut pending = Vec::new();
    each_transcript_message(client, session, |message| {
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
    })
    .await?;
    Ok(pending)
}

/// Reads a session's whole transcript page by page, oldest message first.
async fn each_transcript_message(
    client: &mut Client,
    session: &str,
    mut each: impl FnMut(&pb::TranscriptMessage),
) -> Result<(), Failure> {
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
        page.messages.iter().for_each(&mut each);
        if page.next_page_token.is_empty() {
            return Ok(());
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

/// `answer` with no request id: shows the request, asks on the terminal, sends the answer and
/// says what was chosen.
pub(crate) async fn answer_on_terminal(
    client: &mut Client,
    session: &str,
    request: &Pending,
) -> Outcome {
    let mut terminal = Terminal::start();
    let mut question = Question::new(request.clone());
    outln!("{}", question.heading());
    super::output::write(question.first_prompt().as_bytes());
    loop {
        let Some(line) = terminal.next().await else {
            return Ok(0);
        };
        match question.feed(&line) {
            Reply::Ask(prompt) => super::output::write(prompt.as_bytes()),
            Reply::Answer(action, chosen) => {
                let id = question.id();
                if let Some(said) = send_answer(client, session, action, &id, &chosen).await? {
                    outln!("{}", said.trim_start());
                }
                return Ok(0);
            }
        }
    }
}
