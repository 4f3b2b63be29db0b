//! The ACP methods an agent serves, each mapped onto the harness's gRPC API.

use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use agent_client_protocol_schema::v1 as acp;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::{
    AcpArgs,
    attachment::{Attachment, Start},
    errors::{RpcError, code},
    wire::Outbox,
};
use crate::cli::{connect::Client, follow::pending_interactions};
use crate::pb::v1::{self as pb, control_request::Action};

/// How long `initialize` waits for the server before saying it does not answer.
const SERVER_ANSWER_LIMIT: Duration = Duration::from_secs(15);

/// The `_meta` key a client may use to name the profile in `session/new`.
const META_KEY: &str = "agent-harness";

pub(crate) struct Bridge {
    args: AcpArgs,
    pub(crate) outbox: Outbox,
    client: tokio::sync::Mutex<Option<Client>>,
    attached: Mutex<HashMap<String, Arc<Attachment>>>,
    /// The client's `clientCapabilities`, from `initialize`.
    capabilities: Mutex<Value>,
    /// Keeps this client's Control calls in the order it sent them.
    control_order: tokio::sync::Mutex<()>,
}

fn params<T: DeserializeOwned>(params: Value) -> Result<T, RpcError> {
    serde_json::from_value(params).map_err(|e| RpcError::invalid_params(e.to_string()))
}

impl Bridge {
    pub(crate) fn new(args: AcpArgs, outbox: Outbox) -> Self {
        Self {
            args,
            outbox,
            client: tokio::sync::Mutex::default(),
            attached: Mutex::default(),
            capabilities: Mutex::new(Value::Null),
            control_order: tokio::sync::Mutex::default(),
        }
    }

    pub(crate) async fn request(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        match method {
            "initialize" => self.initialize(params).await,
            "authenticate" => Ok(json!({})),
            "session/new" => self.new_session(params).await,
            "session/load" => self.load(params, true).await,
            "session/resume" => self.load(params, false).await,
            "session/prompt" => self.prompt(params).await,
            "session/set_config_option" => self.set_config_option(params).await,
            "session/set_mode" => self.set_mode(params).await,
            "session/list" => self.list(params).await,
            "session/close" => self.close(params).await,
            _ => Err(RpcError::method_not_found(method)),
        }
    }

    pub(crate) async fn notification(&self, method: &str, params: Value) {
        if method == "session/cancel" {
            match serde_json::from_value::<acp::CancelNotification>(params) {
                Ok(cancel) => self.cancel(&cancel.session_id.0).await,
                Err(e) => eprintln!("agent-harness acp: session/cancel ignored: {e}"),
            }
        }
        // Other notifications (`$/cancel_request` for a prompt, extensions) need nothing here:
        // a prompt ends with its turn.
    }

    /// The gRPC client, connecting on first use (and again after a failed attempt).
    async fn client(&self) -> Result<Client, RpcError> {
        let mut slot = self.client.lock().await;
        if let Some(client) = &*slot {
            return Ok(client.clone());
        }
        let client = self.args.server.connect().await?;
        *slot = Some(client.clone());
        Ok(client)
    }

    async fn initialize(&self, params: Value) -> Result<Value, RpcError> {
        let request: acp::InitializeRequest = self::params(params.clone())?;
        *self.capabilities.lock().expect("not poisoned") = params
            .get("clientCapabilities")
            .cloned()
            .unwrap_or(Value::Null);
        let mut client = self.client().await?;
        let server = crate::cli::redacted_url(self.args.server.url());
        // What the harness knows of the agent: from the named session, else from the newest
        // session of the profile. The call also proves the server answers, and takes the token.
        let known = tokio::time::timeout(SERVER_ANSWER_LIMIT, async {
            if let Some(id) = &self.args.session {
                let session = client
                    .get_session(pb::GetSessionRequest {
                        session_id: id.clone(),
                    })
                    .await?
                    .into_inner()
                    .session;
                return Ok::<_, tonic::Status>(session);
            }
            let page = client
                .list_sessions(pb::ListSessionsRequest {
                    page_size: 50,
                    ..Default::default()
                })
                .await?
                .into_inner();
            Ok(page.sessions.into_iter().find(|s| {
                Some(&s.profile) == self.args.profile.as_ref()
                    && !s.agent_capabilities_json.is_empty()
            }))
        })
        .await
        .map_err(|_| {
            RpcError::harness(
                code::INTERNAL_ERROR,
                "UNAVAILABLE",
                format!(
                    "{server} did not answer within {} s",
                    SERVER_ANSWER_LIMIT.as_secs()
                ),
            )
        })??;
        let profile = known
            .as_ref()
            .map(|s| s.profile.clone())
            .or_else(|| self.args.profile.clone());
        let agent = known.as_ref().and_then(|s| s.agent_info.clone());
        let agent_capabilities: Value = known
            .as_ref()
            .and_then(|s| serde_json::from_str(&s.agent_capabilities_json).ok())
            .unwrap_or(Value::Null);
        let behind = match (&agent, &profile) {
            (Some(agent), Some(profile)) => format!(
                " — {} (profile {profile})",
                agent.title.clone().unwrap_or_else(|| agent.name.clone())
            ),
            (None, Some(profile)) => format!(" — profile {profile}"),
            _ => String::new(),
        };
        Ok(json!({
            "protocolVersion": request
                .protocol_version
                .min(agent_client_protocol_schema::ProtocolVersion::LATEST),
            "agentCapabilities": {
                // The harness replays its own log, so every session loads and resumes,
                // whatever the agent behind it supports.
                "loadSession": true,
                // Prompts travel as text and file links; image, audio and embedded data
                // have no place in a harness prompt.
                "promptCapabilities": {"image": false, "audio": false, "embeddedContext": false},
                "mcpCapabilities": {"http": false, "sse": false},
                "sessionCapabilities": {"resume": {}, "list": {}, "close": {}},
            },
            "authMethods": [],
            "agentInfo": {
                "name": "agent-harness",
                "title": format!("agent-harness{behind}"),
                "version": env!("CARGO_PKG_VERSION"),
            },
            "_meta": {META_KEY: {
                "server": server,
                "profile": profile,
                "agent": agent.map(|a| json!({"name": a.name, "version": a.version, "title": a.title})),
                "agentCapabilities": agent_capabilities,
            }},
        }))
    }

    fn elicitation_capable(&self) -> bool {
        let capabilities = self.capabilities.lock().expect("not poisoned");
        capabilities
            .get("elicitation")
            .is_some_and(|e| !e.is_null() && *e != json!(false))
    }

    async fn new_session(&self, params: Value) -> Result<Value, RpcError> {
        let meta_profile = params["_meta"][META_KEY]["profile"]
            .as_str()
            .map(str::to_owned);
        let request: acp::NewSessionRequest = self::params(params)?;
        if !request.mcp_servers.is_empty() {
            eprintln!(
                "agent-harness acp: the client's {} MCP server(s) are not passed on: the harness opens agent sessions with no MCP servers (see docs/acp-agent.md)",
                request.mcp_servers.len()
            );
        }
        let mut client = self.client().await?;
        if let Some(id) = self.args.session.clone() {
            // Pinned to one session: a "new" session is that one, its history replayed.
            let session = get_session(&mut client, &id).await?;
            return self.attach(client, session, true, true).await;
        }
        let profile = meta_profile.or_else(|| self.args.profile.clone()).ok_or_else(|| {
            RpcError::harness(
                code::INVALID_PARAMS,
                "INVALID_ARGUMENT",
                "no profile: start `agent-harness acp --profile NAME`, or pass _meta {\"agent-harness\": {\"profile\": NAME}} in session/new",
            )
        })?;
        let created = client
            .create_session(pb::CreateSessionRequest {
                profile,
                cwd: request.cwd.to_string_lossy().into_owned(),
                labels: [("client".to_owned(), "acp".to_owned())].into(),
                ..Default::default()
            })
            .await?
            .into_inner();
        let session = created.session.unwrap_or_default();
        // From the start: what the agent says before the first prompt (its commands, say)
        // is news to this client.
        self.attach(client, session, false, true).await
    }

    async fn load(&self, params: Value, replay: bool) -> Result<Value, RpcError> {
        let session_id = params["sessionId"].as_str().map(str::to_owned);
        let session_id = if replay {
            self::params::<acp::LoadSessionRequest>(params)?
                .session_id
                .0
                .to_string()
        } else {
            session_id.ok_or_else(|| RpcError::invalid_params("missing sessionId"))?
        };
        let mut client = self.client().await?;
        let session = get_session(&mut client, &session_id).await?;
        self.attach(client, session, replay, false).await
    }

    /// Attaches `session` to this connection (once; again replaces the old stream). With
    /// `replay` the whole log is streamed as updates before the answer; `from_start` streams
    /// it after the answer (a new session's first words).
    async fn attach(
        &self,
        mut client: Client,
        session: pb::AgentSession,
        replay: bool,
        from_start: bool,
    ) -> Result<Value, RpcError> {
        let held = if replay || from_start {
            Vec::new()
        } else {
            pending_interactions(&mut client, &session.id)
                .await
                .map_err(RpcError::from)?
        };
        let attachment = Attachment::new(&session.id, self.elicitation_capable());
        if let Some(old) = self
            .attached
            .lock()
            .expect("not poisoned")
            .insert(session.id.clone(), attachment.clone())
        {
            old.detach();
        }
        let (go, wait_go) = oneshot::channel();
        let (caught_up, on_caught_up) = oneshot::channel();
        attachment.start(
            client,
            self.outbox.clone(),
            held,
            session.status(),
            Start {
                after: if replay || from_start {
                    0
                } else {
                    session.head_offset
                },
                caught_up: Some(caught_up),
                go: wait_go,
            },
        );
        let mut answer = json!({});
        if let Some(options) = config_options(&session) {
            answer["configOptions"] = options;
        }
        answer["_meta"] = json!({META_KEY: {"profile": session.profile, "status": status_name(session.status())}});
        if from_start {
            answer["sessionId"] = json!(session.id);
        }
        let _ = go.send(());
        if replay && !from_start {
            // The history goes out before the answer, as ACP's load does it.
            let _ = on_caught_up.await;
        }
        Ok(answer)
    }

    fn attachment(&self, session_id: &str) -> Option<Arc<Attachment>> {
        self.attached
            .lock()
            .expect("not poisoned")
            .get(session_id)
            .cloned()
    }

    /// The attachment for a session named in a request; a session of the harness not yet
    /// attached here is attached (as `session/resume` would).
    async fn attached(&self, session_id: &str) -> Result<Arc<Attachment>, RpcError> {
        if let Some(attachment) = self.attachment(session_id) {
            return Ok(attachment);
        }
        self.load(json!({"sessionId": session_id}), false).await?;
        self.attachment(session_id).ok_or_else(|| {
            RpcError::harness(code::RESOURCE_NOT_FOUND, "SESSION_NOT_FOUND", session_id)
        })
    }

    async fn prompt(&self, params: Value) -> Result<Value, RpcError> {
        let request: acp::PromptRequest = self::params(params)?;
        let session_id = request.session_id.0.to_string();
        let prompt = prompt_action(request.prompt)?;
        let attachment = self.attached(&session_id).await?;
        let mut client = self.client().await?;
        let action_id = uuid::Uuid::now_v7().to_string();
        let ended = attachment.expect_turn(&action_id);
        let request = pb::ControlRequest {
            session_id: session_id.clone(),
            action_id: Some(action_id.clone()),
            action: Some(Action::Prompt(prompt)),
            ..Default::default()
        };
        let sent = {
            let _order = self.control_order.lock().await;
            client.control(request.clone()).await
        };
        if let Err(status) = sent {
            attachment.forget_turn(&action_id);
            return Err(status.into());
        }
        attachment.accepted(&client, request);
        let stop_reason = ended.await.map_err(|_| {
            RpcError::harness(
                code::INTERNAL_ERROR,
                "DETACHED",
                "the session was detached before the turn ended",
            )
        })??;
        Ok(json!({"stopReason": stop_reason}))
    }

    /// Cancels this client's prompts: queued ones leave the queue, a running one is stopped.
    /// Another client's running turn is left alone.
    async fn cancel(&self, session_id: &str) {
        let Some(attachment) = self.attachment(session_id) else {
            return;
        };
        let Ok(mut client) = self.client().await else {
            return;
        };
        let (running, queued) = attachment.our_open_prompts();
        for action_id in queued {
            let removed = client
                .remove_queued_action(pb::RemoveQueuedActionRequest {
                    session_id: session_id.to_owned(),
                    action_id: action_id.clone(),
                })
                .await;
            if removed.is_ok() {
                attachment.end_turn(&action_id, Ok("cancelled"));
            }
        }
        if !running.is_empty() {
            let stopped = client
                .control(pb::ControlRequest {
                    session_id: session_id.to_owned(),
                    action: Some(Action::Stop(pb::StopAction { clear_queue: false })),
                    ..Default::default()
                })
                .await;
            if let Err(status) = stopped {
                eprintln!("agent-harness acp: stop refused: {}", status.message());
            }
        }
    }

    /// Sends a config change and waits for the agent's answer to it.
    async fn configure(&self, session_id: &str, action: Action) -> Result<Value, RpcError> {
        let attachment = self.attached(session_id).await?;
        let mut client = self.client().await?;
        let action_id = uuid::Uuid::now_v7().to_string();
        let answered = attachment.expect_answer(&action_id);
        client
            .control(pb::ControlRequest {
                session_id: session_id.to_owned(),
                action_id: Some(action_id),
                action: Some(action),
                ..Default::default()
            })
            .await?;
        match answered.await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(error)) => Err(RpcError {
                code: error["code"].as_i64().unwrap_or(code::INTERNAL_ERROR),
                message: error["message"].as_str().unwrap_or("refused").to_owned(),
                data: Some(json!({"reason": "AGENT_ERROR", "agentError": error})),
            }),
            Err(_) => Err(RpcError::harness(
                code::INTERNAL_ERROR,
                "DETACHED",
                "the session was detached before the agent answered",
            )),
        }
    }

    async fn set_config_option(&self, params: Value) -> Result<Value, RpcError> {
        let request: acp::SetSessionConfigOptionRequest = self::params(params)?;
        let value = match &request.value {
            acp::SessionConfigOptionValue::Boolean { value } => value.to_string(),
            acp::SessionConfigOptionValue::ValueId { value } => value.0.to_string(),
            _ => {
                return Err(RpcError::invalid_params(
                    "an option value of an unknown type",
                ));
            }
        };
        let session_id = request.session_id.0.to_string();
        let result = self
            .configure(
                &session_id,
                Action::SetConfigOption(pb::SetConfigOptionAction {
                    config_id: request.config_id.0.to_string(),
                    value,
                }),
            )
            .await?;
        Ok(json!({"configOptions": result.get("configOptions").cloned().unwrap_or(json!([]))}))
    }

    /// Modes are the agent's config option of category `mode`.
    async fn set_mode(&self, params: Value) -> Result<Value, RpcError> {
        let request: acp::SetSessionModeRequest = self::params(params)?;
        let session_id = request.session_id.0.to_string();
        let mut client = self.client().await?;
        let session = get_session(&mut client, &session_id).await?;
        let mode_option = config_options(&session)
            .and_then(|options| {
                options.as_array()?.iter().find_map(|o| {
                    (o["category"] == "mode").then(|| o["id"].as_str().map(str::to_owned))?
                })
            })
            .ok_or_else(|| {
                RpcError::harness(
                    code::INVALID_PARAMS,
                    "CONFIG_OPTION_UNKNOWN",
                    "the agent advertises no mode option",
                )
            })?;
        self.configure(
            &session_id,
            Action::SetConfigOption(pb::SetConfigOptionAction {
                config_id: mode_option,
                value: request.mode_id.0.to_string(),
            }),
        )
        .await?;
        Ok(json!({}))
    }

    async fn list(&self, params: Value) -> Result<Value, RpcError> {
        let request: acp::ListSessionsRequest =
            self::params(if params.is_null() { json!({}) } else { params })?;
        let mut client = self.client().await?;
        let page = client
            .list_sessions(pb::ListSessionsRequest {
                page_size: 100,
                page_token: request.cursor.unwrap_or_default(),
                ..Default::default()
            })
            .await?
            .into_inner();
        let sessions: Vec<Value> = page
            .sessions
            .iter()
            .filter(|s| {
                request
                    .cwd
                    .as_deref()
                    .is_none_or(|cwd| Path::new(&s.cwd) == cwd)
            })
            .map(|s| {
                let mut info = json!({
                    "sessionId": s.id,
                    "cwd": s.cwd,
                    "_meta": {META_KEY: {"profile": s.profile, "status": status_name(s.status())}},
                });
                if !s.name.is_empty() {
                    info["title"] = json!(s.name);
                }
                if let Some(updated) = &s.updated_at {
                    info["updatedAt"] = json!(rfc3339(updated));
                }
                info
            })
            .collect();
        let mut answer = json!({"sessions": sessions});
        if !page.next_page_token.is_empty() {
            answer["nextCursor"] = json!(page.next_page_token);
        }
        Ok(answer)
    }

    async fn close(&self, params: Value) -> Result<Value, RpcError> {
        let request: acp::CloseSessionRequest = self::params(params)?;
        let session_id = request.session_id.0.to_string();
        let mut client = self.client().await?;
        client
            .close_session(pb::CloseSessionRequest {
                session_id: session_id.clone(),
            })
            .await?;
        if let Some(attachment) = self
            .attached
            .lock()
            .expect("not poisoned")
            .remove(&session_id)
        {
            attachment.detach();
        }
        Ok(json!({}))
    }
}

async fn get_session(client: &mut Client, id: &str) -> Result<pb::AgentSession, RpcError> {
    Ok(client
        .get_session(pb::GetSessionRequest {
            session_id: id.to_owned(),
        })
        .await?
        .into_inner()
        .session
        .unwrap_or_default())
}

fn config_options(session: &pb::AgentSession) -> Option<Value> {
    serde_json::from_str::<Value>(&session.config_options_json)
        .ok()
        .filter(|options| options.as_array().is_some_and(|a| !a.is_empty()))
}

fn status_name(status: pb::SessionStatus) -> String {
    status
        .as_str_name()
        .trim_start_matches("SESSION_STATUS_")
        .to_ascii_lowercase()
}

fn rfc3339(at: &prost_types::Timestamp) -> String {
    humantime::format_rfc3339_millis(
        std::time::UNIX_EPOCH
            + Duration::new(
                at.seconds.max(0) as u64,
                at.nanos.clamp(0, 999_999_999) as u32,
            ),
    )
    .to_string()
}

/// An ACP prompt as a harness prompt: text blocks joined by newlines, links and resources (and
/// images or audio that name a URI) as attachments. Data with no URI has nowhere to go.
fn prompt_action(blocks: Vec<acp::ContentBlock>) -> Result<pb::PromptAction, RpcError> {
    let mut texts = Vec::new();
    let mut attachments = Vec::new();
    let link = |uri: String, name: Option<String>, mime_type: Option<String>, size: Option<i64>| {
        pb::PromptAttachment {
            name: name.unwrap_or_else(|| crate::cli::attachment_name(&uri)),
            uri,
            mime_type,
            size,
        }
    };
    for block in blocks {
        match block {
            acp::ContentBlock::Text(text) => texts.push(text.text),
            acp::ContentBlock::ResourceLink(l) => {
                attachments.push(link(l.uri, Some(l.name), l.mime_type, l.size))
            }
            acp::ContentBlock::Resource(embedded) => match embedded.resource {
                acp::EmbeddedResourceResource::TextResourceContents(r) => {
                    attachments.push(link(r.uri, None, r.mime_type, None))
                }
                acp::EmbeddedResourceResource::BlobResourceContents(r) => {
                    attachments.push(link(r.uri, None, r.mime_type, None))
                }
                _ => {
                    return Err(RpcError::invalid_params(
                        "an embedded resource of an unknown kind",
                    ));
                }
            },
            acp::ContentBlock::Image(image) => match image.uri {
                Some(uri) => attachments.push(link(uri, None, Some(image.mime_type), None)),
                None => {
                    return Err(RpcError::invalid_params(
                        "an image without a uri: the harness carries files as links (promptCapabilities.image is false)",
                    ));
                }
            },
            _ => {
                return Err(RpcError::invalid_params(
                    "a content block the harness cannot carry (only text, resource_link, resource and images with a uri)",
                ));
            }
        }
    }
    Ok(pb::PromptAction {
        prompt: texts.join("\n"),
        attachments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_keeps_its_text_and_links_and_refuses_data_without_a_uri() {
        let blocks: Vec<acp::ContentBlock> = serde_json::from_value(json!([
            {"type": "text", "text": "look"},
            {"type": "resource_link", "uri": "https://f.example/a.png", "name": "a.png", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///w/b.rs", "text": "fn main() {}"}},
            {"type": "text", "text": "please"},
        ]))
        .unwrap();
        let prompt = prompt_action(blocks).unwrap();
        assert_eq!(prompt.prompt, "look\nplease");
        assert_eq!(prompt.attachments.len(), 2);
        assert_eq!(prompt.attachments[1].name, "b.rs");
        let image: Vec<acp::ContentBlock> = serde_json::from_value(
            json!([{"type": "image", "data": "AAAA", "mimeType": "image/png"}]),
        )
        .unwrap();
        assert_eq!(prompt_action(image).unwrap_err().code, code::INVALID_PARAMS);
    }
}
