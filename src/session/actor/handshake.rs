//! A runtime's handshake, one step per answer: `initialize` answered, then the session
//! opened (`session/new` or `session/fork`, and the model a new session asked for) or reopened
//! (`session/resume` or `session/load`, and the settings re-applied), then ready.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{
    Actor, HARNESS_ACTOR, Out, PendingKind, StartPurpose, fingerprint,
    reapply::{SettingRequest, plan_profile_options, plan_reapply},
};
use crate::{
    acp::{
        frames::{self as acp_frames, ConfigValue, ReopenMethod, RpcErrorCode, rpc_code},
        transcript::CONTEXT_REBUILT_EVENT,
        views::{Reply, RpcError, SessionResult, view},
    },
    domain::{
        Action, ActionId, Error, ErrorCode,
        queue::{QueuedEntry, QueuedWork},
        text::{MAX_FOREIGN_TEXT_BYTES, cap_foreign},
    },
    session::profile::OnReopenFailure,
    store::ActionState,
};

/// What an agent's `initialize` answer says it can do with sessions.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Capabilities {
    pub load: bool,
    pub resume: bool,
    pub fork: bool,
}

impl Capabilities {
    pub(super) fn from_initialize(result: &SessionResult) -> Self {
        let capabilities = result.agent_capabilities.as_ref();
        let sessions = capabilities.and_then(|c| c.session_capabilities.as_ref());
        Self {
            load: capabilities.and_then(|c| c.load_session).unwrap_or(false),
            resume: sessions.is_some_and(|s| s.resume.is_some()),
            // `session/fork` is unstable in ACP 1.20 (`unstable_session_fork`): advertised as
            // `sessionCapabilities.fork`, asked with the parent's session id, answered like
            // `session/new`.
            fork: sessions.is_some_and(|s| s.fork.is_some()),
        }
    }
}

/// How a session is reopened: by resume when the agent can, else by load.
pub(super) fn reopen_method(can_resume: bool, can_load: bool) -> Option<ReopenMethod> {
    if can_resume {
        Some(ReopenMethod::Resume)
    } else if can_load {
        Some(ReopenMethod::Load)
    } else {
        None
    }
}

/// The failure of a start whose handshake request was answered with a JSON-RPC error. An
/// agent that wants authentication (-32000) gets RUNTIME_AUTH_REQUIRED, with the sign-in
/// methods it advertised (`auth_methods`, as [`describe_auth_methods`] put them).
pub(super) fn handshake_failure(
    kind: &PendingKind,
    error: &RpcError,
    auth_methods: &str,
) -> (ErrorCode, String) {
    let code = error.code.unwrap_or_default();
    let message = error.describe().unwrap_or_else(|| "no message".into());
    let step = match kind {
        PendingKind::Initialize => "initialize",
        PendingKind::Authenticate => "authenticate",
        PendingKind::NewSession | PendingKind::FreshSession { .. } => "session/new",
        PendingKind::Reopen(method) => method.as_str(),
        PendingKind::SetConfig { .. } => "session/set_config_option",
    };
    let reason = format!("{step} failed with error {code}: {message}");
    // A refused `authenticate` is a sign-in problem whatever code the agent chose.
    if code != rpc_code(RpcErrorCode::AuthRequired) && !matches!(kind, PendingKind::Authenticate) {
        return (ErrorCode::RuntimeStartFailed, reason);
    }
    auth_required(reason, auth_methods)
}

/// RUNTIME_AUTH_REQUIRED: `reason`, the agent's sign-in methods, and what to do.
fn auth_required(reason: String, auth_methods: &str) -> (ErrorCode, String) {
    let methods = match auth_methods {
        "" => "the agent advertises no sign-in method".to_owned(),
        methods => format!("the agent's sign-in methods: {methods}"),
    };
    (
        ErrorCode::RuntimeAuthRequired,
        format!(
            "{reason}; {methods} (the harness does not sign in: give the agent its key \
             through the profile, e.g. env_passthrough or env_files)"
        ),
    )
}

/// `initialize`'s `authMethods` for people: `name (id): description` each, `; ` between.
pub(super) fn describe_auth_methods(methods: &[Value]) -> String {
    let text = |method: &Value, key: &str| {
        method
            .get(key)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
    };
    let described: Vec<String> = methods
        .iter()
        .filter_map(|method| {
            let id = text(method, "id");
            let name = text(method, "name");
            let mut line = match (name, id) {
                (Some(name), Some(id)) if name != id => format!("{name} ({id})"),
                (Some(one), _) | (None, Some(one)) => one,
                (None, None) => return None,
            };
            if let Some(description) = text(method, "description") {
                line.push_str(&format!(": {description}"));
            }
            Some(line)
        })
        .collect();
    cap_foreign(&described.join("; "))
}

/// The request that opens the session once `initialize` is answered, with its kind and method.
type OpenRequest = (Value, PendingKind, &'static str);

/// The session id a `session/new` (or `session/fork`) answer names, or why it is not one.
fn opened_session_id<'a>(result: &SessionResult<'a>) -> Result<&'a str, String> {
    let Some(session_id) = result.session_id else {
        return Err("session/new answered without a sessionId".into());
    };
    if session_id.len() > MAX_FOREIGN_TEXT_BYTES {
        return Err(format!(
            "session/new answered a sessionId of {} bytes (at most {MAX_FOREIGN_TEXT_BYTES})",
            session_id.len()
        ));
    }
    Ok(session_id)
}

impl Actor {
    /// A reply to a handshake request: the next step, or the failure of the start.
    pub(super) async fn on_handshake_response(&mut self, kind: PendingKind, response: &Value) {
        let reply: Reply<SessionResult> = view(response);
        if let Some(error) = &reply.error {
            let methods = describe_auth_methods(&self.runtime.auth_methods);
            let (code, reason) = handshake_failure(&kind, error, &methods);
            // The agent refused to reopen its session (it is gone): a fresh one, if the profile
            // says so.
            if matches!(kind, PendingKind::Reopen(_)) && self.fresh_on_reopen_failure() {
                let reason = cap_foreign(&reason);
                return self.open_fresh_session(reason).await;
            }
            return self.startup_fault(code, reason).await;
        }
        let result = reply.result.unwrap_or_default();
        match kind {
            PendingKind::Initialize => self.on_initialized(&result).await,
            PendingKind::Authenticate => self.open_session().await,
            PendingKind::NewSession => self.on_session_opened(result).await,
            PendingKind::Reopen(_) => self.on_session_reopened(result).await,
            PendingKind::FreshSession { why } => self.on_fresh_session_opened(result, why).await,
            PendingKind::SetConfig { .. } => unreachable!("handled as a control response"),
        }
    }

    fn fresh_on_reopen_failure(&self) -> bool {
        self.profile.resilience.on_reopen_failure == OnReopenFailure::Fresh
    }

    /// `on_reopen_failure = "fresh"`: the session cannot be reopened in its agent (`why`), so a
    /// new ACP session takes its place; its first prompt carries the transcript.
    async fn open_fresh_session(&mut self, why: String) {
        let id = self.harness_request_id();
        let frame = acp_frames::new_session_request(id.clone(), &self.record.cwd);
        self.expect(&id, PendingKind::FreshSession { why }, "session/new");
        let mut out = Out::default();
        self.log_send(&mut out, &frame, HARNESS_ACTOR, None);
        self.flush_or_fault(out).await;
    }

    /// The new ACP session in place of the lost one is open: `context_rebuilt` is logged (the
    /// next prompt is primed with the transcript, as the fold tells), and the settings chosen
    /// before are asked for again, as after a reopen.
    async fn on_fresh_session_opened(&mut self, result: SessionResult<'_>, why: String) {
        let session_id = match opened_session_id(&result) {
            Ok(session_id) => session_id,
            Err(reason) => {
                return self
                    .startup_fault(ErrorCode::RuntimeStartFailed, reason)
                    .await;
            }
        };
        let previous = std::mem::replace(&mut self.record.acp_session_id, session_id.to_owned());
        let mut out = Out::default();
        self.log_event(
            &mut out,
            json!({"event": CONTEXT_REBUILT_EVENT, "epoch": self.runtime.epoch, "reason": why,
                   "previous_acp_session_id": previous, "acp_session_id": session_id,
                   "context_bytes": self.profile.resilience.reopen_context_bytes}),
            None,
        );
        self.touch(&mut out);
        tracing::warn!(session = %self.record.id, reason = %why, "the agent could not reopen the session: continuing in a new one primed with the transcript");
        if let Err(error) = self.flush(out).await {
            return self.fault("storage", error.message).await;
        }
        self.on_session_reopened(result).await;
    }

    /// `initialize` answered: what the agent can do is recorded, then the profile's sign-in
    /// method is asked for (when it has one) and the session is opened.
    async fn on_initialized(&mut self, result: &SessionResult<'_>) {
        let capabilities = Capabilities::from_initialize(result);
        self.runtime.auth_methods = result.auth_methods.clone().unwrap_or_default();
        self.record.can_load = capabilities.load;
        self.record.can_resume = capabilities.resume;
        self.runtime.can_fork = capabilities.fork;
        let Some(method) = self.profile.auth_method.clone() else {
            return self.open_session().await;
        };
        let mut out = Out::default();
        self.touch(&mut out);
        let advertised = self
            .runtime
            .auth_methods
            .iter()
            .any(|m| m.get("id").and_then(Value::as_str) == Some(method.as_str()));
        if !advertised {
            let _ = self.flush(out).await;
            let (code, reason) = auth_required(
                format!(
                    "the profile's auth_method {method:?} is not a sign-in method of the agent"
                ),
                &describe_auth_methods(&self.runtime.auth_methods),
            );
            return self.startup_fault(code, reason).await;
        }
        let id = self.harness_request_id();
        let frame = acp_frames::authenticate_request(id.clone(), &method);
        self.expect(&id, PendingKind::Authenticate, "authenticate");
        self.log_send(&mut out, &frame, HARNESS_ACTOR, None);
        self.flush_or_fault(out).await;
    }

    /// Opens the session (new, fork or reopen) once the runtime is initialized (and signed in).
    async fn open_session(&mut self) {
        let mut out = Out::default();
        self.touch(&mut out);
        let id = self.harness_request_id();
        match self.open_request(id.clone(), self.runtime.can_fork) {
            Ok((frame, kind, method)) => {
                self.expect(&id, kind, method);
                self.log_send(&mut out, &frame, HARNESS_ACTOR, None);
                self.flush_or_fault(out).await;
            }
            Err((code, reason)) => {
                let _ = self.flush(out).await;
                self.startup_fault(code, reason.into()).await;
            }
        }
    }

    /// The request that opens the session: `session/new`, `session/fork` for a fork, or
    /// `session/resume` / `session/load` for a reopen; why not, when the agent cannot.
    fn open_request(
        &self,
        id: Value,
        can_fork: bool,
    ) -> Result<OpenRequest, (ErrorCode, &'static str)> {
        let cwd = &self.record.cwd;
        match self.runtime.state.purpose() {
            Some(StartPurpose::Create {
                fork_of: Some(parent),
                ..
            }) => {
                if !can_fork {
                    return Err((
                        ErrorCode::NotSupported,
                        "the agent does not advertise session/fork",
                    ));
                }
                let frame = acp_frames::fork_session_request(id, parent, cwd);
                Ok((frame, PendingKind::NewSession, "session/fork"))
            }
            Some(StartPurpose::Create { .. }) => {
                let frame = acp_frames::new_session_request(id, cwd);
                Ok((frame, PendingKind::NewSession, "session/new"))
            }
            _ => {
                const NEITHER: &str =
                    "the runtime advertises neither session/resume nor session/load";
                let Some(method) = reopen_method(self.record.can_resume, self.record.can_load)
                else {
                    if self.fresh_on_reopen_failure() {
                        let frame = acp_frames::new_session_request(id, cwd);
                        let why = NEITHER.to_owned();
                        return Ok((frame, PendingKind::FreshSession { why }, "session/new"));
                    }
                    return Err((ErrorCode::RuntimeDisconnected, NEITHER));
                };
                let frame = acp_frames::reopen_session_request(
                    id,
                    method,
                    &self.record.acp_session_id,
                    cwd,
                );
                Ok((frame, PendingKind::Reopen(method), method.as_str()))
            }
        }
    }

    /// `session/new` (or `session/fork`) answered: the session has its ACP id; the profile's
    /// config options and the model the caller asked for are set before the session is ready.
    async fn on_session_opened(&mut self, result: SessionResult<'_>) {
        let session_id = match opened_session_id(&result) {
            Ok(session_id) => session_id,
            Err(reason) => {
                return self
                    .startup_fault(ErrorCode::RuntimeStartFailed, reason)
                    .await;
            }
        };
        self.record.acp_session_id = session_id.to_owned();
        self.adopt_config_options(result.config_options);
        let mut out = Out::default();
        self.touch(&mut out);
        let (requests, skipped) =
            plan_profile_options(&self.profile.config_options, &self.runtime.config_options);
        if !skipped.is_empty() {
            let listed = Value::Array(skipped.clone()).to_string();
            tracing::warn!(session = %self.record.id, profile = %self.profile.name, skipped = %listed,
                "the agent does not offer some of the profile's config_options");
            self.log_event(
                &mut out,
                json!({"event": "config_options_skipped", "skipped": skipped}),
                None,
            );
        }
        for request in requests {
            self.send_setting(&mut out, request, HARNESS_ACTOR);
        }
        let requested_model = match self.runtime.state.purpose_mut() {
            Some(StartPurpose::Create { model, .. }) => model.take(),
            _ => None,
        };
        match requested_model {
            Some(model) if model != self.record.model => self.request_model(out, model).await,
            _ if self.setting_pending() => self.flush_or_fault(out).await,
            _ => self.become_ready(out).await,
        }
    }

    /// A `session/set_config_option` of the handshake awaits its answer.
    pub(super) fn setting_pending(&self) -> bool {
        self.runtime.state.conn().is_some_and(|c| {
            c.pending
                .values()
                .any(|p| matches!(p.kind, PendingKind::SetConfig { .. }))
        })
    }

    /// Asks the agent for the model a new session was created with; the session is ready once
    /// it has answered every setting (see `on_set_config_response`).
    async fn request_model(&mut self, mut out: Out, model: String) {
        if let Err(error) = self.check_model(&model) {
            let _ = self.flush(out).await;
            return self.startup_fault(error.code, error.message).await;
        }
        let request = SettingRequest {
            config_id: acp_frames::model_config_id(&self.runtime.config_options).to_owned(),
            value: ConfigValue::Id(model.clone()),
            action: Action::SetModel { model },
        };
        let actor = self.record.owner.clone();
        let action_id = self.send_setting(&mut out, request, &actor);
        if let Some(StartPurpose::Create { model_request, .. }) = self.runtime.state.purpose_mut() {
            *model_request = Some(action_id);
        }
        self.flush_or_fault(out).await;
    }

    /// `session/resume` (or `session/load`) answered: the settings chosen before are asked for
    /// again where the agent reports other values; ready once it has answered them all.
    async fn on_session_reopened(&mut self, result: SessionResult<'_>) {
        let chosen_model = std::mem::take(&mut self.record.model);
        let chosen_options: BTreeMap<String, Value> = self.chosen_config_options().await;
        self.adopt_config_options(result.config_options);
        let reported_model = self.record.model.clone();
        if reported_model.is_empty() {
            self.record.model = chosen_model.clone();
        }
        let mut out = Out::default();
        self.touch(&mut out);
        let plan = plan_reapply(
            &chosen_model,
            &reported_model,
            chosen_options,
            &self.runtime.config_options,
        );
        if let Some(event) = plan.event {
            self.log_event(&mut out, event, None);
        }
        if plan.requests.is_empty() {
            return self.become_ready(out).await;
        }
        for request in plan.requests {
            let _ = self.send_setting(&mut out, request, HARNESS_ACTOR);
        }
        self.flush_or_fault(out).await;
        // Ready once the agent has answered them all (see `on_set_config_response`).
    }

    /// Logs a `session/set_config_option` request of the handshake, as a new action, and
    /// expects its answer; the action's id.
    fn send_setting(&mut self, out: &mut Out, request: SettingRequest, actor: &str) -> ActionId {
        let action_id = ActionId::mint();
        let frame = acp_frames::set_config_option_request(
            &action_id,
            self.acp_session_id(),
            &request.config_id,
            &request.value,
        );
        self.expect(
            &frame["id"],
            PendingKind::SetConfig { action_id },
            "session/set_config_option",
        );
        out.record_action(
            action_id,
            fingerprint(&request.action, &None, false),
            ActionState::Sent,
        );
        self.log_send(out, &frame, actor, Some(action_id));
        action_id
    }

    /// The handshake is done: answer CreateSession, send the first prompt, drain the queue.
    pub(super) async fn become_ready(&mut self, mut out: Out) {
        let purpose = self.runtime.state.finish_start();
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

    /// A failure during the handshake: a new session's creation fails; a reopen leaves the
    /// session DISCONNECTED.
    pub(super) async fn startup_fault(&mut self, code: ErrorCode, reason: String) {
        let reason = cap_foreign(&reason);
        let tail = self.stderr_tail().await;
        let message = if tail.is_empty() {
            reason.clone()
        } else {
            format!("{reason}; stderr: {tail}")
        };
        if self.runtime.state.is_creating() {
            self.fail_create(Error::new(code, message));
        } else {
            self.fault("handshake", reason).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// What an `initialize` answer's `result` says it can do.
    fn capabilities(result: Value) -> Capabilities {
        Capabilities::from_initialize(&view(&result))
    }

    /// The failure a handshake step's error reply (a whole frame) gives.
    fn failure(kind: &PendingKind, reply: Value) -> (ErrorCode, String) {
        let reply: Reply<SessionResult> = view(&reply);
        handshake_failure(kind, reply.error.as_ref().expect("an error reply"), "")
    }

    #[test]
    fn capabilities_are_read_from_the_initialize_answer_and_a_null_one_is_not_advertised() {
        let result = json!({"agentCapabilities": {"loadSession": true,
            "sessionCapabilities": {"resume": {}, "fork": null}}});
        assert_eq!(
            capabilities(result),
            Capabilities {
                load: true,
                resume: true,
                fork: false
            }
        );
        assert_eq!(capabilities(json!({})), Capabilities::default());
    }

    #[test]
    fn a_session_capability_is_advertised_by_any_value_but_null_and_garbage_advertises_nothing() {
        // Any value but null advertises a session capability, even `false` (as before).
        assert_eq!(
            capabilities(json!({"agentCapabilities": {"loadSession": "yes",
                "sessionCapabilities": {"resume": false, "fork": 0}}})),
            Capabilities {
                load: false,
                resume: true,
                fork: true
            }
        );
        for garbage in [
            json!(null),
            json!("initialized"),
            json!([{"agentCapabilities": {"loadSession": true}}]),
            json!({"agentCapabilities": [true]}),
            json!({"agentCapabilities": "all"}),
            json!({"agentCapabilities": {"sessionCapabilities": [{"resume": {}}]}}),
            json!({"agentCapabilities": {"loadSession": 1, "sessionCapabilities": "resume"}}),
        ] {
            assert_eq!(
                capabilities(garbage.clone()),
                Capabilities::default(),
                "{garbage}"
            );
        }
    }

    #[test]
    fn a_session_reopens_by_resume_when_it_can_else_by_load_else_not_at_all() {
        assert_eq!(reopen_method(true, true), Some(ReopenMethod::Resume));
        assert_eq!(reopen_method(false, true), Some(ReopenMethod::Load));
        assert_eq!(reopen_method(false, false), None);
    }

    #[test]
    fn an_error_answer_names_its_step_and_auth_required_is_told_apart() {
        let auth = json!({"jsonrpc": "2.0", "id": "harness:1:0", "error":
            {"code": rpc_code(RpcErrorCode::AuthRequired), "message": "log in"}});
        let (code, reason) = failure(&PendingKind::Initialize, auth.clone());
        assert_eq!(code, ErrorCode::RuntimeAuthRequired);
        assert!(
            reason.starts_with(&format!(
                "initialize failed with error {}: log in; the agent advertises no sign-in method",
                rpc_code(RpcErrorCode::AuthRequired)
            )),
            "{reason}"
        );
        let methods = describe_auth_methods(&[
            json!({"id": "login", "name": "Log in", "description": "run `agent login`"}),
            json!({"id": "api-key"}),
            json!({"name": 7}),
        ]);
        assert_eq!(methods, "Log in (login): run `agent login`; api-key");
        let reply: Reply<SessionResult> = view(&auth);
        let (_, reason) = handshake_failure(
            &PendingKind::NewSession,
            reply.error.as_ref().unwrap(),
            &methods,
        );
        assert!(
            reason.contains(
                "the agent's sign-in methods: Log in (login): run `agent login`; api-key"
            ),
            "{reason}"
        );
        let (code, reason) = failure(
            &PendingKind::Reopen(ReopenMethod::Load),
            json!({"id": 1, "error": {"code": -1}}),
        );
        assert_eq!(code, ErrorCode::RuntimeStartFailed);
        assert_eq!(reason, "session/load failed with error -1: no message");
    }

    #[test]
    fn an_error_of_any_shape_fails_the_step_with_what_can_be_read_of_it() {
        for (error, said) in [
            (json!(null), "error 0: no message"),
            (json!("boom"), "error 0: no message"),
            (json!([-32603, "boom"]), "error 0: no message"),
            (
                json!({"code": "-32603", "message": 7}),
                "error 0: no message",
            ),
            (json!({"code": 1.5, "message": "half"}), "error 0: half"),
            (
                json!({"code": 18446744073709551615_u64}),
                "error 0: no message",
            ),
            (
                json!({"code": -32603, "message": null}),
                "error -32603: no message",
            ),
        ] {
            let (code, reason) = failure(
                &PendingKind::NewSession,
                json!({"id": "harness:1:1", "error": error}),
            );
            assert_eq!(code, ErrorCode::RuntimeStartFailed, "{error}");
            assert_eq!(reason, format!("session/new failed with {said}"), "{error}");
        }
    }
}
