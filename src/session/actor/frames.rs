//! Frames from the runtime: logged first, then reacted to — responses end turns and handshake
//! steps, agent requests are held or answered, notifications update state — and the dispatch
//! of the next queued turn.

use serde_json::{Value, json};
use tracing::Instrument;

use super::{Actor, HARNESS_ACTOR, Out, PendingKind, RUNTIME_ACTOR, Turn, spans::WaitKind};
use crate::session::{
    PermissionPolicy,
    interactions::{self, HeldElicitation, HeldPermission, Released, RuleMatch, answer_json},
};
use crate::{
    acp::{
        connection::{Inbound, InvalidLine, RuntimeEvent},
        frames::{self as acp_frames, PromptOptions, RpcErrorCode, rpc_code},
        primer::{self, ContextPrimer},
        views::{
            CancelParams, Envelope, Params, PromptResult, RawParams, Reply, SessionResult,
            UpdateParams, view,
        },
    },
    domain::{
        ActionId, ElicitationAnswer, ErrorCode, JsonRpcId, PermissionAnswer, Result,
        queue::{Queue, QueuedEntry, QueuedWork},
        session::SessionStatus,
    },
    store::{ActionRecord, ActionState, Direction, QueueOp},
};
use std::time::Instant;

/// Why a runtime was stopped after a cancelled turn (the event's reason and the status reason).
const RESTARTED_AFTER_CANCEL: &str = "restarted after a cancelled turn (restart_after_cancel)";
/// Why a runtime was stopped after its agent answered a prompt with an error.
const RESTARTED_AFTER_ERROR: &str = "restarted after a failed turn (restart_after_error)";

/// How a turn ended, as far as restarting its runtime goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TurnEnd {
    /// The agent answered (any stop reason but `cancelled`).
    Answered,
    /// A stop was sent, or the agent answered `cancelled`.
    Cancelled,
    /// The agent answered the prompt with a JSON-RPC error.
    Error,
}

impl Actor {
    pub(super) async fn on_runtime_events(&mut self, events: Vec<RuntimeEvent>) {
        let mut out = Out::default();
        let mut frames = Vec::new();
        let mut terminal = None;
        for event in events {
            if self.runtime.state.conn().map(|c| c.epoch) != Some(event.epoch) {
                continue; // from an earlier connection
            }
            match event.inbound {
                Inbound::Frame { raw, value } => {
                    let action_id = self.attribute(&value);
                    self.log(
                        &mut out,
                        Direction::FromRuntime,
                        raw,
                        RUNTIME_ACTOR,
                        action_id,
                    );
                    frames.push(value);
                }
                other => {
                    terminal = Some(other);
                    break;
                }
            }
        }
        let usage = self.meter(&mut out, &frames).await;
        let replaced_status = terminal
            .is_none()
            .then(|| self.end_status_with_answer(&mut out, &frames))
            .flatten();
        if let Err(error) = self.flush(out).await {
            if let Some((status, reason)) = replaced_status {
                self.record.status = status;
                self.record.status_reason = reason;
            }
            self.unmetered();
            // Nothing may be acted on before it is logged.
            return self
                .fault(
                    "storage",
                    format!("could not log runtime frames: {}", error.message),
                )
                .await;
        }
        self.metered(&usage);
        for frame in frames {
            if !self.runtime.state.is_up() {
                break;
            }
            let span = self
                .work
                .turn
                .as_ref()
                .map_or_else(tracing::Span::none, |t| t.span.clone());
            self.react(frame).instrument(span).await;
        }
        if let Some(terminal) = terminal {
            self.on_terminal(terminal).await;
        }
    }

    pub(super) async fn on_terminal(&mut self, inbound: Inbound) {
        match inbound {
            Inbound::Invalid {
                reason,
                preview,
                length,
            } => {
                let (kind, detail) = match reason {
                    InvalidLine::NotJson(why) => (
                        "invalid_line",
                        format!("the runtime wrote a line that is not JSON-RPC ({why})"),
                    ),
                    InvalidLine::TooLong => (
                        "line_too_long",
                        format!(
                            "the runtime wrote a line over the limit of {} bytes",
                            self.ctx.limits.runtime_line_bytes
                        ),
                    ),
                };
                // The line itself is logged as an event holding its first 1 KiB and its length.
                let mut out = Out::default();
                self.log_event(
                    &mut out,
                    json!({"event": "invalid_line", "kind": kind, "length": length, "preview": preview}),
                    self.work.turn.as_ref().map(|t| t.action_id),
                );
                let _ = self.flush(out).await;
                self.fault(kind, detail).await;
            }
            Inbound::Closed => {
                if let Some((kind, detail)) = self.on_output_closed() {
                    self.fault(kind, detail).await;
                }
            }
            Inbound::WriteFailed(why) => {
                self.fault(
                    "input_closed",
                    format!("could not write to the runtime: {why}"),
                )
                .await;
            }
            Inbound::Frame { .. } => unreachable!("frames are not terminal"),
        }
    }

    /// The action an inbound frame belongs to: the request it answers, else the running turn.
    pub(super) fn attribute(&self, frame: &Value) -> Option<ActionId> {
        let envelope: Envelope = view(frame);
        // A reply has no `method` at all; one of another shape still makes it no reply.
        if envelope.method.is_missing()
            && let Some(id) = &envelope.id
        {
            if let Some(action_id) = ActionId::from_jsonrpc_id(id) {
                return Some(action_id);
            }
            if self
                .runtime
                .state
                .conn()
                .is_some_and(|c| c.pending.contains_key(&id.to_string()))
            {
                return None;
            }
        }
        self.work.turn.as_ref().map(|t| t.action_id)
    }

    pub(super) async fn react(&mut self, frame: Value) {
        let envelope: Envelope = view(&frame);
        match (envelope.method.ok(), envelope.id) {
            (Some(method), Some(id)) => {
                let params = view::<RawParams>(&frame).params.unwrap_or(Value::Null);
                self.on_agent_request(&id, method, &params).await
            }
            (Some(method), None) => self.on_agent_notification(method, &frame).await,
            (None, Some(id)) => self.on_response(&id, &frame).await,
            (None, None) => {}
        }
    }

    pub(super) async fn on_response(&mut self, id: &Value, frame: &Value) {
        let pending = self
            .runtime
            .state
            .conn_mut()
            .and_then(|c| c.pending.remove(&id.to_string()));
        if let Some(pending) = pending {
            return match pending.kind {
                PendingKind::SetConfig { action_id } => {
                    self.on_set_config_response(action_id, frame).await
                }
                kind => self.on_handshake_response(kind, frame).await,
            };
        }
        if let Some((ended, stop_reason)) = self.turn_end_of(id, frame) {
            if let Some(turn) = &self.work.turn {
                turn.ended(if turn.failed_by_harness {
                    "failed"
                } else {
                    stop_reason
                });
            }
            self.end_turn(ended).await;
        }
    }

    /// How the running turn ends when `frame` (a reply with this `id`) answers its prompt, and
    /// the stop reason; `None` when it answers something else.
    fn turn_end_of<'f>(&self, id: &Value, frame: &'f Value) -> Option<(TurnEnd, &'f str)> {
        let action_id = ActionId::from_jsonrpc_id(id)?;
        let turn = self
            .work
            .turn
            .as_ref()
            .filter(|t| t.action_id == action_id)?;
        let reply: Reply<PromptResult> = view(frame);
        let stop_reason = match &reply.result {
            Some(result) => result.stop_reason.unwrap_or("end_turn"),
            None => "failed",
        };
        let ended = if stop_reason == "cancelled" || turn.cancel_deadline.is_some() {
            TurnEnd::Cancelled
        } else if reply.error.is_some() {
            TurnEnd::Error
        } else {
            TurnEnd::Answered
        };
        Some((ended, stop_reason))
    }

    /// Why the runtime restarts after a turn that ended so, if it does.
    fn restart_after(&self, ended: TurnEnd) -> Option<&'static str> {
        let resilience = &self.profile.resilience;
        let reason = match ended {
            TurnEnd::Cancelled if resilience.restart_after_cancel => RESTARTED_AFTER_CANCEL,
            TurnEnd::Error if resilience.restart_after_error => RESTARTED_AFTER_ERROR,
            _ => return None,
        };
        self.profile
            .can_come_back(self.record.can_resume, self.record.can_load)
            .then_some(reason)
    }

    /// The common end of a turn — a batch of the agent's lines whose last is its answer to the
    /// running prompt, after plain updates only, with no restart to follow — changes nothing
    /// but the session's status. That status goes into the batch that logs the answer, so the
    /// turn ends in one commit, not two, and the answer reaches subscribers without waiting
    /// behind a second one. The reactions still come after the commit, in order; the turn's
    /// end then finds the status already stored and commits nothing more. Anything less plain
    /// (a request, a cancel, a config change, a restart) keeps the two steps. Returns the status
    /// and reason it replaced, for the caller to put back if the batch is not stored.
    fn end_status_with_answer(
        &mut self,
        out: &mut Out,
        frames: &[Value],
    ) -> Option<(SessionStatus, String)> {
        let (answer, before) = frames.split_last()?;
        if !self.runtime.state.is_ready() || self.record.status == SessionStatus::Closed {
            return None;
        }
        let envelope: Envelope = view(answer);
        let id = envelope.id.filter(|_| envelope.method.is_missing())?;
        let plain_end = self
            .turn_end_of(&id, answer)
            .is_some_and(|(ended, _)| self.restart_after(ended).is_none());
        if !plain_end || !before.iter().all(is_plain_update) {
            return None;
        }
        // What `end_turn` would store: no turn and nothing held.
        if self.record.status == SessionStatus::Idle {
            return None;
        }
        let replaced = (
            std::mem::replace(&mut self.record.status, SessionStatus::Idle),
            std::mem::take(&mut self.record.status_reason),
        );
        self.touch(out);
        Some(replaced)
    }

    pub(super) async fn on_set_config_response(&mut self, action_id: ActionId, frame: &Value) {
        let mut out = Out::default();
        let reply: Reply<SessionResult> = view(frame);
        if let Some(result) = reply.result {
            self.adopt_config_options(result.config_options);
            self.touch(&mut out);
        } else {
            tracing::info!(session = %self.record.id, %action_id, "the runtime refused a config change");
        }
        if self.runtime.state.is_creating() {
            let model_request = match self.runtime.state.purpose() {
                Some(super::StartPurpose::Create { model_request, .. }) => *model_request,
                _ => None,
            };
            // The model the caller asked for is required; a profile's config option is not.
            if let Some(error) = reply.error
                && model_request == Some(action_id)
            {
                let message = error.message.unwrap_or("refused");
                return self
                    .startup_fault(
                        ErrorCode::ModelNotAdvertised,
                        format!("the runtime refused the requested model: {message}"),
                    )
                    .await;
            }
            if !self.setting_pending() {
                return self.become_ready(out).await;
            }
        }
        // A setting re-applied after a reopen: refused or not, the session goes on once the
        // agent has answered every one of them.
        if self.runtime.state.is_reopening() && !self.setting_pending() {
            return self.become_ready(out).await;
        }
        let _ = self.flush(out).await;
    }

    /// The running turn ended (how: see [`TurnEnd`]).
    pub(super) async fn end_turn(&mut self, ended: TurnEnd) {
        self.work.turn = None;
        // Held requests of the turn are released: a later answer gets *_NOT_PENDING.
        self.work.held.clear();
        if let Some(reason) = self.restart_after(ended) {
            return self.restart_runtime_after_turn(reason).await;
        }
        let mut out = Out::default();
        self.refresh_status(&mut out);
        if out.batch.is_empty() {
            // The status was stored with the agent's answer (`end_status_with_answer`), so
            // nothing is committed here; the idle timer starts now that no turn runs.
            self.arm_idle_timer();
        }
        let _ = self.flush(out).await;
        self.dispatch_next().await;
    }

    /// `restart_after_cancel`, `restart_after_error`: some agents desync after a cancel or a
    /// failed turn (a later prompt gets the earlier one's reply), so the runtime is stopped
    /// (gracefully) and the session SUSPENDED; queued work reopens it at once, else the next
    /// turn does.
    async fn restart_runtime_after_turn(&mut self, reason: &'static str) {
        self.stop_runtime();
        let mut out = Out::default();
        self.log_event(
            &mut out,
            json!({"event": "runtime_stopped", "epoch": self.runtime.epoch, "reason": reason}),
            None,
        );
        self.record.status = SessionStatus::Suspended;
        self.record.status_reason = reason.to_owned();
        self.touch(&mut out);
        if let Err(error) = self.flush(out).await {
            tracing::error!(session = %self.record.id, %error, "could not record a restart after a cancel");
        }
        if !self.work.queue.is_empty() && !self.ctx.is_draining() {
            crate::session::metrics::reopened(crate::session::metrics::ReopenReason::AfterTurn);
            Box::pin(self.start_runtime(super::StartPurpose::Reopen)).await;
        }
    }

    pub(super) async fn on_agent_request(&mut self, id: &Value, method: &str, params: &Value) {
        let Some(agent_id) = JsonRpcId::from_json(id) else {
            return; // not a request ACP allows; nothing can answer it
        };
        let turn = self.work.turn.as_ref().map(|t| t.action_id);
        let mut out = Out::default();
        match method {
            "session/request_permission" => {
                let options = interactions::offered_options(params);
                // Rules come before the policy; a rule that says `ask` holds the
                // request even under auto-accept.
                let rule =
                    interactions::apply_rules(&self.profile.permission_rules, params, &options);
                if let Some(RuleMatch {
                    index,
                    decision,
                    answer: Some(answer),
                }) = &rule
                {
                    self.log_event(
                        &mut out,
                        json!({"event": "permission_decided", "request_id": id, "by": "rule",
                               "rule": index, "decision": decision,
                               "answer": answer_json(answer)}),
                        turn,
                    );
                    let frame = acp_frames::permission_response(&agent_id, answer);
                    self.log_send(&mut out, &frame, HARNESS_ACTOR, turn);
                } else if rule.is_none()
                    && self.profile.permission_policy == PermissionPolicy::AutoAccept
                {
                    let answer = interactions::auto_accept(&options);
                    let frame = acp_frames::permission_response(&agent_id, &answer);
                    self.log_send(&mut out, &frame, HARNESS_ACTOR, turn);
                } else {
                    if let Some(RuleMatch {
                        index, decision, ..
                    }) = &rule
                    {
                        self.log_event(
                            &mut out,
                            json!({"event": "permission_held", "request_id": id, "by": "rule",
                                   "rule": index, "decision": decision}),
                            turn,
                        );
                    }
                    if let Some(trace) = self.turn_trace() {
                        trace.wait_began(&agent_id, WaitKind::Permission);
                    }
                    self.work.held.permissions.push(HeldPermission {
                        id: agent_id,
                        options,
                        deadline: self.profile.permission_timeout.map(|t| Instant::now() + t),
                    });
                    self.refresh_status(&mut out);
                }
            }
            "elicitation/create" => {
                match interactions::elicitation_refusal(params, &self.work.held) {
                    Some(reason) => {
                        let frame = acp_frames::error_response(
                            id,
                            rpc_code(RpcErrorCode::InvalidParams),
                            reason,
                        );
                        self.log_send(&mut out, &frame, HARNESS_ACTOR, turn);
                    }
                    None => {
                        if let Some(trace) = self.turn_trace() {
                            trace.wait_began(&agent_id, WaitKind::Elicitation);
                        }
                        self.work.held.elicitation = Some(HeldElicitation { id: agent_id });
                        self.refresh_status(&mut out);
                    }
                }
            }
            _ => {
                let message = format!("method not found: {method} is not served by this client");
                let frame = acp_frames::error_response(
                    id,
                    rpc_code(RpcErrorCode::MethodNotFound),
                    &message,
                );
                self.log_send(&mut out, &frame, HARNESS_ACTOR, turn);
            }
        }
        if let Err(e) = self.flush(out).await {
            self.fault("storage", e.message).await;
        }
    }

    pub(super) async fn on_agent_notification(&mut self, method: &str, frame: &Value) {
        match method {
            "session/update" => {
                self.trace_update(frame);
                // (Usage was recorded with the frame: `meter`.)
                let params: Params<UpdateParams> = view(frame);
                if let Some(update) = params.params.and_then(|p| p.update)
                    && update.session_update == Some("config_option_update")
                {
                    self.adopt_config_options(update.config_options);
                    let mut out = Out::default();
                    self.touch(&mut out);
                    let _ = self.flush(out).await;
                }
            }
            "$/cancel_request" => {
                let params: Params<CancelParams> = view(frame);
                let Some(agent_id) = params
                    .params
                    .and_then(|p| p.request_id)
                    .and_then(|id| JsonRpcId::from_json(&id))
                else {
                    return;
                };
                // ACP: the original request still gets an answer; a cancelled one.
                let frame = match self.work.held.release(&agent_id) {
                    Some(Released::Permission) => {
                        acp_frames::permission_response(&agent_id, &PermissionAnswer::Cancelled)
                    }
                    Some(Released::Elicitation) => {
                        acp_frames::elicitation_response(&agent_id, &ElicitationAnswer::Cancel)
                    }
                    None => return,
                };
                if let Some(trace) = self.turn_trace() {
                    trace.wait_ended(&agent_id, "withdrawn");
                }
                let mut out = Out::default();
                let turn = self.work.turn.as_ref().map(|t| t.action_id);
                self.log_send(&mut out, &frame, HARNESS_ACTOR, turn);
                self.refresh_status(&mut out);
                let _ = self.flush(out).await;
            }
            _ => {}
        }
    }

    /// Sends the next queued action when the runtime is ready and no turn runs. Taking the head
    /// of the queue and appending its frame are one store transaction.
    pub(super) async fn dispatch_next(&mut self) {
        if !self.runtime.state.is_ready() || self.work.turn.is_some() || self.ctx.is_draining() {
            return;
        }
        let Some(entry) = self.work.queue.front().cloned() else {
            return;
        };
        self.work.queue.pop_front();
        if let Err(error) = self.dispatch_entry(entry.clone(), None, true).await {
            tracing::error!(session = %self.record.id, %error, "could not dispatch the queue head");
            // Nothing changed in the store: put it back.
            let mut queue: Vec<QueuedEntry> = vec![entry];
            queue.extend(self.work.queue.entries().cloned());
            self.work.queue = Queue::from_entries(queue);
        }
    }

    /// After a `context_rebuilt` (a fresh ACP session in place of one the agent lost), the
    /// transcript the next prompt carries; the fold says whether one is due, so it survives a
    /// restart of the harness.
    async fn context_primer(&mut self) -> Result<Option<ContextPrimer>> {
        let fold = match self.fold.take() {
            Some(fold) => fold,
            None => self.fold_log().await?,
        };
        let budget = self.profile.resilience.reopen_context_bytes;
        let primer = fold
            .context_rebuilt()
            .and_then(|reason| primer::build(fold.messages(), budget, reason));
        self.fold = Some(fold);
        Ok(primer)
    }

    /// Logs and sends a turn's `session/prompt`. `new_action`: the fingerprint when the action id
    /// is recorded by this very step (not yet queued); `from_queue`: it was the queue head.
    pub(super) async fn dispatch_entry(
        &mut self,
        entry: QueuedEntry,
        new_action: Option<String>,
        from_queue: bool,
    ) -> Result<()> {
        let primer = match &entry.work {
            QueuedWork::Prompt(_) => self.context_primer().await?,
            QueuedWork::Compact => None,
        };
        let turn = Turn::new(
            self.record.id,
            entry.action_id,
            &self.record.profile,
            &self.ctx.traces,
            entry.traceparent.as_deref(),
            &self.turn_slot,
            self.profile.turn_timeout,
        );
        // Traced, the agent's spans hang under the turn's; else the caller's context goes on.
        let traceparent = turn
            .trace
            .traceparent()
            .or_else(|| entry.traceparent.clone());
        let frame = match &entry.work {
            QueuedWork::Prompt(prompt) => acp_frames::prompt_request(
                &entry.action_id,
                self.acp_session_id(),
                prompt,
                PromptOptions {
                    meta_key: &self.ctx.meta_key,
                    context: entry.context.as_ref(),
                    traceparent: traceparent.as_deref(),
                    primer: primer.as_ref(),
                },
            ),
            QueuedWork::Compact => {
                acp_frames::compact_request(&entry.action_id, self.acp_session_id())
            }
        };
        let mut out = Out::default();
        if from_queue {
            out.batch.queue.push(QueueOp::Remove(entry.action_id));
            out.batch
                .action_states
                .push((entry.action_id, ActionState::Sent));
            out.queue_changed = true;
        }
        if let Some(fingerprint) = new_action {
            out.batch.new_actions.push(ActionRecord {
                action_id: entry.action_id,
                fingerprint,
                state: ActionState::Sent,
                created_at: entry.created_at,
            });
        }
        if self.record.name.is_empty()
            && let QueuedWork::Prompt(prompt) = &entry.work
            && let Some(name) = self.ctx.limits.session_name_from_prompt(&prompt.prompt)
        {
            self.record.name = name;
            self.touch(&mut out);
        }
        self.log_send(&mut out, &frame, &entry.actor, Some(entry.action_id));
        let previous = self.work.turn.replace(turn);
        self.refresh_status(&mut out);
        if let Err(error) = self.flush(out).await {
            self.work.turn = previous;
            self.record.status = self.live_status();
            return Err(error);
        }
        Ok(())
    }
}

/// A `session/update` notification whose reaction writes nothing (it is not a config change).
fn is_plain_update(frame: &Value) -> bool {
    let envelope: Envelope = view(frame);
    if envelope.method.ok() != Some("session/update") || envelope.id.is_some() {
        return false;
    }
    let params: Params<UpdateParams> = view(frame);
    params
        .params
        .and_then(|p| p.update)
        .is_none_or(|update| update.session_update != Some("config_option_update"))
}
