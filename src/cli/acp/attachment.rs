//! One harness session attached to this ACP connection: a Subscribe stream (ALL view) that
//! resumes by itself from the last offset, read into `session/update`s, the answers to this
//! client's prompts (each at its own TurnEnded), and the interactions forwarded to the client.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::{Value, json};
use tokio::{sync::oneshot, task::JoinHandle};
use tonic::{Code, Status};
use tonic_types::StatusExt;

use super::{
    errors::{RpcError, code},
    interactions::{self, Interactions, Step},
    updates::Translator,
    wire::Outbox,
};
use crate::cli::{connect::Client, render::Pending};
use crate::pb::v1::{self as pb, StopReason, subscribe_response::Event};

/// How a prompt of ours ended: an ACP stop reason, or an error.
pub(crate) type TurnOutcome = Result<&'static str, RpcError>;

#[derive(Default)]
struct Waiting {
    /// Our prompts' action ids and who waits for their turn's end.
    prompts: HashMap<String, oneshot::Sender<TurnOutcome>>,
    /// Every prompt this client sent (its text is on the client's screen already).
    ours: HashSet<String>,
    /// Prompts that reached the agent.
    dispatched: HashSet<String>,
    /// The accepted Control of each prompt of ours not yet dispatched: sent again (same action
    /// id, so it changes nothing) to learn whether a prompt that left the queue was removed.
    accepted: HashMap<String, pb::ControlRequest>,
    /// The action ids of the last queue snapshot the stream brought.
    last_queue: Option<HashSet<String>>,
    /// Action ids whose agent answer (to set_config_option) someone waits for.
    answers: HashMap<String, oneshot::Sender<Result<Value, Value>>>,
}

pub(crate) struct Attachment {
    pub(crate) session_id: String,
    waiting: Mutex<Waiting>,
    interactions: Mutex<Interactions>,
    task: Mutex<Option<JoinHandle<()>>>,
}

/// Where the stream starts and what the caller waits for.
pub(crate) struct Start {
    pub(crate) after: u64,
    /// Fired once the stream has caught up with the log (the end of a replay).
    pub(crate) caught_up: Option<oneshot::Sender<()>>,
    /// The stream waits for this before sending anything (the answer that names the session
    /// goes out first).
    pub(crate) go: oneshot::Receiver<()>,
}

impl Attachment {
    pub(crate) fn new(session_id: &str, elicitation: bool) -> Arc<Self> {
        Arc::new(Self {
            session_id: session_id.to_owned(),
            waiting: Mutex::default(),
            interactions: Mutex::new(Interactions::new(session_id, elicitation)),
            task: Mutex::default(),
        })
    }

    /// Seeds what the session holds now and starts the stream.
    pub(crate) fn start(
        self: &Arc<Self>,
        client: Client,
        outbox: Outbox,
        held: Vec<Pending>,
        status: pb::SessionStatus,
        start: Start,
    ) {
        self.interactions
            .lock()
            .expect("not poisoned")
            .seed(held, status);
        let this = self.clone();
        let task = tokio::spawn(async move { this.follow(client, outbox, start).await });
        *self.task.lock().expect("not poisoned") = Some(task);
    }

    /// Stops the stream; prompts still waiting end `cancelled`.
    pub(crate) fn detach(&self) {
        if let Some(task) = self.task.lock().expect("not poisoned").take() {
            task.abort();
        }
        let prompts = std::mem::take(&mut self.waiting.lock().expect("not poisoned").prompts);
        for (_, waiter) in prompts {
            let _ = waiter.send(Ok("cancelled"));
        }
    }

    /// Registers a prompt before it is sent, so its turn's end cannot be missed.
    pub(crate) fn expect_turn(&self, action_id: &str) -> oneshot::Receiver<TurnOutcome> {
        let (tx, rx) = oneshot::channel();
        let mut waiting = self.waiting.lock().expect("not poisoned");
        waiting.prompts.insert(action_id.to_owned(), tx);
        waiting.ours.insert(action_id.to_owned());
        rx
    }

    pub(crate) fn forget_turn(&self, action_id: &str) {
        self.waiting
            .lock()
            .expect("not poisoned")
            .prompts
            .remove(action_id);
    }

    /// Records a prompt's Control as accepted (queued or sent). The stream may have brought
    /// the queue without it already (removed before this answer came back): then ask at once.
    pub(crate) fn accepted(self: &Arc<Self>, client: &Client, request: pb::ControlRequest) {
        let Some(action_id) = request.action_id.clone() else {
            return;
        };
        let ask = {
            let mut waiting = self.waiting.lock().expect("not poisoned");
            if !waiting.prompts.contains_key(&action_id) || waiting.dispatched.contains(&action_id)
            {
                return;
            }
            waiting.accepted.insert(action_id.clone(), request.clone());
            waiting
                .last_queue
                .as_ref()
                .is_some_and(|queue| !queue.contains(&action_id))
        };
        if ask {
            self.ask_if_removed(client, action_id, request);
        }
    }

    /// Ends a prompt of ours at once (removed from the queue before it ran).
    pub(crate) fn end_turn(&self, action_id: &str, outcome: TurnOutcome) {
        let mut waiting = self.waiting.lock().expect("not poisoned");
        waiting.accepted.remove(action_id);
        if let Some(waiter) = waiting.prompts.remove(action_id) {
            let _ = waiter.send(outcome);
        }
    }

    /// Our prompts still waiting, split into those that reached the agent and those queued.
    pub(crate) fn our_open_prompts(&self) -> (Vec<String>, Vec<String>) {
        let waiting = self.waiting.lock().expect("not poisoned");
        waiting
            .prompts
            .keys()
            .cloned()
            .partition(|id| waiting.dispatched.contains(id))
    }

    /// Registers interest in the agent's answer to the request sent for `action_id`.
    pub(crate) fn expect_answer(&self, action_id: &str) -> oneshot::Receiver<Result<Value, Value>> {
        let (tx, rx) = oneshot::channel();
        self.waiting
            .lock()
            .expect("not poisoned")
            .answers
            .insert(action_id.to_owned(), tx);
        rx
    }

    async fn follow(self: Arc<Self>, mut client: Client, outbox: Outbox, start: Start) {
        let Start {
            after,
            mut caught_up,
            go,
        } = start;
        if go.await.is_err() {
            return;
        }
        let mut cursor = after;
        let mut translator = Translator::new(&self.session_id);
        let mut backoff = Duration::from_millis(100);
        loop {
            let subscribed = client
                .subscribe(pb::SubscribeRequest {
                    session_id: self.session_id.clone(),
                    after_offset: cursor,
                    view: pb::SubscribeView::All as i32,
                })
                .await;
            let ended = match subscribed {
                Ok(stream) => {
                    let mut stream = stream.into_inner();
                    loop {
                        match stream.message().await {
                            Ok(Some(event)) => {
                                backoff = Duration::from_millis(100);
                                cursor = event.offset;
                                self.event(
                                    event,
                                    &mut translator,
                                    &client,
                                    &outbox,
                                    &mut caught_up,
                                );
                            }
                            Ok(None) => break Status::unavailable("the stream ended"),
                            Err(status) => break status,
                        }
                    }
                }
                Err(status) => status,
            };
            if !matches!(
                ended.code(),
                Code::Unavailable
                    | Code::Unknown
                    | Code::Cancelled
                    | Code::Aborted
                    | Code::Internal
            ) {
                eprintln!(
                    "agent-harness acp: session {}: the stream ended: {}",
                    self.session_id,
                    ended.message()
                );
                let error = RpcError::from(ended);
                let prompts =
                    std::mem::take(&mut self.waiting.lock().expect("not poisoned").prompts);
                for (_, waiter) in prompts {
                    let _ = waiter.send(Err(error.clone()));
                }
                return;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    fn event(
        self: &Arc<Self>,
        event: pb::SubscribeResponse,
        translator: &mut Translator,
        client: &Client,
        outbox: &Outbox,
        caught_up: &mut Option<oneshot::Sender<()>>,
    ) {
        match event.event {
            Some(Event::Entry(entry)) => {
                let read = {
                    let waiting = self.waiting.lock().expect("not poisoned");
                    translator.read(&entry, |id| waiting.ours.contains(id))
                };
                for update in read.updates {
                    outbox.notify("session/update", update);
                }
                let mut waiting = self.waiting.lock().expect("not poisoned");
                if let Some(action) = read.dispatched {
                    waiting.accepted.remove(&action);
                    waiting.dispatched.insert(action);
                }
                if let Some((action, outcome)) = read.answer
                    && let Some(waiter) = waiting.answers.remove(&action)
                {
                    let _ = waiter.send(outcome);
                }
            }
            Some(Event::Message(message)) => {
                self.interactions
                    .lock()
                    .expect("not poisoned")
                    .message(&message);
                self.interact(client, outbox);
            }
            Some(Event::Status(change)) => {
                self.interactions
                    .lock()
                    .expect("not poisoned")
                    .status(change.status());
                self.interact(client, outbox);
            }
            Some(Event::CaughtUp(_)) => {
                self.interactions.lock().expect("not poisoned").caught_up();
                if let Some(done) = caught_up.take() {
                    let _ = done.send(());
                }
                self.interact(client, outbox);
            }
            Some(Event::TurnEnded(ended)) => {
                self.end_turn(&ended.request_id, turn_outcome(&ended));
            }
            Some(Event::Queue(queue)) => self.left_the_queue(&queue, client),
            _ => {}
        }
    }

    /// A prompt of ours that is no longer queued either reached the agent (its dispatch may
    /// not have been read yet) or was removed by someone else (`agent-harness queue rm`, the
    /// console). Its Control sent again tells which without changing anything: a removed
    /// action answers QUEUED_ACTION_NOT_FOUND, and its prompt ends `cancelled`.
    fn left_the_queue(self: &Arc<Self>, queue: &pb::QueueSnapshot, client: &Client) {
        let still_queued: HashSet<String> = queue
            .entries
            .iter()
            .map(|entry| entry.action_id.clone())
            .collect();
        let gone: Vec<(String, pb::ControlRequest)> = {
            let mut waiting = self.waiting.lock().expect("not poisoned");
            let gone = waiting
                .accepted
                .iter()
                .filter(|(action_id, _)| !still_queued.contains(*action_id))
                .map(|(action_id, request)| (action_id.clone(), request.clone()))
                .collect();
            waiting.last_queue = Some(still_queued);
            gone
        };
        for (action_id, request) in gone {
            self.ask_if_removed(client, action_id, request);
        }
    }

    /// Sends a prompt's Control again (same action id: it changes nothing) and ends the prompt
    /// `cancelled` when the harness says it was removed from the queue.
    fn ask_if_removed(
        self: &Arc<Self>,
        client: &Client,
        action_id: String,
        request: pb::ControlRequest,
    ) {
        let this = self.clone();
        let mut client = client.clone();
        tokio::spawn(async move {
            if let Err(status) = client.control(request).await
                && status
                    .get_details_error_info()
                    .is_some_and(|info| info.reason == "QUEUED_ACTION_NOT_FOUND")
            {
                this.end_turn(&action_id, Ok("cancelled"));
            }
        });
    }

    /// Sends what the interactions call for, and answers the client's replies as Control.
    fn interact(self: &Arc<Self>, client: &Client, outbox: &Outbox) {
        let steps = self.interactions.lock().expect("not poisoned").steps();
        for step in steps {
            match step {
                Step::Withdraw { ours } => {
                    outbox.forget(ours);
                    outbox.notify("$/cancel_request", json!({"requestId": ours}));
                }
                Step::Forward {
                    key,
                    method,
                    params,
                } => {
                    let (ours, answered) = outbox.request(method, params);
                    self.interactions
                        .lock()
                        .expect("not poisoned")
                        .sent(key.clone(), ours);
                    let this = self.clone();
                    let mut client = client.clone();
                    tokio::spawn(async move {
                        let Ok(Ok(result)) = answered.await else {
                            // Withdrawn, or the client refused: someone else may answer.
                            return;
                        };
                        let action = {
                            let mut interactions = this.interactions.lock().expect("not poisoned");
                            interactions.answered(&key);
                            interactions
                                .held(&key)
                                .and_then(|held| interactions::answer_action(held, &result))
                        };
                        let Some(action) = action else {
                            eprintln!(
                                "agent-harness acp: the client's answer {result} to request {ours} is not one the harness can send"
                            );
                            return;
                        };
                        let sent = client
                            .control(pb::ControlRequest {
                                session_id: this.session_id.clone(),
                                action: Some(action),
                                ..Default::default()
                            })
                            .await;
                        if let Err(status) = sent
                            && status.code() != Code::FailedPrecondition
                        {
                            eprintln!(
                                "agent-harness acp: the answer to request {ours} was refused: {}",
                                status.message()
                            );
                        }
                    });
                }
            }
        }
    }
}

/// A turn's end as the prompt's answer: its ACP stop reason, or an error for a failed turn.
fn turn_outcome(ended: &pb::TurnEnded) -> TurnOutcome {
    Ok(match ended.stop_reason() {
        StopReason::EndTurn => "end_turn",
        StopReason::MaxTokens => "max_tokens",
        StopReason::MaxTurnRequests => "max_turn_requests",
        StopReason::Refusal => "refusal",
        StopReason::Cancelled => "cancelled",
        StopReason::Failed | StopReason::Unspecified => {
            return Err(RpcError::harness(
                code::INTERNAL_ERROR,
                "TURN_FAILED",
                ended
                    .error
                    .clone()
                    .unwrap_or_else(|| "the turn failed".to_owned()),
            ));
        }
    })
}
