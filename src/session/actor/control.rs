//! Commands from callers: Control (every action, with the queue's rules), queue
//! edits and removals, close and delete.

use std::time::Instant;

use serde_json::{Map, Value, json};

use super::{Actor, HARNESS_ACTOR, Out, PendingKind, StartPurpose, fingerprint, sent};
use crate::session::{Command, ControlInput, ControlOutcome, ControlStatus, SessionEvent};
use crate::{
    acp::frames::{self as acp_frames, ConfigValue},
    domain::{
        Action, ActionId, ElicitationAnswer, Error, ErrorCode, JsonRpcId, PermissionAnswer,
        Principal, PrincipalKind, PromptAction, Result,
        queue::{Queue, QueuedEntry, QueuedWork},
        session::{SessionRecord, SessionStatus},
    },
    store::{ActionRecord, ActionState, QueueOp},
};

/// How many model and config option changes may wait for a starting runtime; beyond that they
/// are answered at once (RUNTIME_DISCONNECTED: not ready).
const WAITING_CONFIGS: usize = 16;

impl Actor {
    pub(super) async fn on_command(&mut self, command: Command) {
        // A write's outcome still unknown: the actor's view of the session may be wrong, so it
        // takes nothing on until the store has told (see `doubt`).
        if self.doubt.is_some()
            && let Err(error) = self.resolve_doubt().await
        {
            let error = self.refusal_in_doubt(&command).unwrap_or(error);
            return command.refuse(error);
        }
        match command {
            Command::Control {
                principal,
                input,
                traceparent,
                reply,
            } => {
                if matches!(
                    input.action,
                    Action::SetModel { .. } | Action::SetConfigOption { .. }
                ) && self.runtime.state.is_starting()
                    && self.work.waiting_configs.len() < WAITING_CONFIGS
                {
                    self.work.waiting_configs.push(Command::Control {
                        principal,
                        input,
                        traceparent,
                        reply,
                    });
                    return;
                }
                let result = self.on_control(principal, *input, traceparent).await;
                let _ = reply.send(result);
            }
            Command::GetQueue { reply } => {
                let _ = reply.send(Ok(self.work.queue.entries().cloned().collect()));
            }
            Command::EditQueued {
                principal,
                action_id,
                text,
                reply,
            } => {
                let _ = reply.send(self.on_edit(principal, action_id, text).await);
            }
            Command::RemoveQueued { action_id, reply } => {
                let _ = reply.send(self.on_remove(action_id).await);
            }
            Command::Close { reply } => {
                let _ = reply.send(self.on_close().await);
            }
            Command::Delete { reply } => {
                let _ = reply.send(self.on_delete().await);
            }
            Command::Drain { reply } => {
                let _ = reply.send(self.on_drain().await);
            }
            Command::HandOff { reply } => {
                let _ = reply.send(Ok(self.on_hand_off().await));
            }
            Command::BudgetSpent { reason, reply } => {
                let _ = reply.send(self.on_budget_spent(reason).await);
            }
        }
    }

    pub(super) async fn on_control(
        &mut self,
        principal: Principal,
        input: ControlInput,
        traceparent: Option<String>,
    ) -> Result<ControlOutcome> {
        if self.record.status == SessionStatus::Closed {
            return Err(Error::new(
                ErrorCode::SessionClosed,
                format!("session {} is closed", self.record.id),
            ));
        }
        let ControlInput {
            action_id,
            context,
            interrupt,
            expect_idle,
            action,
            ..
        } = input;
        self.check_control(&principal, &action, &context, interrupt)?;
        if expect_idle && !matches!(action, Action::Prompt(_) | Action::Compact) {
            return Err(Error::invalid(
                "expect applies to prompts and compacts only",
            ));
        }
        let fingerprint = fingerprint(&action, &context, interrupt);
        let action_id = match action_id {
            Some(action_id) => {
                if let Some(record) = self
                    .ctx
                    .store
                    .find_action(self.record.id, action_id)
                    .await?
                {
                    return self.resend(record, &fingerprint);
                }
                action_id
            }
            None => ActionId::mint(),
        };
        // After the re-send check, so a re-sent admitted action still reports its status.
        if expect_idle {
            self.check_idle()?;
        }
        // A compaction is a model call too (a paid one, on a real agent): spent is spent.
        if matches!(action, Action::Prompt(_) | Action::Compact) {
            self.ctx
                .check_budget(&self.record.owner, crate::session::metering::NOT_TAKEN)
                .await?;
        }
        let actor = principal.actor().to_owned();
        match action {
            Action::Prompt(_) | Action::Compact => {
                let work = QueuedWork::from_action(&action).expect("turn-occupying");
                let entry = QueuedEntry {
                    action_id,
                    work,
                    context,
                    actor,
                    created_at: crate::domain::now(),
                    traceparent,
                };
                self.on_turn_action(entry, fingerprint, interrupt).await
            }
            Action::SetModel { model } => {
                self.require_ready()?;
                self.check_model(&model)?;
                let config_id =
                    acp_frames::model_config_id(&self.runtime.config_options).to_owned();
                self.send_config(
                    action_id,
                    fingerprint,
                    &actor,
                    &config_id,
                    ConfigValue::Id(model),
                )
                .await
            }
            Action::SetConfigOption { config_id, value } => {
                self.require_ready()?;
                let value = self.check_config_option(&config_id, &value)?;
                self.send_config(action_id, fingerprint, &actor, &config_id, value)
                    .await
            }
            Action::Stop { clear_queue } => {
                self.on_stop(action_id, fingerprint, &actor, clear_queue)
                    .await
            }
            Action::RespondToPermission { request_id, answer } => {
                self.work
                    .held
                    .check_permission_answer(&request_id, &answer)?;
                let frame = acp_frames::permission_response(&request_id, &answer);
                self.send_answer(action_id, fingerprint, &actor, &request_id, frame)
                    .await
            }
            Action::RespondElicitation { request_id, answer } => {
                self.work
                    .held
                    .check_elicitation_answer(&request_id, &answer)?;
                let frame = acp_frames::elicitation_response(&request_id, &answer);
                self.send_answer(action_id, fingerprint, &actor, &request_id, frame)
                    .await
            }
        }
    }

    /// Who may do what, and the limits, before anything is stored.
    pub(super) fn check_control(
        &self,
        principal: &Principal,
        action: &Action,
        context: &Option<Map<String, Value>>,
        interrupt: bool,
    ) -> Result<()> {
        let limits = &self.ctx.limits;
        if let Some(context) = context {
            if !principal.may_send_context() {
                return Err(Error::new(
                    ErrorCode::ContextNotAllowed,
                    "only services may send a context (trigger)",
                ));
            }
            if !matches!(action, Action::Prompt(_)) {
                return Err(Error::invalid("context applies to prompts only"));
            }
            let bytes = Value::Object(context.clone()).to_string().len();
            if bytes > limits.context_bytes {
                return Err(Error::limit(
                    "context_bytes",
                    limits.context_bytes,
                    format_args!("a context of {bytes} bytes"),
                ));
            }
        }
        if action.is_answer() && !principal.may_answer() {
            return Err(Error::new(
                ErrorCode::Forbidden,
                "only a person may answer a permission request or an elicitation",
            ));
        }
        if interrupt && !matches!(action, Action::Prompt(_)) {
            return Err(Error::invalid("interrupt delivery is for prompts only"));
        }
        match action {
            Action::Prompt(prompt) => limits.check_prompt(prompt),
            Action::SetModel { model } => limits.check_identifier("set_model.model", model),
            Action::SetConfigOption { config_id, value } => {
                limits.check_identifier("set_config_option.config_id", config_id)?;
                limits.check_identifier("set_config_option.value", value)
            }
            Action::RespondToPermission {
                answer: PermissionAnswer::Selected { option_id },
                ..
            } => limits.check_identifier("respond_to_permission.selected_option_id", option_id),
            _ => Ok(()),
        }
    }

    /// "Start only if idle": no turn, nothing held, nothing queued, no runtime
    /// starting. A suspended or disconnected session with nothing to do counts as idle: the
    /// action reopens it, and piles nothing up.
    fn check_idle(&self) -> Result<()> {
        let busy = if self.work.turn.is_some() {
            Some("a turn is running")
        } else if !self.work.held.is_empty() {
            Some("a permission request or elicitation is held")
        } else if !self.work.queue.is_empty() {
            Some("actions are queued")
        } else if self.runtime.state.is_starting() {
            Some("the runtime is starting")
        } else {
            None
        };
        match busy {
            Some(why) => Err(Error::new(
                ErrorCode::SessionBusy,
                format!("session {} is not idle: {why}", self.record.id),
            )),
            None => Ok(()),
        }
    }

    /// A re-sent action id: the same action reports its status now and changes nothing.
    pub(super) fn resend(&self, record: ActionRecord, fingerprint: &str) -> Result<ControlOutcome> {
        if record.fingerprint != fingerprint {
            return Err(Error::new(
                ErrorCode::ActionIdConflict,
                format!(
                    "action id {} was already used for a different action",
                    record.action_id
                ),
            ));
        }
        let status = match record.state {
            ActionState::Sent => ControlStatus::Sent,
            ActionState::Queued => {
                ControlStatus::Queued(self.work.queue.position(&record.action_id).unwrap_or(1))
            }
            ActionState::Removed => {
                return Err(Error::new(
                    ErrorCode::QueuedActionNotFound,
                    format!(
                        "action {} was removed from the queue before it was dispatched",
                        record.action_id
                    ),
                ));
            }
        };
        Ok(ControlOutcome {
            action_id: record.action_id,
            status,
        })
    }

    pub(super) fn require_ready(&self) -> Result<()> {
        if self.runtime.state.is_ready() {
            return Ok(());
        }
        let why = match self.live_status() {
            SessionStatus::Starting => {
                "the runtime is starting; retry once the session is IDLE".to_owned()
            }
            SessionStatus::Suspended => {
                "the runtime is suspended; a prompt or compact reopens it".to_owned()
            }
            _ => format!("the runtime is disconnected: {}", self.record.status_reason),
        };
        Err(Error::new(ErrorCode::RuntimeDisconnected, why))
    }

    pub(super) async fn on_turn_action(
        &mut self,
        entry: QueuedEntry,
        fingerprint: String,
        interrupt: bool,
    ) -> Result<ControlOutcome> {
        if self.ctx.is_draining() {
            return Err(draining());
        }
        let action_id = entry.action_id;
        if !self.runtime.state.is_up() {
            // SUSPENDED or DISCONNECTED: reopen, with this action queued behind the reopen.
            if !self
                .profile
                .can_come_back(self.record.can_resume, self.record.can_load)
            {
                return Err(Error::new(
                    ErrorCode::RuntimeDisconnected,
                    format!(
                        "session {} cannot be reopened: its runtime advertises neither \
                         session/resume nor session/load ({})",
                        self.record.id, self.record.status_reason
                    ),
                ));
            }
            // An interrupt goes first here too; there is no turn to stop.
            let position = self
                .enqueue(entry, fingerprint, interrupt, |_, _| {})
                .await?;
            crate::session::metrics::reopened(
                if self.record.status == SessionStatus::Disconnected {
                    crate::session::metrics::ReopenReason::Fault
                } else {
                    crate::session::metrics::ReopenReason::Resume
                },
            );
            self.start_runtime(StartPurpose::Reopen).await;
            return Ok(queued(action_id, position));
        }
        if interrupt && self.work.turn.is_some() {
            // Behaves as a stop (by the caller), and the prompt goes first.
            let actor = entry.actor.clone();
            let position = self
                .enqueue(entry, fingerprint, true, |this, out| {
                    this.cancel_turn(out, action_id, &actor)
                })
                .await?;
            return Ok(queued(action_id, position));
        }
        if self.runtime.state.is_ready() && self.work.turn.is_none() && self.work.queue.is_empty() {
            self.dispatch_entry(entry, Some(fingerprint), false).await?;
            return Ok(sent(action_id));
        }
        let position = self
            .enqueue(entry, fingerprint, interrupt, |_, _| {})
            .await?;
        Ok(queued(action_id, position))
    }

    /// Queues a turn action (`first`: at the front, as an interrupt) and commits it as QUEUED,
    /// with whatever `also` adds to the same step; if the commit fails it leaves the queue again.
    /// Its position in the queue.
    async fn enqueue(
        &mut self,
        entry: QueuedEntry,
        fingerprint: String,
        first: bool,
        also: impl FnOnce(&mut Self, &mut Out),
    ) -> Result<u32> {
        let action_id = entry.action_id;
        let record = ActionRecord {
            action_id,
            fingerprint,
            state: ActionState::Queued,
            created_at: entry.created_at,
        };
        let cap = self.ctx.limits.queued_actions;
        let (position, op) = if first {
            let position = self.work.queue.push_front(entry.clone(), cap)?;
            (position, QueueOp::PushFront(entry))
        } else {
            let position = self.work.queue.push_back(entry.clone(), cap)?;
            (position, QueueOp::PushBack(entry))
        };
        let mut out = Out::default();
        out.batch.new_actions.push(record);
        out.batch.queue.push(op);
        out.queue_changed = true;
        also(self, &mut out);
        if let Err(error) = self.flush(out).await {
            self.work.queue.remove(&action_id).ok();
            return Err(error);
        }
        Ok(position)
    }

    /// Answers held interactions (elicitations `cancel`, permissions `cancelled`) and then sends
    /// `session/cancel`, so the agent is never left waiting.
    pub(super) fn cancel_turn(&mut self, out: &mut Out, action_id: ActionId, actor: &str) {
        if let Some(elicitation) = self.work.held.elicitation.take() {
            let frame =
                acp_frames::elicitation_response(&elicitation.id, &ElicitationAnswer::Cancel);
            self.log_send(out, &frame, actor, Some(action_id));
        }
        for permission in std::mem::take(&mut self.work.held.permissions) {
            let frame =
                acp_frames::permission_response(&permission.id, &PermissionAnswer::Cancelled);
            self.log_send(out, &frame, actor, Some(action_id));
        }
        let frame = acp_frames::cancel_notification(self.acp_session_id());
        self.log_send(out, &frame, actor, Some(action_id));
        let grace = self.profile.cancel_grace;
        if let Some(turn) = &mut self.work.turn
            && turn.cancel_deadline.is_none()
        {
            turn.cancel_deadline = Some(Instant::now() + grace);
        }
        self.refresh_status(out);
    }

    /// The running turn's model call was refused for a spent budget: the turn ends FAILED with
    /// the refusal as its error, at once (whatever the agent makes of the refusal), and the agent
    /// is asked to stop it; the session takes its next turn once the agent has answered.
    async fn on_budget_spent(&mut self, reason: String) -> Result<()> {
        self.fail_turn_for_the_harness(reason).await
    }

    /// Ends the running turn FAILED with `reason` at once (whatever the agent makes of it), and
    /// asks the agent to stop it; the session takes its next turn once the agent has answered
    /// (or `cancel_grace` has run out).
    pub(super) async fn fail_turn_for_the_harness(&mut self, reason: String) -> Result<()> {
        let Some(turn) = self.work.turn.as_mut() else {
            return Ok(());
        };
        if turn.failed_by_harness || !self.runtime.state.is_ready() {
            return Ok(());
        }
        turn.failed_by_harness = true;
        let action_id = turn.action_id;
        let mut out = Out::default();
        self.log_event(
            &mut out,
            json!({"event": crate::acp::transcript::TURN_FAILED_EVENT,
                   "failed_turn": action_id.to_string(), "detail": reason}),
            Some(action_id),
        );
        self.cancel_turn(&mut out, action_id, HARNESS_ACTOR);
        self.flush(out).await
    }

    pub(super) async fn on_stop(
        &mut self,
        action_id: ActionId,
        fingerprint: String,
        actor: &str,
        clear_queue: bool,
    ) -> Result<ControlOutcome> {
        let mut out = Out::default();
        out.record_action(action_id, fingerprint, ActionState::Sent);
        if clear_queue {
            self.clear_queue(&mut out);
        }
        if self.runtime.state.is_ready() {
            self.cancel_turn(&mut out, action_id, actor);
        } else {
            // No ACP session to cancel (starting, suspended or disconnected): the stop is
            // recorded, and clears the queue when asked.
            self.log_event(
                &mut out,
                json!({"event": "stop", "clear_queue": clear_queue,
                       "note": "no runtime turn to cancel"}),
                Some(action_id),
            );
        }
        self.flush(out).await?;
        Ok(sent(action_id))
    }

    pub(super) async fn send_config(
        &mut self,
        action_id: ActionId,
        fingerprint: String,
        actor: &str,
        config_id: &str,
        value: ConfigValue,
    ) -> Result<ControlOutcome> {
        let frame = acp_frames::set_config_option_request(
            &action_id,
            self.acp_session_id(),
            config_id,
            &value,
        );
        let mut out = Out::default();
        out.record_action(action_id, fingerprint, ActionState::Sent);
        self.log_send(&mut out, &frame, actor, Some(action_id));
        self.flush(out).await?;
        self.expect(
            &frame["id"],
            PendingKind::SetConfig { action_id },
            "session/set_config_option",
        );
        Ok(sent(action_id))
    }

    pub(super) async fn send_answer(
        &mut self,
        action_id: ActionId,
        fingerprint: String,
        actor: &str,
        request_id: &JsonRpcId,
        frame: Value,
    ) -> Result<ControlOutcome> {
        let mut out = Out::default();
        out.record_action(action_id, fingerprint, ActionState::Sent);
        self.log_send(&mut out, &frame, actor, Some(action_id));
        // Kept whole (options and order) in case the answer cannot be stored.
        let held = self.work.held.clone();
        self.work.held.release(request_id);
        self.refresh_status(&mut out);
        if let Err(error) = self.flush(out).await {
            // Nothing was sent: the request stays held, exactly as it was.
            self.work.held = held;
            return Err(error);
        }
        if let Some(trace) = self.turn_trace() {
            trace.wait_ended(request_id, "answered");
        }
        Ok(sent(action_id))
    }

    pub(super) async fn on_edit(
        &mut self,
        principal: Principal,
        action_id: ActionId,
        text: String,
    ) -> Result<QueuedEntry> {
        if self.record.status == SessionStatus::Closed {
            return Err(Error::new(
                ErrorCode::SessionClosed,
                "the session is closed",
            ));
        }
        let limits = self.ctx.limits.clone();
        limits.check_prompt(&PromptAction::text(text.clone()))?;
        let before = self.work.queue.get(&action_id).cloned();
        // A user cannot speak under a service's trigger: a user's edit drops the context.
        let drop_context = principal.kind != PrincipalKind::Service;
        let entry = self
            .work
            .queue
            .edit(&action_id, text, principal.actor(), drop_context)?
            .clone();
        let mut out = Out::default();
        out.batch.queue.push(QueueOp::Update(entry.clone()));
        out.queue_changed = true;
        if let Err(error) = self.flush(out).await {
            if let Some(before) = before {
                let restored: Vec<QueuedEntry> = self
                    .work
                    .queue
                    .entries()
                    .map(|e| {
                        if e.action_id == action_id {
                            before.clone()
                        } else {
                            e.clone()
                        }
                    })
                    .collect();
                self.work.queue = Queue::from_entries(restored);
            }
            return Err(error);
        }
        Ok(entry)
    }

    pub(super) async fn on_remove(&mut self, action_id: ActionId) -> Result<()> {
        let before: Vec<QueuedEntry> = self.work.queue.entries().cloned().collect();
        self.work.queue.remove(&action_id)?;
        let mut out = Out::default();
        out.batch.queue.push(QueueOp::Remove(action_id));
        out.batch
            .action_states
            .push((action_id, ActionState::Removed));
        out.queue_changed = true;
        if let Err(error) = self.flush(out).await {
            self.work.queue = Queue::from_entries(before);
            return Err(error);
        }
        self.arm_idle_timer();
        Ok(())
    }

    pub(super) async fn on_close(&mut self) -> Result<SessionRecord> {
        if self.record.status == SessionStatus::Closed {
            return Ok(self.record.clone());
        }
        let had_runtime = self.runtime.state.is_up();
        self.stop_runtime();
        let open_turn = self.fail_running_turn();
        let mut out = Out::default();
        self.clear_queue(&mut out);
        let mut event = json!({"event": "session_closed", "epoch": self.runtime.epoch});
        if had_runtime {
            event["runtime_stopped"] = true.into();
        }
        if let Some(turn) = open_turn {
            event["failed_turn"] = turn.to_string().into();
        }
        self.log_event(&mut out, event, open_turn);
        self.record.status = SessionStatus::Closed;
        self.record.status_reason = "closed".to_owned();
        self.touch(&mut out);
        self.flush(out).await?;
        Ok(self.record.clone())
    }

    pub(super) async fn on_delete(&mut self) -> Result<()> {
        self.stop_runtime();
        self.ctx.store.delete_session(self.record.id).await?;
        self.shared.publish(SessionEvent::Deleted);
        self.finished = true;
        Ok(())
    }
}

fn queued(action_id: ActionId, position: u32) -> ControlOutcome {
    ControlOutcome {
        action_id,
        status: ControlStatus::Queued(position),
    }
}

pub(super) fn draining() -> Error {
    Error::new(
        ErrorCode::Draining,
        "the server is draining: new sessions and turns go elsewhere",
    )
}
