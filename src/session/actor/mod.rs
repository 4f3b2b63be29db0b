//! One actor per agent session. It owns the runtime connection, the turn, the queue and the held
//! interactions, and serialises control, runtime frames and queue edits, so edits never race
//! dispatch. It never awaits a person or a slow operation while reading the runtime: requests
//! for a person are parked and answered later. Every frame is logged before it is acted on
//! (inbound: append, then react; outbound: append, then send).

mod config_options;
mod control;
mod doubt;
mod frames;
mod handshake;
mod lifecycle;
mod metering;
mod reapply;
mod spans;
mod state;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use super::{
    Command, ControlOutcome, ControlStatus, EngineContext, Profile, SessionEvent, SessionHandle,
    Shared,
    interactions::Held,
    metering::{TurnSlot, TurnSpans},
    metrics,
};
use crate::{
    acp::{connection::RuntimeEvent, fold::Fold},
    domain::{
        Action, ActionId, PromptAction, Result,
        queue::{Queue, QueuedEntry},
        session::{SessionRecord, SessionStatus},
    },
    store::{ActionRecord, ActionState, Batch, CommitError, Direction, LogEntry, Probe, QueueOp},
};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use state::{Conn, Pending, PendingKind, RuntimeState, Stopping};
use tokio::sync::{mpsc, oneshot};

/// Actor of the log entries the runtime wrote.
pub(crate) const RUNTIME_ACTOR: &str = "runtime";
/// Actor of entries the harness made on its own (handshake, events, automatic answers).
pub(crate) const HARNESS_ACTOR: &str = "harness";
/// The `status_reason` prefix of a session whose runtime is gone and can be reopened neither by
/// `session/resume` nor `session/load`.
pub(crate) const CANNOT_REOPEN: &str = "RUNTIME_CANNOT_REOPEN";
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
        /// The `session/set_config_option` asking for `model`, once sent: its refusal fails
        /// the creation (a refused profile config option does not).
        model_request: Option<ActionId>,
        first_prompt: Option<FirstPrompt>,
        /// A fork: the parent's ACP session id, opened with `session/fork` instead
        /// of `session/new`.
        fork_of: Option<String>,
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

struct Turn {
    action_id: ActionId,
    cancel_deadline: Option<Instant>,
    /// The harness has already logged the turn FAILED for a reason of its own (the model proxy
    /// refused a call for a spent budget, or the turn ran out of `turn_timeout`).
    failed_by_harness: bool,
    /// The profile's `turn_timeout`, counting the agent's time only (`None`: no limit).
    clock: Option<TurnClock>,
    span: tracing::Span,
    started: Instant,
    /// The turn's trace span, its tool calls' and its waits' (see `spans`).
    trace: spans::TurnTrace,
    /// Where the model proxy finds the running turn, to hang its `model_call` spans under it.
    slot: TurnSlot,
}

/// What is left of a turn's time limit. The agent's time counts against it; time the turn waits
/// on a person (AWAITING_INPUT) does not, as a person's answer has a timeout of its own.
#[derive(Debug, Clone, Copy)]
struct TurnClock {
    limit: Duration,
    left: Duration,
    /// Since when the agent's time has counted (`None` while the turn waits on a person).
    since: Option<Instant>,
}

impl TurnClock {
    fn start(limit: Duration) -> Self {
        Self {
            limit,
            left: limit,
            since: Some(Instant::now()),
        }
    }

    fn deadline(&self) -> Option<Instant> {
        self.since.map(|since| since + self.left)
    }

    /// Stops counting (the turn waits on a person) or starts again (the agent works).
    fn counting(&mut self, counts: bool, now: Instant) {
        match (counts, self.since) {
            (false, Some(since)) => {
                self.left = self
                    .left
                    .saturating_sub(now.saturating_duration_since(since));
                self.since = None;
            }
            (true, None) => self.since = Some(now),
            _ => {}
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|t| t.action_id == self.action_id) {
            *slot = None;
        }
    }
}

impl Turn {
    /// A turn starting now; its trace span hangs under `parent` (the W3C `traceparent` the
    /// action came with).
    fn new(
        session: uuid::Uuid,
        action_id: ActionId,
        profile: &str,
        traces: &super::traces::Traces,
        parent: Option<&str>,
        slot: &TurnSlot,
        limit: Option<Duration>,
    ) -> Self {
        let span = tracing::info_span!("turn", %session, %action_id);
        span.in_scope(|| tracing::debug!("turn started"));
        let trace = spans::TurnTrace::start(traces, session, action_id, profile, parent);
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(TurnSpans {
            action_id,
            log: span.clone(),
            trace: trace.context().map(|cx| (traces.clone(), cx.clone())),
        });
        Self {
            action_id,
            cancel_deadline: None,
            failed_by_harness: false,
            clock: limit.map(TurnClock::start),
            span,
            started: Instant::now(),
            trace,
            slot: slot.clone(),
        }
    }

    /// Records how the turn ended (metrics and its spans).
    fn ended(&self, stop_reason: &str) {
        metrics::turn_ended(stop_reason);
        let millis = self.started.elapsed().as_millis() as u64;
        self.span
            .in_scope(|| tracing::info!(stop_reason, duration_ms = millis, "turn ended"));
        self.trace.ended(stop_reason);
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
    commands: mpsc::Receiver<Command>,
    /// A way back into its own command channel, for what works beside the actor (the model
    /// proxy's meter); weak, so it never keeps the actor alive.
    own: mpsc::WeakSender<Command>,
    /// The running turn, for the model proxy's spans.
    turn_slot: TurnSlot,
    /// Whether the runtime's calls go through the model proxy (set by its box at the start):
    /// then the proxy records usage and the agent's own reports are left out.
    proxied: Arc<std::sync::atomic::AtomicBool>,
    runtime: RuntimeLink,
    work: Work,
    /// The session's transcript as of `head`, folded as entries are committed, so the actor can
    /// log each turn's end (`None` until first needed, and after a failed commit).
    fold: Option<Fold>,
    /// Set when the session was deleted (or its creation failed): the actor stops.
    finished: bool,
    /// A commit whose answer was lost and could not be read back yet: until it is, the actor
    /// commits, sends and takes in nothing (see `doubt`).
    doubt: Option<doubt::Doubt>,
    /// The cumulative cost the agent last reported (currency, micros), to record what each new
    /// report adds; read from the store at the first report after the actor starts.
    cost_seen: Option<(String, i64)>,
}

/// The actor's side of its runtime: the current epoch, where the runtime is (down, starting,
/// ready), and what it advertised.
struct RuntimeLink {
    epoch: u32,
    /// Lines and exits from the runtime reader; the sender is lent to each new connection.
    events_tx: mpsc::Sender<RuntimeEvent>,
    events_rx: mpsc::Receiver<RuntimeEvent>,
    state: RuntimeState,
    config_options: Vec<Value>,
    /// The sign-in methods `initialize` advertised (`authMethods`, each as it came).
    auth_methods: Vec<Value>,
    /// `initialize` advertised `session/fork`.
    can_fork: bool,
    /// The runtime stopped last, while it is still going: the next start waits for it, so an
    /// agent that writes its session on the way out is done before it is reopened.
    stopping: Option<Stopping>,
}

/// What the session is doing for its callers: the running turn, the queue behind it, the
/// requests held for a person, and when an idle runtime is stopped.
struct Work {
    turn: Option<Turn>,
    queue: Queue,
    held: Held,
    idle_deadline: Option<Instant>,
    /// Model and config option changes that came while the runtime was starting: answered once
    /// the handshake ends, since the runtime is not dead, only not ready yet.
    waiting_configs: Vec<Command>,
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
    /// The fence of this replica's lease on the session; `None` with one replica.
    pub fence: Option<u64>,
    /// Claimed from a replica that died (with `after_restart`): its runtime died with it.
    pub owner_lost: bool,
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
        let mut shared = Shared::new(resume.record.clone(), resume.head);
        shared.fence = resume.fence;
        let shared = Arc::new(shared);
        let after_restart = resume.after_restart;
        let owner_lost = resume.owner_lost;
        let actor = Actor {
            ctx,
            shared: shared.clone(),
            record: resume.record,
            profile,
            head: resume.head,
            commands,
            own: commands_tx.downgrade(),
            turn_slot: TurnSlot::default(),
            proxied: Default::default(),
            runtime: RuntimeLink {
                epoch: resume.epoch,
                events_tx: runtime_tx,
                events_rx: runtime_rx,
                state: RuntimeState::Down,
                config_options: Vec::new(),
                auth_methods: Vec::new(),
                can_fork: false,
                stopping: None,
            },
            work: Work {
                turn: None,
                queue: Queue::from_entries(resume.queue),
                held: Held::default(),
                idle_deadline: None,
                waiting_configs: Vec::new(),
            },
            fold: None,
            finished: false,
            doubt: None,
            cost_seen: None,
        };
        actor.shared.set_queue_len(actor.work.queue.len());
        tokio::spawn(actor.run(after_restart, owner_lost, purpose));
        SessionHandle {
            shared,
            commands: commands_tx,
        }
    }

    async fn run(mut self, after_restart: bool, owner_lost: bool, purpose: Option<StartPurpose>) {
        let mut lost = self.shared.lost.subscribe();
        if after_restart {
            let why = match owner_lost {
                true => lifecycle::Interruption::OwnerLost,
                false => lifecycle::Interruption::HarnessRestarted,
            };
            Box::pin(self.recover(why)).await;
        }
        if let Some(purpose) = purpose {
            Box::pin(self.start_runtime(purpose)).await;
        }
        while !self.finished {
            if self.shared.is_lost() {
                self.stop_lost("lease lost");
                break;
            }
            let deadline = self.next_deadline();
            let exited = async {
                match self
                    .runtime
                    .state
                    .conn_mut()
                    .and_then(|c| c.exited.as_mut())
                {
                    Some(exited) => exited.await.ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                // Another replica holds the session now: stop at once, write nothing.
                // First of all: losing the lease also drops the registry's handle, which closes
                // the command channel, and that must not end the actor without saying why.
                _ = lost.changed() => {
                    if self.shared.is_lost() {
                        self.stop_lost("lease lost");
                    }
                }
                // In doubt, the runtime's frames wait: nothing can be logged, so nothing is
                // taken in.
                Some(first) = self.runtime.events_rx.recv(), if self.doubt.is_none() => {
                    let mut events = vec![first];
                    while events.len() < INBOUND_BATCH {
                        match self.runtime.events_rx.try_recv() {
                            Ok(event) => events.push(event),
                            Err(_) => break,
                        }
                    }
                    Box::pin(self.on_runtime_events(events)).await;
                }
                status = exited, if self.doubt.is_none() => Box::pin(self.on_exit(status)).await,
                command = self.commands.recv() => match command {
                    Some(command) => Box::pin(self.on_command(command)).await,
                    None => {
                        if self.shared.is_lost() {
                            self.stop_lost("lease lost");
                        }
                        break;
                    }
                },
                _ = sleep_until(deadline) => Box::pin(self.on_deadline()).await,
            }
            if !self.runtime.state.is_starting() && !self.work.waiting_configs.is_empty() {
                for command in std::mem::take(&mut self.work.waiting_configs) {
                    Box::pin(self.on_command(command)).await;
                }
            }
        }
        // The actor ends with its runtime up only when the harness lets go of the session (it is
        // shutting down): a stop on purpose. Nobody waits for it.
        if let (Some(conn), _) = self.runtime.state.stop() {
            let _ = conn.stop_gracefully(self.profile.resilience.stop_grace);
        }
    }

    fn acp_session_id(&self) -> &str {
        &self.record.acp_session_id
    }

    fn next_deadline(&self) -> Option<Instant> {
        if let Some(doubt) = &self.doubt {
            // Nothing else is acted on until the doubt is settled.
            return Some(doubt.retry_at);
        }
        let conn = self.runtime.state.conn();
        let pending = conn
            .into_iter()
            .flat_map(|c| c.pending.values().map(|p| p.deadline));
        let cancel = self.work.turn.as_ref().and_then(|t| t.cancel_deadline);
        let timeout = self
            .work
            .turn
            .as_ref()
            .filter(|t| !t.failed_by_harness)
            .and_then(|t| t.clock.as_ref()?.deadline());
        let exit = conn.and_then(|c| c.exit_deadline);
        let held = self.work.held.permissions.iter().filter_map(|p| p.deadline);
        pending
            .chain(cancel)
            .chain(timeout)
            .chain(exit)
            .chain(held)
            .chain(self.work.idle_deadline)
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
            epoch: self.runtime.epoch,
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
        match (self.record.status, &self.runtime.state) {
            (SessionStatus::Closed, _) => SessionStatus::Closed,
            (status, RuntimeState::Down) => status,
            (_, RuntimeState::Starting { .. }) => SessionStatus::Starting,
            (_, RuntimeState::Ready { .. }) if !self.work.held.is_empty() => {
                SessionStatus::AwaitingInput
            }
            (_, RuntimeState::Ready { .. }) if self.work.turn.is_some() => SessionStatus::Running,
            (_, RuntimeState::Ready { .. }) => SessionStatus::Idle,
        }
    }

    /// Puts the record in the batch if the status (or anything else) changed.
    fn refresh_status(&mut self, out: &mut Out) {
        let status = self.live_status();
        if let Some(clock) = self.work.turn.as_mut().and_then(|t| t.clock.as_mut()) {
            clock.counting(status != SessionStatus::AwaitingInput, Instant::now());
        }
        if status != self.record.status {
            self.record.status = status;
            if status.has_runtime() {
                self.record.status_reason.clear();
            }
            self.touch(out);
        }
    }

    /// Marks the record changed in this step without calling it activity: a status the
    /// harness itself set (a drain, a restart) keeps the session's UPDATED time, so a list after
    /// a restart still says when each session was last used.
    fn touch_keeping_time(&mut self, out: &mut Out) {
        let updated = self.record.updated_at;
        self.touch(out);
        self.record.updated_at = updated;
        if let Some(record) = &mut out.batch.session {
            record.updated_at = updated;
        }
    }

    /// Marks the record changed in this step.
    fn touch(&mut self, out: &mut Out) {
        // Every status reason is stored through here; a runtime or bridge may have written it.
        crate::domain::text::cap_foreign_in_place(&mut self.record.status_reason);
        self.record.updated_at = crate::domain::now();
        out.batch.session = Some(self.record.clone());
    }

    /// Folds a step's entries into the session's transcript and, right after each entry that
    /// ends a turn, logs a `turn_ended` event in the same batch: every view of every stream, live
    /// or replayed from the log, then tells a turn's end from the log alone (`TurnEnded`).
    async fn log_turn_ends(&mut self, entries: &mut Vec<LogEntry>) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut fold = match self.fold.take() {
            Some(fold) => fold,
            None => self.fold_log().await?,
        };
        let mut marked = Vec::with_capacity(entries.len() + 1);
        for entry in entries.drain(..) {
            fold.apply(&entry);
            let epoch = entry.epoch;
            marked.push(entry);
            for end in fold.take_turn_ends() {
                let event = LogEntry {
                    offset: 0,
                    direction: Direction::Event,
                    json: end.to_event().to_string(),
                    actor: HARNESS_ACTOR.to_owned(),
                    action_id: end.request_id,
                    epoch,
                    created_at: crate::domain::now(),
                };
                fold.apply(&event);
                marked.push(event);
            }
        }
        fold.take_urgent();
        for (i, entry) in marked.iter_mut().enumerate() {
            entry.offset = self.head + 1 + i as u64;
        }
        *entries = marked;
        self.fold = Some(fold);
        Ok(())
    }

    /// Folds the session's stored log up to the head.
    async fn fold_log(&self) -> Result<Fold> {
        let mut fold = Fold::new(self.ctx.meta_key.clone());
        super::fold_stored_log(
            self.ctx.store.as_ref(),
            self.record.id,
            &mut fold,
            self.head,
        )
        .await?;
        Ok(fold)
    }

    /// Commits a step, then sends its frames and publishes its events. On a storage failure
    /// nothing is sent and the error is returned. A commit whose answer was lost is read back
    /// first: stored, it goes on as committed; not stored, it fails like any other; unknown,
    /// it fails OUTCOME_UNKNOWN and the actor waits for the store to tell (see `doubt`).
    async fn flush(&mut self, out: Out) -> Result<()> {
        let Out {
            mut batch,
            send,
            queue_changed,
        } = out;
        if batch.is_empty() {
            return Ok(());
        }
        self.resolve_doubt().await?;
        self.log_turn_ends(&mut batch.entries).await?;
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
        batch.fence = self.shared.fence;
        let probe = Probe::of(&batch);
        let committed = self.commit(batch, &probe).await?;
        if let Err(error) = committed {
            let error = match error {
                fenced @ CommitError::Fenced { .. } => {
                    self.stop_lost("write fenced off");
                    return Err(fenced.into());
                }
                CommitError::Failed(error) => Some(error),
                CommitError::Ambiguous { .. } => self.read_back_lost_commit(probe, &send).await?,
            };
            if let Some(error) = error {
                return Err(self.commit_failed(error).await);
            }
        }
        self.head += appended;
        self.shared.set_head(self.head);
        metrics::log_committed();
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
        if let Some(conn) = self.runtime.state.conn() {
            for line in send {
                if let Err(reason) = conn.writer.send(line) {
                    tracing::warn!(session = %self.record.id, reason, "could not send a frame");
                    break;
                }
            }
        }
        self.publish_entries(entries, appended).await;
        if queue_changed {
            self.publish_queue();
        }
        if session_changed {
            self.publish_status();
        }
        self.arm_idle_timer();
        Ok(())
    }

    /// Sends `batch` to the store, unless the lease is lost: a lease lost (its time ran out
    /// here while the database did not answer) ends the wait for a commit, and no commit starts
    /// after it, so the runtime stops now, not when a database that may never answer does. A
    /// commit abandoned may still land, but only while the lease is still this replica's: its
    /// caller hears OUTCOME_UNKNOWN, and a retry reaches the replica that holds the session.
    async fn commit(&mut self, batch: Batch, probe: &Probe) -> Result<Result<(), CommitError>> {
        let session_id = self.record.id;
        if self.shared.is_lost() {
            self.stop_lost("lease lost");
            return Err(no_longer_held(session_id));
        }
        let mut lost = self.shared.lost.subscribe();
        tokio::select! {
            biased;
            committed = self.ctx.store.commit(session_id, batch) => Ok(committed),
            // The guard `wait_for` returns is dropped at once: marking the session lost needs
            // the lock it holds.
            _ = async { drop(lost.wait_for(|lost| *lost).await) } => {
                self.stop_lost("lease lost while a write was in flight");
                Err(doubt::lost_in_flight(session_id, probe.action_id()))
            }
        }
    }

    /// After a commit that stored nothing: the error to answer, once the actor's view of the
    /// log is the store's again.
    async fn commit_failed(&mut self, error: crate::domain::Error) -> crate::domain::Error {
        tracing::error!(session = %self.record.id, %error, "log commit failed");
        // The fold saw entries the log does not hold: fold the log again when next needed.
        self.fold = None;
        // Whatever the store holds is the truth; offsets continue from there.
        self.head = self
            .ctx
            .store
            .head_offset(self.record.id)
            .await
            .unwrap_or(self.head);
        error
    }

    /// Publishes the queue as it stands now.
    fn publish_queue(&self) {
        self.shared.set_queue_len(self.work.queue.len());
        let snapshot: Vec<QueuedEntry> = self.work.queue.entries().cloned().collect();
        self.shared.publish(SessionEvent::Queue(Arc::new(snapshot)));
    }

    /// Publishes the record's status as it stands now.
    fn publish_status(&self) {
        self.ctx.activity.notify_waiters();
        self.shared.publish(SessionEvent::Status {
            status: self.record.status,
            reason: self.record.status_reason.clone(),
        });
    }

    /// Commits a step; a storage failure is a runtime fault (nothing unlogged may reach it).
    async fn flush_or_fault(&mut self, out: Out) {
        if let Err(error) = self.flush(out).await {
            self.fault("storage", error.message).await;
        }
    }

    /// Another replica took the session: the runtime is killed at once and the actor ends; it
    /// never writes for the session again (the store refuses its fence anyway). Not gracefully:
    /// the new owner may already be reopening the agent's session, and a late flush of this
    /// runtime's state could overwrite what the new one writes.
    fn stop_lost(&mut self, why: &str) {
        if !self.finished {
            tracing::warn!(session = %self.record.id, fence = ?self.shared.fence, why, "this replica no longer holds the session; stopping its actor and runtime");
        }
        if let (Some(mut conn), _) = self.runtime.state.stop() {
            conn.killer.kill();
        }
        self.finished = true;
        self.shared.mark_lost();
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
            self.shared
                .publish(SessionEvent::Entry(Arc::new(entry.into())));
        }
    }

    /// Ends the running turn as failed (the runtime is going away with it); its action id.
    fn fail_running_turn(&mut self) -> Option<ActionId> {
        self.work.turn.take().map(|turn| {
            turn.ended("failed");
            turn.action_id
        })
    }

    /// Removes every queued action in this step (a clearing stop, a close).
    fn clear_queue(&mut self, out: &mut Out) {
        if self.work.queue.is_empty() {
            return;
        }
        for entry in self.work.queue.clear() {
            out.batch
                .action_states
                .push((entry.action_id, ActionState::Removed));
        }
        out.batch.queue.push(QueueOp::Clear);
        out.queue_changed = true;
    }

    fn arm_idle_timer(&mut self) {
        self.work.idle_deadline = match self.profile.idle_timeout {
            // A runtime that cannot be reopened is kept: suspending it would lose the session.
            Some(idle)
                if self.live_status() == SessionStatus::Idle
                    && self.work.queue.is_empty()
                    && (self.record.can_resume || self.record.can_load) =>
            {
                Some(Instant::now() + idle)
            }
            _ => None,
        };
    }
}

/// The error of a write this replica may no longer make: the session's lease is lost.
fn no_longer_held(session_id: uuid::Uuid) -> crate::domain::Error {
    crate::domain::Error::internal(format!(
        "session {session_id}: this replica no longer holds the session"
    ))
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
