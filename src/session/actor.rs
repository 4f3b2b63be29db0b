//! One actor per agent session. It owns the runtime connection, the turn, the queue and the held
//! interactions, and serialises control, runtime frames and queue edits, so edits never race
//! dispatch. It never awaits a person or a slow operation while reading the runtime: requests
//! for a person are parked and answered later. Every frame is logged before it is acted on
//! (inbound: append, then react; outbound: append, then send).

use std::{
    collections::HashMap,
    io,
    process::ExitStatus,
    sync::Arc,
    time::{Duration, Instant},
};

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};
use tracing::Instrument;

use super::{
    Command, ControlOutcome, ControlStatus, EngineContext, SessionEvent, SessionHandle, Shared,
    interactions::{self, Held, HeldElicitation, HeldPermission, Released},
};
use crate::{
    acp::{
        connection::{self, Inbound, InvalidLine, LineWriter, RuntimeEvent},
        process::{self, RuntimeKiller, StderrTail},
    },
    config::{PermissionPolicy, Profile},
    domain::{
        Action, ActionId, ElicitationAnswer, Error, ErrorCode, JsonRpcId, PermissionAnswer,
        Principal, PrincipalKind, PromptAction, Result,
        acp_frames::{self, ConfigValue, PromptOptions, ReopenMethod},
        queue::{Queue, QueuedEntry, QueuedWork},
        session::{SessionRecord, SessionStatus},
    },
    grpc::convert::ControlInput,
    store::{ActionRecord, ActionState, Batch, Direction, LogEntry, QueueOp},
    telemetry::metrics,
};

/// Actor of the log entries the runtime wrote.
pub const RUNTIME_ACTOR: &str = "runtime";
/// Actor of entries the harness made on its own (handshake, events, automatic answers).
pub const HARNESS_ACTOR: &str = "harness";
/// How long to wait for a runtime's output to close after its process exited.
const EXIT_DRAIN: Duration = Duration::from_secs(2);
/// How long to wait for a runtime to exit after its output closed, before calling it a closed
/// output of a live process.
const CLOSE_GRACE: Duration = Duration::from_millis(250);
/// How long to wait for a dead runtime's stderr so its tail is complete.
const STDERR_DRAIN: Duration = Duration::from_millis(500);
/// Characters of stderr quoted in a status reason or error.
const STDERR_QUOTE_CHARS: usize = 2000;
/// Runtime events folded into one log commit at most.
const INBOUND_BATCH: usize = 256;

/// How a session's runtime is being started.
pub(crate) enum StartPurpose {
    /// A new session: `ready` answers CreateSession.
    Create {
        ready: oneshot::Sender<Result<Option<ActionId>>>,
        model: Option<String>,
        first_prompt: Option<FirstPrompt>,
    },
    /// A new epoch for an existing session.
    Reopen,
}

/// The first prompt of a session opened by an origin.
pub(crate) struct FirstPrompt {
    pub action_id: ActionId,
    pub prompt: PromptAction,
    pub actor: String,
    pub traceparent: Option<String>,
}

enum PendingKind {
    Initialize,
    NewSession,
    Reopen(ReopenMethod),
    SetConfig { action_id: ActionId },
}

struct Pending {
    kind: PendingKind,
    method: &'static str,
    deadline: Instant,
}

struct Conn {
    epoch: u32,
    writer: LineWriter,
    killer: RuntimeKiller,
    stderr: Arc<StderrTail>,
    exited: Option<oneshot::Receiver<io::Result<ExitStatus>>>,
    exit_status: Option<String>,
    /// The reader saw the end of the runtime's output.
    output_closed: bool,
    /// When to stop waiting for the other half of an ending (exit, or end of output).
    exit_deadline: Option<Instant>,
    next_id: u64,
    _permit: OwnedSemaphorePermit,
}

struct Turn {
    action_id: ActionId,
    cancel_deadline: Option<Instant>,
    span: tracing::Span,
    started: Instant,
}

impl Turn {
    fn new(session: uuid::Uuid, action_id: ActionId) -> Self {
        let span = tracing::info_span!("turn", %session, %action_id);
        span.in_scope(|| tracing::debug!("turn started"));
        Self {
            action_id,
            cancel_deadline: None,
            span,
            started: Instant::now(),
        }
    }

    /// Records how the turn ended (metrics and its span).
    fn ended(&self, stop_reason: &str) {
        metrics::turn_ended(stop_reason);
        let millis = self.started.elapsed().as_millis() as u64;
        self.span
            .in_scope(|| tracing::info!(stop_reason, duration_ms = millis, "turn ended"));
    }
}

/// What one step produces: a batch to commit, then lines to send, then events to publish.
#[derive(Default)]
struct Out {
    batch: Batch,
    send: Vec<Arc<str>>,
    queue_changed: bool,
}

impl Out {
    /// Records a new action id in this step (unique per session forever).
    fn record_action(&mut self, action_id: ActionId, fingerprint: String, state: ActionState) {
        self.batch.new_actions.push(ActionRecord {
            action_id,
            fingerprint,
            state,
            created_at: crate::domain::now(),
        });
    }
}

fn sent(action_id: ActionId) -> ControlOutcome {
    ControlOutcome {
        action_id,
        status: ControlStatus::Sent,
    }
}

pub(crate) struct Actor {
    ctx: Arc<EngineContext>,
    shared: Arc<Shared>,
    record: SessionRecord,
    profile: Arc<Profile>,
    head: u64,
    epoch: u32,
    commands: mpsc::Receiver<Command>,
    runtime_tx: mpsc::Sender<RuntimeEvent>,
    runtime_rx: mpsc::Receiver<RuntimeEvent>,
    conn: Option<Conn>,
    starting: Option<StartPurpose>,
    pending: HashMap<String, Pending>,
    turn: Option<Turn>,
    queue: Queue,
    held: Held,
    config_options: Vec<Value>,
    idle_deadline: Option<Instant>,
    /// Set when the session was deleted (or its creation failed): the actor stops.
    finished: bool,
}

/// Capacity of a session's command channel.
const COMMAND_CAPACITY: usize = 64;
/// Capacity of the channel from the runtime reader to the actor.
const RUNTIME_CAPACITY: usize = 1024;

/// The state a session actor starts from.
pub(crate) struct Resume {
    pub record: SessionRecord,
    pub head: u64,
    pub epoch: u32,
    pub queue: Vec<QueuedEntry>,
    /// Loaded at harness start: its runtime died with the previous harness process.
    pub after_restart: bool,
}

impl Actor {
    /// Starts the actor of a session; with a purpose, it starts the runtime at once.
    pub(crate) fn spawn(
        ctx: Arc<EngineContext>,
        profile: Arc<Profile>,
        resume: Resume,
        purpose: Option<StartPurpose>,
    ) -> SessionHandle {
        let (commands_tx, commands) = mpsc::channel(COMMAND_CAPACITY);
        let (runtime_tx, runtime_rx) = mpsc::channel(RUNTIME_CAPACITY);
        let shared = Arc::new(Shared::new(resume.record.clone(), resume.head));
        let after_restart = resume.after_restart;
        let actor = Actor {
            ctx,
            shared: shared.clone(),
            record: resume.record,
            profile,
            head: resume.head,
            epoch: resume.epoch,
            commands,
            runtime_tx,
            runtime_rx,
            conn: None,
            starting: None,
            pending: HashMap::new(),
            turn: None,
            queue: Queue::from_entries(resume.queue),
            held: Held::default(),
            config_options: Vec::new(),
            idle_deadline: None,
            finished: false,
        };
        actor.shared.set_queue_len(actor.queue.len());
        tokio::spawn(actor.run(after_restart, purpose));
        SessionHandle {
            shared,
            commands: commands_tx,
        }
    }

    async fn run(mut self, after_restart: bool, purpose: Option<StartPurpose>) {
        if after_restart {
            Box::pin(self.recover()).await;
        }
        if let Some(purpose) = purpose {
            Box::pin(self.start_runtime(purpose)).await;
        }
        while !self.finished {
            let deadline = self.next_deadline();
            let exited = async {
                match self.conn.as_mut().and_then(|c| c.exited.as_mut()) {
                    Some(exited) => exited.await.ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                Some(first) = self.runtime_rx.recv() => {
                    let mut events = vec![first];
                    while events.len() < INBOUND_BATCH {
                        match self.runtime_rx.try_recv() {
                            Ok(event) => events.push(event),
                            Err(_) => break,
                        }
                    }
                    Box::pin(self.on_runtime_events(events)).await;
                }
                status = exited => Box::pin(self.on_exit(status)).await,
                command = self.commands.recv() => match command {
                    Some(command) => Box::pin(self.on_command(command)).await,
                    None => break,
                },
                _ = sleep_until(deadline) => Box::pin(self.on_deadline()).await,
            }
        }
        if let Some(mut conn) = self.conn.take() {
            conn.killer.kill();
        }
    }

    /// After a harness restart (SPEC §8): a turn that was in flight is closed in the log as
    /// FAILED ("harness restarted") and never re-sent; a session with queued work reopens at once
    /// and drains; the rest are SUSPENDED and reopen on demand.
    async fn recover(&mut self) {
        if !self.record.status.has_runtime() {
            if self.record.status != SessionStatus::Closed
                && !self.queue.is_empty()
                && (self.record.can_resume || self.record.can_load)
            {
                tracing::info!(session = %self.record.id, queued = self.queue.len(), "reopening to drain the queue");
                self.start_runtime(StartPurpose::Reopen).await;
            }
            return;
        }
        let turn_in_flight = matches!(
            self.record.status,
            SessionStatus::Running | SessionStatus::AwaitingInput
        );
        let mut out = Out::default();
        if turn_in_flight {
            self.log_event(
                &mut out,
                json!({"event": "harness_restarted", "epoch": self.epoch,
                       "detail": "the harness restarted during the turn; it is not re-sent"}),
                None,
            );
        }
        if self.record.acp_session_id.is_empty() {
            self.record.status = SessionStatus::Disconnected;
            self.record.status_reason =
                "harness restarted before the runtime finished starting".to_owned();
        } else {
            self.record.status = SessionStatus::Suspended;
            self.record.status_reason = "harness restarted".to_owned();
        }
        self.touch(&mut out);
        if let Err(error) = self.flush(out).await {
            tracing::error!(session = %self.record.id, %error, "could not record the restart");
            return;
        }
        if !self.queue.is_empty() && (self.record.can_resume || self.record.can_load) {
            tracing::info!(session = %self.record.id, queued = self.queue.len(), "reopening to drain the queue");
            self.start_runtime(StartPurpose::Reopen).await;
        }
    }

    // ---- bookkeeping -------------------------------------------------------------------------

    fn ready(&self) -> bool {
        self.conn.is_some() && self.starting.is_none()
    }

    fn acp_session_id(&self) -> &str {
        &self.record.acp_session_id
    }

    fn next_deadline(&self) -> Option<Instant> {
        let pending = self.pending.values().map(|p| p.deadline);
        let cancel = self.turn.as_ref().and_then(|t| t.cancel_deadline);
        let exit = self.conn.as_ref().and_then(|c| c.exit_deadline);
        pending
            .chain(cancel)
            .chain(exit)
            .chain(self.idle_deadline)
            .min()
    }

    /// Appends a log entry to a step's batch, at the next offset.
    fn log(
        &self,
        out: &mut Out,
        direction: Direction,
        json: String,
        actor: &str,
        action_id: Option<ActionId>,
    ) {
        let offset = self.head + out.batch.entries.len() as u64 + 1;
        out.batch.entries.push(LogEntry {
            offset,
            direction,
            json,
            actor: actor.to_owned(),
            action_id,
            epoch: self.epoch,
            created_at: crate::domain::now(),
        });
    }

    /// Logs an outbound frame and schedules it to be sent after the commit.
    fn log_send(&self, out: &mut Out, frame: &Value, actor: &str, action_id: Option<ActionId>) {
        let text = frame.to_string();
        out.send.push(Arc::from(text.as_str()));
        self.log(out, Direction::ToRuntime, text, actor, action_id);
    }

    fn log_event(&self, out: &mut Out, event: Value, action_id: Option<ActionId>) {
        self.log(
            out,
            Direction::Event,
            event.to_string(),
            HARNESS_ACTOR,
            action_id,
        );
    }

    /// The status the session is in, from its live state.
    fn live_status(&self) -> SessionStatus {
        match self.record.status {
            SessionStatus::Closed => SessionStatus::Closed,
            _ if self.conn.is_none() => self.record.status,
            _ if self.starting.is_some() => SessionStatus::Starting,
            _ if !self.held.is_empty() => SessionStatus::AwaitingInput,
            _ if self.turn.is_some() => SessionStatus::Running,
            _ => SessionStatus::Idle,
        }
    }

    /// Puts the record in the batch if the status (or anything else) changed.
    fn refresh_status(&mut self, out: &mut Out) {
        let status = self.live_status();
        if status != self.record.status {
            self.record.status = status;
            if status.has_runtime() {
                self.record.status_reason.clear();
            }
            self.touch(out);
        }
    }

    /// Marks the record changed in this step.
    fn touch(&mut self, out: &mut Out) {
        self.record.updated_at = crate::domain::now();
        out.batch.session = Some(self.record.clone());
    }

    /// Commits a step, then sends its frames and publishes its events. On a storage failure
    /// nothing is sent and the error is returned.
    async fn flush(&mut self, out: Out) -> Result<()> {
        let Out {
            batch,
            send,
            queue_changed,
        } = out;
        if batch.is_empty() {
            return Ok(());
        }
        // Entries are kept for the live feed when someone is subscribed now; a subscriber who
        // registers while the commit runs is caught below (see `publish_entries`).
        let entries = self
            .shared
            .has_live_subscribers()
            .then(|| batch.entries.clone());
        let appended = batch.entries.len() as u64;
        let mut by_direction = [0u64; 3];
        for entry in &batch.entries {
            by_direction[entry.direction as usize] += 1;
        }
        let session_changed = batch.session.is_some();
        if let Err(error) = self.ctx.store.commit(self.record.id, batch).await {
            tracing::error!(session = %self.record.id, %error, "log commit failed");
            // Whatever the store holds is the truth; offsets continue from there.
            self.head = self
                .ctx
                .store
                .head_offset(self.record.id)
                .await
                .unwrap_or(self.head);
            return Err(error);
        }
        self.head += appended;
        self.shared.set_head(self.head);
        for (direction, count) in [
            Direction::ToRuntime,
            Direction::FromRuntime,
            Direction::Event,
        ]
        .into_iter()
        .zip(by_direction)
        {
            if count > 0 {
                metrics::frames_appended(direction, count);
            }
        }
        if session_changed {
            self.shared.set_record(&self.record);
        }
        if let Some(conn) = &self.conn {
            for line in send {
                if let Err(reason) = conn.writer.send(line) {
                    tracing::warn!(session = %self.record.id, reason, "could not send a frame");
                    break;
                }
            }
        }
        self.publish_entries(entries, appended).await;
        if queue_changed {
            self.shared.set_queue_len(self.queue.len());
            let snapshot: Vec<QueuedEntry> = self.queue.entries().cloned().collect();
            self.shared.publish(SessionEvent::Queue(Arc::new(snapshot)));
        }
        if session_changed {
            self.ctx.activity.notify_waiters();
            self.shared.publish(SessionEvent::Status {
                status: self.record.status,
                reason: self.record.status_reason.clone(),
            });
        }
        self.arm_idle_timer();
        Ok(())
    }

    /// Publishes committed entries to the live feed. The check comes after the head moved: a
    /// subscriber registering after it sees the new head and reads these entries from the log;
    /// one registered before it gets them here (read back from the log if they were not kept,
    /// because nobody was subscribed when the commit began).
    async fn publish_entries(&self, kept: Option<Vec<LogEntry>>, appended: u64) {
        if appended == 0 || !self.shared.has_live_subscribers() {
            return;
        }
        let entries = match kept {
            Some(entries) => entries,
            None => self
                .ctx
                .store
                .read_log(self.record.id, self.head - appended, appended as usize)
                .await
                .unwrap_or_default(),
        };
        for entry in entries {
            self.shared.publish(SessionEvent::Entry(Arc::new(entry)));
        }
    }

    fn arm_idle_timer(&mut self) {
        self.idle_deadline = match self.profile.idle_timeout {
            Some(idle) if self.live_status() == SessionStatus::Idle && self.queue.is_empty() => {
                Some(Instant::now() + idle)
            }
            _ => None,
        };
    }

    // ---- runtime lifecycle -------------------------------------------------------------------

    async fn start_runtime(&mut self, purpose: StartPurpose) {
        let permit = match self.ctx.runtime_slots.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                let error = Error::new(
                    ErrorCode::TooManyRuntimes,
                    format!(
                        "the harness runs its maximum of {} live runtimes",
                        self.ctx.limits.live_runtimes
                    ),
                )
                .with("max", self.ctx.limits.live_runtimes);
                return self.start_failed(purpose, error).await;
            }
        };
        let cwd = std::path::PathBuf::from(&self.record.cwd);
        let spawned = match process::spawn(&self.profile, &cwd, &self.ctx.registry) {
            Ok(spawned) => spawned,
            Err(e) => {
                let error = Error::new(
                    ErrorCode::RuntimeStartFailed,
                    format!(
                        "could not start runtime {:?} of profile {}: {e}",
                        self.profile.command, self.profile.name
                    ),
                );
                return self.start_failed(purpose, error).await;
            }
        };
        self.epoch += 1;
        let epoch = self.epoch;
        let writer = LineWriter::start(spawned.stdin, epoch, self.runtime_tx.clone());
        tokio::spawn(connection::read_lines(
            spawned.stdout,
            epoch,
            self.ctx.limits.runtime_line_bytes,
            self.runtime_tx.clone(),
        ));
        self.conn = Some(Conn {
            epoch,
            writer,
            killer: spawned.killer,
            stderr: spawned.stderr,
            exited: Some(spawned.exited),
            exit_status: None,
            output_closed: false,
            exit_deadline: None,
            next_id: 0,
            _permit: permit,
        });
        self.starting = Some(purpose);
        let mut out = Out::default();
        self.log_event(
            &mut out,
            json!({"event": "runtime_started", "epoch": epoch, "pid": spawned.pid,
                   "profile": self.profile.name, "profile_fingerprint": self.record.profile_fingerprint}),
            None,
        );
        let id = self.harness_request_id();
        let frame = acp_frames::initialize_request(id.clone());
        self.expect(&id, PendingKind::Initialize, "initialize");
        self.log_send(&mut out, &frame, HARNESS_ACTOR, None);
        self.refresh_status(&mut out);
        if let Err(error) = self.flush(out).await {
            self.fault("storage", error.message).await;
        }
    }

    fn harness_request_id(&mut self) -> Value {
        let conn = self.conn.as_mut().expect("a runtime is connected");
        let id = acp_frames::harness_request_id(conn.epoch, conn.next_id);
        conn.next_id += 1;
        id
    }

    fn expect(&mut self, id: &Value, kind: PendingKind, method: &'static str) {
        let timeout = self.profile.startup_timeout;
        self.pending.insert(
            id.to_string(),
            Pending {
                kind,
                method,
                deadline: Instant::now() + timeout,
            },
        );
    }

    /// Startup could not even begin (no runtime slot, spawn failed).
    async fn start_failed(&mut self, purpose: StartPurpose, error: Error) {
        match purpose {
            StartPurpose::Create { ready, .. } => {
                let _ = ready.send(Err(error));
                self.finished = true;
            }
            StartPurpose::Reopen => {
                let mut out = Out::default();
                self.log_event(
                    &mut out,
                    json!({"event": "reopen_failed", "reason": error.message}),
                    None,
                );
                self.record.status = SessionStatus::Disconnected;
                self.record.status_reason = error.message.clone();
                self.touch(&mut out);
                let _ = self.flush(out).await;
            }
        }
    }

    /// A reply to a handshake request: the next step, or the failure of the start.
    async fn on_handshake_response(&mut self, kind: PendingKind, response: &Value) {
        if let Some(error) = response.get("error") {
            let code = error
                .get("code")
                .and_then(Value::as_i64)
                .unwrap_or_default();
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("no message");
            let step = match kind {
                PendingKind::Initialize => "initialize",
                PendingKind::NewSession => "session/new",
                PendingKind::Reopen(method) => method.as_str(),
                PendingKind::SetConfig { .. } => "session/set_config_option",
            };
            let reason = format!("{step} failed with error {code}: {message}");
            let code = if code == acp_frames::AUTH_REQUIRED {
                ErrorCode::RuntimeAuthRequired
            } else {
                ErrorCode::RuntimeStartFailed
            };
            return self.startup_fault(code, reason).await;
        }
        let result = response.get("result").cloned().unwrap_or(Value::Null);
        let mut out = Out::default();
        match kind {
            PendingKind::Initialize => {
                let capabilities = result.get("agentCapabilities");
                self.record.can_load = capabilities
                    .and_then(|c| c.get("loadSession"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                self.record.can_resume = capabilities
                    .and_then(|c| c.pointer("/sessionCapabilities/resume"))
                    .is_some_and(|r| !r.is_null());
                self.touch(&mut out);
                let id = self.harness_request_id();
                match self.starting {
                    Some(StartPurpose::Create { .. }) => {
                        let frame = acp_frames::new_session_request(id.clone(), &self.record.cwd);
                        self.expect(&id, PendingKind::NewSession, "session/new");
                        self.log_send(&mut out, &frame, HARNESS_ACTOR, None);
                    }
                    _ => {
                        let method = if self.record.can_resume {
                            ReopenMethod::Resume
                        } else if self.record.can_load {
                            ReopenMethod::Load
                        } else {
                            let _ = self.flush(out).await;
                            return self
                                .startup_fault(
                                    ErrorCode::RuntimeDisconnected,
                                    "the runtime advertises neither session/resume nor session/load"
                                        .into(),
                                )
                                .await;
                        };
                        let frame = acp_frames::reopen_session_request(
                            id.clone(),
                            method,
                            &self.record.acp_session_id,
                            &self.record.cwd,
                        );
                        self.expect(&id, PendingKind::Reopen(method), method.as_str());
                        self.log_send(&mut out, &frame, HARNESS_ACTOR, None);
                    }
                }
                if let Err(e) = self.flush(out).await {
                    self.fault("storage", e.message).await;
                }
            }
            PendingKind::NewSession => {
                let Some(session_id) = result.get("sessionId").and_then(Value::as_str) else {
                    return self
                        .startup_fault(
                            ErrorCode::RuntimeStartFailed,
                            "session/new answered without a sessionId".into(),
                        )
                        .await;
                };
                self.record.acp_session_id = session_id.to_owned();
                self.adopt_config_options(&result);
                self.touch(&mut out);
                let requested_model = match &mut self.starting {
                    Some(StartPurpose::Create { model, .. }) => model.take(),
                    _ => None,
                };
                if let Some(model) = requested_model
                    && model != self.record.model
                {
                    if let Err(error) = self.check_model(&model) {
                        let _ = self.flush(out).await;
                        return self.startup_fault(error.code, error.message).await;
                    }
                    let action_id = ActionId::mint();
                    let config_id = acp_frames::model_config_id(&self.config_options).to_owned();
                    let frame = acp_frames::set_config_option_request(
                        &action_id,
                        self.acp_session_id(),
                        &config_id,
                        &ConfigValue::Id(model.clone()),
                    );
                    let id = frame["id"].clone();
                    self.expect(
                        &id,
                        PendingKind::SetConfig { action_id },
                        "session/set_config_option",
                    );
                    out.record_action(
                        action_id,
                        fingerprint(&Action::SetModel { model }, &None, false),
                        ActionState::Sent,
                    );
                    let actor = self.record.owner.clone();
                    self.log_send(&mut out, &frame, &actor, Some(action_id));
                    if let Err(e) = self.flush(out).await {
                        self.fault("storage", e.message).await;
                    }
                } else {
                    self.become_ready(out).await;
                }
            }
            PendingKind::Reopen(_) => {
                self.adopt_config_options(&result);
                self.touch(&mut out);
                self.become_ready(out).await;
            }
            PendingKind::SetConfig { .. } => unreachable!("handled as a control response"),
        }
    }

    /// The handshake is done: answer CreateSession, send the first prompt, drain the queue.
    async fn become_ready(&mut self, mut out: Out) {
        let purpose = self.starting.take();
        self.refresh_status(&mut out);
        if let Err(e) = self.flush(out).await {
            return self.fault("storage", e.message).await;
        }
        match purpose {
            Some(StartPurpose::Create {
                ready,
                first_prompt,
                ..
            }) => {
                let mut first_action_id = None;
                if let Some(first) = first_prompt {
                    let entry = QueuedEntry {
                        action_id: first.action_id,
                        work: QueuedWork::Prompt(first.prompt),
                        context: None,
                        actor: first.actor,
                        created_at: crate::domain::now(),
                        traceparent: first.traceparent,
                    };
                    let fp = fingerprint(&entry.work.to_action(), &None, false);
                    match self.dispatch_entry(entry, Some(fp), false).await {
                        Ok(()) => first_action_id = Some(first.action_id),
                        Err(error) => {
                            let _ = ready.send(Err(error));
                            self.finished = true;
                            return;
                        }
                    }
                }
                let _ = ready.send(Ok(first_action_id));
            }
            _ => self.dispatch_next().await,
        }
    }

    fn adopt_config_options(&mut self, result: &Value) {
        if let Some(options) = result.get("configOptions").and_then(Value::as_array) {
            self.config_options = options.clone();
            if let Some(model) = self.current_model() {
                self.record.model = model;
            }
        }
    }

    fn model_option(&self) -> Option<&Value> {
        let id = acp_frames::model_config_id(&self.config_options);
        self.config_options
            .iter()
            .find(|o| o.get("id").and_then(Value::as_str) == Some(id))
    }

    fn current_model(&self) -> Option<String> {
        self.model_option()?
            .get("currentValue")
            .and_then(Value::as_str)
            .map(str::to_owned)
    }

    fn check_model(&self, model: &str) -> Result<()> {
        let advertised = self.model_option().map(select_values).unwrap_or_default();
        if advertised.iter().any(|v| v == model) {
            return Ok(());
        }
        let list = if advertised.is_empty() {
            "none".to_owned()
        } else {
            advertised.join(", ")
        };
        Err(Error::new(
            ErrorCode::ModelNotAdvertised,
            format!("model {model:?} is not advertised by the runtime; advertised: {list}"),
        )
        .with("advertised", list))
    }

    fn check_config_option(&self, config_id: &str, value: &str) -> Result<ConfigValue> {
        let option = self
            .config_options
            .iter()
            .find(|o| o.get("id").and_then(Value::as_str) == Some(config_id))
            .ok_or_else(|| {
                let ids: Vec<&str> = self
                    .config_options
                    .iter()
                    .filter_map(|o| o.get("id").and_then(Value::as_str))
                    .collect();
                Error::new(
                    ErrorCode::ConfigOptionUnknown,
                    format!(
                        "config option {config_id:?} is not advertised; advertised: {}",
                        if ids.is_empty() {
                            "none".to_owned()
                        } else {
                            ids.join(", ")
                        }
                    ),
                )
            })?;
        match option.get("type").and_then(Value::as_str) {
            Some("boolean") => match value {
                "true" => Ok(ConfigValue::Bool(true)),
                "false" => Ok(ConfigValue::Bool(false)),
                _ => Err(Error::new(
                    ErrorCode::ConfigOptionUnknown,
                    format!("config option {config_id:?} is a boolean: use \"true\" or \"false\""),
                )),
            },
            _ => {
                let values = select_values(option);
                if values.iter().any(|v| v == value) {
                    Ok(ConfigValue::Id(value.to_owned()))
                } else {
                    Err(Error::new(
                        ErrorCode::ConfigOptionUnknown,
                        format!(
                            "value {value:?} is not advertised for config option {config_id:?}; advertised: {}",
                            values.join(", ")
                        ),
                    ))
                }
            }
        }
    }

    /// A failure during the handshake: a new session's creation fails; a reopen leaves the
    /// session DISCONNECTED.
    async fn startup_fault(&mut self, code: ErrorCode, reason: String) {
        let tail = self.stderr_tail().await;
        let message = if tail.is_empty() {
            reason.clone()
        } else {
            format!("{reason}; stderr: {tail}")
        };
        if matches!(self.starting, Some(StartPurpose::Create { .. })) {
            self.fail_create(Error::new(code, message));
        } else {
            self.fault("handshake", reason).await;
        }
    }

    /// A new session's runtime failed to come up: kill it and fail CreateSession (the manager
    /// then removes the session).
    fn fail_create(&mut self, error: Error) {
        self.kill_runtime();
        if let Some(StartPurpose::Create { ready, .. }) = self.starting.take() {
            let _ = ready.send(Err(error));
        }
        self.finished = true;
    }

    async fn stderr_tail(&self) -> String {
        let Some(conn) = &self.conn else {
            return String::new();
        };
        conn.stderr.closed(STDERR_DRAIN).await;
        conn.stderr.text(STDERR_QUOTE_CHARS)
    }

    fn kill_runtime(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            conn.killer.kill();
        }
        self.pending.clear();
        self.held.clear();
    }

    /// A runtime fault (SPEC §8): log it, fail the running turn, release held interactions,
    /// kill the process, and leave the session DISCONNECTED with a reason. No automatic respawn.
    async fn fault(&mut self, kind: &str, detail: String) {
        if self.conn.is_none() {
            return;
        }
        let tail = self.stderr_tail().await;
        if matches!(self.starting, Some(StartPurpose::Create { .. })) {
            let message = if tail.is_empty() {
                detail
            } else {
                format!("{detail}; stderr: {tail}")
            };
            return self.fail_create(Error::new(ErrorCode::RuntimeStartFailed, message));
        }
        let epoch = self.epoch;
        let exit = self.conn.as_ref().and_then(|c| c.exit_status.clone());
        self.kill_runtime();
        self.starting = None;
        let failed_turn = self.turn.take().map(|t| {
            t.ended("failed");
            t.action_id
        });
        let mut reason = detail.clone();
        if !tail.is_empty() {
            reason.push_str("; stderr: ");
            reason.push_str(&tail);
        }
        let mut out = Out::default();
        let mut event = json!({"event": "fault", "kind": kind, "detail": detail, "epoch": epoch});
        if let Some(exit) = exit {
            event["exit"] = exit.into();
        }
        if !tail.is_empty() {
            event["stderr_tail"] = tail.into();
        }
        if let Some(turn) = failed_turn {
            event["failed_turn"] = turn.to_string().into();
        }
        self.log_event(&mut out, event, failed_turn);
        self.record.status = SessionStatus::Disconnected;
        self.record.status_reason = reason;
        self.touch(&mut out);
        tracing::warn!(session = %self.record.id, kind, %detail, "runtime fault");
        if let Err(error) = self.flush(out).await {
            tracing::error!(session = %self.record.id, %error, "could not log a runtime fault");
        }
    }

    async fn on_exit(&mut self, status: Option<io::Result<ExitStatus>>) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        conn.exited = None;
        let text = match status {
            Some(Ok(status)) => describe_exit(status),
            Some(Err(e)) => format!("could not be waited for: {e}"),
            None => "ended".to_owned(),
        };
        conn.exit_status = Some(text.clone());
        if conn.output_closed {
            return self.fault("exit", format!("runtime {text}")).await;
        }
        // Its last lines may still be in the pipe: wait for the end of its output.
        conn.exit_deadline = Some(Instant::now() + EXIT_DRAIN);
    }

    /// The end of the runtime's output: a fault once it is clear whether the process exited.
    fn on_output_closed(&mut self) -> Option<(&'static str, String)> {
        let conn = self.conn.as_mut()?;
        conn.output_closed = true;
        match &conn.exit_status {
            Some(exit) => Some(("exit", format!("runtime {exit}"))),
            None => {
                conn.exit_deadline = Some(Instant::now() + CLOSE_GRACE);
                None
            }
        }
    }

    async fn on_deadline(&mut self) {
        let now = Instant::now();
        if let Some(conn) = &self.conn
            && conn.exit_deadline.is_some_and(|d| d <= now)
        {
            return match &conn.exit_status {
                Some(exit) => self.fault("exit", format!("runtime {exit}")).await,
                None => {
                    self.fault("closed_output", "the runtime closed its output".to_owned())
                        .await
                }
            };
        }
        if let Some((key, _)) = self.pending.iter().find(|(_, p)| p.deadline <= now) {
            let key = key.clone();
            let pending = self.pending.remove(&key).expect("just found");
            let detail = format!(
                "no answer to {} within {}",
                pending.method,
                humantime::format_duration(self.profile.startup_timeout)
            );
            return self.fault("timeout", detail).await;
        }
        if self
            .turn
            .as_ref()
            .and_then(|t| t.cancel_deadline)
            .is_some_and(|d| d <= now)
        {
            let detail = format!(
                "the cancelled turn did not end within cancel_grace {}",
                humantime::format_duration(self.profile.cancel_grace)
            );
            return self.fault("cancel_grace", detail).await;
        }
        if self.idle_deadline.is_some_and(|d| d <= now) {
            self.idle_deadline = None;
            self.suspend("idle timeout").await;
        }
    }

    /// Stops the runtime on purpose (SUSPENDED); it reopens on demand.
    async fn suspend(&mut self, why: &str) {
        if self.conn.is_none() || self.turn.is_some() || !self.queue.is_empty() {
            return;
        }
        self.kill_runtime();
        let mut out = Out::default();
        self.log_event(
            &mut out,
            json!({"event": "runtime_stopped", "epoch": self.epoch, "reason": why}),
            None,
        );
        self.record.status = SessionStatus::Suspended;
        self.record.status_reason = why.to_owned();
        self.touch(&mut out);
        let _ = self.flush(out).await;
    }

    // ---- runtime frames ----------------------------------------------------------------------

    async fn on_runtime_events(&mut self, events: Vec<RuntimeEvent>) {
        let mut out = Out::default();
        let mut frames = Vec::new();
        let mut terminal = None;
        for event in events {
            if self.conn.as_ref().map(|c| c.epoch) != Some(event.epoch) {
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
        if let Err(error) = self.flush(out).await {
            // Nothing may be acted on before it is logged.
            return self
                .fault(
                    "storage",
                    format!("could not log runtime frames: {}", error.message),
                )
                .await;
        }
        for frame in frames {
            if self.conn.is_none() {
                break;
            }
            let span = self
                .turn
                .as_ref()
                .map_or_else(tracing::Span::none, |t| t.span.clone());
            self.react(frame).instrument(span).await;
        }
        if let Some(terminal) = terminal {
            self.on_terminal(terminal).await;
        }
    }

    async fn on_terminal(&mut self, inbound: Inbound) {
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
                    self.turn.as_ref().map(|t| t.action_id),
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
    fn attribute(&self, frame: &Value) -> Option<ActionId> {
        if frame.get("method").is_none()
            && let Some(id) = frame.get("id")
        {
            if let Some(action_id) = ActionId::from_jsonrpc_id(id) {
                return Some(action_id);
            }
            if self.pending.contains_key(&id.to_string()) {
                return None;
            }
        }
        self.turn.as_ref().map(|t| t.action_id)
    }

    async fn react(&mut self, frame: Value) {
        let method = frame
            .get("method")
            .and_then(Value::as_str)
            .map(str::to_owned);
        match (method, frame.get("id")) {
            (Some(method), Some(id)) => {
                let id = id.clone();
                self.on_agent_request(&id, &method, frame.get("params").unwrap_or(&Value::Null))
                    .await
            }
            (Some(method), None) => {
                self.on_agent_notification(&method, frame.get("params").unwrap_or(&Value::Null))
                    .await
            }
            (None, Some(id)) => {
                let id = id.clone();
                self.on_response(&id, &frame).await
            }
            (None, None) => {}
        }
    }

    async fn on_response(&mut self, id: &Value, frame: &Value) {
        if let Some(pending) = self.pending.remove(&id.to_string()) {
            return match pending.kind {
                PendingKind::SetConfig { action_id } => {
                    self.on_set_config_response(action_id, frame).await
                }
                kind => self.on_handshake_response(kind, frame).await,
            };
        }
        let Some(action_id) = ActionId::from_jsonrpc_id(id) else {
            return;
        };
        if let Some(turn) = self.turn.as_ref().filter(|t| t.action_id == action_id) {
            let stop_reason = match frame.get("result") {
                Some(result) => result
                    .get("stopReason")
                    .and_then(Value::as_str)
                    .unwrap_or("end_turn"),
                None => "failed",
            };
            turn.ended(stop_reason);
            self.end_turn().await;
        }
    }

    async fn on_set_config_response(&mut self, action_id: ActionId, frame: &Value) {
        let mut out = Out::default();
        if let Some(result) = frame.get("result") {
            self.adopt_config_options(result);
            self.touch(&mut out);
        } else {
            tracing::info!(session = %self.record.id, %action_id, "the runtime refused a config change");
        }
        let creating = matches!(self.starting, Some(StartPurpose::Create { .. }));
        if creating {
            if let Some(error) = frame.get("error") {
                let message = error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("refused");
                return self
                    .startup_fault(
                        ErrorCode::ModelNotAdvertised,
                        format!("the runtime refused the requested model: {message}"),
                    )
                    .await;
            }
            return self.become_ready(out).await;
        }
        let _ = self.flush(out).await;
    }

    async fn end_turn(&mut self) {
        self.turn = None;
        // Held requests of the turn are released: a later answer gets *_NOT_PENDING.
        self.held.clear();
        let mut out = Out::default();
        self.refresh_status(&mut out);
        let _ = self.flush(out).await;
        self.dispatch_next().await;
    }

    async fn on_agent_request(&mut self, id: &Value, method: &str, params: &Value) {
        let Some(agent_id) = JsonRpcId::from_json(id) else {
            return; // not a request ACP allows; nothing can answer it
        };
        let turn = self.turn.as_ref().map(|t| t.action_id);
        let mut out = Out::default();
        match method {
            "session/request_permission" => {
                let options = interactions::offered_options(params);
                if self.profile.permission_policy == PermissionPolicy::AutoAccept {
                    let answer = interactions::auto_accept(&options);
                    let frame = acp_frames::permission_response(&agent_id, &answer);
                    self.log_send(&mut out, &frame, HARNESS_ACTOR, turn);
                } else {
                    self.held.permissions.push(HeldPermission {
                        id: agent_id,
                        options,
                    });
                    self.refresh_status(&mut out);
                }
            }
            "elicitation/create" => match interactions::elicitation_refusal(params, &self.held) {
                Some(reason) => {
                    let frame = acp_frames::error_response(id, acp_frames::INVALID_PARAMS, reason);
                    self.log_send(&mut out, &frame, HARNESS_ACTOR, turn);
                }
                None => {
                    self.held.elicitation = Some(HeldElicitation { id: agent_id });
                    self.refresh_status(&mut out);
                }
            },
            _ => {
                let message = format!("method not found: {method} is not served by this client");
                let frame = acp_frames::error_response(id, acp_frames::METHOD_NOT_FOUND, &message);
                self.log_send(&mut out, &frame, HARNESS_ACTOR, turn);
            }
        }
        if let Err(e) = self.flush(out).await {
            self.fault("storage", e.message).await;
        }
    }

    async fn on_agent_notification(&mut self, method: &str, params: &Value) {
        match method {
            "session/update" => {
                let update = params.get("update");
                if update
                    .and_then(|u| u.get("sessionUpdate"))
                    .and_then(Value::as_str)
                    == Some("config_option_update")
                    && let Some(update) = update
                {
                    self.adopt_config_options(update);
                    let mut out = Out::default();
                    self.touch(&mut out);
                    let _ = self.flush(out).await;
                }
            }
            "$/cancel_request" => {
                let Some(agent_id) = params.get("requestId").and_then(JsonRpcId::from_json) else {
                    return;
                };
                // ACP: the original request still gets an answer; a cancelled one.
                let frame = match self.held.release(&agent_id) {
                    Some(Released::Permission) => {
                        acp_frames::permission_response(&agent_id, &PermissionAnswer::Cancelled)
                    }
                    Some(Released::Elicitation) => {
                        acp_frames::elicitation_response(&agent_id, &ElicitationAnswer::Cancel)
                    }
                    None => return,
                };
                let mut out = Out::default();
                let turn = self.turn.as_ref().map(|t| t.action_id);
                self.log_send(&mut out, &frame, HARNESS_ACTOR, turn);
                self.refresh_status(&mut out);
                let _ = self.flush(out).await;
            }
            _ => {}
        }
    }

    // ---- dispatch ----------------------------------------------------------------------------

    /// Sends the next queued action when the runtime is ready and no turn runs. Taking the head
    /// of the queue and appending its frame are one store transaction.
    async fn dispatch_next(&mut self) {
        if !self.ready() || self.turn.is_some() || self.ctx.is_draining() {
            return;
        }
        let Some(entry) = self.queue.front().cloned() else {
            return;
        };
        self.queue.pop_front();
        if let Err(error) = self.dispatch_entry(entry.clone(), None, true).await {
            tracing::error!(session = %self.record.id, %error, "could not dispatch the queue head");
            // Nothing changed in the store: put it back.
            let mut queue: Vec<QueuedEntry> = vec![entry];
            queue.extend(self.queue.entries().cloned());
            self.queue = Queue::from_entries(queue);
        }
    }

    /// Logs and sends a turn's `session/prompt`. `new_action`: the fingerprint when the action id
    /// is recorded by this very step (not yet queued); `from_queue`: it was the queue head.
    async fn dispatch_entry(
        &mut self,
        entry: QueuedEntry,
        new_action: Option<String>,
        from_queue: bool,
    ) -> Result<()> {
        let frame = match &entry.work {
            QueuedWork::Prompt(prompt) => acp_frames::prompt_request(
                &entry.action_id,
                self.acp_session_id(),
                prompt,
                PromptOptions {
                    meta_key: &self.ctx.meta_key,
                    context: entry.context.as_ref(),
                    traceparent: entry.traceparent.as_deref(),
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
        let previous = self
            .turn
            .replace(Turn::new(self.record.id, entry.action_id));
        self.refresh_status(&mut out);
        if let Err(error) = self.flush(out).await {
            self.turn = previous;
            self.record.status = self.live_status();
            return Err(error);
        }
        Ok(())
    }

    // ---- commands ----------------------------------------------------------------------------

    async fn on_command(&mut self, command: Command) {
        match command {
            Command::Control {
                principal,
                input,
                traceparent,
                reply,
            } => {
                let result = self.on_control(principal, input, traceparent).await;
                let _ = reply.send(result);
            }
            Command::GetQueue { reply } => {
                let _ = reply.send(Ok(self.queue.entries().cloned().collect()));
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
        }
    }

    async fn on_control(
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
            action,
            ..
        } = input;
        self.check_control(&principal, &action, &context, interrupt)?;
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
                let config_id = acp_frames::model_config_id(&self.config_options).to_owned();
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
                self.held.check_permission_answer(&request_id, &answer)?;
                let frame = acp_frames::permission_response(&request_id, &answer);
                self.send_answer(action_id, fingerprint, &actor, &request_id, frame)
                    .await
            }
            Action::RespondElicitation { request_id, answer } => {
                self.held.check_elicitation_answer(&request_id, &answer)?;
                let frame = acp_frames::elicitation_response(&request_id, &answer);
                self.send_answer(action_id, fingerprint, &actor, &request_id, frame)
                    .await
            }
        }
    }

    /// Who may do what, and the limits, before anything is stored.
    fn check_control(
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

    /// A re-sent action id: the same action reports its status now and changes nothing.
    fn resend(&self, record: ActionRecord, fingerprint: &str) -> Result<ControlOutcome> {
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
                ControlStatus::Queued(self.queue.position(&record.action_id).unwrap_or(1))
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

    fn require_ready(&self) -> Result<()> {
        if self.ready() {
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

    async fn on_turn_action(
        &mut self,
        entry: QueuedEntry,
        fingerprint: String,
        interrupt: bool,
    ) -> Result<ControlOutcome> {
        if self.ctx.is_draining() {
            return Err(draining());
        }
        let action_id = entry.action_id;
        let cap = self.ctx.limits.queued_actions;
        let queued = |fingerprint: String| ActionRecord {
            action_id,
            fingerprint,
            state: ActionState::Queued,
            created_at: entry.created_at,
        };
        if self.conn.is_none() {
            // SUSPENDED or DISCONNECTED: reopen, with this action queued behind the reopen.
            if !(self.record.can_resume || self.record.can_load) {
                return Err(Error::new(
                    ErrorCode::RuntimeDisconnected,
                    format!(
                        "session {} cannot be reopened: its runtime advertises neither \
                         session/resume nor session/load ({})",
                        self.record.id, self.record.status_reason
                    ),
                ));
            }
            let position = self.queue.push_back(entry.clone(), cap)?;
            let mut out = Out::default();
            out.batch.new_actions.push(queued(fingerprint));
            out.batch.queue.push(QueueOp::PushBack(entry));
            out.queue_changed = true;
            if let Err(error) = self.flush(out).await {
                self.queue.remove(&action_id).ok();
                return Err(error);
            }
            self.start_runtime(StartPurpose::Reopen).await;
            return Ok(ControlOutcome {
                action_id,
                status: ControlStatus::Queued(position),
            });
        }
        if interrupt && self.turn.is_some() {
            // Behaves as a stop, and the prompt goes first.
            self.queue.push_front(entry.clone(), cap)?;
            let mut out = Out::default();
            out.batch.new_actions.push(queued(fingerprint));
            out.batch.queue.push(QueueOp::PushFront(entry));
            out.queue_changed = true;
            self.cancel_turn(&mut out, action_id, &self.record.owner.clone());
            if let Err(error) = self.flush(out).await {
                self.queue.remove(&action_id).ok();
                return Err(error);
            }
            return Ok(ControlOutcome {
                action_id,
                status: ControlStatus::Queued(1),
            });
        }
        if self.ready() && self.turn.is_none() && self.queue.is_empty() {
            self.dispatch_entry(entry, Some(fingerprint), false).await?;
            return Ok(sent(action_id));
        }
        let position = if interrupt {
            self.queue.push_front(entry.clone(), cap)?
        } else {
            self.queue.push_back(entry.clone(), cap)?
        };
        let mut out = Out::default();
        out.batch.new_actions.push(queued(fingerprint));
        out.batch.queue.push(if interrupt {
            QueueOp::PushFront(entry)
        } else {
            QueueOp::PushBack(entry)
        });
        out.queue_changed = true;
        if let Err(error) = self.flush(out).await {
            self.queue.remove(&action_id).ok();
            return Err(error);
        }
        Ok(ControlOutcome {
            action_id,
            status: ControlStatus::Queued(position),
        })
    }

    /// Answers held interactions (elicitations `cancel`, permissions `cancelled`) and then sends
    /// `session/cancel`, so the agent is never left waiting.
    fn cancel_turn(&mut self, out: &mut Out, action_id: ActionId, actor: &str) {
        if let Some(elicitation) = self.held.elicitation.take() {
            let frame =
                acp_frames::elicitation_response(&elicitation.id, &ElicitationAnswer::Cancel);
            self.log_send(out, &frame, actor, Some(action_id));
        }
        for permission in std::mem::take(&mut self.held.permissions) {
            let frame =
                acp_frames::permission_response(&permission.id, &PermissionAnswer::Cancelled);
            self.log_send(out, &frame, actor, Some(action_id));
        }
        let frame = acp_frames::cancel_notification(self.acp_session_id());
        self.log_send(out, &frame, actor, Some(action_id));
        let grace = self.profile.cancel_grace;
        if let Some(turn) = &mut self.turn
            && turn.cancel_deadline.is_none()
        {
            turn.cancel_deadline = Some(Instant::now() + grace);
        }
        self.refresh_status(out);
    }

    async fn on_stop(
        &mut self,
        action_id: ActionId,
        fingerprint: String,
        actor: &str,
        clear_queue: bool,
    ) -> Result<ControlOutcome> {
        let mut out = Out::default();
        out.record_action(action_id, fingerprint, ActionState::Sent);
        if clear_queue && !self.queue.is_empty() {
            for entry in self.queue.clear() {
                out.batch
                    .action_states
                    .push((entry.action_id, ActionState::Removed));
            }
            out.batch.queue.push(QueueOp::Clear);
            out.queue_changed = true;
        }
        if self.ready() {
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

    async fn send_config(
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

    async fn send_answer(
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
        let released = self.held.release(request_id);
        self.refresh_status(&mut out);
        if let Err(error) = self.flush(out).await {
            // Nothing was sent: the request stays held.
            if let Some(kind) = released {
                self.restore_held(kind, request_id);
            }
            return Err(error);
        }
        Ok(sent(action_id))
    }

    fn restore_held(&mut self, kind: Released, id: &JsonRpcId) {
        match kind {
            Released::Permission => self.held.permissions.push(HeldPermission {
                id: id.clone(),
                options: Vec::new(),
            }),
            Released::Elicitation => {
                self.held.elicitation = Some(HeldElicitation { id: id.clone() })
            }
        }
    }

    async fn on_edit(
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
        let before = self.queue.get(&action_id).cloned();
        // A user cannot speak under a service's trigger: a user's edit drops the context.
        let drop_context = principal.kind != PrincipalKind::Service;
        let entry = self
            .queue
            .edit(&action_id, text, principal.actor(), drop_context)?
            .clone();
        let mut out = Out::default();
        out.batch.queue.push(QueueOp::Update(entry.clone()));
        out.queue_changed = true;
        if let Err(error) = self.flush(out).await {
            if let Some(before) = before {
                let restored: Vec<QueuedEntry> = self
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
                self.queue = Queue::from_entries(restored);
            }
            return Err(error);
        }
        Ok(entry)
    }

    async fn on_remove(&mut self, action_id: ActionId) -> Result<()> {
        let before: Vec<QueuedEntry> = self.queue.entries().cloned().collect();
        self.queue.remove(&action_id)?;
        let mut out = Out::default();
        out.batch.queue.push(QueueOp::Remove(action_id));
        out.batch
            .action_states
            .push((action_id, ActionState::Removed));
        out.queue_changed = true;
        if let Err(error) = self.flush(out).await {
            self.queue = Queue::from_entries(before);
            return Err(error);
        }
        self.arm_idle_timer();
        Ok(())
    }

    async fn on_close(&mut self) -> Result<SessionRecord> {
        if self.record.status == SessionStatus::Closed {
            return Ok(self.record.clone());
        }
        let had_runtime = self.conn.is_some();
        self.kill_runtime();
        self.starting = None;
        let open_turn = self.turn.take().map(|t| {
            t.ended("failed");
            t.action_id
        });
        let mut out = Out::default();
        if !self.queue.is_empty() {
            for entry in self.queue.clear() {
                out.batch
                    .action_states
                    .push((entry.action_id, ActionState::Removed));
            }
            out.batch.queue.push(QueueOp::Clear);
            out.queue_changed = true;
        }
        let mut event = json!({"event": "session_closed", "epoch": self.epoch});
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

    /// The harness is stopping after its drain grace: a turn still running is closed as FAILED,
    /// the runtime is stopped, and the session is SUSPENDED (queued work survives and reopens
    /// when the harness starts again).
    async fn on_drain(&mut self) -> Result<()> {
        if self.conn.is_none() {
            return Ok(());
        }
        self.kill_runtime();
        self.starting = None;
        let failed_turn = self.turn.take().map(|t| {
            t.ended("failed");
            t.action_id
        });
        let mut out = Out::default();
        let mut event = json!({"event": "drain", "epoch": self.epoch, "runtime_stopped": true});
        if let Some(turn) = failed_turn {
            event["failed_turn"] = turn.to_string().into();
        }
        self.log_event(&mut out, event, failed_turn);
        self.record.status = SessionStatus::Suspended;
        self.record.status_reason = "the harness stopped (drain)".to_owned();
        self.touch(&mut out);
        self.flush(out).await
    }

    async fn on_delete(&mut self) -> Result<()> {
        self.kill_runtime();
        self.ctx.store.delete_session(self.record.id).await?;
        self.shared.publish(SessionEvent::Deleted);
        self.finished = true;
        Ok(())
    }
}

fn draining() -> Error {
    Error::new(
        ErrorCode::Draining,
        "the server is draining: new sessions and turns go elsewhere",
    )
}

/// The values of a select config option, flattening groups.
fn select_values(option: &Value) -> Vec<String> {
    fn collect(options: &Value, out: &mut Vec<String>) {
        for option in options.as_array().into_iter().flatten() {
            if let Some(value) = option.get("value").and_then(Value::as_str) {
                out.push(value.to_owned());
            } else if let Some(group) = option.get("options") {
                collect(group, out);
            }
        }
    }
    let mut values = Vec::new();
    if let Some(options) = option.get("options") {
        collect(options, &mut values);
    }
    values
}

fn describe_exit(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        _ => "exited".to_owned(),
    }
}

/// A digest of an action as first received, telling a re-send from a different action.
pub(crate) fn fingerprint(
    action: &Action,
    context: &Option<Map<String, Value>>,
    interrupt: bool,
) -> String {
    let canonical = json!({"action": action, "context": context, "interrupt": interrupt});
    hex::encode(Sha256::digest(canonical.to_string().as_bytes()))
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}
