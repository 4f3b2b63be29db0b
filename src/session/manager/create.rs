//! Creating a session: everything is validated before anything is stored; a create repeated
//! with the same session id and request finds the session it made.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;
use uuid::Uuid;

use super::Sessions;
use crate::{
    domain::{
        ActionId, Error, ErrorCode, Principal, PromptAction, Result,
        action_id::parse_session_id,
        origin::Origin,
        session::{SessionRecord, SessionStatus},
    },
    session::{
        actor::{Actor, FirstPrompt, Resume, StartPurpose},
        workspace,
    },
    store::CappedCreate,
};

/// A CreateSession request, decoded.
#[derive(Debug, Clone, Default)]
pub(crate) struct CreateInput {
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
pub(crate) struct Created {
    pub record: SessionRecord,
    pub head: u64,
    pub first_action_id: Option<ActionId>,
}

/// What a create came to: the session created (or idempotently found) here, or the replica it
/// must be created on (the one holding a bridge that matches its remote profile), with the
/// decoded request handed back so the transport can send it there.
#[derive(Debug)]
pub(crate) enum Creation {
    Here(Created),
    Elsewhere { address: String, input: CreateInput },
}

/// A create request checked whole, before anything is stored.
struct Checked {
    profile: std::sync::Arc<crate::session::Profile>,
    cwd: PathBuf,
    session_id: Uuid,
    first_prompt: Option<PromptAction>,
}

/// What storing a new session's record came to.
enum Stored {
    New(SessionRecord),
    /// The id was taken meanwhile, by the same request: the session it made.
    Found(Created),
}

/// What a fork starts from: the parent's ACP session, and the first log entry that
/// carries the parent's log up to the fork point.
pub(crate) struct ForkFrom {
    pub parent_acp_session_id: String,
    pub forked_event: Value,
}

impl Sessions {
    pub(crate) async fn create(
        &self,
        principal: &Principal,
        input: CreateInput,
        traceparent: Option<String>,
    ) -> Result<Creation> {
        self.create_from(principal, input, traceparent, None).await
    }

    /// Creates a session here, or finds that it belongs on another replica: the request is
    /// checked whole ([`Self::check_new`]), an id already taken answers as the first create did,
    /// then the record is stored ([`Self::store_new`]) and its runtime started
    /// ([`Self::start_new`]).
    pub(crate) async fn create_from(
        &self,
        principal: &Principal,
        input: CreateInput,
        traceparent: Option<String>,
        fork: Option<ForkFrom>,
    ) -> Result<Creation> {
        let owner = principal.actor().to_owned();
        let checked = self.check_new(&input, &owner).await?;
        let request_fingerprint = request_fingerprint(&owner, &input);
        if input.session_id.is_some()
            && let Some(existing) = self.ctx.store.get_session(checked.session_id).await?
        {
            return self
                .idempotent(existing, &owner, &request_fingerprint)
                .await
                .map(Creation::Here);
        }
        // A session opened with a prompt spends its owner's budget at once.
        if checked.first_prompt.is_some() {
            self.ctx
                .check_budget(&owner, crate::session::metering::NOT_TAKEN)
                .await?;
        }
        // With several replicas a remote session runs where a matching bridge is connected.
        let home = self.home_for_new(&checked.profile).await?;
        if let Some(address) = self.moved_to(checked.session_id, &checked.profile.name, home) {
            if fork.is_some() {
                // A fork starts from its parent's context, which lives here.
                return Err(Error::new(
                    ErrorCode::RuntimeStartFailed,
                    format!(
                        "cannot fork into profile {}: no bridge matching its labels is connected \
                         to the replica running the parent session",
                        checked.profile.name
                    ),
                ));
            }
            return Ok(Creation::Elsewhere { address, input });
        }
        let record = match self
            .store_new(&checked, &input, owner, request_fingerprint)
            .await?
        {
            Stored::New(record) => record,
            Stored::Found(created) => return Ok(Creation::Here(created)),
        };
        self.start_new(record, checked, input.model, traceparent, fork)
            .await
            .map(Creation::Here)
    }

    /// Everything about a new session that can be checked before anything is stored.
    async fn check_new(&self, input: &CreateInput, owner: &str) -> Result<Checked> {
        let ctx = &self.ctx;
        let limits = &ctx.limits;
        let profile = ctx.profiles.get(&input.profile).cloned().ok_or_else(|| {
            let known: Vec<&str> = ctx.profiles.keys().map(String::as_str).collect();
            // A preset is not a profile until the config names it (with its keys, roots, box).
            let hint = if ctx.presets.contains(&input.profile) {
                format!(
                    "; {name:?} is a preset: add a profile for it to the config file, \
                     `[profiles.{name}]` with `preset = \"{name}\"` (and its key in \
                     env_passthrough or env_files), and restart",
                    name = input.profile
                )
            } else {
                String::new()
            };
            Error::new(
                ErrorCode::ProfileNotFound,
                format!(
                    "profile {:?} is not configured; configured: {}{hint}",
                    input.profile,
                    known.join(", ")
                ),
            )
        })?;
        let roots = profile
            .allowed_cwd_roots
            .as_deref()
            .map(|roots| workspace::roots_for(roots, owner));
        let cwd = match &profile.remote {
            Some(_) => self.check_remote_cwd(&input.cwd, roots.as_deref())?,
            None => self.check_cwd(&input.cwd, roots).await?,
        };
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
        Ok(Checked {
            profile,
            cwd,
            session_id,
            first_prompt,
        })
    }

    /// Stores the new session's record, within the principal's cap on live sessions; a
    /// concurrent create with the same id finds the session the first one stored.
    async fn store_new(
        &self,
        checked: &Checked,
        input: &CreateInput,
        owner: String,
        request_fingerprint: String,
    ) -> Result<Stored> {
        let ctx = &self.ctx;
        let limits = &ctx.limits;
        let admission = self.admission.lock().await;
        let now = crate::domain::now();
        let record = SessionRecord {
            id: checked.session_id,
            name: input.name.clone().unwrap_or_default(),
            owner: owner.clone(),
            profile: checked.profile.name.clone(),
            cwd: checked.cwd.to_string_lossy().into_owned(),
            model: String::new(),
            acp_session_id: String::new(),
            status: SessionStatus::Starting,
            status_reason: String::new(),
            created_at: now,
            updated_at: now,
            labels: input.labels.clone(),
            profile_fingerprint: checked.profile.fingerprint(),
            editors: input.editors.clone(),
            request_fingerprint: request_fingerprint.clone(),
            can_resume: false,
            can_load: false,
            first_action_id: checked.first_prompt.as_ref().map(|_| ActionId::mint()),
            // A boxed runtime's HOME is its owner's for this profile, kept with the session.
            home: (checked.profile.remote.is_none() && checked.profile.sandbox.is_some()).then(
                || {
                    ctx.sandbox()
                        .home_of(&checked.profile.name, &owner)
                        .to_string_lossy()
                        .into_owned()
                },
            ),
        };
        // Counted in the store with the insert, so the cap holds across replicas.
        let stored = ctx
            .store
            .create_session_capped(&record, limits.sessions_per_principal as u64)
            .await;
        drop(admission);
        match stored {
            Ok(CappedCreate::Created) => Ok(Stored::New(record)),
            Ok(CappedCreate::AtCap) => Err(Error::new(
                ErrorCode::TooManySessions,
                format!(
                    "{owner} owns its maximum of {} live sessions; close some first",
                    limits.sessions_per_principal
                ),
            )
            .with("max", limits.sessions_per_principal)),
            Err(error) => {
                if error.code == ErrorCode::SessionExists
                    && let Some(existing) = ctx.store.get_session(checked.session_id).await?
                {
                    return self
                        .idempotent(existing, &owner, &request_fingerprint)
                        .await
                        .map(Stored::Found);
                }
                Err(error)
            }
        }
    }

    /// Claims the stored session, writes a fork's first entry, and starts its actor and
    /// runtime; answers once the runtime is up (or the start failed and nothing is left).
    async fn start_new(
        &self,
        record: SessionRecord,
        checked: Checked,
        model: Option<String>,
        traceparent: Option<String>,
        fork: Option<ForkFrom>,
    ) -> Result<Created> {
        let ctx = &self.ctx;
        let Checked {
            profile,
            session_id,
            first_prompt,
            ..
        } = checked;
        let owner = record.owner.clone();
        let now = record.created_at;
        // The creating replica owns the new session.
        let fence = self.claim_new(session_id).await?;
        let mut head = 0;
        let mut fork_of = None;
        if let Some(fork) = fork {
            // The parent's messages are the new log's first entry, before its runtime starts.
            let batch = crate::store::Batch {
                entries: vec![crate::store::LogEntry {
                    offset: 1,
                    direction: crate::store::Direction::Event,
                    json: fork.forked_event.to_string(),
                    actor: crate::session::actor::HARNESS_ACTOR.to_owned(),
                    action_id: None,
                    epoch: 0,
                    created_at: now,
                }],
                fence,
                ..Default::default()
            };
            if let Err(error) = ctx.store.commit(session_id, batch).await {
                let mut error = crate::domain::Error::from(error);
                match ctx.store.delete_session(session_id).await {
                    // Gone whole, whether or not a commit whose answer was lost had landed.
                    Ok(_) if error.code == crate::domain::ErrorCode::OutcomeUnknown => {
                        error.code = crate::domain::ErrorCode::StoreUnavailable;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::error!(session = %session_id, error = %e, "could not remove a failed fork");
                    }
                }
                return Err(error);
            }
            head = 1;
            fork_of = Some(fork.parent_acp_session_id);
        }
        let (ready_tx, ready_rx) = oneshot::channel();
        let first = first_prompt.map(|prompt| FirstPrompt {
            action_id: record.first_action_id.expect("minted with the record"),
            prompt,
            actor: owner.clone(),
            traceparent,
        });
        let handle = Actor::spawn(
            ctx.clone(),
            profile.clone(),
            Resume {
                record,
                head,
                epoch: 0,
                queue: Vec::new(),
                after_restart: false,
                fence,
                owner_lost: false,
            },
            Some(StartPurpose::Create {
                ready: ready_tx,
                model,
                model_request: None,
                first_prompt: first,
                fork_of,
            }),
        );
        self.handles
            .write()
            .expect("not poisoned")
            .insert(session_id, handle.clone());
        // The rest runs in a task of its own: a caller who gives up (and so drops this future)
        // must not leave a session whose start fails behind, in memory or in the store.
        let handles = self.handles.clone();
        let ctx = ctx.clone();
        let finish = tokio::spawn(async move {
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
                    handles.write().expect("not poisoned").remove(&session_id);
                    if let Err(e) = ctx.store.delete_session(session_id).await {
                        tracing::error!(session = %session_id, error = %e, "could not remove a failed session");
                    }
                    tracing::info!(session = %session_id, %error, "session creation failed");
                    Err(error)
                }
            }
        });
        finish
            .await
            .map_err(|e| Error::internal(format!("creating the session failed: {e}")))?
    }

    async fn idempotent(
        &self,
        existing: SessionRecord,
        owner: &str,
        request_fingerprint: &str,
    ) -> Result<Created> {
        // Another principal's session and one of the caller's own made by a different request
        // get one and the same answer, built from the id the caller sent and nothing stored:
        // the caller cannot tell whether the id is someone else's (docs/security.md).
        if existing.owner != owner || existing.request_fingerprint != request_fingerprint {
            return Err(session_id_taken(existing.id));
        }
        let (record, head) = match self.live_snapshot(existing.id) {
            Some(snapshot) => snapshot,
            None => {
                let head = self.ctx.store.head_offset(existing.id).await?;
                (existing, head)
            }
        };
        // Sessions stored before the record kept it: read it back from the log.
        let first_action_id = match record.first_action_id {
            Some(id) => Some(id),
            None => self.first_prompt_id(record.id).await?,
        };
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

    /// A remote runtime's cwd is on the bridge's machine, so here it is checked by its text only
    /// (absolute, no `.` or `..`, under an allowed root); the bridge canonicalises it and checks
    /// its own profile's roots before it starts anything.
    fn check_remote_cwd(&self, cwd: &str, roots: Option<&[PathBuf]>) -> Result<PathBuf> {
        use std::path::Component;
        let path = Path::new(cwd);
        if cwd.is_empty() || !path.is_absolute() || cwd.len() > 4096 {
            return Err(Error::invalid(format!(
                "cwd {cwd:?} must be an absolute path of at most 4096 bytes"
            )));
        }
        if path
            .components()
            .any(|c| matches!(c, Component::CurDir | Component::ParentDir))
        {
            return Err(Error::invalid(format!(
                "cwd {cwd:?} of a remote profile may not hold . or .. components"
            )));
        }
        match roots {
            None if self.ctx.tokens_configured => Err(Error::invalid(
                "this profile has no allowed_cwd_roots, so it accepts no cwd",
            )),
            Some(roots) if !roots.iter().any(|root| path.starts_with(root)) => Err(Error::invalid(
                format!("cwd {cwd:?} is not under an allowed root of this profile"),
            )),
            _ => Ok(path.to_path_buf()),
        }
    }

    /// `cwd` must be absolute, exist, and — canonicalised — lie under an allowed root (as
    /// expanded for the owner) and clear of the server's files (`workspace`). The file system
    /// is asked on a blocking thread: a slow or hung mount must not stall the runtime's worker
    /// threads (every session on them).
    async fn check_cwd(&self, cwd: &str, roots: Option<Vec<PathBuf>>) -> Result<PathBuf> {
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
        let has_roots = roots.is_some();
        let looked_up =
            workspace::look_up_on_a_thread(path.to_path_buf(), roots, self.ctx.forbidden_cwds())
                .await
                .map_err(|e| Error::invalid(format!("cwd {cwd:?} cannot be used: {e}")))?;
        let workspace::Lookup::Directory {
            canonical,
            allowed: under_a_root,
        } = looked_up
        else {
            return Err(Error::invalid(format!("cwd {cwd:?} is not a directory")));
        };
        match under_a_root {
            None if self.ctx.tokens_configured => Err(Error::invalid(
                "this profile has no allowed_cwd_roots, so it accepts no cwd",
            )),
            None | Some(true) => Ok(canonical),
            // Without roots there are no tokens either (one trusted user): the reason can be
            // told. With them, every refusal reads alike (module `workspace`).
            Some(false) if !has_roots => Err(Error::invalid(format!(
                "cwd {cwd:?} lies in a path of the server's or holds one of its files (config, \
                 tokens file, TLS keys, secrets): an agent may change anything in its cwd, so \
                 choose a directory apart from them"
            ))),
            Some(false) => Err(Error::invalid(format!(
                "cwd {cwd:?} is not under an allowed root of this profile"
            ))),
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
}

/// The answer to a caller-minted session id that is already in use by a different request.
fn session_id_taken(session_id: Uuid) -> Error {
    Error::new(
        ErrorCode::SessionExists,
        format!("session id {session_id} is taken by a different request"),
    )
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
