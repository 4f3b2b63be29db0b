//! Helpers for session tests: profiles running our mock agent with flags, creating sessions,
//! sending actions, and waiting on the session's own stream (never on the clock).

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use agent_harness::{
    config::{PermissionPolicy, Profile, ServeConfig},
    pb::v1::{
        self as pb, agent_session_service_client::AgentSessionServiceClient,
        control_request::Action, subscribe_response::Event,
    },
};
use serde_json::Value;
use tonic::{Status, Streaming, transport::Channel};

use crate::harness::Harness;

/// Adds a profile that runs `agent-harness mock-agent` with these flags.
pub fn mock_profile(config: &mut ServeConfig, name: &str, flags: &[&str]) {
    mock_profile_with(config, name, flags, |_| {});
}

/// Like [`mock_profile`], with a chance to change the profile.
pub fn mock_profile_with(
    config: &mut ServeConfig,
    name: &str,
    flags: &[&str],
    edit: impl FnOnce(&mut Profile),
) {
    let mut args = vec!["mock-agent".to_owned()];
    args.extend(flags.iter().map(|f| f.to_string()));
    let mut profile = Profile {
        name: name.to_owned(),
        command: crate::service_bin(),
        args,
        env: BTreeMap::new(),
        permission_policy: PermissionPolicy::Ask,
        allowed_cwd_roots: None,
        startup_timeout: Duration::from_secs(10),
        turn_timeout: None,
        cancel_grace: Duration::from_secs(10),
        idle_timeout: None,
        permission_rules: Vec::new(),
        permission_timeout: None,
        remote: None,
        warm_pool: 0,
        resilience: Default::default(),
        secrets: Default::default(),
        config_options: Default::default(),
        auth_method: None,
        // Boxed, with the default limits, as a configured profile is.
        sandbox: Some(agent_harness::acp::sandbox::BoxPolicy {
            limits: agent_harness::config::sandbox::SandboxDefaults::default().limits,
            ..Default::default()
        }),
    };
    edit(&mut profile);
    config.profiles.insert(name.to_owned(), Arc::new(profile));
}

/// A session-driving client bound to one session.
pub struct Session {
    pub id: String,
    pub client: AgentSessionServiceClient<Channel>,
    pub created: pb::CreateSessionResponse,
}

pub fn create_request(h: &Harness, profile: &str) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        profile: profile.to_owned(),
        cwd: h.workspace().to_string_lossy().into_owned(),
        ..Default::default()
    }
}

impl Session {
    pub async fn create(h: &Harness, profile: &str) -> Self {
        Self::create_with(h, create_request(h, profile)).await
    }

    pub async fn create_with(h: &Harness, request: pb::CreateSessionRequest) -> Self {
        Self::create_with_client(h.sessions(), request).await
    }

    /// A session already there, reached through this client.
    pub fn attach(client: AgentSessionServiceClient<Channel>, id: &str) -> Self {
        Self {
            id: id.to_owned(),
            client,
            created: Default::default(),
        }
    }

    pub async fn create_with_client(
        mut client: AgentSessionServiceClient<Channel>,
        request: pb::CreateSessionRequest,
    ) -> Self {
        let created = client
            .create_session(request)
            .await
            .expect("the session is created")
            .into_inner();
        Self {
            id: created.session.as_ref().expect("a session").id.clone(),
            client,
            created,
        }
    }

    pub fn control_request(&self, action: Action) -> pb::ControlRequest {
        pb::ControlRequest {
            session_id: self.id.clone(),
            action: Some(action),
            ..Default::default()
        }
    }

    pub async fn control(
        &mut self,
        request: pb::ControlRequest,
    ) -> Result<pb::ControlResponse, Status> {
        self.client.control(request).await.map(|r| r.into_inner())
    }

    pub async fn act(&mut self, action: Action) -> Result<pb::ControlResponse, Status> {
        let request = self.control_request(action);
        self.control(request).await
    }

    pub async fn prompt(&mut self, text: &str) -> pb::ControlResponse {
        self.act(prompt(text))
            .await
            .expect("the prompt is accepted")
    }

    pub async fn get(&mut self) -> pb::AgentSession {
        self.client
            .get_session(pb::GetSessionRequest {
                session_id: self.id.clone(),
            })
            .await
            .expect("the session is readable")
            .into_inner()
            .session
            .expect("a session")
    }

    pub async fn queue(&mut self) -> Vec<pb::QueuedAction> {
        self.client
            .get_queue(pb::GetQueueRequest {
                session_id: self.id.clone(),
            })
            .await
            .expect("the queue is readable")
            .into_inner()
            .entries
    }

    /// The whole log as (direction, frame) pairs.
    pub async fn log(&mut self) -> Vec<pb::LogEntry> {
        let mut entries = Vec::new();
        loop {
            let page = self
                .client
                .read_log(pb::ReadLogRequest {
                    session_id: self.id.clone(),
                    after_offset: entries.last().map_or(0, |e: &pb::LogEntry| e.offset),
                    limit: 5000,
                })
                .await
                .expect("the log is readable")
                .into_inner();
            if page.entries.is_empty() {
                return entries;
            }
            entries.extend(page.entries);
        }
    }

    /// Outbound frames the runtime received, parsed.
    pub async fn sent_frames(&mut self) -> Vec<Value> {
        self.log()
            .await
            .into_iter()
            .filter(|e| e.direction == pb::LogDirection::ToRuntime as i32)
            .map(|e| serde_json::from_str(&e.json).expect("logged JSON"))
            .collect()
    }

    /// The first page of the folded transcript.
    pub async fn transcript(&mut self) -> pb::GetTranscriptResponse {
        self.client
            .get_transcript(pb::GetTranscriptRequest {
                session_id: self.id.clone(),
                ..Default::default()
            })
            .await
            .expect("the transcript reads")
            .into_inner()
    }

    /// A LOG-view stream from the beginning.
    pub async fn watch(&mut self) -> Watch {
        self.watch_from(0, pb::SubscribeView::Log).await
    }

    pub async fn watch_from(&mut self, after: u64, view: pb::SubscribeView) -> Watch {
        let stream = self
            .client
            .subscribe(pb::SubscribeRequest {
                session_id: self.id.clone(),
                after_offset: after,
                view: view as i32,
            })
            .await
            .expect("the session can be subscribed to")
            .into_inner();
        Watch {
            stream,
            entries: Vec::new(),
            statuses: Vec::new(),
        }
    }
}

pub fn prompt(text: &str) -> Action {
    Action::Prompt(pb::PromptAction {
        prompt: text.to_owned(),
        attachments: Vec::new(),
    })
}

pub fn attachment(uri: &str, name: &str) -> pb::PromptAttachment {
    pb::PromptAttachment {
        uri: uri.to_owned(),
        name: name.to_owned(),
        mime_type: None,
        size: None,
    }
}

pub fn stop(clear_queue: bool) -> Action {
    Action::Stop(pb::StopAction { clear_queue })
}

pub fn set_model(model: &str) -> Action {
    Action::SetModel(pb::SetModelAction {
        model: model.to_owned(),
    })
}

pub fn permission_answer(id: pb::JsonRpcId, option: Option<&str>) -> Action {
    use pb::respond_to_permission_action::Outcome;
    Action::RespondToPermission(pb::RespondToPermissionAction {
        request_id: Some(id),
        outcome: Some(match option {
            Some(option) => Outcome::SelectedOptionId(option.to_owned()),
            None => Outcome::Cancelled(pb::PermissionCancelled {}),
        }),
    })
}

/// An answer to the permission request the agent sent as `request` (its frame), on its own id
/// (a number, or a string as some agents send).
pub fn answer_request(request: &Value, option: Option<&str>) -> Action {
    let id = match &request["id"] {
        Value::String(text) => pb::JsonRpcId {
            id: Some(pb::json_rpc_id::Id::Text(text.clone())),
        },
        other => number_id(other.as_i64().expect("a numeric or string agent id")),
    };
    permission_answer(id, option)
}

/// How many sessions the harness lists for the (local) caller.
pub async fn session_count(h: &Harness) -> usize {
    h.sessions()
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect("sessions are listable")
        .into_inner()
        .sessions
        .len()
}

pub fn number_id(n: i64) -> pb::JsonRpcId {
    pb::JsonRpcId {
        id: Some(pb::json_rpc_id::Id::Number(n)),
    }
}

/// A session's stream, remembering everything it saw.
pub struct Watch {
    pub stream: Streaming<pb::SubscribeResponse>,
    pub entries: Vec<pb::LogEntry>,
    pub statuses: Vec<i32>,
}

impl Watch {
    /// Waits for the next event of any kind.
    pub async fn next(&mut self) -> Option<Result<pb::SubscribeResponse, Status>> {
        let item = self.stream.message().await.transpose()?;
        if let Ok(response) = &item {
            match &response.event {
                Some(Event::Entry(entry)) => self.entries.push(entry.clone()),
                Some(Event::Status(status)) => self.statuses.push(status.status),
                _ => {}
            }
        }
        Some(item)
    }

    /// Waits until a log entry matches (checking those already seen first); returns its frame.
    pub async fn entry(
        &mut self,
        matches: impl Fn(&pb::LogEntry, &Value) -> bool,
    ) -> (pb::LogEntry, Value) {
        let parsed =
            |e: &pb::LogEntry| serde_json::from_str::<Value>(&e.json).expect("logged JSON");
        if let Some(found) = self.entries.iter().find(|e| matches(e, &parsed(e))) {
            return (found.clone(), parsed(found));
        }
        loop {
            let event = self
                .next()
                .await
                .expect("the stream stays open")
                .expect("the stream does not fail");
            if let Some(Event::Entry(entry)) = event.event {
                let frame = parsed(&entry);
                if matches(&entry, &frame) {
                    return (entry, frame);
                }
            }
        }
    }

    /// Waits for the runtime's response to a request id.
    pub async fn response_to(&mut self, id: &str) -> Value {
        let id = id.to_owned();
        self.entry(move |e, f| {
            e.direction == pb::LogDirection::FromRuntime as i32 && f["id"] == id.as_str()
        })
        .await
        .1
    }

    /// Waits for an agent message chunk whose text contains `needle`.
    pub async fn chunk(&mut self, needle: &str) -> Value {
        let needle = needle.to_owned();
        self.entry(move |_, f| {
            f["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
                && f["params"]["update"]["content"]["text"]
                    .as_str()
                    .is_some_and(|t| t.contains(&needle))
        })
        .await
        .1
    }

    /// Waits for a request from the agent with this method; returns its frame.
    pub async fn agent_request(&mut self, method: &str) -> Value {
        let method = method.to_owned();
        self.entry(move |e, f| {
            e.direction == pb::LogDirection::FromRuntime as i32
                && f["method"] == method.as_str()
                && f.get("id").is_some()
        })
        .await
        .1
    }

    /// Waits for a harness event (`{"event": name}`).
    pub async fn event(&mut self, name: &str) -> Value {
        let name = name.to_owned();
        self.entry(move |e, f| {
            e.direction == pb::LogDirection::Event as i32 && f["event"] == name.as_str()
        })
        .await
        .1
    }

    /// Waits until a status event announces `status`.
    pub async fn status(&mut self, status: pb::SessionStatus) {
        let want = status as i32;
        if self.statuses.last() == Some(&want) {
            return;
        }
        loop {
            let event = self
                .next()
                .await
                .expect("the stream stays open")
                .expect("no failure");
            if let Some(Event::Status(change)) = event.event
                && change.status == want
            {
                return;
            }
        }
    }

    /// Waits for the next status event (the session record changed after what was seen so far).
    pub async fn next_status(&mut self) -> i32 {
        loop {
            let event = self
                .next()
                .await
                .expect("the stream stays open")
                .expect("no failure");
            if let Some(Event::Status(change)) = event.event {
                return change.status;
            }
        }
    }

    /// Waits for the stream to end with an error.
    pub async fn end(&mut self) -> Status {
        loop {
            match self.next().await {
                Some(Ok(_)) => continue,
                Some(Err(status)) => return status,
                None => panic!("the stream ended without an error"),
            }
        }
    }
}

/// Pids of live processes whose command line contains `marker`.
pub fn processes_with(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z'));
        if !zombie && String::from_utf8_lossy(&cmdline).contains(marker) {
            found.push(pid);
        }
    }
    found
}

/// Waits until each of `pids` has exited, on the kernel's notice (a pidfd turns readable when
/// its process ends) rather than by polling `/proc`. A pid already gone counts as exited.
pub async fn exited(pids: &[u32]) {
    use std::os::fd::{FromRawFd, OwnedFd};
    for &pid in pids {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor (or -1).
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::ESRCH),
                "pidfd_open({pid})"
            );
            continue;
        }
        // SAFETY: a descriptor just returned to us, owned from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
        // SAFETY: the AsyncFd owns the OwnedFd, which stays open (the same descriptor) until
        // both are dropped together.
        let fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        }
        .unwrap_or_else(|e| panic!("a pidfd registers with the runtime: {e:?}"));
        let _ = fd.readable().await.expect("the pidfd becomes readable");
    }
}
