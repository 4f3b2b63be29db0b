//! The agent's state machine: one task, no locks. Incoming messages arrive over a channel from
//! the stdin reader (which keeps reading while a turn runs); a turn is an interpreter over its
//! directives that runs until it has to wait (for a reply, a timer or a cancel) and then yields
//! to the next message or timer.

use std::{
    collections::HashMap,
    future::Future,
    io::Write,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::{Value, json};
use tokio::{
    io::{AsyncWrite, AsyncWriteExt},
    sync::mpsc::{UnboundedReceiver, error::TryRecvError},
    time::Instant,
};

use agent_client_protocol_schema::v1::{ErrorCode, StopReason};

use super::{
    args::MockAgentArgs,
    options::ConfigOptions,
    script::{Directive, ElicitKind, PromptView, Script, chunk_text},
    store::SessionStore,
    wire::{self, ChunkKind},
};

/// How long `@cancel-permission` waits for any answer.
pub const CANCEL_PERMISSION_WAIT: Duration = Duration::from_secs(1);
/// Pending output beyond this is written out even in the middle of a directive.
const FLUSH_AT: usize = 64 * 1024;
/// The output buffer is shrunk back after a burst beyond this.
const KEEP_CAPACITY: usize = 1024 * 1024;

/// What the stdin reader hands over.
#[derive(Debug)]
pub enum Incoming {
    Message(Value),
    /// A line that is not JSON.
    Invalid,
}

/// Buffered stdout: frames are appended to `buf` and written out whenever the agent is about to
/// wait, before it exits, and whenever more than [`FLUSH_AT`] bytes are pending.
struct Out<W> {
    buf: Vec<u8>,
    /// `None` once closed (`@close-stdout`) or broken (a write failed).
    sink: Option<W>,
}

impl<W: AsyncWrite + Unpin> Out<W> {
    async fn flush(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        if let Some(sink) = &mut self.sink {
            let written = async {
                sink.write_all(&self.buf).await?;
                sink.flush().await
            }
            .await;
            if written.is_err() {
                // Nobody reads us any more: never write again, keep draining stdin.
                self.sink = None;
            }
        }
        self.buf.clear();
        if self.buf.capacity() > KEEP_CAPACITY {
            self.buf.shrink_to(FLUSH_AT);
        }
    }

    async fn flush_if_large(&mut self) {
        if self.buf.len() >= FLUSH_AT {
            self.flush().await;
        }
    }

    async fn close(&mut self) {
        self.flush().await;
        if let Some(mut sink) = self.sink.take() {
            let _ = sink.shutdown().await;
        }
    }
}

/// What one of the agent's own requests was for, so its answer can be reported.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Purpose {
    Permission,
    CancelPermission,
    Elicitation { url_elicitation_id: Option<String> },
    UnknownRequest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Run the next directive.
    Ready,
    /// `@sleep`.
    Until(Instant),
    /// `@wait-cancel`.
    Cancel,
    /// Until every outstanding request is answered (or the deadline, for `@cancel-permission`).
    Replies { deadline: Option<Instant> },
}

/// The running prompt.
struct Turn {
    /// The `session/prompt` request id, answered exactly.
    id: Value,
    session_id: String,
    directives: std::vec::IntoIter<Directive>,
    ignore_cancel: bool,
    wait: Wait,
    outstanding: Vec<(i64, Purpose)>,
    /// Token usage (input, output) the reply carries (`@turn-usage`).
    usage: Option<(u64, u64)>,
    /// The prompt's `_meta.traceparent`.
    traceparent: Option<String>,
}

enum Step {
    Continue,
    Exit(i32),
}

/// How the agent's loop ended.
enum Ending {
    /// Stdin closed (and the running turn did what it could without it).
    InputClosed,
    /// A directive exited with this code.
    Exit(i32),
}

pub struct Agent<W, E> {
    args: MockAgentArgs,
    out: Out<W>,
    stderr: E,
    /// Options a new (or newly seen) session starts with.
    initial_options: ConfigOptions,
    sessions: HashMap<String, ConfigOptions>,
    next_session: u64,
    next_request: i64,
    next_elicitation: u64,
    turn: Option<Turn>,
    /// `@silent`: nothing is ever written again.
    silent: bool,
    /// Reused by `@chunks`.
    scratch: String,
    /// `--session-dir`: the sessions' files (shared with whoever writes them on a stop).
    store: Option<Arc<Mutex<SessionStore>>>,
    /// `authenticate` succeeded with one of the `--auth-method`s: `--auth-required` no longer
    /// refuses `session/new`.
    signed_in: bool,
}

impl<W: AsyncWrite + Unpin, E: Write> Agent<W, E> {
    pub fn new(args: MockAgentArgs, output: W, stderr: E) -> Self {
        let initial_options = ConfigOptions::from_args(&args);
        let store = args.session_dir.as_deref().map(|dir| {
            let delay = Duration::from_millis(args.save_delay.unwrap_or(0));
            Arc::new(Mutex::new(SessionStore::new(dir, delay)))
        });
        Self {
            args,
            out: Out {
                buf: Vec::with_capacity(FLUSH_AT),
                sink: Some(output),
            },
            stderr,
            initial_options,
            sessions: HashMap::new(),
            next_session: 1,
            next_request: 1,
            next_elicitation: 1,
            turn: None,
            silent: false,
            scratch: String::new(),
            store,
            signed_in: false,
        }
    }

    /// Serves until stdin closes (0), a directive exits (its code), or `terminate` resolves (0:
    /// the process got SIGTERM). Once stdin has closed, the running turn still runs what needs no
    /// input (timers included), then the agent exits. Sessions not yet written are written when
    /// stdin closes and on `terminate`, never when a directive crashes the agent.
    pub async fn serve(
        mut self,
        incoming: &mut UnboundedReceiver<Incoming>,
        terminate: impl Future<Output = ()>,
    ) -> i32 {
        let store = self.store.clone();
        let write_all = || {
            if let Some(store) = &store {
                store.lock().expect("not poisoned").write_all();
            }
        };
        tokio::select! {
            ending = self.serve_loop(incoming) => match ending {
                Ending::Exit(code) => code,
                Ending::InputClosed => {
                    write_all();
                    0
                }
            },
            () = terminate => {
                write_all();
                0
            }
        }
    }

    fn store(&self) -> Option<std::sync::MutexGuard<'_, SessionStore>> {
        self.store
            .as_ref()
            .map(|store| store.lock().expect("not poisoned"))
    }

    async fn serve_loop(&mut self, incoming: &mut UnboundedReceiver<Incoming>) -> Ending {
        let mut input_open = true;
        loop {
            if self.silent || self.out.sink.is_none() {
                // Nothing can be written any more: keep the pipe drained until it closes.
                self.out.buf.clear();
                while incoming.recv().await.is_some() {}
                return Ending::InputClosed;
            }
            if input_open {
                match incoming.try_recv() {
                    Ok(message) => {
                        self.handle(message);
                        continue;
                    }
                    Err(TryRecvError::Disconnected) => {
                        input_open = false;
                        // Asked to stop: what is not written yet is written now.
                        if let Some(mut store) = self.store() {
                            store.write_all();
                        }
                    }
                    Err(TryRecvError::Empty) => {}
                }
            }
            if self.turn.as_ref().is_some_and(|t| t.wait == Wait::Ready) {
                if let Step::Exit(code) = self.step().await {
                    return Ending::Exit(code);
                }
                self.out.flush_if_large().await;
                continue;
            }
            self.out.flush().await;
            let deadline = self.turn.as_ref().and_then(|turn| match turn.wait {
                Wait::Until(at) => Some(at),
                Wait::Replies { deadline } => deadline,
                Wait::Ready | Wait::Cancel => None,
            });
            if !input_open {
                match deadline {
                    Some(at) => {
                        tokio::time::sleep_until(at).await;
                        self.on_deadline();
                        continue;
                    }
                    None => return Ending::InputClosed,
                }
            }
            let save_at = self.store().and_then(|store| store.next_due());
            tokio::select! {
                message = incoming.recv() => match message {
                    Some(message) => self.handle(message),
                    None => {
                        input_open = false;
                        if let Some(mut store) = self.store() {
                            store.write_all();
                        }
                    }
                },
                () = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    self.on_deadline();
                }
                () = tokio::time::sleep_until(save_at.unwrap_or_else(Instant::now)), if save_at.is_some() => {
                    if let Some(mut store) = self.store() {
                        store.write_due();
                    }
                }
            }
        }
    }

    fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.out.buf
    }

    fn handle(&mut self, message: Incoming) {
        let Incoming::Message(message) = message else {
            wire::error(
                self.buf(),
                &Value::Null,
                ErrorCode::ParseError,
                "Parse error",
            );
            return;
        };
        let params = message.get("params").unwrap_or(&Value::Null);
        match (
            message.get("method").and_then(Value::as_str),
            message.get("id"),
        ) {
            (Some(method), Some(id)) => self.on_request(method, id, params),
            (Some(method), None) => self.on_notification(method, params),
            (None, Some(id))
                if message.get("result").is_some() || message.get("error").is_some() =>
            {
                self.on_response(id, &message);
            }
            (None, id) => wire::error(
                self.buf(),
                id.unwrap_or(&Value::Null),
                ErrorCode::InvalidRequest,
                "Invalid Request: neither a request, a notification nor a response",
            ),
        }
    }

    fn session_options(&mut self, session_id: &str) -> &mut ConfigOptions {
        if !self.sessions.contains_key(session_id) {
            self.sessions
                .insert(session_id.to_owned(), self.initial_options.clone());
        }
        self.sessions.get_mut(session_id).expect("just inserted")
    }

    /// `{sessionId?, configOptions?}` for a session; the options are left out when there are none.
    fn session_result(&mut self, session_id: &str, with_id: bool) -> Value {
        let mut result = serde_json::Map::new();
        if with_id {
            result.insert("sessionId".into(), session_id.into());
        }
        let options = self.session_options(session_id);
        if !options.is_empty() {
            result.insert("configOptions".into(), options.to_json());
        }
        Value::Object(result)
    }

    fn on_request(&mut self, method: &str, id: &Value, params: &Value) {
        match method {
            "initialize" => {
                if self.args.hang_initialize {
                    // Never answered.
                    return;
                }
                if let Some(ms) = self.args.delay_initialize {
                    // Blocking is fine: nothing else can happen before the handshake.
                    std::thread::sleep(std::time::Duration::from_millis(ms));
                }
                if self.args.fail_initialize {
                    wire::error(
                        self.buf(),
                        id,
                        ErrorCode::InternalError,
                        "mock agent: initialize failed (--fail-initialize)",
                    );
                } else {
                    let result = self.initialize_result();
                    wire::response(self.buf(), id, &result);
                }
            }
            "authenticate" if !self.args.auth_methods.is_empty() => {
                let wanted = params.get("methodId").and_then(Value::as_str);
                let known =
                    self.args.auth_methods.iter().any(|m| {
                        Some(m.split_once('=').map_or(m.as_str(), |(id, _)| id)) == wanted
                    });
                if known {
                    self.signed_in = true;
                    wire::response(self.buf(), id, &json!({}));
                } else {
                    wire::error(
                        self.buf(),
                        id,
                        ErrorCode::InvalidParams,
                        &format!("unknown sign-in method {wanted:?}"),
                    );
                }
            }
            "session/new" => {
                if let Some(file) = &self.args.crash_on_new_session_once
                    && std::fs::remove_file(file).is_ok()
                {
                    eprintln!("mock agent: crashing on session/new (--crash-on-new-session-once)");
                    std::process::exit(1);
                }
                if self.args.auth_required && !self.signed_in {
                    wire::error(
                        self.buf(),
                        id,
                        ErrorCode::AuthRequired,
                        "authentication required",
                    );
                } else if self.args.fail_new_session {
                    wire::error(
                        self.buf(),
                        id,
                        ErrorCode::InternalError,
                        "mock agent: session/new failed (--fail-new-session)",
                    );
                } else {
                    let mut session_id = self.new_session_id();
                    if let Some(bytes) = self.args.session_id_bytes {
                        let pad = bytes.saturating_sub(session_id.len());
                        session_id.push_str(&"x".repeat(pad));
                    }
                    if let Some(mut store) = self.store() {
                        store.touch(&session_id, false);
                    }
                    let result = self.session_result(&session_id, true);
                    wire::response(self.buf(), id, &result);
                }
            }
            "session/load" if self.args.load => {
                let Some(session_id) = params.get("sessionId").and_then(Value::as_str) else {
                    return self.invalid_params(id, "params.sessionId must be a string");
                };
                if !self.reopen(id, session_id) {
                    return;
                }
                let buf = &mut self.out.buf;
                wire::text_chunk(
                    buf,
                    session_id,
                    ChunkKind::User,
                    "(replayed) earlier prompt",
                );
                wire::text_chunk(
                    buf,
                    session_id,
                    ChunkKind::Agent,
                    "(replayed) earlier answer",
                );
                let result = self.session_result(session_id, false);
                wire::response(self.buf(), id, &result);
            }
            "session/resume" if self.args.resume => {
                let Some(session_id) = params.get("sessionId").and_then(Value::as_str) else {
                    return self.invalid_params(id, "params.sessionId must be a string");
                };
                if !self.reopen(id, session_id) {
                    return;
                }
                let result = self.session_result(session_id, false);
                wire::response(self.buf(), id, &result);
            }
            "session/fork" if self.args.fork => {
                let Some(parent) = params.get("sessionId").and_then(Value::as_str) else {
                    return self.invalid_params(id, "params.sessionId must be a string");
                };
                let session_id = format!("{parent}-fork-{}", self.next_session);
                self.next_session += 1;
                if let Some(mut store) = self.store() {
                    store.touch(&session_id, false);
                }
                let result = self.session_result(&session_id, true);
                wire::response(self.buf(), id, &result);
            }
            "session/set_config_option" => {
                let Some(session_id) = params.get("sessionId").and_then(Value::as_str) else {
                    return self.invalid_params(id, "params.sessionId must be a string");
                };
                let options = self.session_options(session_id);
                match options.set(params) {
                    Ok(()) => {
                        let result = json!({"configOptions": options.to_json()});
                        wire::response(self.buf(), id, &result);
                    }
                    Err(refusal) => self.invalid_params(id, &refusal),
                }
            }
            "session/prompt" => self.start_turn(id, params),
            _ => wire::error(
                self.buf(),
                id,
                ErrorCode::MethodNotFound,
                &format!("Method not found: {method}"),
            ),
        }
    }

    /// A new session's id: `mock-session-<n>`, or with `--session-dir`, where ids must not
    /// repeat across processes, `mock-session-<unique>-<n>`.
    fn new_session_id(&mut self) -> String {
        let n = self.next_session;
        self.next_session += 1;
        if self.store.is_none() {
            return format!("mock-session-{n}");
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        format!("mock-session-{nanos:x}{:x}-{n}", std::process::id())
    }

    /// Checks a session to resume or load against `--session-dir`; answers the request with
    /// -32002 "Resource not found" and says `false` when its file is gone.
    fn reopen(&mut self, id: &Value, session_id: &str) -> bool {
        let Some(mut store) = self.store() else {
            return true;
        };
        if store.knows(session_id) {
            store.touch(session_id, false);
            return true;
        }
        drop(store);
        wire::error(
            self.buf(),
            id,
            ErrorCode::ResourceNotFound,
            &format!("Resource not found: session {session_id}"),
        );
        false
    }

    fn invalid_params(&mut self, id: &Value, message: &str) {
        wire::error(self.buf(), id, ErrorCode::InvalidParams, message);
    }

    /// `--auth-method ID[=NAME]`, each as ACP's `{id, name, description}`.
    fn auth_methods(&self) -> Value {
        self.args
            .auth_methods
            .iter()
            .map(|method| {
                let (id, name) = method.split_once('=').unwrap_or((method, method));
                json!({"id": id, "name": name,
                       "description": format!("mock sign-in method {id}")})
            })
            .collect()
    }

    fn initialize_result(&self) -> Value {
        let mut session_capabilities = serde_json::Map::new();
        if self.args.resume {
            session_capabilities.insert("resume".into(), json!({}));
        }
        if self.args.fork {
            session_capabilities.insert("fork".into(), json!({}));
        }
        json!({
            "protocolVersion": 1,
            "agentCapabilities": {
                "loadSession": self.args.load,
                "promptCapabilities": {"image": false, "audio": false, "embeddedContext": false},
                "mcpCapabilities": {"http": false, "sse": false},
                "sessionCapabilities": session_capabilities,
            },
            "authMethods": self.auth_methods(),
            "agentInfo": {
                "name": "agent-harness-mock",
                "title": "agent-harness mock agent",
                "version": env!("CARGO_PKG_VERSION"),
            },
        })
    }

    fn on_notification(&mut self, method: &str, params: &Value) {
        if method != "session/cancel" {
            return;
        }
        let session_id = params.get("sessionId").and_then(Value::as_str);
        let honoured = self.turn.as_ref().is_some_and(|turn| {
            !turn.ignore_cancel && session_id == Some(turn.session_id.as_str())
        });
        if honoured {
            self.end_turn(StopReason::Cancelled);
        }
    }

    fn end_turn(&mut self, reason: StopReason) {
        if let Some(turn) = self.turn.take() {
            wire::stop_with_usage(&mut self.out.buf, &turn.id, reason, turn.usage);
        }
    }

    fn on_response(&mut self, id: &Value, message: &Value) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        let Some(id) = id.as_i64() else {
            return;
        };
        let Some(index) = turn.outstanding.iter().position(|(own, _)| *own == id) else {
            return;
        };
        let (_, purpose) = turn.outstanding.remove(index);
        let session_id = turn.session_id.clone();
        if turn.outstanding.is_empty() && matches!(turn.wait, Wait::Replies { .. }) {
            turn.wait = Wait::Ready;
        }
        let error = message.get("error");
        let result = message.get("result").unwrap_or(&Value::Null);
        let report = match purpose {
            Purpose::Permission => format!("permission: {}", describe_permission(error, result)),
            Purpose::CancelPermission => {
                format!("cancel-permission: {}", describe_permission(error, result))
            }
            Purpose::UnknownRequest => match error {
                Some(error) => format!("unknown-request: error {}", error_code(error)),
                None => format!("unknown-request: result {result}"),
            },
            Purpose::Elicitation { url_elicitation_id } => {
                if let Some(elicitation_id) = url_elicitation_id
                    && error.is_none()
                    && result.get("action").and_then(Value::as_str) == Some("accept")
                {
                    wire::notification(
                        self.buf(),
                        "elicitation/complete",
                        &json!({"elicitationId": elicitation_id}),
                    );
                }
                format!("elicitation: {}", describe_elicitation(error, result))
            }
        };
        wire::text_chunk(self.buf(), &session_id, ChunkKind::Agent, &report);
    }

    fn on_deadline(&mut self) {
        let now = Instant::now();
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        match turn.wait {
            Wait::Until(at) if at <= now => turn.wait = Wait::Ready,
            Wait::Replies { deadline: Some(at) } if at <= now => {
                let session_id = turn.session_id.clone();
                let unanswered = std::mem::take(&mut turn.outstanding);
                turn.wait = Wait::Ready;
                for (_, purpose) in unanswered {
                    let label = match purpose {
                        Purpose::CancelPermission => "cancel-permission",
                        Purpose::Permission => "permission",
                        Purpose::Elicitation { .. } => "elicitation",
                        Purpose::UnknownRequest => "unknown-request",
                    };
                    wire::text_chunk(
                        &mut self.out.buf,
                        &session_id,
                        ChunkKind::Agent,
                        &format!("{label}: no response"),
                    );
                }
            }
            _ => {}
        }
    }

    fn start_turn(&mut self, id: &Value, params: &Value) {
        if self.turn.is_some() {
            return self.invalid_params(id, "a prompt is already running");
        }
        let Some(session_id) = params.get("sessionId").and_then(Value::as_str) else {
            return self.invalid_params(id, "params.sessionId must be a string");
        };
        let Some(blocks) = params.get("prompt").and_then(Value::as_array) else {
            return self.invalid_params(id, "params.prompt must be an array of content blocks");
        };
        if let Some(mut store) = self.store() {
            store.touch(session_id, true);
        }
        let buf = &mut self.out.buf;
        let (user_text, has_user_text, links) = match PromptView::read(blocks) {
            PromptView::Compact => {
                wire::text_chunk(buf, session_id, ChunkKind::Agent, "compacted");
                wire::stop(buf, id, StopReason::EndTurn);
                return;
            }
            PromptView::Ordinary {
                user_text,
                has_user_text,
                links,
            } => (user_text, has_user_text, links),
        };
        if has_user_text {
            self.scratch.clear();
            self.scratch.push_str("echo: ");
            self.scratch.push_str(&user_text);
            wire::text_chunk(buf, session_id, ChunkKind::Agent, &self.scratch);
        }
        for link in links {
            wire::block_chunk(buf, session_id, link);
        }
        let script = Script::parse(&user_text);
        if script.echo_all {
            for block in blocks {
                wire::block_chunk(buf, session_id, block);
            }
        }
        if script.directives.is_empty() {
            wire::stop(buf, id, StopReason::EndTurn);
            return;
        }
        self.turn = Some(Turn {
            id: id.clone(),
            session_id: session_id.to_owned(),
            directives: script.directives.into_iter(),
            ignore_cancel: script.ignore_cancel || self.args.ignore_cancel,
            wait: Wait::Ready,
            outstanding: Vec::new(),
            usage: None,
            traceparent: params
                .get("_meta")
                .and_then(|meta| meta.get("traceparent"))
                .and_then(Value::as_str)
                .map(str::to_owned),
        });
    }

    fn next_request_id(&mut self) -> i64 {
        let id = self.next_request;
        self.next_request += 1;
        id
    }

    /// Runs the running turn's next directive (or ends it when none is left).
    async fn step(&mut self) -> Step {
        let Some(mut turn) = self.turn.take() else {
            return Step::Continue;
        };
        let Some(directive) = turn.directives.next() else {
            wire::stop_with_usage(&mut self.out.buf, &turn.id, StopReason::EndTurn, turn.usage);
            return Step::Continue;
        };
        let session_id = turn.session_id.as_str();
        match directive {
            Directive::Chunks { count, size } => {
                let mut text = std::mem::take(&mut self.scratch);
                for index in 0..count {
                    text.clear();
                    chunk_text(index, size, &mut text);
                    wire::text_chunk(&mut self.out.buf, session_id, ChunkKind::Agent, &text);
                    self.out.flush_if_large().await;
                    if self.out.sink.is_none() {
                        break;
                    }
                }
                self.scratch = text;
            }
            Directive::Thought(text) => {
                wire::text_chunk(self.buf(), session_id, ChunkKind::Thought, &text);
            }
            Directive::Tool(tool_id) => {
                let buf = &mut self.out.buf;
                wire::update(
                    buf,
                    session_id,
                    &json!({"sessionUpdate": "tool_call", "toolCallId": tool_id,
                            "title": format!("Run {tool_id}"), "kind": "execute", "status": "pending"}),
                );
                wire::update(
                    buf,
                    session_id,
                    &json!({"sessionUpdate": "tool_call_update", "toolCallId": tool_id,
                            "status": "in_progress"}),
                );
                wire::update(
                    buf,
                    session_id,
                    &json!({"sessionUpdate": "tool_call_update", "toolCallId": tool_id,
                            "status": "completed",
                            "content": [{"type": "content", "content": {"type": "text", "text": "done"}}]}),
                );
            }
            Directive::Plan(entries) => {
                let entries: Vec<Value> = entries
                    .iter()
                    .enumerate()
                    .map(|(i, entry)| {
                        json!({"content": entry, "priority": "medium",
                               "status": if i == 0 { "in_progress" } else { "pending" }})
                    })
                    .collect();
                wire::update(
                    self.buf(),
                    session_id,
                    &json!({"sessionUpdate": "plan", "entries": entries}),
                );
            }
            Directive::Commands => wire::update(
                self.buf(),
                session_id,
                &json!({"sessionUpdate": "available_commands_update", "availableCommands": [
                    {"name": "test", "description": "Run the tests"},
                    {"name": "lint", "description": "Run the linter"},
                ]}),
            ),
            Directive::ConfigUpdate => {
                let options = self.session_options(session_id).to_json();
                wire::update(
                    self.buf(),
                    session_id,
                    &json!({"sessionUpdate": "config_option_update", "configOptions": options}),
                );
            }
            Directive::Image => wire::block_chunk(
                self.buf(),
                session_id,
                &json!({"type": "image", "mimeType": "image/png", "data": wire::PIXEL_PNG_BASE64}),
            ),
            Directive::Permission { title } => {
                let id = self.request_permission(session_id, &title);
                turn.outstanding.push((id, Purpose::Permission));
                turn.wait = Wait::Replies { deadline: None };
            }
            Directive::PermissionKind { kind, title } => {
                let id = self.request_permission_of(session_id, &title, Some(&kind));
                turn.outstanding.push((id, Purpose::Permission));
                turn.wait = Wait::Replies { deadline: None };
            }
            Directive::Usage { used, size, cost } => {
                let mut update =
                    json!({"sessionUpdate": "usage_update", "used": used, "size": size});
                if let Some((amount, currency)) = cost {
                    let amount: f64 = amount.parse().expect("checked when parsed");
                    update["cost"] = json!({"amount": amount, "currency": currency});
                }
                wire::update(self.buf(), session_id, &update);
            }
            Directive::PermissionTwice => {
                for n in 1..=2 {
                    let title = format!("Run mock command ({n} of 2)");
                    let id = self.request_permission(session_id, &title);
                    turn.outstanding.push((id, Purpose::Permission));
                }
                turn.wait = Wait::Replies { deadline: None };
            }
            Directive::PermissionNoWait => {
                // Asked, never awaited: an answer arriving later is ignored like any stray one.
                self.request_permission(session_id, "Run mock command (not awaited)");
            }
            Directive::CancelPermission => {
                let id = self.request_permission(session_id, "Run mock command (withdrawn)");
                wire::notification(self.buf(), "$/cancel_request", &json!({"requestId": id}));
                turn.outstanding.push((id, Purpose::CancelPermission));
                turn.wait = Wait::Replies {
                    deadline: Some(Instant::now() + CANCEL_PERMISSION_WAIT),
                };
            }
            Directive::Elicit(kind) => {
                let count = if kind == ElicitKind::Twice { 2 } else { 1 };
                for _ in 0..count {
                    let (id, purpose) = self.elicit(session_id, &turn.id, kind);
                    turn.outstanding.push((id, purpose));
                }
                turn.wait = Wait::Replies { deadline: None };
            }
            Directive::UnknownRequest => {
                let id = self.next_request_id();
                wire::request(
                    self.buf(),
                    id,
                    "fs/read_text_file",
                    &json!({"sessionId": session_id, "path": "/mock-agent/unknown-request.txt"}),
                );
                turn.outstanding.push((id, Purpose::UnknownRequest));
                turn.wait = Wait::Replies { deadline: None };
            }
            Directive::TurnUsage { input, output } => turn.usage = Some((input, output)),
            Directive::Traceparent => {
                let report = format!(
                    "traceparent: {}",
                    turn.traceparent.as_deref().unwrap_or("none")
                );
                wire::text_chunk(&mut self.out.buf, session_id, ChunkKind::Agent, &report);
            }
            Directive::Sleep { millis } => {
                turn.wait = Wait::Until(Instant::now() + Duration::from_millis(millis));
            }
            Directive::WaitCancel => turn.wait = Wait::Cancel,
            // Lifted into the turn's flags when the script was read.
            Directive::IgnoreCancel | Directive::EchoAll => {}
            Directive::Stop(reason) => {
                wire::stop_with_usage(&mut self.out.buf, &turn.id, reason, turn.usage);
                return Step::Continue;
            }
            Directive::Error { code, message } => {
                wire::error(self.buf(), &turn.id, code, &message);
                return Step::Continue;
            }
            Directive::Stderr(text) => {
                let _ = writeln!(self.stderr, "{text}");
                let _ = self.stderr.flush();
            }
            Directive::Crash { code } => {
                self.out.flush().await;
                let _ = writeln!(
                    self.stderr,
                    "mock-agent: crashing on purpose (@crash), exit code {code}"
                );
                let _ = self.stderr.flush();
                return Step::Exit(code);
            }
            Directive::Garbage => self.buf().extend_from_slice(b"this is not json\n"),
            Directive::Long { bytes } => {
                let mut text = String::with_capacity(bytes);
                chunk_text(0, bytes, &mut text);
                wire::text_chunk(self.buf(), session_id, ChunkKind::Agent, &text);
            }
            Directive::Silent => {
                self.out.flush().await;
                self.silent = true;
                return Step::Continue;
            }
            Directive::CloseStdout => {
                self.out.close().await;
                return Step::Continue;
            }
            Directive::Env => {
                let env: std::collections::BTreeMap<String, String> = std::env::vars_os()
                    .map(|(k, v)| {
                        (
                            k.to_string_lossy().into_owned(),
                            v.to_string_lossy().into_owned(),
                        )
                    })
                    .collect();
                let text = format!("env: {}", serde_json::to_string(&env).unwrap_or_default());
                wire::text_chunk(self.buf(), session_id, ChunkKind::Agent, &text);
            }
            Directive::EnvDigest(name) => {
                let text = format!("env-digest {name}: {}", env_digest(&name));
                wire::text_chunk(self.buf(), session_id, ChunkKind::Agent, &text);
            }
            Directive::Cwd => {
                let cwd = std::env::current_dir()
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_else(|e| format!("<{e}>"));
                wire::text_chunk(
                    self.buf(),
                    session_id,
                    ChunkKind::Agent,
                    &format!("cwd: {cwd}"),
                );
            }
            Directive::Fds => {
                let text = format!(
                    "fds: {}",
                    serde_json::to_string(&open_fds()).unwrap_or_default()
                );
                wire::text_chunk(self.buf(), session_id, ChunkKind::Agent, &text);
            }
            Directive::Unknown(line) => wire::text_chunk(
                self.buf(),
                session_id,
                ChunkKind::Agent,
                &format!("unknown directive: {line}"),
            ),
        }
        self.turn = Some(turn);
        Step::Continue
    }

    fn request_permission(&mut self, session_id: &str, title: &str) -> i64 {
        self.request_permission_of(session_id, title, None)
    }

    fn request_permission_of(&mut self, session_id: &str, title: &str, kind: Option<&str>) -> i64 {
        let id = self.next_request_id();
        let mut tool_call = json!({"toolCallId": format!("mock-permission-{id}"), "title": title});
        if let Some(kind) = kind {
            tool_call["kind"] = kind.into();
        }
        wire::request(
            self.buf(),
            id,
            "session/request_permission",
            &json!({
                "sessionId": session_id,
                "toolCall": tool_call,
                "options": [
                    {"optionId": "allow-once", "name": "Allow once", "kind": "allow_once"},
                    {"optionId": "allow-always", "name": "Allow always", "kind": "allow_always"},
                    {"optionId": "reject-once", "name": "Reject once", "kind": "reject_once"},
                    {"optionId": "reject-always", "name": "Reject always", "kind": "reject_always"},
                ],
            }),
        );
        id
    }

    fn elicit(&mut self, session_id: &str, prompt_id: &Value, kind: ElicitKind) -> (i64, Purpose) {
        let id = self.next_request_id();
        let form_schema = json!({
            "type": "object",
            "properties": {"name": {"type": "string", "title": "Name"}},
            "required": ["name"],
        });
        let (params, purpose) = match kind {
            ElicitKind::Form | ElicitKind::Twice => (
                json!({"mode": "form", "sessionId": session_id, "message": "Please fill in",
                       "requestedSchema": form_schema}),
                Purpose::Elicitation {
                    url_elicitation_id: None,
                },
            ),
            ElicitKind::Request => (
                json!({"mode": "form", "requestId": prompt_id, "message": "Please fill in",
                       "requestedSchema": form_schema}),
                Purpose::Elicitation {
                    url_elicitation_id: None,
                },
            ),
            ElicitKind::Url => {
                let elicitation_id = format!("el-{}", self.next_elicitation);
                self.next_elicitation += 1;
                (
                    json!({"mode": "url", "sessionId": session_id, "elicitationId": elicitation_id,
                           "url": "https://example.com/authorize",
                           "message": "Please authorize the mock agent"}),
                    Purpose::Elicitation {
                        url_elicitation_id: Some(elicitation_id),
                    },
                )
            }
        };
        wire::request(self.buf(), id, "elicitation/create", &params);
        (id, purpose)
    }
}

fn error_code(error: &Value) -> String {
    error
        .get("code")
        .map_or_else(|| "null".to_owned(), Value::to_string)
}

/// `selected <optionId>`, `cancelled`, `error <code>`, or `invalid <result>`.
fn describe_permission(error: Option<&Value>, result: &Value) -> String {
    if let Some(error) = error {
        return format!("error {}", error_code(error));
    }
    let outcome = result.get("outcome");
    match outcome
        .and_then(|o| o.get("outcome"))
        .and_then(Value::as_str)
    {
        Some("selected") => match outcome
            .and_then(|o| o.get("optionId"))
            .and_then(Value::as_str)
        {
            Some(option_id) => format!("selected {option_id}"),
            None => format!("invalid {result}"),
        },
        Some("cancelled") => "cancelled".to_owned(),
        _ => format!("invalid {result}"),
    }
}

/// `<action>` plus ` <content-json>` when content came back, or `error <code> <message>`.
fn describe_elicitation(error: Option<&Value>, result: &Value) -> String {
    if let Some(error) = error {
        let message = error.get("message").and_then(Value::as_str).unwrap_or("");
        return format!("error {} {message}", error_code(error));
    }
    match result.get("action").and_then(Value::as_str) {
        Some(action) => match result.get("content") {
            Some(content) if !content.is_null() => format!("{action} {content}"),
            _ => action.to_owned(),
        },
        None => format!("invalid {result}"),
    }
}

/// `fd → what it points at` for every open descriptor of this process (Linux `/proc`).
fn open_fds() -> std::collections::BTreeMap<u32, String> {
    let mut fds = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) {
            let target = std::fs::read_link(entry.path())
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            fds.insert(fd, target);
        }
    }
    fds
}

/// `set, N bytes, sha256 HEX` or `unset`: what `@env-digest` says of a variable.
fn env_digest(name: &str) -> String {
    use sha2::{Digest, Sha256};
    match std::env::var_os(name) {
        Some(value) => {
            let bytes = value.as_encoded_bytes();
            let digest: String = Sha256::digest(bytes)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            format!("set, {} bytes, sha256 {digest}", bytes.len())
        }
        None => "unset".to_owned(),
    }
}
