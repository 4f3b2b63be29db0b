//! The registry of sessions: creates them (validating everything before anything is stored),
//! finds them for a caller (another caller's session reads as SESSION_NOT_FOUND), and routes
//! each operation to the session's actor. No global lock is held across an await.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::SystemTime,
};

use base64::Engine;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;
use uuid::Uuid;

use super::{
    Command, ControlOutcome, EngineContext, SessionHandle,
    actor::{Actor, FirstPrompt, Resume, StartPurpose},
};
use crate::{
    domain::{
        ActionId, Error, ErrorCode, Principal, PromptAction, Result,
        action_id::parse_session_id,
        origin::Origin,
        queue::QueuedEntry,
        session::{SessionRecord, SessionStatus},
    },
    grpc::convert::ControlInput,
    store::{LogEntry, SessionQuery},
};

/// A CreateSession request, decoded.
#[derive(Debug, Clone, Default)]
pub struct CreateInput {
    pub session_id: Option<String>,
    pub profile: String,
    pub cwd: String,
    pub model: Option<String>,
    pub name: Option<String>,
    pub origin: Option<Origin>,
    pub labels: BTreeMap<String, String>,
    pub editors: Vec<String>,
}

/// A created (or idempotently found) session.
#[derive(Debug, Clone)]
pub struct Created {
    pub record: SessionRecord,
    pub head: u64,
    pub first_action_id: Option<ActionId>,
}

/// A ListSessions page request.
#[derive(Debug, Clone, Default)]
pub struct ListInput {
    pub page_size: i32,
    pub page_token: String,
    pub statuses: Vec<SessionStatus>,
    pub labels: BTreeMap<String, String>,
}

pub const DEFAULT_PAGE_SIZE: usize = 50;
pub const MAX_PAGE_SIZE: usize = 500;
/// ReadLog defaults (SPEC §3.4).
pub const DEFAULT_LOG_LIMIT: usize = 500;
pub const MAX_LOG_LIMIT: usize = 5000;
/// Room kept in a ReadLog page for the response's own fields.
const PAGE_OVERHEAD_BYTES: usize = 64 * 1024;
/// What one entry costs in a page besides its JSON (offset, actor, ids, time, framing).
const ENTRY_OVERHEAD_BYTES: usize = 128;

pub struct Sessions {
    ctx: Arc<EngineContext>,
    handles: RwLock<HashMap<Uuid, SessionHandle>>,
    /// Held from counting a principal's live sessions to storing a new one, so concurrent
    /// creates cannot both pass the cap (two quick store calls; creates only).
    admission: tokio::sync::Mutex<()>,
}

impl Sessions {
    /// Opens the registry over the store: every session that is not closed gets its actor back.
    pub async fn open(ctx: Arc<EngineContext>) -> Result<Self> {
        let reaped = ctx.registry.reap_leftovers();
        if reaped > 0 {
            tracing::warn!(
                reaped,
                "killed runtimes left over from a previous harness process"
            );
        }
        let sessions = Self {
            ctx: ctx.clone(),
            handles: RwLock::new(HashMap::new()),
            admission: tokio::sync::Mutex::new(()),
        };
        for record in ctx.store.open_sessions().await? {
            let id = record.id;
            let handle = sessions.resume(record, true).await?;
            sessions
                .handles
                .write()
                .expect("not poisoned")
                .insert(id, handle);
        }
        Ok(sessions)
    }

    pub fn context(&self) -> &Arc<EngineContext> {
        &self.ctx
    }

    /// Brings back the actor of a stored session, without a runtime (`after_restart`: loaded
    /// at harness start, so its runtime died with the previous process).
    async fn resume(&self, record: SessionRecord, after_restart: bool) -> Result<SessionHandle> {
        let store = &self.ctx.store;
        let head = store.head_offset(record.id).await?;
        let epoch = match head {
            0 => 0,
            head => store
                .read_log(record.id, head - 1, 1)
                .await?
                .first()
                .map_or(0, |e| e.epoch),
        };
        let queue = store.load_queue(record.id).await?;
        let profile = self
            .ctx
            .profiles
            .get(&record.profile)
            .cloned()
            .unwrap_or_else(|| {
                Arc::new(crate::config::Profile::builtin_mock(PathBuf::from(
                    format!(
                        "/nonexistent/profile-{}-is-no-longer-configured",
                        record.profile
                    ),
                )))
            });
        Ok(Actor::spawn(
            self.ctx.clone(),
            profile,
            Resume {
                record,
                head,
                epoch,
                queue,
                after_restart,
            },
            None,
        ))
    }

    /// The handle of a session the caller may see; any other reads as SESSION_NOT_FOUND.
    pub async fn handle(&self, principal: &Principal, session_id: &str) -> Result<SessionHandle> {
        let id = parse_session_id(session_id)?;
        let found = self.handles.read().expect("not poisoned").get(&id).cloned();
        let handle = match found {
            Some(handle) => handle,
            None => {
                // Closed sessions are not kept in memory; bring one back on demand.
                let record = self
                    .ctx
                    .store
                    .get_session(id)
                    .await?
                    .ok_or_else(|| Error::session_not_found(session_id))?;
                if !principal.may_access(&record.owner, &record.editors) {
                    return Err(Error::session_not_found(session_id));
                }
                let handle = self.resume(record, false).await?;
                let mut handles = self.handles.write().expect("not poisoned");
                handles.entry(id).or_insert(handle).clone()
            }
        };
        if !principal.may_access(&handle.shared.owner, &handle.shared.editors) {
            return Err(Error::session_not_found(session_id));
        }
        Ok(handle)
    }

    pub async fn create(
        &self,
        principal: &Principal,
        input: CreateInput,
        traceparent: Option<String>,
    ) -> Result<Created> {
        let ctx = &self.ctx;
        let limits = &ctx.limits;
        let profile = ctx.profiles.get(&input.profile).cloned().ok_or_else(|| {
            let known: Vec<&str> = ctx.profiles.keys().map(String::as_str).collect();
            Error::new(
                ErrorCode::ProfileNotFound,
                format!(
                    "profile {:?} is not configured; configured: {}",
                    input.profile,
                    known.join(", ")
                ),
            )
        })?;
        let cwd = self.check_cwd(&input.cwd, profile.allowed_cwd_roots.as_deref())?;
        let session_id = match &input.session_id {
            Some(id) => parse_session_id(id)?,
            None => Uuid::now_v7(),
        };
        if let Some(name) = &input.name {
            limits.check_session_name(name)?;
        }
        if let Some(model) = &input.model {
            limits.check_identifier("model", model)?;
        }
        self.check_labels_and_editors(&input.labels, &input.editors)?;
        let first_prompt = match &input.origin {
            Some(origin) => self.first_prompt(origin)?,
            None => None,
        };
        if let Some(prompt) = &first_prompt {
            limits.check_prompt(prompt)?;
        }
        if ctx.is_draining() {
            return Err(Error::new(
                ErrorCode::Draining,
                "the server is draining: create the session elsewhere",
            ));
        }
        let owner = principal.actor().to_owned();
        let request_fingerprint = request_fingerprint(&owner, &input);

        if input.session_id.is_some()
            && let Some(existing) = ctx.store.get_session(session_id).await?
        {
            return self
                .idempotent(existing, &owner, &request_fingerprint)
                .await;
        }
        let admission = self.admission.lock().await;
        if ctx.store.count_live_sessions(&owner).await? >= limits.sessions_per_principal as u64 {
            return Err(Error::new(
                ErrorCode::TooManySessions,
                format!(
                    "{owner} owns its maximum of {} live sessions; close some first",
                    limits.sessions_per_principal
                ),
            )
            .with("max", limits.sessions_per_principal));
        }

        let now = crate::domain::now();
        let record = SessionRecord {
            id: session_id,
            name: input.name.clone().unwrap_or_default(),
            owner: owner.clone(),
            profile: profile.name.clone(),
            cwd: cwd.to_string_lossy().into_owned(),
            model: String::new(),
            acp_session_id: String::new(),
            status: SessionStatus::Starting,
            status_reason: String::new(),
            created_at: now,
            updated_at: now,
            labels: input.labels.clone(),
            profile_fingerprint: profile.fingerprint(),
            editors: input.editors.clone(),
            request_fingerprint: request_fingerprint.clone(),
            can_resume: false,
            can_load: false,
        };
        let stored = ctx.store.create_session(&record).await;
        drop(admission);
        if let Err(error) = stored {
            if error.code == ErrorCode::SessionExists
                && let Some(existing) = ctx.store.get_session(session_id).await?
            {
                return self
                    .idempotent(existing, &owner, &request_fingerprint)
                    .await;
            }
            return Err(error);
        }

        let (ready_tx, ready_rx) = oneshot::channel();
        let first = first_prompt.map(|prompt| FirstPrompt {
            action_id: ActionId::mint(),
            prompt,
            actor: owner.clone(),
            traceparent,
        });
        let handle = Actor::spawn(
            ctx.clone(),
            profile.clone(),
            Resume {
                record,
                head: 0,
                epoch: 0,
                queue: Vec::new(),
                after_restart: false,
            },
            Some(StartPurpose::Create {
                ready: ready_tx,
                model: input.model.clone(),
                first_prompt: first,
            }),
        );
        self.handles
            .write()
            .expect("not poisoned")
            .insert(session_id, handle.clone());
        let started = ready_rx.await.unwrap_or_else(|_| {
            Err(Error::new(
                ErrorCode::RuntimeStartFailed,
                "the session stopped while its runtime was starting",
            ))
        });
        match started {
            Ok(first_action_id) => {
                let (record, head) = handle.shared.snapshot();
                tracing::info!(session = %session_id, profile = %profile.name, %owner, "session created");
                Ok(Created {
                    record,
                    head,
                    first_action_id,
                })
            }
            Err(error) => {
                // No session is left behind: not in memory, not in the store.
                self.handles
                    .write()
                    .expect("not poisoned")
                    .remove(&session_id);
                if let Err(e) = ctx.store.delete_session(session_id).await {
                    tracing::error!(session = %session_id, error = %e, "could not remove a failed session");
                }
                tracing::info!(session = %session_id, %error, "session creation failed");
                Err(error)
            }
        }
    }

    async fn idempotent(
        &self,
        existing: SessionRecord,
        owner: &str,
        request_fingerprint: &str,
    ) -> Result<Created> {
        if existing.owner != owner || existing.request_fingerprint != request_fingerprint {
            return Err(Error::new(
                ErrorCode::SessionExists,
                format!("session id {} is taken by a different request", existing.id),
            ));
        }
        let (record, head) = match self.live_snapshot(existing.id) {
            Some(snapshot) => snapshot,
            None => {
                let head = self.ctx.store.head_offset(existing.id).await?;
                (existing, head)
            }
        };
        let first_action_id = self.first_prompt_id(record.id).await?;
        Ok(Created {
            record,
            head,
            first_action_id,
        })
    }

    /// The action id of a session's first prompt, read back from its log.
    async fn first_prompt_id(&self, session_id: Uuid) -> Result<Option<ActionId>> {
        let entries = self.ctx.store.read_log(session_id, 0, 64).await?;
        Ok(entries.iter().find_map(|entry| {
            let frame: Value = serde_json::from_str(&entry.json).ok()?;
            (frame.get("method")?.as_str()? == "session/prompt")
                .then_some(entry.action_id)
                .flatten()
        }))
    }

    fn first_prompt(&self, origin: &Origin) -> Result<Option<PromptAction>> {
        let prompt = match origin {
            Origin::Mention(message) => {
                if message.attachments.is_empty() {
                    PromptAction::text(message.content.clone())
                } else {
                    self.ctx.translator.translate(message)?.prompt
                }
            }
            Origin::TaskAssignment(task) => PromptAction::text(task.prompt.clone()),
        };
        let empty = prompt.prompt.trim().is_empty() && prompt.attachments.is_empty();
        Ok((!empty).then_some(prompt))
    }

    /// `cwd` must be absolute, exist, and — canonicalised — lie under an allowed root.
    fn check_cwd(&self, cwd: &str, roots: Option<&[PathBuf]>) -> Result<PathBuf> {
        let path = Path::new(cwd);
        if cwd.is_empty() || !path.is_absolute() {
            return Err(Error::invalid(format!(
                "cwd {cwd:?} must be an absolute path"
            )));
        }
        if cwd.len() > 4096 {
            return Err(Error::limit(
                "cwd_bytes",
                4096,
                format_args!("a cwd of {} bytes", cwd.len()),
            ));
        }
        let canonical = std::fs::canonicalize(path)
            .map_err(|e| Error::invalid(format!("cwd {cwd:?} cannot be used: {e}")))?;
        if !canonical.is_dir() {
            return Err(Error::invalid(format!("cwd {cwd:?} is not a directory")));
        }
        match roots {
            None if self.ctx.tokens_configured => Err(Error::invalid(
                "this profile has no allowed_cwd_roots, so it accepts no cwd",
            )),
            None => Ok(canonical),
            Some(roots) => {
                let allowed = roots.iter().any(|root| {
                    std::fs::canonicalize(root).is_ok_and(|root| canonical.starts_with(root))
                });
                if allowed {
                    Ok(canonical)
                } else {
                    Err(Error::invalid(format!(
                        "cwd {cwd:?} is not under an allowed root of this profile"
                    )))
                }
            }
        }
    }

    fn check_labels_and_editors(
        &self,
        labels: &BTreeMap<String, String>,
        editors: &[String],
    ) -> Result<()> {
        let limits = &self.ctx.limits;
        if labels.len() > limits.labels {
            return Err(Error::limit(
                "labels",
                limits.labels,
                format_args!("{} labels", labels.len()),
            ));
        }
        for (key, value) in labels {
            if key.is_empty() {
                return Err(Error::invalid("a label key is empty"));
            }
            if key.len() > limits.label_bytes || value.len() > limits.label_bytes {
                return Err(Error::limit(
                    "label_bytes",
                    limits.label_bytes,
                    format_args!("label {key:?}"),
                ));
            }
        }
        if editors.len() > limits.editors {
            return Err(Error::limit(
                "editors",
                limits.editors,
                format_args!("{} editors", editors.len()),
            ));
        }
        for editor in editors {
            limits.check_identifier("editor", editor)?;
        }
        Ok(())
    }

    pub async fn get(
        &self,
        principal: &Principal,
        session_id: &str,
    ) -> Result<(SessionRecord, u64)> {
        Ok(self.handle(principal, session_id).await?.shared.snapshot())
    }

    pub async fn list(
        &self,
        principal: &Principal,
        input: ListInput,
    ) -> Result<(Vec<(SessionRecord, u64)>, String)> {
        let page_size = match input.page_size {
            n if n < 0 => return Err(Error::invalid("page_size must not be negative")),
            0 => DEFAULT_PAGE_SIZE,
            n => (n as usize).min(MAX_PAGE_SIZE),
        };
        let after = if input.page_token.is_empty() {
            None
        } else {
            Some(decode_page_token(&input.page_token)?)
        };
        let query = SessionQuery {
            owner_or_editor: (principal.kind != crate::domain::PrincipalKind::Local)
                .then(|| principal.actor().to_owned()),
            statuses: input.statuses,
            labels: input.labels,
            page_size: page_size + 1,
            after,
        };
        let mut records = self.ctx.store.list_sessions(&query).await?;
        let more = records.len() > page_size;
        records.truncate(page_size);
        let next = match (more, records.last()) {
            (true, Some(last)) => encode_page_token(last.created_at, last.id),
            _ => String::new(),
        };
        let mut page = Vec::with_capacity(records.len());
        for record in records {
            match self.live_snapshot(record.id) {
                Some(snapshot) => page.push(snapshot),
                None => {
                    let head = self.ctx.store.head_offset(record.id).await?;
                    page.push((record, head));
                }
            }
        }
        Ok((page, next))
    }

    pub async fn control(
        &self,
        principal: &Principal,
        input: ControlInput,
        traceparent: Option<String>,
    ) -> Result<ControlOutcome> {
        let handle = self.handle(principal, &input.session_id).await?;
        let principal = principal.clone();
        handle
            .ask(|reply| Command::Control {
                principal,
                input,
                traceparent,
                reply,
            })
            .await
    }

    pub async fn get_queue(
        &self,
        principal: &Principal,
        session_id: &str,
    ) -> Result<Vec<QueuedEntry>> {
        let handle = self.handle(principal, session_id).await?;
        handle.ask(|reply| Command::GetQueue { reply }).await
    }

    pub async fn edit_queued(
        &self,
        principal: &Principal,
        session_id: &str,
        action_id: &str,
        text: String,
    ) -> Result<QueuedEntry> {
        let handle = self.handle(principal, session_id).await?;
        let action_id = parse_queued_id(action_id)?;
        let principal = principal.clone();
        handle
            .ask(|reply| Command::EditQueued {
                principal,
                action_id,
                text,
                reply,
            })
            .await
    }

    pub async fn remove_queued(
        &self,
        principal: &Principal,
        session_id: &str,
        action_id: &str,
    ) -> Result<()> {
        let handle = self.handle(principal, session_id).await?;
        let action_id = parse_queued_id(action_id)?;
        handle
            .ask(|reply| Command::RemoveQueued { action_id, reply })
            .await
    }

    pub async fn close(
        &self,
        principal: &Principal,
        session_id: &str,
    ) -> Result<(SessionRecord, u64)> {
        let handle = self.handle(principal, session_id).await?;
        let record = handle.ask(|reply| Command::Close { reply }).await?;
        tracing::info!(session = %record.id, "session closed");
        Ok((record, handle.shared.head()))
    }

    pub async fn delete(&self, principal: &Principal, session_id: &str) -> Result<()> {
        let handle = self.handle(principal, session_id).await?;
        handle.ask(|reply| Command::Delete { reply }).await?;
        self.handles
            .write()
            .expect("not poisoned")
            .remove(&handle.shared.id);
        tracing::info!(session = %handle.shared.id, "session deleted");
        Ok(())
    }

    pub async fn read_log(
        &self,
        principal: &Principal,
        session_id: &str,
        after: u64,
        limit: u32,
    ) -> Result<(Vec<LogEntry>, u64)> {
        let handle = self.handle(principal, session_id).await?;
        let limit = match limit as usize {
            0 => DEFAULT_LOG_LIMIT,
            n => n.min(MAX_LOG_LIMIT),
        };
        let head = self.head_covering(&handle, after).await?;
        if after > head {
            return Err(offset_out_of_range(after, head));
        }
        let mut entries = self
            .ctx
            .store
            .read_log(handle.shared.id, after, limit)
            .await?;
        // A page also stays under the gRPC message limit: it ends before the entry that would
        // overflow it (an entry larger than the limit on its own still comes, alone).
        let budget = self
            .ctx
            .limits
            .grpc_message_bytes
            .saturating_sub(PAGE_OVERHEAD_BYTES);
        let mut used = 0;
        let fits = entries
            .iter()
            .position(|e| {
                used += e.json.len() + ENTRY_OVERHEAD_BYTES;
                used > budget
            })
            .unwrap_or(entries.len())
            .max(1);
        entries.truncate(fits);
        Ok((entries, head))
    }

    /// The session's head, read from the store when `after` is past the head the actor has
    /// published: a stream may already have delivered an entry the store holds before the actor
    /// moved its head, and resuming from that entry's offset must not be refused.
    async fn head_covering(&self, handle: &SessionHandle, after: u64) -> Result<u64> {
        let head = handle.shared.head();
        if after <= head {
            return Ok(head);
        }
        Ok(head.max(self.ctx.store.head_offset(handle.shared.id).await?))
    }

    /// Opens a stream of a session from `after` (see [`super::subscribe`]).
    pub async fn subscribe(
        &self,
        principal: &Principal,
        session_id: &str,
        after: u64,
        view: super::subscribe::View,
    ) -> Result<tokio::sync::mpsc::Receiver<super::subscribe::StreamItem>> {
        let handle = self.handle(principal, session_id).await?;
        let head = self.head_covering(&handle, after).await?;
        super::subscribe::start(
            handle,
            super::subscribe::StreamStart { after, head, view },
            self.ctx.store.clone(),
            self.ctx.meta_key.clone(),
            self.ctx.streams.subscribe(),
            self.ctx.limits.subscribers_per_session,
        )
    }

    /// The folded transcript, paged by turns, oldest first.
    pub async fn transcript(
        &self,
        principal: &Principal,
        session_id: &str,
        page_size: u32,
        page_token: &str,
    ) -> Result<Transcript> {
        let handle = self.handle(principal, session_id).await?;
        let page_size = match page_size as usize {
            0 => DEFAULT_PAGE_SIZE,
            n => n.min(MAX_PAGE_SIZE),
        } as u32;
        let after_turn: u32 = if page_token.is_empty() {
            0
        } else {
            decode_turn_token(page_token)?
        };
        let fold = self.fold(handle.shared.id).await?;
        let (messages, next_page_token) =
            match crate::domain::fold::page_turns(fold.turns(), after_turn, page_size) {
                Some((from, to)) => (
                    fold.turn_range(from, to).cloned().collect(),
                    if to < fold.turns() {
                        encode_turn_token(to)
                    } else {
                        String::new()
                    },
                ),
                None => (Vec::new(), String::new()),
            };
        let (record, _) = handle.shared.snapshot();
        Ok(Transcript {
            messages,
            metadata: fold.metadata().clone(),
            status: record.status,
            head: fold.head(),
            next_page_token,
        })
    }

    /// Folds a session's whole log, page by page.
    async fn fold(&self, session_id: Uuid) -> Result<crate::domain::fold::Fold> {
        let mut fold = crate::domain::fold::Fold::new(self.ctx.meta_key.clone());
        let mut after = 0;
        loop {
            let page = self
                .ctx
                .store
                .read_log(session_id, after, MAX_LOG_LIMIT)
                .await?;
            for entry in &page {
                fold.apply(entry);
            }
            match page.last() {
                Some(last) if page.len() == MAX_LOG_LIMIT => after = last.offset,
                _ => return Ok(fold),
            }
        }
    }

    /// Draining (SPEC §12): waits until no turn runs or `grace` has passed, ends every stream
    /// with DRAINING, then stops every runtime. New sessions and turns are already refused.
    pub async fn drain(&self, grace: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let activity = self.ctx.activity.notified();
            let busy = self
                .all()
                .iter()
                .filter(|h| {
                    matches!(
                        h.shared.status(),
                        SessionStatus::Running
                            | SessionStatus::AwaitingInput
                            | SessionStatus::Starting
                    )
                })
                .count();
            if busy == 0 {
                break;
            }
            tracing::info!(busy, "draining: waiting for running turns");
            if tokio::time::timeout_at(deadline, activity).await.is_err() {
                tracing::warn!(
                    busy,
                    "draining: grace period over; failing the turns still running"
                );
                break;
            }
        }
        let _ = self
            .ctx
            .streams
            .send(super::subscribe::StreamStop::Draining);
        let drains = self.all().into_iter().map(|handle| async move {
            let _ = handle.ask(|reply| Command::Drain { reply }).await;
        });
        futures::future::join_all(drains).await;
    }

    /// The record and head of a session held in memory, as they stand now.
    fn live_snapshot(&self, id: Uuid) -> Option<(SessionRecord, u64)> {
        self.handles
            .read()
            .expect("not poisoned")
            .get(&id)
            .map(|h| h.shared.snapshot())
    }

    /// Every live session handle (for draining and metrics).
    pub fn all(&self) -> Vec<SessionHandle> {
        self.handles
            .read()
            .expect("not poisoned")
            .values()
            .cloned()
            .collect()
    }
}

/// A page of a transcript.
#[derive(Debug, Clone)]
pub struct Transcript {
    pub messages: Vec<crate::domain::fold::Message>,
    pub metadata: crate::domain::fold::Metadata,
    pub status: SessionStatus,
    pub head: u64,
    pub next_page_token: String,
}

fn encode_turn_token(turn: u32) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("turn:{turn}"))
}

fn decode_turn_token(token: &str) -> Result<u32> {
    let bad = || Error::invalid("page_token is not a token this server issued");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    String::from_utf8(bytes)
        .ok()
        .and_then(|t| t.strip_prefix("turn:").and_then(|n| n.parse().ok()))
        .ok_or_else(bad)
}

pub(crate) fn offset_out_of_range(after: u64, head: u64) -> Error {
    Error::new(
        ErrorCode::OffsetOutOfRange,
        format!("after_offset {after} is beyond the head offset {head}"),
    )
    .with("head_offset", head)
}

fn parse_queued_id(text: &str) -> Result<ActionId> {
    ActionId::from_stored(text)
        .ok_or_else(|| Error::invalid(format!("action_id {text:?} is not a UUID")))
}

fn request_fingerprint(owner: &str, input: &CreateInput) -> String {
    let origin = match &input.origin {
        None => Value::Null,
        Some(Origin::Mention(m)) => json!({
            "mention": {"message_id": m.message_id, "channel_id": m.channel_id, "thread_id": m.thread_id,
                        "sender_id": m.sender_id, "content": m.content,
                        "attachments": m.attachments.iter().map(|a| [&a.entity_type, &a.entity_id]).collect::<Vec<_>>()}
        }),
        Some(Origin::TaskAssignment(t)) => {
            json!({"task_assignment": {"prompt": t.prompt, "assigned_by": t.assigned_by}})
        }
    };
    let canonical = json!({
        "owner": owner, "profile": input.profile, "cwd": input.cwd, "model": input.model,
        "name": input.name, "origin": origin, "labels": input.labels, "editors": input.editors,
    });
    hex::encode(Sha256::digest(canonical.to_string().as_bytes()))
}

fn encode_page_token(created_at: SystemTime, id: Uuid) -> String {
    let micros = crate::store::to_micros(created_at);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{micros}:{id}"))
}

fn decode_page_token(token: &str) -> Result<(SystemTime, Uuid)> {
    let bad = || Error::invalid("page_token is not a token this server issued");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let (micros, id) = text.split_once(':').ok_or_else(bad)?;
    let micros: i64 = micros.parse().map_err(|_| bad())?;
    let id = Uuid::try_parse(id).map_err(|_| bad())?;
    Ok((crate::store::from_micros(micros), id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_token_round_trips_and_garbage_is_invalid() {
        let at = crate::store::from_micros(1_700_000_000_123_456);
        let id = Uuid::now_v7();
        let token = encode_page_token(at, id);
        assert_eq!(decode_page_token(&token).unwrap(), (at, id));
        assert_eq!(
            decode_page_token("%%%").unwrap_err().code,
            ErrorCode::InvalidArgument
        );
    }
}
