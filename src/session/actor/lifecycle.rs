//! A session's runtime over its life: start (the handshake itself is in `handshake`), recovery
//! after a harness restart, faults, deadlines, suspension and draining.

use std::{
    io,
    path::{Path, PathBuf},
    process::ExitStatus,
    time::Instant,
};

use serde_json::{Value, json};

use super::{
    Actor, CANNOT_REOPEN, CLOSE_GRACE, Conn, EXIT_DRAIN, HARNESS_ACTOR, Out, Pending, PendingKind,
    STDERR_DRAIN, STDERR_QUOTE_CHARS, StartPurpose,
};
use crate::{
    acp::{
        connection::{self, LineWriter},
        frames as acp_frames,
        launch::{self, Launch},
        remote::RemoteSpec,
    },
    domain::{Error, ErrorCode, Result, session::SessionStatus, text::cap_foreign},
    session::{
        interactions::{self, HeldPermission},
        warm, workspace,
    },
};

/// What stopped a session's runtime behind the actor's back, as [`Actor::recover`] logs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Interruption {
    HarnessRestarted,
    /// Claimed from a replica that died.
    OwnerLost,
    /// A write's outcome was unknown for a while (see `doubt`); the runtime was stopped.
    WriteInDoubt,
}

impl Interruption {
    /// The log event's name and what it says happened.
    fn event(self) -> (&'static str, &'static str) {
        match self {
            Self::HarnessRestarted => ("harness_restarted", "harness restarted"),
            Self::OwnerLost => ("owner_replica_lost", "owner replica lost"),
            Self::WriteInDoubt => (
                "fault",
                "the database's answer to a write was lost and the session was read back",
            ),
        }
    }
}

impl Actor {
    /// After a harness restart: a turn that was in flight is closed in the log as
    /// FAILED ("harness restarted") and never re-sent; a session with queued work or a turn in
    /// flight reopens at once (and drains); the rest are SUSPENDED and reopen on demand. A
    /// session that cannot be reopened is DISCONNECTED with [`CANNOT_REOPEN`] and its queue is
    /// abandoned visibly, rather than waiting for a reopen that can never happen. `why` says in
    /// the log what stopped the runtime: the harness restarted, the session was claimed from a
    /// replica that died ("owner replica lost"), or a write's outcome was unknown for a while.
    pub(super) async fn recover(&mut self, why: Interruption) {
        let plan = plan_recovery(
            self.record.status,
            // With `on_reopen_failure = "fresh"` a session whose agent cannot reopen it still
            // comes back, in a new ACP session.
            self.profile
                .can_come_back(self.record.can_resume, self.record.can_load),
            !self.work.queue.is_empty(),
            !self.record.acp_session_id.is_empty(),
        );
        let (event, why) = why.event();
        let mut out = Out::default();
        if plan.turn_interrupted {
            let mut event = json!({"event": event, "epoch": self.runtime.epoch,
                                   "detail": format!("{why} during the turn; it is not re-sent")});
            if event["event"] == "fault" {
                event["kind"] = "storage".into();
            }
            self.log_event(&mut out, event, None);
        }
        match plan.mark {
            None => {}
            Some(Mark::CannotReopen) => self.cannot_reopen(&mut out),
            Some(Mark::NeverStarted) => {
                self.record.status = SessionStatus::Disconnected;
                self.record.status_reason = format!("{why} before the runtime finished starting");
                self.touch_keeping_time(&mut out);
            }
            Some(Mark::Suspended) => {
                self.record.status = SessionStatus::Suspended;
                self.record.status_reason = why.to_owned();
                self.touch_keeping_time(&mut out);
            }
        }
        if let Err(error) = self.flush(out).await {
            tracing::error!(session = %self.record.id, %error, "could not record the restart");
            return;
        }
        // A turn that was in flight is not re-sent, but the session reopens now so its agent
        // is back as it was before the restart, and its queue drains.
        if plan.reopen {
            tracing::info!(session = %self.record.id, queued = self.work.queue.len(), "reopening after the restart");
            crate::session::metrics::reopened(crate::session::metrics::ReopenReason::Restart);
            self.start_runtime(StartPurpose::Reopen).await;
        }
    }

    /// The runtime is gone and can be reopened neither by resume nor load: DISCONNECTED with
    /// [`CANNOT_REOPEN`], every queued action abandoned (logged, REMOVED, an empty queue).
    fn cannot_reopen(&mut self, out: &mut Out) {
        if !self.work.queue.is_empty() {
            let abandoned: Vec<String> = self
                .work
                .queue
                .entries()
                .map(|e| e.action_id.to_string())
                .collect();
            self.log_event(
                out,
                json!({"event": "queue_abandoned", "reason": CANNOT_REOPEN,
                       "action_ids": abandoned}),
                None,
            );
            self.clear_queue(out);
        }
        self.record.status = SessionStatus::Disconnected;
        self.record.status_reason = format!(
            "{CANNOT_REOPEN}: the harness restarted and the agent advertises neither \
             session/resume nor session/load"
        );
        self.touch(out);
    }

    /// Brings the session's runtime up (the one launch path, `acp::launch`): a new session's
    /// first may come from its profile's warm pool; otherwise it starts here, in its box (or
    /// unboxed), or on a bridge. Then the handshake begins: `initialize` is sent (a warm
    /// runtime's was sent already, with this epoch's first request id, and is logged as such).
    pub(super) async fn start_runtime(&mut self, purpose: StartPurpose) {
        let warm = if matches!(purpose, StartPurpose::Create { .. })
            && self.runtime.epoch + 1 == warm::FIRST_EPOCH
            && is_dir(Path::new(&self.record.cwd)).await
        {
            self.ctx.take_warm(&self.profile.name)
        } else {
            None
        };
        let (permit, launched, initialize) = match warm {
            Some(warm) => {
                let launched = launch::launch(Launch::Warm {
                    spawned: warm.spawned,
                    unread: warm.unread,
                })
                .await;
                (warm.permit, launched, Some(warm.initialize))
            }
            None => {
                // The runtime stopped last may still be writing its session on the way out: a
                // reopen must find it written (at most its grace, usually far less).
                self.wait_stopped().await;
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
                let launched = match self.start_here_or_on_a_bridge().await {
                    Ok(launched) => launched,
                    Err(error) => return self.start_failed(purpose, error).await,
                };
                (permit, Ok(launched), None)
            }
        };
        let runtime = match launched {
            Ok(runtime) => runtime,
            Err(why) => {
                return self
                    .start_failed(purpose, Error::new(ErrorCode::RuntimeStartFailed, why))
                    .await;
            }
        };
        self.runtime.epoch += 1;
        let epoch = self.runtime.epoch;
        if let Some(bridge) = &runtime.bridge {
            *self.shared.bridge.lock().expect("not poisoned") = Some(bridge.clone());
        }
        let writer = self.connect(epoch, runtime.stdin, runtime.stdout);
        let lost = self.shared.watch_lost();
        let conn = Conn::new(
            epoch,
            writer,
            runtime.killer,
            runtime.stderr,
            runtime.exited,
            permit,
            lost,
        )
        .with_limit(runtime.limit);
        self.runtime
            .state
            .start(conn, purpose, initialize.is_some());
        let mut out = Out::default();
        let mut event = json!({"event": "runtime_started", "epoch": epoch,
               "profile": self.profile.name, "profile_fingerprint": self.record.profile_fingerprint});
        if let Some(event) = event.as_object_mut() {
            event.extend(runtime.described);
        }
        self.log_event(&mut out, event, None);
        let id = self.harness_request_id();
        self.expect(&id, PendingKind::Initialize, "initialize");
        match initialize {
            Some(sent) => {
                debug_assert_eq!(id, acp_frames::harness_request_id(warm::FIRST_EPOCH, 0));
                self.log(
                    &mut out,
                    crate::store::Direction::ToRuntime,
                    sent,
                    HARNESS_ACTOR,
                    None,
                );
            }
            None => {
                let frame = acp_frames::initialize_request(id.clone());
                self.log_send(&mut out, &frame, HARNESS_ACTOR, None);
            }
        }
        self.refresh_status(&mut out);
        self.flush_or_fault(out).await;
    }

    /// Starts writing and reading a runtime's lines for `epoch`; the writer.
    fn connect(
        &self,
        epoch: u32,
        input: impl tokio::io::AsyncWrite + Unpin + Send + 'static,
        output: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    ) -> LineWriter {
        let writer = LineWriter::start(input, epoch, self.runtime.events_tx.clone());
        tokio::spawn(connection::read_lines(
            output,
            epoch,
            self.ctx.limits.runtime_line_bytes,
            self.runtime.events_tx.clone(),
        ));
        writer
    }

    /// Starts the profile's runtime here (its cwd checked again first) or on a bridge.
    async fn start_here_or_on_a_bridge(&mut self) -> Result<launch::Runtime> {
        let session_id = self.record.id.to_string();
        if let Some(remote) = &self.profile.remote {
            let spec = RemoteSpec {
                labels: &remote.bridge_labels,
                principals: remote.bridge_principals.as_deref(),
                bridge_profile: &remote.bridge_profile,
                cwd: &self.record.cwd,
                session_id: &session_id,
                owner: &self.record.owner,
                startup_timeout: self.profile.startup_timeout,
                reconnect_grace: remote.reconnect_grace,
            };
            // Waiting for a bridge holds this session's commands back (at most
            // startup_timeout), as a local handshake would; other sessions are unaffected.
            return launch::launch(Launch::Bridge {
                gateway: self.ctx.gateway(),
                spec,
            })
            .await
            .map_err(|why| Error::new(ErrorCode::RuntimeStartFailed, why));
        }
        let cwd = self.checked_cwd().await?;
        let home = self
            .record
            .home
            .clone()
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                // Stored before HOMEs were per owner: the owner's HOME as configured now.
                self.ctx
                    .sandbox()
                    .home_of(&self.profile.name, &self.record.owner)
            });
        let sandbox = self.ctx.sandbox().clone();
        // A new flag per start: the box says whether its proxy serves this one.
        self.proxied = Default::default();
        let model = self
            .profile
            .sandbox
            .as_ref()
            .filter(|policy| !policy.model.is_empty())
            .map(|_| crate::model_proxy::ModelCalls {
                proxied: self.proxied.clone(),
                session: self.record.id,
                meter: std::sync::Arc::new(crate::session::metering::SessionMeter {
                    ctx: self.ctx.clone(),
                    session: self.record.id,
                    owner: self.record.owner.clone(),
                    profile: self.profile.name.clone(),
                    storing: Default::default(),
                    actor: self.own.clone(),
                    turn: self.turn_slot.clone(),
                }),
            });
        let boxed = self.profile.sandbox.as_ref().map(|policy| launch::Boxed {
            sandbox: &sandbox,
            policy,
            home: &home,
            model: model.as_ref(),
        });
        launch::launch(Launch::Local(launch::LocalLaunch {
            runtime: self.profile.launch(),
            profile: &self.profile.name,
            cwd: &cwd,
            boxed,
            processes: &self.ctx.processes,
            timeout: self.profile.startup_timeout,
        }))
        .await
        .map_err(|why| Error::new(ErrorCode::RuntimeStartFailed, why))
    }

    /// The session's cwd, checked again before its runtime starts: it still exists on this
    /// replica, is still the canonical path it was at creation (no component swapped for a
    /// link), and is still allowed for its owner and clear of the server's files.
    async fn checked_cwd(&self) -> Result<PathBuf> {
        let cwd = PathBuf::from(&self.record.cwd);
        // With several replicas the workspace must be on storage each of them mounts
        // (docs/replicas.md, "Shared storage"); a replica that claimed the session
        // without it says so, not a bare spawn error.
        if !is_dir(&cwd).await {
            return Err(Error::new(
                ErrorCode::RuntimeStartFailed,
                format!(
                    "the session's cwd {} does not exist on this replica",
                    cwd.display()
                ),
            ));
        }
        let roots = self
            .profile
            .allowed_cwd_roots
            .as_deref()
            .map(|roots| workspace::roots_for(roots, &self.record.owner));
        let refused = || {
            Error::new(
                ErrorCode::RuntimeStartFailed,
                format!(
                    "the session's cwd {} is no longer allowed (it changed since the session \
                     was created, or is not under an allowed root of this profile)",
                    cwd.display()
                ),
            )
        };
        let looked_up =
            workspace::look_up_on_a_thread(cwd.clone(), roots, self.ctx.forbidden_cwds())
                .await
                .map_err(|_| refused())?;
        match looked_up {
            workspace::Lookup::Directory { canonical, allowed }
                if canonical == cwd && allowed != Some(false) =>
            {
                Ok(canonical)
            }
            _ => Err(refused()),
        }
    }

    pub(super) fn harness_request_id(&mut self) -> Value {
        let conn = self
            .runtime
            .state
            .conn_mut()
            .expect("a runtime is connected");
        let id = acp_frames::harness_request_id(conn.epoch, conn.next_id);
        conn.next_id += 1;
        id
    }

    pub(super) fn expect(&mut self, id: &Value, kind: PendingKind, method: &'static str) {
        let timeout = self.profile.startup_timeout;
        let conn = self
            .runtime
            .state
            .conn_mut()
            .expect("a runtime is connected");
        conn.pending.insert(
            id.to_string(),
            Pending {
                kind,
                method,
                deadline: Instant::now() + timeout,
            },
        );
    }

    /// Startup could not even begin (no runtime slot, spawn failed).
    pub(super) async fn start_failed(&mut self, purpose: StartPurpose, error: Error) {
        match purpose {
            StartPurpose::Create { ready, .. } => {
                let _ = ready.send(Err(error));
                self.finished = true;
            }
            StartPurpose::Reopen => {
                let mut out = Out::default();
                self.log_event(
                    &mut out,
                    json!({"event": "reopen_failed", "code": error.code.reason(),
                           "reason": cap_foreign(&error.message)}),
                    None,
                );
                self.record.status = SessionStatus::Disconnected;
                // Led by the reason code, as a client tells the fault apart by it. The message
                // may hold a bridge's or runtime's text: `touch` caps it as it is stored.
                self.record.status_reason = format!("{}: {}", error.code.reason(), error.message);
                self.touch(&mut out);
                let _ = self.flush(out).await;
            }
        }
    }

    /// A runtime from the warm pool that dies, goes silent or garbles before a new session's
    /// handshake ends failed in the pool (or between being taken and adopted), not because of
    /// the session: it is logged (`warm_runtime_failed`) and a cold runtime is started in its
    /// place, once. Returns whether it did so. (An agent's error answer to the handshake is not
    /// retried: a cold runtime would answer the same.)
    async fn replace_failed_warm(&mut self, kind: &str, detail: &str) -> bool {
        let epoch = self.runtime.epoch;
        // A storage failure is the harness's, not the runtime's: a cold start would not help.
        if !self.runtime.state.is_warm_create() || kind == "storage" {
            return false;
        }
        let tail = self.stderr_tail().await;
        tracing::warn!(session = %self.record.id, kind, detail, "a warm runtime failed before its handshake ended; starting a cold one");
        let purpose = self.kill_runtime().expect("checked above: a Create");
        let mut out = Out::default();
        let mut event = json!({"event": "warm_runtime_failed", "kind": kind, "detail": detail,
                               "epoch": epoch});
        if !tail.is_empty() {
            event["stderr_tail"] = tail.into();
        }
        self.log_event(&mut out, event, None);
        if let Err(error) = self.flush(out).await {
            tracing::error!(session = %self.record.id, %error, "could not log a failed warm runtime");
        }
        // The next epoch is past the pool's (`warm::FIRST_EPOCH`), so this start is cold.
        Box::pin(self.start_runtime(purpose)).await;
        true
    }

    /// A new session's runtime failed to come up: kill it and fail CreateSession (the manager
    /// then removes the session).
    pub(super) fn fail_create(&mut self, error: Error) {
        if let Some(StartPurpose::Create { ready, .. }) = self.kill_runtime() {
            let _ = ready.send(Err(error));
        }
        self.finished = true;
    }

    pub(super) async fn stderr_tail(&self) -> String {
        let Some(conn) = self.runtime.state.conn() else {
            return String::new();
        };
        conn.stderr.closed(STDERR_DRAIN).await;
        conn.stderr.text(STDERR_QUOTE_CHARS)
    }

    /// Kills the runtime at once (down, its requests forgotten, nothing held): for faults, where
    /// the runtime is dying, garbled or stalled and waiting for it would be wrong. The purpose of
    /// the start it interrupted, if any.
    pub(super) fn kill_runtime(&mut self) -> Option<StartPurpose> {
        let (conn, purpose) = self.runtime.state.stop();
        if let Some(mut conn) = conn {
            conn.killer.kill();
        }
        self.runtime_gone();
        purpose
    }

    /// Stops the runtime on purpose, gracefully: its stdin closes, its whole tree gets SIGTERM,
    /// and SIGKILL after the profile's `stop_grace` (agents write their session files on the way
    /// out). The next start waits for it to be gone.
    pub(super) fn stop_runtime(&mut self) {
        let (conn, _) = self.runtime.state.stop();
        if let Some(conn) = conn {
            let grace = self.profile.resilience.stop_grace;
            self.runtime.stopping = Some(conn.stop_gracefully(grace));
        }
        self.runtime_gone();
    }

    fn runtime_gone(&mut self) {
        *self.shared.bridge.lock().expect("not poisoned") = None;
        self.work.held.clear();
    }

    /// Waits until the runtime stopped last is gone (at most its grace and a margin).
    pub(super) async fn wait_stopped(&mut self) {
        if let Some(stopping) = self.runtime.stopping.take() {
            stopping.wait().await;
        }
    }

    /// A runtime fault: log it, fail the running turn, release held interactions,
    /// kill the process, and leave the session DISCONNECTED with a reason. No automatic respawn.
    pub(super) async fn fault(&mut self, kind: &str, detail: String) {
        if !self.runtime.state.is_up() {
            return;
        }
        // The detail may quote what the runtime or its bridge said.
        let detail = cap_foreign(&detail);
        if self.replace_failed_warm(kind, &detail).await {
            return;
        }
        let tail = self.stderr_tail().await;
        if self.runtime.state.is_creating() {
            let message = if tail.is_empty() {
                detail
            } else {
                format!("{detail}; stderr: {tail}")
            };
            return self.fail_create(Error::new(ErrorCode::RuntimeStartFailed, message));
        }
        let epoch = self.runtime.epoch;
        let exit = self
            .runtime
            .state
            .conn()
            .and_then(|c| c.exit_status.clone());
        match kind {
            // The harness cannot log, the runtime did nothing wrong: stopped as on purpose, so its
            // agent keeps its session for a reopen once the store is back.
            "storage" => self.stop_runtime(),
            // Exited, garbled, stalled or out of its cancel grace: at once.
            _ => {
                self.kill_runtime();
            }
        }
        let failed_turn = self.fail_running_turn();
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
        // The detail and the tail are the runtime's (or its bridge's) text: `touch` caps it.
        self.record.status_reason = reason;
        self.touch(&mut out);
        tracing::warn!(session = %self.record.id, kind, %detail, "runtime fault");
        if let Err(error) = self.flush(out).await {
            tracing::error!(session = %self.record.id, %error, "could not log a runtime fault");
        }
    }

    pub(super) async fn on_exit(&mut self, status: Option<io::Result<ExitStatus>>) {
        let Some(conn) = self.runtime.state.conn_mut() else {
            return;
        };
        conn.exited = None;
        let limit = conn.limit.get().cloned();
        let text = match status {
            // A limit of its box ended it: that is the reason, not the signal it died of.
            _ if limit.is_some() => format!("was stopped: {}", limit.unwrap_or_default()),
            Some(Ok(status)) => describe_exit(status),
            // A remote runtime whose bridge is gone.
            Some(Err(e)) if e.kind() == io::ErrorKind::ConnectionAborted => {
                format!("was lost: {e}")
            }
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
    pub(super) fn on_output_closed(&mut self) -> Option<(&'static str, String)> {
        let conn = self.runtime.state.conn_mut()?;
        conn.output_closed = true;
        match &conn.exit_status {
            Some(exit) => Some(("exit", format!("runtime {exit}"))),
            None => {
                conn.exit_deadline = Some(Instant::now() + CLOSE_GRACE);
                None
            }
        }
    }

    pub(super) async fn on_deadline(&mut self) {
        if self.doubt.is_some() {
            // Not settled yet: it is tried again later, and on the next command.
            let _ = self.resolve_doubt().await;
            return;
        }
        let now = Instant::now();
        if let Some(conn) = self.runtime.state.conn_mut() {
            if conn.exit_deadline.is_some_and(|d| d <= now) {
                let (kind, detail) = match &conn.exit_status {
                    Some(exit) => ("exit", format!("runtime {exit}")),
                    None => ("closed_output", "the runtime closed its output".to_owned()),
                };
                return self.fault(kind, detail).await;
            }
            let expired = conn
                .pending
                .iter()
                .find(|(_, p)| p.deadline <= now)
                .map(|(key, _)| key.clone());
            if let Some(key) = expired {
                let pending = conn.pending.remove(&key).expect("just found");
                let detail = format!(
                    "no answer to {} within {}",
                    pending.method,
                    humantime::format_duration(self.profile.startup_timeout)
                );
                return self.fault("timeout", detail).await;
            }
        }
        self.on_work_deadline(now).await
    }

    /// The deadlines of the session's work: a cancelled turn's grace, a turn's time limit, a
    /// held permission's timeout, the idle timer.
    async fn on_work_deadline(&mut self, now: Instant) {
        if self
            .work
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
        if let Some(turn) = self.work.turn.as_mut().filter(|t| !t.failed_by_harness)
            && turn.clock.and_then(|c| c.deadline()).is_some_and(|d| d <= now)
            // Taken: it fires once, whatever comes of it.
            && let Some(clock) = turn.clock.take()
        {
            let reason = format!(
                "turn timed out after {} (the profile's turn_timeout; time waiting on a person \
                 not counted)",
                humantime::format_duration(clock.limit)
            );
            tracing::warn!(parent: &turn.span, "{reason}");
            if let Err(error) = self.fail_turn_for_the_harness(reason).await {
                tracing::warn!(%error, "could not fail the timed-out turn");
            }
            return;
        }
        if let Some(held) = self
            .work
            .held
            .permissions
            .iter()
            .find(|p| p.deadline.is_some_and(|d| d <= now))
            .cloned()
        {
            return self.permission_timed_out(held).await;
        }
        if self.work.idle_deadline.is_some_and(|d| d <= now) {
            self.work.idle_deadline = None;
            self.suspend("idle timeout").await;
        }
    }

    /// `permission_timeout` ran out on a held request: answered with its first reject
    /// option, else `cancelled`, and the harness event says it was the timeout.
    async fn permission_timed_out(&mut self, held: HeldPermission) {
        let answer = interactions::timeout_answer(&held.options);
        let turn = self.work.turn.as_ref().map(|t| t.action_id);
        let timeout = self.profile.permission_timeout.unwrap_or_default();
        let mut out = Out::default();
        self.log_event(
            &mut out,
            json!({"event": "permission_decided", "request_id": held.id.to_json(),
                   "by": "timeout", "timeout": humantime::format_duration(timeout).to_string(),
                   "answer": interactions::answer_json(&answer)}),
            turn,
        );
        let frame = acp_frames::permission_response(&held.id, &answer);
        self.log_send(&mut out, &frame, HARNESS_ACTOR, turn);
        if let Some(trace) = self.turn_trace() {
            trace.wait_ended(&held.id, "timeout");
        }
        let before = self.work.held.clone();
        self.work.held.release(&held.id);
        self.refresh_status(&mut out);
        if let Err(error) = self.flush(out).await {
            // Nothing was sent: hold it as it was; the storage fault ends the runtime anyway.
            self.work.held = before;
            self.fault("storage", error.message).await;
        }
    }

    /// Stops the runtime on purpose (SUSPENDED); it reopens on demand.
    pub(super) async fn suspend(&mut self, why: &str) {
        if !self.runtime.state.is_up() || self.work.turn.is_some() || !self.work.queue.is_empty() {
            return;
        }
        self.stop_runtime();
        let mut out = Out::default();
        self.log_event(
            &mut out,
            json!({"event": "runtime_stopped", "epoch": self.runtime.epoch, "reason": why}),
            None,
        );
        self.record.status = SessionStatus::Suspended;
        self.record.status_reason = why.to_owned();
        self.touch(&mut out);
        let _ = self.flush(out).await;
    }

    /// The session's bridge serves another replica now: an idle session (no turn,
    /// nothing queued or held, not starting) stops its runtime as SUSPENDED and its actor, so
    /// the replica holding the bridge claims it and reopens it by resume. Whether it did.
    pub(super) async fn on_hand_off(&mut self) -> bool {
        let idle = self
            .runtime
            .state
            .conn()
            .is_some_and(|conn| conn.pending.is_empty())
            && self.runtime.state.is_ready()
            && self.work.turn.is_none()
            && self.work.queue.is_empty()
            && self.work.held.is_empty();
        if !idle {
            return false;
        }
        self.suspend("the session's bridge is connected to another replica")
            .await;
        if self.runtime.state.is_up() {
            return false;
        }
        // The other replica reopens it at once: its agent must have written its session first.
        self.wait_stopped().await;
        self.finished = true;
        self.shared.mark_lost();
        true
    }

    /// The harness is stopping after its drain grace: a turn still running is closed as FAILED,
    /// the runtime is stopped gracefully and waited for (the harness exits only once its agents
    /// have written their state), and the session is SUSPENDED (queued work survives and reopens
    /// when the harness starts again).
    pub(super) async fn on_drain(&mut self) -> Result<()> {
        if !self.runtime.state.is_up() {
            self.wait_stopped().await;
            return Ok(());
        }
        self.stop_runtime();
        let failed_turn = self.fail_running_turn();
        let mut out = Out::default();
        let mut event =
            json!({"event": "drain", "epoch": self.runtime.epoch, "runtime_stopped": true});
        if let Some(turn) = failed_turn {
            event["failed_turn"] = turn.to_string().into();
        }
        self.log_event(&mut out, event, failed_turn);
        self.record.status = SessionStatus::Suspended;
        self.record.status_reason = "the harness stopped (drain)".to_owned();
        self.touch_keeping_time(&mut out);
        let flushed = self.flush(out).await;
        self.wait_stopped().await;
        flushed
    }
}

/// How a session's record is marked after a harness restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mark {
    /// DISCONNECTED with [`CANNOT_REOPEN`], its queue abandoned.
    CannotReopen,
    /// DISCONNECTED: the runtime died before the session had an ACP id.
    NeverStarted,
    /// SUSPENDED: it reopens on demand.
    Suspended,
}

/// What to do with a session loaded after a harness restart (see [`Actor::recover`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Recovery {
    /// A turn was in flight: it is closed in the log, never re-sent.
    pub turn_interrupted: bool,
    pub mark: Option<Mark>,
    /// Reopen at once (after the mark is stored).
    pub reopen: bool,
}

/// The recovery of a session whose stored `status` says what it was doing when the harness
/// stopped; `reopenable`: its agent advertised resume or load (or a fresh session may take its
/// place); `queued`: work waits in its queue; `opened`: it has an ACP session id.
pub(super) fn plan_recovery(
    status: SessionStatus,
    reopenable: bool,
    queued: bool,
    opened: bool,
) -> Recovery {
    if !status.has_runtime() {
        // No runtime died with the harness: only a queue that can never drain needs saying.
        let stuck = status != SessionStatus::Closed
            && !reopenable
            && (status != SessionStatus::Disconnected || queued);
        return Recovery {
            turn_interrupted: false,
            mark: stuck.then_some(Mark::CannotReopen),
            reopen: status != SessionStatus::Closed && reopenable && queued,
        };
    }
    let turn_interrupted = matches!(
        status,
        SessionStatus::Running | SessionStatus::AwaitingInput
    );
    let mark = if !opened {
        Mark::NeverStarted
    } else if !reopenable {
        Mark::CannotReopen
    } else {
        Mark::Suspended
    };
    Recovery {
        turn_interrupted,
        mark: Some(mark),
        reopen: reopenable && (turn_interrupted || queued),
    }
}

pub(super) fn describe_exit(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        _ => "exited".to_owned(),
    }
}

/// Whether `path` is a directory, asked on a blocking thread: a slow or hung mount must not
/// stall the worker thread (and every actor on it).
async fn is_dir(path: &Path) -> bool {
    tokio::fs::metadata(path).await.is_ok_and(|m| m.is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;
    use SessionStatus::*;

    fn plan(status: SessionStatus, reopenable: bool, queued: bool) -> Recovery {
        plan_recovery(status, reopenable, queued, true)
    }

    #[test]
    fn a_turn_in_flight_at_a_restart_is_closed_and_its_session_reopens_when_it_can() {
        for status in [Running, AwaitingInput] {
            let expected = Recovery {
                turn_interrupted: true,
                mark: Some(Mark::Suspended),
                reopen: true,
            };
            assert_eq!(plan(status, true, false), expected, "{status:?}");
            let expected = Recovery {
                turn_interrupted: true,
                mark: Some(Mark::CannotReopen),
                reopen: false,
            };
            assert_eq!(plan(status, false, false), expected, "{status:?}");
        }
    }

    #[test]
    fn an_idle_session_at_a_restart_is_suspended_and_reopens_only_to_drain_its_queue() {
        for status in [Starting, Idle] {
            let quiet = plan(status, true, false);
            assert_eq!(
                quiet,
                Recovery {
                    turn_interrupted: false,
                    mark: Some(Mark::Suspended),
                    reopen: false
                }
            );
            assert!(plan(status, true, true).reopen, "{status:?}");
        }
    }

    #[test]
    fn a_runtime_that_died_before_the_session_opened_leaves_it_disconnected() {
        let recovery = plan_recovery(Starting, true, true, false);
        assert_eq!(recovery.mark, Some(Mark::NeverStarted));
        assert!(recovery.reopen, "its queue still drains by a reopen");
    }

    #[test]
    fn a_session_without_a_runtime_changes_only_if_its_queue_could_never_drain() {
        let nothing = Recovery {
            turn_interrupted: false,
            mark: None,
            reopen: false,
        };
        assert_eq!(plan(Closed, false, true), nothing);
        assert_eq!(plan(Closed, true, true), nothing);
        assert_eq!(plan(Suspended, true, false), nothing);
        assert_eq!(plan(Disconnected, false, false), nothing, "already said");
        assert_eq!(
            plan(Disconnected, false, true).mark,
            Some(Mark::CannotReopen)
        );
        assert_eq!(plan(Suspended, false, false).mark, Some(Mark::CannotReopen));
        let drain = plan(Suspended, true, true);
        assert_eq!((drain.mark, drain.reopen), (None, true));
        assert!(plan(Disconnected, true, true).reopen);
    }

    #[test]
    fn an_exit_is_described_by_its_code_or_its_signal() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            describe_exit(ExitStatus::from_raw(3 << 8)),
            "exited with code 3"
        );
        assert_eq!(
            describe_exit(ExitStatus::from_raw(9)),
            "was killed by signal 9"
        );
    }
}
