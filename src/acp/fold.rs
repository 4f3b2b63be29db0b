//! The fold: a pure, deterministic, incremental function from a session's ordered log
//! entries to the transcript people read — messages and session metadata. The same entries always
//! give the same transcript; folding is incremental so live subscribers pay per entry.
//!
//! Shape of the transcript: a turn is what is sent to the agent for it to work on — a prompt or a
//! compact. Each opens a numbered turn with a user message `"{turn}:user"` whose `request_id` is
//! the action id; a prompt's message holds the user's text (the hidden block left out) and its
//! attachments read back from the frame, a compact's a control part. The other controls (setModel,
//! setConfigOption, stop) open no turn: each is a user message `"{turn}:control:{n}"` of the turn
//! it came during or after (0 before the first prompt), `n` counting the session's controls, so one
//! numbering holds everywhere a transcript is shown. Agent output of a running prompt or compact
//! goes to that turn's `"{turn}:agent"` message. Answers update the permission and elicitation
//! parts they answer.
//!
//! The transcript's types live in `acp/transcript.rs`. Frames are read through the lenient views
//! of `acp/fold/views.rs`: a field an agent leaves out or sends in another shape is skipped,
//! never a reason to drop the frame; the log keeps every frame word for word.

mod views;

use std::{collections::HashMap, sync::Arc};

use serde_json::Value;

use super::{
    frames as acp_frames,
    transcript::{
        AgentInfo, CONTEXT_REBUILT_EVENT, ContextRebuiltPart, ControlKind, ControlPart,
        ElicitationPart, Message, Metadata, ModelOption, Outcome, Part, PermissionOption,
        PermissionPart, PlanEntry, Role, StopReason, TURN_FAILED_EVENT, ToolPart, TurnEnd, Usage,
    },
    // The views shared with the session actor (`acp/views.rs`); the fold's own are `views::` below.
    views::{ConfigOption, ContentBlock, Envelope, Params, RawParams, Reply, RpcError, view},
};
use crate::domain::text::cap_foreign;
use crate::domain::{
    Action, ActionId, JsonRpcId,
    action::{ElicitationAnswer, PermissionAnswer},
    log::{Direction, LogEntry},
};
use views::{
    ElicitationParams, Event, Forked, ForkedEntry, PermissionParams, ReplyResult, Update,
    UpdateParams,
};

/// The `event` name of a fork's first log entry: `{"event": "forked", "parent_session_id",
/// "parent_head", "entries": [{"offset", "direction", "json", "actor", "action_id", "epoch"}]}`.
pub const FORKED_EVENT: &str = "forked";

/// One parent entry of a `forked` event, as a log entry (its time is not kept).
fn inherited_entry(entry: ForkedEntry) -> Option<LogEntry> {
    Some(LogEntry {
        offset: entry.offset?,
        direction: Direction::from_i64(entry.direction?)?,
        json: entry.json?.to_owned(),
        actor: entry.actor.unwrap_or_default().to_owned(),
        action_id: entry.action_id.and_then(ActionId::from_stored),
        epoch: entry.epoch.unwrap_or(0) as u32,
        created_at: std::time::UNIX_EPOCH,
    })
}

/// The `event` of a fork's first entry, holding the parent's log up to the fork point.
pub fn forked_event(parent_session_id: &str, entries: &[LogEntry]) -> Value {
    serde_json::json!({
        "event": FORKED_EVENT,
        "parent_session_id": parent_session_id,
        "parent_head": entries.last().map_or(0, |e| e.offset),
        "entries": entries.iter().map(|e| serde_json::json!({
            "offset": e.offset,
            "direction": e.direction.as_i64(),
            "json": e.json,
            "actor": e.actor,
            "action_id": e.action_id.map(|id| id.to_string()),
            "epoch": e.epoch,
        })).collect::<Vec<_>>(),
    })
}

/// Where to find a part the agent may update later.
#[derive(Debug, Clone, Copy)]
struct PartRef {
    message: usize,
    part: usize,
}

/// The fold's state: the transcript so far plus what later entries refer to.
///
/// Cloning is cheap and the clones share everything neither has changed since: the messages and
/// the maps are held behind `Arc`s and copied on write, one message at a time. Streams of one
/// session adopt a common fold this way (`session/subscribe/shared_fold.rs`), so a hundred of
/// them hold one transcript, not a hundred.
#[derive(Debug, Clone)]
pub struct Fold {
    meta_key: Arc<str>,
    messages: Arc<Vec<Arc<Message>>>,
    index: Arc<HashMap<String, usize>>,
    turns: u32,
    /// Turn number of each prompt and compact.
    turn_of: Arc<HashMap<ActionId, u32>>,
    /// Message id of each control that opened no turn (setModel, setConfigOption, stop).
    control_of: Arc<HashMap<ActionId, String>>,
    /// Controls that opened no turn so far: the `n` of their message ids.
    controls: u32,
    /// The prompt or compact whose response has not arrived.
    open_turn: Option<u32>,
    /// The last prompt or compact turn, for agent output that arrives between turns.
    last_prompt_turn: Option<u32>,
    permissions: Arc<HashMap<JsonRpcId, PartRef>>,
    elicitations: Arc<HashMap<JsonRpcId, PartRef>>,
    /// Requests the harness made whose replies replay history (`session/load`), by id text.
    replaying: Option<String>,
    /// Why the agent's session was rebuilt, until the next prompt (which carries the transcript
    /// and shows it).
    context_rebuilt: Option<String>,
    config_options: Arc<Vec<Value>>,
    metadata: Arc<Metadata>,
    head: u64,
    /// Turns ended by the entries folded since [`Fold::take_turn_ends`] was last called.
    ended: Vec<TurnEnd>,
    /// Set when an entry ended a turn or showed a new pending interaction: what a subscriber waits
    /// for, never to be held back by coalescing.
    urgent: bool,
}

impl Fold {
    pub fn new(meta_key: impl Into<String>) -> Self {
        Self {
            meta_key: Arc::from(meta_key.into()),
            messages: Default::default(),
            index: Default::default(),
            turns: 0,
            turn_of: Default::default(),
            control_of: Default::default(),
            controls: 0,
            open_turn: None,
            last_prompt_turn: None,
            permissions: Default::default(),
            elicitations: Default::default(),
            replaying: None,
            context_rebuilt: None,
            config_options: Default::default(),
            metadata: Default::default(),
            head: 0,
            ended: Vec::new(),
            urgent: false,
        }
    }

    /// Folds a whole log.
    pub fn of<'a>(meta_key: &str, entries: impl IntoIterator<Item = &'a LogEntry>) -> Self {
        let mut fold = Self::new(meta_key);
        for entry in entries {
            fold.apply(entry);
        }
        fold
    }

    /// Why the agent's session was rebuilt, while the next prompt (which is to carry the
    /// transcript) has not been sent.
    pub fn context_rebuilt(&self) -> Option<&str> {
        self.context_rebuilt.as_deref()
    }

    /// The messages in transcript order, each shared with the fold's clones until one changes it.
    pub fn messages(&self) -> &[Arc<Message>] {
        &self.messages
    }

    pub fn message(&self, id: &str) -> Option<&Message> {
        self.index.get(id).map(|&i| &*self.messages[i])
    }

    /// How many folds hold this one's messages (itself included): clones that changed none.
    #[cfg(test)]
    pub(crate) fn sharers(&self) -> usize {
        Arc::strong_count(&self.messages)
    }

    /// The `_meta` key of the hidden invocation block this fold reads prompts with.
    pub fn meta_key(&self) -> &str {
        &self.meta_key
    }

    /// The message at `i`, to change: copied first if a clone of the fold shares it.
    fn message_mut(&mut self, i: usize) -> &mut Message {
        Arc::make_mut(&mut Arc::make_mut(&mut self.messages)[i])
    }

    fn metadata_mut(&mut self) -> &mut Metadata {
        Arc::make_mut(&mut self.metadata)
    }

    /// Where the message `id` is in transcript order.
    pub fn position(&self, id: &str) -> Option<usize> {
        self.index.get(id).copied()
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The offset of the last entry folded.
    pub fn head(&self) -> u64 {
        self.head
    }

    /// How many turns the transcript holds. What came before the first prompt (turn 0: agent
    /// output, controls) belongs to the first page, so it alone makes one page.
    pub fn turns(&self) -> u32 {
        self.turns.max(u32::from(
            self.messages.first().is_some_and(|m| m.turn == 0),
        ))
    }

    /// The messages of turns `from..=to`, oldest first; the first page (`from` 1) also holds
    /// turn 0, the agent's output before the first prompt.
    pub fn turn_range(&self, from: u32, to: u32) -> impl Iterator<Item = &Message> {
        let from = if from <= 1 { 0 } else { from };
        self.messages
            .iter()
            .map(|m| &**m)
            .filter(move |m| m.turn >= from && m.turn <= to)
    }

    /// The turns ended since the last call, in order.
    pub fn take_turn_ends(&mut self) -> Vec<TurnEnd> {
        std::mem::take(&mut self.ended)
    }

    /// Whether anything folded since the last call ended a turn or showed a new pending
    /// permission or elicitation.
    pub fn take_urgent(&mut self) -> bool {
        std::mem::take(&mut self.urgent)
    }

    /// Folds one entry; returns the ids of the messages it changed, in order.
    pub fn apply(&mut self, entry: &LogEntry) -> Vec<String> {
        self.head = self.head.max(entry.offset);
        let Ok(frame) = serde_json::from_str::<Value>(&entry.json) else {
            return Vec::new();
        };
        let mut changed = Changed::default();
        match entry.direction {
            Direction::ToRuntime => self.outbound(entry, &frame, &mut changed),
            Direction::FromRuntime => self.inbound(entry, &frame, &mut changed),
            Direction::Event => self.event(entry, &frame, &mut changed),
        }
        let pending = self.pending_interactions();
        if self.metadata.pending_interactions != pending {
            self.metadata_mut().pending_interactions = pending;
        }
        changed.ids
    }

    fn pending_interactions(&self) -> Vec<JsonRpcId> {
        let mut pending: Vec<(u64, JsonRpcId)> = self
            .permissions
            .iter()
            .filter(|(_, r)| {
                matches!(&self.messages[r.message].parts[r.part], Part::Permission(p) if p.outcome == Outcome::Pending)
            })
            .chain(self.elicitations.iter().filter(|(_, r)| {
                matches!(&self.messages[r.message].parts[r.part], Part::Elicitation(e) if e.outcome == Outcome::Pending)
            }))
            .map(|(id, r)| (self.messages[r.message].first_offset * 1000 + r.part as u64, id.clone()))
            .collect();
        pending.sort();
        pending.into_iter().map(|(_, id)| id).collect()
    }

    // ---- messages ------------------------------------------------------------------------------

    fn upsert(&mut self, turn: u32, role: Role, entry: &LogEntry, actor: &str) -> usize {
        let id = format!(
            "{turn}:{}",
            match role {
                Role::User => "user",
                Role::Agent => "agent",
            }
        );
        if let Some(&i) = self.index.get(&id) {
            if self.messages[i].last_offset < entry.offset {
                self.message_mut(i).last_offset = entry.offset;
            }
            return i;
        }
        self.push_message(id, turn, role, entry, actor)
    }

    /// Appends a new message; `id` is not in the transcript yet.
    fn push_message(
        &mut self,
        id: String,
        turn: u32,
        role: Role,
        entry: &LogEntry,
        actor: &str,
    ) -> usize {
        // The agent message answers its turn's user message: same request id.
        let request_id = match role {
            Role::User => None,
            Role::Agent => self
                .index
                .get(&format!("{turn}:user"))
                .and_then(|&u| self.messages[u].request_id),
        };
        Arc::make_mut(&mut self.messages).push(Arc::new(Message {
            id: id.clone(),
            turn,
            role,
            request_id,
            parts: Vec::new(),
            stop_reason: None,
            error: None,
            actor: actor.to_owned(),
            first_offset: entry.offset,
            last_offset: entry.offset,
            inherited: false,
        }));
        let i = self.messages.len() - 1;
        Arc::make_mut(&mut self.index).insert(id, i);
        i
    }

    /// The agent message output belongs to now.
    fn agent_message(&mut self, entry: &LogEntry) -> usize {
        let turn = self.open_turn.or(self.last_prompt_turn).unwrap_or(0);
        self.upsert(turn, Role::Agent, entry, &entry.actor)
    }

    fn new_turn(&mut self, action_id: Option<ActionId>, entry: &LogEntry) -> (u32, usize) {
        self.turns += 1;
        let turn = self.turns;
        if let Some(action_id) = action_id {
            Arc::make_mut(&mut self.turn_of).insert(action_id, turn);
        }
        let i = self.upsert(turn, Role::User, entry, &entry.actor);
        self.message_mut(i).request_id = action_id;
        (turn, i)
    }

    fn control_part_mut(&mut self, action_id: &ActionId) -> Option<(usize, &mut ControlPart)> {
        let id = match self.control_of.get(action_id) {
            Some(id) => id.clone(),
            None => format!("{}:user", self.turn_of.get(action_id)?),
        };
        let &i = self.index.get(&id)?;
        // Looked for before the message is written to (a prompt's has none).
        if !self.messages[i]
            .parts
            .iter()
            .any(|p| matches!(p, Part::Control(_)))
        {
            return None;
        }
        self.message_mut(i)
            .parts
            .iter_mut()
            .find_map(|p| match p {
                Part::Control(c) => Some(c),
                _ => None,
            })
            .map(|c| (i, c))
    }

    // ---- outbound frames -----------------------------------------------------------------------

    fn outbound(&mut self, entry: &LogEntry, frame: &Value, changed: &mut Changed) {
        let model_id = acp_frames::model_config_id(&self.config_options).to_owned();
        let envelope: Envelope = view(frame);
        if envelope.method.ok() == Some("session/load") {
            // Its reply replays history as updates: those add nothing.
            self.replaying = envelope.id.as_ref().map(Value::to_string);
            return;
        }
        let action = acp_frames::recognise_outbound(frame, &model_id, &self.meta_key);
        let action_id = entry
            .action_id
            .or_else(|| envelope.id.as_ref().and_then(ActionId::from_jsonrpc_id));
        match action {
            Some(Action::Prompt(prompt)) => {
                let (turn, i) = self.new_turn(action_id, entry);
                let rebuilt = self.context_rebuilt.take().map(|reason| {
                    let (turns, bytes) =
                        acp_frames::primer_in(frame, &self.meta_key).unwrap_or_default();
                    ContextRebuiltPart {
                        reason,
                        turns: u32::try_from(turns).unwrap_or(u32::MAX),
                        bytes,
                    }
                });
                let message = self.message_mut(i);
                message.parts.extend(rebuilt.map(Part::ContextRebuilt));
                if !prompt.prompt.is_empty() {
                    message.parts.push(Part::Text(prompt.prompt));
                }
                message
                    .parts
                    .extend(prompt.attachments.into_iter().map(Part::Attachment));
                self.open_turn = Some(turn);
                self.last_prompt_turn = Some(turn);
                changed.push(&self.messages[i].id);
            }
            Some(Action::Compact) => {
                let (turn, i) = self.new_turn(action_id, entry);
                self.message_mut(i).parts.push(Part::Control(ControlPart {
                    kind: ControlKind::Compact,
                    value: String::new(),
                    outcome: Outcome::Pending,
                }));
                self.open_turn = Some(turn);
                self.last_prompt_turn = Some(turn);
                changed.push(&self.messages[i].id);
            }
            Some(Action::SetModel { model }) => self.control_message(
                action_id,
                entry,
                ControlKind::SetModel,
                model,
                Outcome::Pending,
                changed,
            ),
            Some(Action::SetConfigOption { config_id, value }) => self.control_message(
                action_id,
                entry,
                ControlKind::SetConfigOption,
                format!("{config_id}={value}"),
                Outcome::Pending,
                changed,
            ),
            Some(Action::Stop { .. }) => self.control_message(
                action_id,
                entry,
                ControlKind::Stop,
                String::new(),
                Outcome::Accepted,
                changed,
            ),
            Some(Action::RespondToPermission { request_id, answer }) => {
                self.answer_permission(&request_id, &answer, entry, changed)
            }
            Some(Action::RespondElicitation { request_id, answer }) => {
                let answer_json = serde_json::to_string(&answer).unwrap_or_default();
                let outcome = match answer {
                    ElicitationAnswer::Accept { .. } => Outcome::Accepted,
                    ElicitationAnswer::Decline => Outcome::Declined,
                    ElicitationAnswer::Cancel => Outcome::Cancelled,
                };
                self.answer_elicitation(&request_id, outcome, answer_json, entry, changed);
            }
            None => {
                // An error the harness sent in reply to an agent request it refused.
                if let Some(error) = &envelope.error
                    && let Some(id) = envelope.id.as_ref().and_then(JsonRpcId::from_json)
                {
                    let error = error.to_string();
                    self.answer_elicitation(&id, Outcome::Errored, error, entry, changed);
                }
            }
        }
    }

    fn control_message(
        &mut self,
        action_id: Option<ActionId>,
        entry: &LogEntry,
        kind: ControlKind,
        value: String,
        outcome: Outcome,
        changed: &mut Changed,
    ) {
        // A stop's second frame (held answers, then the cancel) belongs to its one message.
        if let Some(action_id) = action_id
            && self.control_of.contains_key(&action_id)
        {
            return;
        }
        // Not a turn of its own: it belongs to the turn it came during, or after.
        let turn = self.open_turn.or(self.last_prompt_turn).unwrap_or(0);
        self.controls += 1;
        let id = format!("{turn}:control:{}", self.controls);
        let i = self.push_message(id.clone(), turn, Role::User, entry, &entry.actor);
        if let Some(action_id) = action_id {
            Arc::make_mut(&mut self.control_of).insert(action_id, id);
        }
        let message = self.message_mut(i);
        message.request_id = action_id;
        message.parts.push(Part::Control(ControlPart {
            kind,
            value,
            outcome,
        }));
        changed.push(&self.messages[i].id);
    }

    fn answer_permission(
        &mut self,
        request_id: &JsonRpcId,
        answer: &PermissionAnswer,
        entry: &LogEntry,
        changed: &mut Changed,
    ) {
        let Some(&at) = self.permissions.get(request_id) else {
            return;
        };
        if !matches!(
            self.messages[at.message].parts[at.part],
            Part::Permission(_)
        ) {
            return;
        }
        let message = self.message_mut(at.message);
        if let Part::Permission(part) = &mut message.parts[at.part] {
            match answer {
                PermissionAnswer::Selected { option_id } => {
                    part.outcome = Outcome::Selected;
                    part.selected_option_id = Some(option_id.clone());
                }
                PermissionAnswer::Cancelled => part.outcome = Outcome::Cancelled,
            }
            message.last_offset = message.last_offset.max(entry.offset);
            changed.push(&message.id);
        }
    }

    fn answer_elicitation(
        &mut self,
        request_id: &JsonRpcId,
        outcome: Outcome,
        answer_json: String,
        entry: &LogEntry,
        changed: &mut Changed,
    ) {
        let Some(&at) = self.elicitations.get(request_id) else {
            return;
        };
        if !matches!(
            self.messages[at.message].parts[at.part],
            Part::Elicitation(_)
        ) {
            return;
        }
        let message = self.message_mut(at.message);
        if let Part::Elicitation(part) = &mut message.parts[at.part] {
            part.outcome = outcome;
            part.answer_json = answer_json;
            message.last_offset = message.last_offset.max(entry.offset);
            changed.push(&message.id);
        }
    }

    // ---- inbound frames ------------------------------------------------------------------------

    fn inbound(&mut self, entry: &LogEntry, frame: &Value, changed: &mut Changed) {
        let envelope: Envelope = view(frame);
        match (envelope.method.ok(), &envelope.id) {
            (Some("session/update"), None) => {
                if self.replaying.is_some() {
                    return; // a session/load replay: the log already holds this history
                }
                let params: Params<UpdateParams> = view(frame);
                if let Some(update) = params.params.and_then(|p| p.update) {
                    self.update(update, entry, changed);
                }
            }
            (Some("elicitation/complete"), None) => {
                let params: Params<ElicitationParams> = view(frame);
                let Some(elicitation_id) = params.params.and_then(|p| p.elicitation_id) else {
                    return;
                };
                let found = self.elicitations.iter().find_map(|(id, at)| {
                    match &self.messages[at.message].parts[at.part] {
                        Part::Elicitation(e)
                            if serde_json::from_str::<Value>(&e.request_json).is_ok_and(|r| {
                                view::<ElicitationParams>(&r).elicitation_id == Some(elicitation_id)
                            }) =>
                        {
                            Some(id.clone())
                        }
                        _ => None,
                    }
                });
                // The completion moves the outcome on but keeps the answer the user gave (a url
                // elicitation is accepted first, then completed by the agent).
                if let Some(id) = found
                    && let Some(&at) = self.elicitations.get(&id)
                    && let Part::Elicitation(part) = &self.messages[at.message].parts[at.part]
                {
                    let answer_json = if part.answer_json.is_empty() {
                        "{\"completed\":true}".to_owned()
                    } else {
                        part.answer_json.clone()
                    };
                    self.answer_elicitation(&id, Outcome::Completed, answer_json, entry, changed);
                }
            }
            (Some("session/request_permission"), Some(id)) => {
                let Some(request_id) = JsonRpcId::from_json(id) else {
                    return;
                };
                let params: Params<PermissionParams> = view(frame);
                let params = params.params.unwrap_or_default();
                let options = params
                    .options
                    .unwrap_or_default()
                    .into_iter()
                    .map(|o| PermissionOption {
                        option_id: o.option_id.unwrap_or_default().to_owned(),
                        name: o.name.unwrap_or_default().to_owned(),
                        kind: o.kind.unwrap_or_default().to_owned(),
                    })
                    .collect();
                let i = self.agent_message(entry);
                self.message_mut(i)
                    .parts
                    .push(Part::Permission(PermissionPart {
                        request_id: request_id.clone(),
                        tool_call_json: params
                            .tool_call
                            .as_ref()
                            .map(Value::to_string)
                            .unwrap_or_default(),
                        options,
                        outcome: Outcome::Pending,
                        selected_option_id: None,
                    }));
                let at = PartRef {
                    message: i,
                    part: self.messages[i].parts.len() - 1,
                };
                Arc::make_mut(&mut self.permissions).insert(request_id, at);
                self.urgent = true;
                changed.push(&self.messages[i].id);
            }
            (Some("elicitation/create"), Some(id)) => {
                let Some(request_id) = JsonRpcId::from_json(id) else {
                    return;
                };
                let params = view::<RawParams>(frame).params.unwrap_or(Value::Null);
                let message = view::<ElicitationParams>(&params)
                    .message
                    .unwrap_or_default()
                    .to_owned();
                let i = self.agent_message(entry);
                self.message_mut(i)
                    .parts
                    .push(Part::Elicitation(ElicitationPart {
                        request_id: request_id.clone(),
                        message,
                        request_json: params.to_string(),
                        outcome: Outcome::Pending,
                        answer_json: String::new(),
                    }));
                let at = PartRef {
                    message: i,
                    part: self.messages[i].parts.len() - 1,
                };
                Arc::make_mut(&mut self.elicitations).insert(request_id, at);
                self.urgent = true;
                changed.push(&self.messages[i].id);
            }
            (None, Some(id)) => self.response(id, frame, &envelope, entry, changed),
            _ => {}
        }
    }

    fn response(
        &mut self,
        id: &Value,
        frame: &Value,
        envelope: &Envelope,
        entry: &LogEntry,
        changed: &mut Changed,
    ) {
        if self.replaying.as_deref() == Some(id.to_string().as_str()) {
            self.replaying = None;
        }
        let reply: Reply<ReplyResult> = view(frame);
        let result = reply.result.unwrap_or_default();
        if let Some(Value::Array(options)) = result.config_options {
            self.adopt_config_options(options);
        }
        // Only `initialize` answers with these (what the agent says about itself).
        if let Some(capabilities) = &result.agent_capabilities {
            self.metadata_mut().agent_capabilities_json = bounded_json(capabilities);
        }
        if let Some(info) = result.agent_info {
            self.metadata_mut().agent_info = Some(AgentInfo {
                name: cap_foreign(info.name.unwrap_or_default()),
                version: cap_foreign(info.version.unwrap_or_default()),
                title: info.title.map(cap_foreign),
            });
        }
        let Some(action_id) = ActionId::from_jsonrpc_id(id) else {
            return;
        };
        let error = envelope.error.as_ref().map(|e| {
            cap_foreign(
                &view::<RpcError>(e)
                    .describe()
                    .unwrap_or_else(|| e.to_string()),
            )
        });
        // A control's reply: accepted or rejected. A compact's also ends its turn.
        if let Some((i, control)) = self.control_part_mut(&action_id) {
            control.outcome = if error.is_some() {
                Outcome::Rejected
            } else {
                Outcome::Accepted
            };
            let is_compact = control.kind == ControlKind::Compact;
            let message = self.message_mut(i);
            message.last_offset = message.last_offset.max(entry.offset);
            changed.push(&message.id);
            if !is_compact {
                return;
            }
        }
        let Some(&turn) = self.turn_of.get(&action_id) else {
            return;
        };
        // A prompt's or compact's reply ends its turn.
        let stop_reason = match &error {
            Some(_) => Some(StopReason::Failed),
            None => result
                .stop_reason
                .and_then(StopReason::parse)
                .or(Some(StopReason::EndTurn)),
        };
        self.close_turn(turn, stop_reason, error, entry, changed);
    }

    fn close_turn(
        &mut self,
        turn: u32,
        stop_reason: Option<StopReason>,
        error: Option<String>,
        entry: &LogEntry,
        changed: &mut Changed,
    ) {
        let i = self.upsert(turn, Role::Agent, entry, "runtime");
        let mut ended = None;
        let message = Arc::make_mut(&mut Arc::make_mut(&mut self.messages)[i]);
        if message.stop_reason.is_none()
            && let Some(reason) = stop_reason
        {
            message.stop_reason = stop_reason;
            message.error = error.clone();
            ended = Some(TurnEnd {
                turn,
                request_id: message.request_id,
                stop_reason: reason,
                error,
            });
        }
        // Requests of the turn still held are released with it.
        for part in &mut message.parts {
            match part {
                Part::Permission(p) if p.outcome == Outcome::Pending => {
                    p.outcome = Outcome::Cancelled
                }
                Part::Elicitation(e) if e.outcome == Outcome::Pending => {
                    e.outcome = Outcome::Cancelled
                }
                _ => {}
            }
        }
        changed.push(&message.id);
        if let Some(ended) = ended {
            // The turn's text is whole now: what its growth reserved beyond it (up to as much
            // again) is given back, as the transcript is kept for as long as the session runs.
            for part in &mut message.parts {
                if let Part::Text(text) | Part::Thought(text) = part {
                    text.shrink_to_fit();
                }
            }
            self.ended.push(ended);
            self.urgent = true;
        }
        if self.open_turn == Some(turn) {
            self.open_turn = None;
        }
    }

    fn update(&mut self, update: Update, entry: &LogEntry, changed: &mut Changed) {
        match update.session_update {
            Some(kind @ ("agent_message_chunk" | "agent_thought_chunk")) => {
                let Some(content) = &update.content else {
                    return;
                };
                let i = self.agent_message(entry);
                let thought = kind == "agent_thought_chunk";
                push_content(&mut self.message_mut(i).parts, content, thought);
                changed.push(&self.messages[i].id);
            }
            Some(kind @ ("tool_call" | "tool_call_update")) => {
                let tool_call_id = update.tool_call_id.unwrap_or_default().to_owned();
                let i = self.agent_message(entry);
                let parts = &mut self.message_mut(i).parts;
                let existing = parts.iter_mut().find_map(|p| match p {
                    Part::Tool(t) if t.tool_call_id == tool_call_id => Some(t),
                    _ => None,
                });
                let tool = match existing {
                    Some(tool) => tool,
                    None => {
                        parts.push(Part::Tool(ToolPart {
                            tool_call_id,
                            title: String::new(),
                            kind: if kind == "tool_call" {
                                "other".into()
                            } else {
                                String::new()
                            },
                            status: if kind == "tool_call" {
                                "pending".into()
                            } else {
                                String::new()
                            },
                            content_json: "[]".into(),
                        }));
                        let Some(Part::Tool(tool)) = parts.last_mut() else {
                            unreachable!()
                        };
                        tool
                    }
                };
                if let Some(title) = update.title {
                    tool.title = title.to_owned();
                }
                if let Some(kind) = update.kind {
                    tool.kind = kind.to_owned();
                }
                if let Some(status) = update.status {
                    tool.status = status.to_owned();
                }
                if let Some(content) = update.content.filter(|c| !c.is_null()) {
                    tool.content_json = content.to_string();
                }
                changed.push(&self.messages[i].id);
            }
            Some("plan") => {
                let entries = update
                    .entries
                    .as_ref()
                    .and_then(Value::as_array)
                    .map(|entries| {
                        entries
                            .iter()
                            .map(|e| {
                                let e: views::PlanEntry = view(e);
                                PlanEntry {
                                    content: e.content.unwrap_or_default().to_owned(),
                                    priority: e.priority.unwrap_or_default().to_owned(),
                                    status: e.status.unwrap_or_default().to_owned(),
                                }
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                if let Some(entries) = &update.entries {
                    self.metadata_mut().plan_json = bounded_json(entries);
                }
                let i = self.agent_message(entry);
                let parts = &mut self.message_mut(i).parts;
                match parts.iter_mut().find(|p| matches!(p, Part::Plan(_))) {
                    Some(plan) => *plan = Part::Plan(entries),
                    None => parts.push(Part::Plan(entries)),
                }
                changed.push(&self.messages[i].id);
            }
            Some("available_commands_update") => {
                if let Some(commands) = &update.available_commands {
                    self.metadata_mut().available_commands_json = bounded_json(commands);
                }
            }
            Some("config_option_update") => {
                if let Some(Value::Array(options)) = update.config_options {
                    self.adopt_config_options(options);
                }
            }
            Some("usage_update") => {
                if let (Some(used), Some(size)) = (update.used, update.size) {
                    let cost = update.cost.and_then(|cost| {
                        Some((cost.amount?, cap_foreign(cost.currency.unwrap_or_default())))
                    });
                    self.metadata_mut().usage = Some(Usage { used, size, cost });
                }
            }
            _ => {}
        }
    }

    fn adopt_config_options(&mut self, options: Vec<Value>) {
        let options = Arc::new(options);
        let metadata = Arc::make_mut(&mut self.metadata);
        metadata.config_options_json = bounded_json(&Value::Array(options.to_vec()));
        match acp_frames::model_option(&options) {
            Some(option) => {
                let option_view: ConfigOption = view(option);
                metadata.model = option_view.current_id().unwrap_or_default().to_owned();
                metadata.models = model_values(option);
            }
            None => {
                metadata.model.clear();
                metadata.models.clear();
            }
        }
        self.config_options = options;
    }

    // ---- harness events ------------------------------------------------------------------------

    /// A fork's first entry: the parent's log up to the fork point, folded on its own and
    /// taken as this transcript's first turns, marked inherited. The session's own turns are
    /// numbered after them.
    fn inherit(&mut self, frame: &Value, changed: &mut Changed) {
        let forked: Forked = view(frame);
        let entries: Vec<LogEntry> = forked
            .entries
            .unwrap_or_default()
            .into_iter()
            .filter_map(inherited_entry)
            .collect();
        let parent = Fold::of(&self.meta_key, &entries);
        let parent_turns = parent.turns;
        let parent_last_prompt_turn = parent.last_prompt_turn;
        let parent_controls = parent.controls;
        let inherited = Arc::unwrap_or_clone(parent.messages);
        let messages = Arc::make_mut(&mut self.messages);
        let index = Arc::make_mut(&mut self.index);
        for mut message in inherited {
            Arc::make_mut(&mut message).inherited = true;
            index.insert(message.id.clone(), messages.len());
            changed.push(&message.id);
            messages.push(message);
        }
        self.turns = self.turns.max(parent_turns);
        self.controls = self.controls.max(parent_controls);
        self.last_prompt_turn = parent_last_prompt_turn.or(self.last_prompt_turn);
    }

    fn event(&mut self, entry: &LogEntry, frame: &Value, changed: &mut Changed) {
        let fields: Event = view(frame);
        let event = fields.event.unwrap_or_default();
        let closes_turn = matches!(
            event,
            "fault" | "session_closed" | "harness_restarted" | "owner_replica_lost" | "drain"
        );
        if event == FORKED_EVENT {
            return self.inherit(frame, changed);
        }
        if event == TURN_FAILED_EVENT {
            // Only the turn named: the connection, its replays and pending controls go on.
            if let Some(turn) = fields
                .failed_turn
                .and_then(ActionId::from_stored)
                .and_then(|id| self.turn_of.get(&id).copied())
            {
                let detail = cap_foreign(fields.detail.unwrap_or("the harness failed the turn"));
                self.close_turn(turn, Some(StopReason::Failed), Some(detail), entry, changed);
            }
            return;
        }
        if event == CONTEXT_REBUILT_EVENT {
            self.context_rebuilt = Some(cap_foreign(fields.reason.unwrap_or_default()));
            return;
        }
        if !closes_turn {
            if event == "runtime_started" {
                // A new connection: nothing of the old one is pending any more.
                self.replaying = None;
            }
            return;
        }
        let detail = match event {
            "fault" => fields.detail.unwrap_or("runtime fault").to_owned(),
            "session_closed" => "session closed".to_owned(),
            "drain" => "the harness stopped before the turn ended".to_owned(),
            "owner_replica_lost" => "owner replica lost".to_owned(),
            _ => "harness restarted".to_owned(),
        };
        // A model or option change the runtime never answered ends with it, rejected. Looked for
        // before anything is written: only the messages that change are copied from the clones.
        let unanswered = |part: &Part| {
            matches!(part, Part::Control(control)
                if control.outcome == Outcome::Pending
                    && matches!(control.kind, ControlKind::SetModel | ControlKind::SetConfigOption))
        };
        let open: Vec<usize> = (0..self.messages.len())
            .filter(|&i| self.messages[i].parts.iter().any(unanswered))
            .collect();
        for i in open {
            let message = self.message_mut(i);
            let mut closed = false;
            for part in &mut message.parts {
                if unanswered(part)
                    && let Part::Control(control) = part
                {
                    control.outcome = Outcome::Rejected;
                    closed = true;
                }
            }
            if closed {
                message.error.get_or_insert_with(|| detail.clone());
                message.last_offset = message.last_offset.max(entry.offset);
                changed.push(&message.id);
            }
        }
        let turn = fields
            .failed_turn
            .and_then(ActionId::from_stored)
            .and_then(|id| self.turn_of.get(&id).copied())
            .or(self.open_turn);
        if let Some(turn) = turn {
            self.close_turn(turn, Some(StopReason::Failed), Some(detail), entry, changed);
        }
        self.replaying = None;
        self.open_turn = None;
    }
}

/// Message ids changed by one entry, each once, in order.
#[derive(Default)]
struct Changed {
    ids: Vec<String>,
}

impl Changed {
    fn push(&mut self, id: &str) {
        if !self.ids.iter().any(|i| i == id) {
            self.ids.push(id.to_owned());
        }
    }
}

/// Bytes kept of one JSON document an agent reports about itself (capabilities, commands, plan,
/// config options), shown on GetSession: enough for any real agent, far below the message limit.
pub const MAX_REPORTED_JSON_BYTES: usize = 64 * 1024;

/// `value` as JSON if it fits [`MAX_REPORTED_JSON_BYTES`]; an array that does not keeps the
/// leading elements that fit (still valid JSON); anything else that does not fit is `null`.
fn bounded_json(value: &Value) -> String {
    let text = value.to_string();
    if text.len() <= MAX_REPORTED_JSON_BYTES {
        return text;
    }
    let Some(items) = value.as_array() else {
        return "null".to_owned();
    };
    let mut kept = Vec::new();
    let mut bytes = 2;
    for item in items {
        let len = item.to_string().len() + 1;
        if bytes + len > MAX_REPORTED_JSON_BYTES {
            break;
        }
        bytes += len;
        kept.push(item.clone());
    }
    Value::Array(kept).to_string()
}

/// Appends a content block: text continues the last text (or thought) part; other block types
/// become content parts.
fn push_content(parts: &mut Vec<Part>, content: &Value, thought: bool) {
    let block: ContentBlock = view(content);
    let kind = block.kind.unwrap_or_default();
    if kind == "text" {
        let text = block.text.unwrap_or_default();
        match (parts.last_mut(), thought) {
            (Some(Part::Text(last)), false) | (Some(Part::Thought(last)), true) => {
                last.push_str(text)
            }
            _ => parts.push(if thought {
                Part::Thought(text.to_owned())
            } else {
                Part::Text(text.to_owned())
            }),
        }
    } else {
        parts.push(Part::Content {
            kind: kind.to_owned(),
            json: content.to_string(),
        });
    }
}

fn model_values(option: &Value) -> Vec<ModelOption> {
    acp_frames::select_choices(option)
        .into_iter()
        .map(|choice| ModelOption {
            value: choice.value.unwrap_or_default().to_owned(),
            name: choice.name.unwrap_or_default().to_owned(),
            description: choice.description.map(str::to_owned),
        })
        .collect()
}

/// Pages of a transcript by turns.
pub fn page_turns(total: u32, after_turn: u32, page_size: u32) -> Option<(u32, u32)> {
    let from = after_turn + 1;
    (from <= total).then(|| (from, (after_turn + page_size).min(total)))
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use serde_json::json;

    use super::*;
    use crate::{
        acp::frames::PromptOptions,
        domain::{PromptAction, PromptAttachment, invocation::DEFAULT_META_KEY},
    };

    /// Builds a log the way the harness writes one.
    #[derive(Default)]
    struct Log {
        entries: Vec<LogEntry>,
    }

    impl Log {
        fn push(
            &mut self,
            direction: Direction,
            frame: Value,
            action_id: Option<ActionId>,
        ) -> &mut Self {
            self.entries.push(LogEntry {
                offset: self.entries.len() as u64 + 1,
                direction,
                json: frame.to_string(),
                actor: match direction {
                    Direction::FromRuntime => "runtime".into(),
                    _ => "ada".into(),
                },
                action_id,
                epoch: 1,
                created_at: SystemTime::UNIX_EPOCH,
            });
            self
        }
        fn out(&mut self, frame: Value, action_id: Option<ActionId>) -> &mut Self {
            self.push(Direction::ToRuntime, frame, action_id)
        }
        fn inc(&mut self, frame: Value) -> &mut Self {
            self.push(Direction::FromRuntime, frame, None)
        }
        fn event(&mut self, frame: Value) -> &mut Self {
            self.push(Direction::Event, frame, None)
        }
        fn prompt(&mut self, action_id: ActionId, prompt: &PromptAction) -> &mut Self {
            let frame =
                acp_frames::prompt_request(&action_id, "s", prompt, PromptOptions::default());
            self.out(frame, Some(action_id))
        }
        fn chunk(&mut self, text: &str) -> &mut Self {
            self.update(json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}))
        }
        fn update(&mut self, update: Value) -> &mut Self {
            self.inc(json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s", "update": update}}))
        }
        fn end(&mut self, action_id: ActionId, reason: &str) -> &mut Self {
            self.inc(json!({"jsonrpc": "2.0", "id": action_id.to_string(), "result": {"stopReason": reason}}))
        }
        fn fold(&self) -> Fold {
            Fold::of(DEFAULT_META_KEY, &self.entries)
        }
    }

    fn model_options(current: &str) -> Value {
        json!([{"id": "model", "name": "Model", "category": "model", "type": "select", "currentValue": current,
                "options": [{"value": "fast", "name": "Fast"}, {"value": "smart", "name": "Smart", "description": "d"}]}])
    }

    #[test]
    fn what_an_agent_reports_about_itself_is_kept_bounded_and_still_valid_json() {
        let huge = "h".repeat(100_000);
        let commands: Vec<Value> = (0..2000)
            .map(|i| json!({"name": format!("cmd{i}"), "description": "x".repeat(100)}))
            .collect();
        let mut log = Log::default();
        log.inc(json!({"jsonrpc": "2.0", "id": 0, "result": {
            "protocolVersion": 1,
            "agentCapabilities": {"_meta": {"junk": huge}},
            "agentInfo": {"name": huge, "version": "1", "title": huge}}}));
        log.update(
            json!({"sessionUpdate": "available_commands_update", "availableCommands": commands}),
        );
        let fold = log.fold();
        let metadata = fold.metadata();
        let info = metadata.agent_info.as_ref().unwrap();
        assert!(info.name.len() <= crate::domain::text::MAX_FOREIGN_TEXT_BYTES);
        assert!(info.name.ends_with(crate::domain::text::CUT_MARK));
        assert!(info.title.as_ref().unwrap().len() <= crate::domain::text::MAX_FOREIGN_TEXT_BYTES);
        assert_eq!(info.version, "1", "a short field is kept whole");
        assert_eq!(metadata.agent_capabilities_json, "null");
        assert!(metadata.available_commands_json.len() <= MAX_REPORTED_JSON_BYTES);
        let kept: Vec<Value> = serde_json::from_str(&metadata.available_commands_json).unwrap();
        assert!(!kept.is_empty() && kept.len() < commands.len());
        assert_eq!(
            kept[..],
            commands[..kept.len()],
            "the leading commands, as sent"
        );
    }

    #[test]
    fn a_context_rebuilt_event_shows_in_the_next_prompts_user_message_and_only_there() {
        let (first, second, third) = (ActionId::mint(), ActionId::mint(), ActionId::mint());
        let mut log = Log::default();
        log.prompt(first, &PromptAction::text("before"))
            .chunk("echo: before")
            .end(first, "end_turn")
            .event(json!({"event": "context_rebuilt", "reason": "session/resume failed"}));
        assert_eq!(log.fold().context_rebuilt(), Some("session/resume failed"));
        let primer = crate::acp::primer::build(log.fold().messages(), 1000, "gone").unwrap();
        let frame = acp_frames::prompt_request(
            &second,
            "s2",
            &PromptAction::text("after"),
            PromptOptions {
                primer: Some(&primer),
                ..Default::default()
            },
        );
        log.out(frame, Some(second))
            .end(second, "end_turn")
            .prompt(third, &PromptAction::text("later"));
        let fold = log.fold();
        assert_eq!(fold.context_rebuilt(), None, "the prompt carried it");
        assert_eq!(
            fold.message("2:user").unwrap().parts,
            vec![
                Part::ContextRebuilt(ContextRebuiltPart {
                    reason: "session/resume failed".into(),
                    turns: 1,
                    bytes: primer.text.len() as u64,
                }),
                Part::Text("after".into()),
            ]
        );
        assert_eq!(
            fold.message("3:user").unwrap().parts,
            vec![Part::Text("later".into())]
        );
    }

    #[test]
    fn a_prompt_becomes_a_user_message_with_its_text_then_its_attachments_and_no_hidden_block() {
        let id = ActionId::mint();
        let prompt = PromptAction::with_attachments(
            "look <m-agent-context here",
            vec![
                PromptAttachment::new("https://x/1", "a.png")
                    .mime_type("image/png")
                    .size(3),
                PromptAttachment::new("https://x/2", "b.pdf"),
            ],
        );
        let fold = Log::default().prompt(id, &prompt).fold();
        let user = fold.message("1:user").unwrap();
        assert_eq!(user.request_id, Some(id));
        assert_eq!(user.role, Role::User);
        assert_eq!(user.actor, "ada");
        assert_eq!(
            user.parts,
            vec![
                Part::Text("look <m-agent-context here".into()),
                Part::Attachment(prompt.attachments[0].clone()),
                Part::Attachment(prompt.attachments[1].clone()),
            ]
        );
        assert!(!format!("{:?}", fold.messages()).contains("invocation"));
    }

    #[test]
    fn agent_output_folds_into_the_turns_agent_message_and_the_response_sets_the_stop_reason() {
        let id = ActionId::mint();
        let mut log = Log::default();
        log.prompt(id, &PromptAction::text("hi"))
            .chunk("Hel")
            .chunk("lo")
            .update(json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hmm"}}))
            .update(json!({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Run", "kind": "execute", "status": "pending"}))
            .update(json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed",
                           "content": [{"type": "content", "content": {"type": "text", "text": "done"}}]}))
            .update(json!({"sessionUpdate": "plan", "entries": [{"content": "a", "priority": "high", "status": "pending"}]}))
            .update(json!({"sessionUpdate": "plan", "entries": [{"content": "a", "priority": "high", "status": "completed"}]}))
            .update(json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "image", "data": "AA==", "mimeType": "image/png"}}))
            .end(id, "end_turn");
        let fold = log.fold();
        let agent = fold.message("1:agent").unwrap();
        assert_eq!(agent.stop_reason, Some(StopReason::EndTurn));
        assert_eq!(agent.parts[0], Part::Text("Hello".into()));
        assert_eq!(agent.parts[1], Part::Thought("hmm".into()));
        let Part::Tool(tool) = &agent.parts[2] else {
            panic!("{:?}", agent.parts)
        };
        assert_eq!(
            (tool.title.as_str(), tool.status.as_str()),
            ("Run", "completed")
        );
        assert!(tool.content_json.contains("done"));
        assert_eq!(
            agent.parts[3],
            Part::Plan(vec![PlanEntry {
                content: "a".into(),
                priority: "high".into(),
                status: "completed".into()
            }])
        );
        assert!(matches!(&agent.parts[4], Part::Content { kind, .. } if kind == "image"));
        assert_eq!(agent.parts.len(), 5);
        assert_eq!((agent.first_offset, agent.last_offset), (2, 10));
    }

    #[test]
    fn an_error_response_fails_the_turn_with_its_message() {
        let id = ActionId::mint();
        let mut log = Log::default();
        log.prompt(id, &PromptAction::text("hi"))
            .inc(json!({"jsonrpc": "2.0", "id": id.to_string(), "error": {"code": -32603, "message": "boom"}}));
        let agent = log.fold().message("1:agent").cloned().unwrap();
        assert_eq!(agent.stop_reason, Some(StopReason::Failed));
        assert_eq!(agent.error.as_deref(), Some("boom"));
    }

    #[test]
    fn an_error_responses_detail_in_data_is_part_of_the_turns_error() {
        for (error, shown) in [
            // Codex: the model API's answer is only in data.message.
            (
                json!({"code": -32603, "message": "Internal error",
                       "data": {"message": "high demand", "codex_error_info": "x"}}),
                "Internal error: high demand",
            ),
            (
                json!({"code": -32603, "message": "m", "data": "the detail"}),
                "m: the detail",
            ),
            // Already said in the message: not twice.
            (
                json!({"code": -32603, "message": "API Error: 500 boom", "data": {"message": "500 boom"}}),
                "API Error: 500 boom",
            ),
            (
                json!({"code": -32603, "data": {"message": "only here"}}),
                "only here",
            ),
            // Qwen Code (the ACP TypeScript SDK): the cause is in data.details.
            (
                json!({"code": -32603, "message": "Internal error",
                       "data": {"details": "401 fake model error 401"}}),
                "Internal error: 401 fake model error 401",
            ),
        ] {
            let id = ActionId::mint();
            let mut log = Log::default();
            log.prompt(id, &PromptAction::text("hi"))
                .inc(json!({"jsonrpc": "2.0", "id": id.to_string(), "error": error}));
            let agent = log.fold().message("1:agent").cloned().unwrap();
            assert_eq!(agent.error.as_deref(), Some(shown));
        }
    }

    #[test]
    fn a_fault_or_restart_event_closes_the_open_turn_as_failed() {
        for (event, error) in [
            (
                json!({"event": "fault", "kind": "exit", "detail": "runtime exited with code 3"}),
                "runtime exited with code 3",
            ),
            (json!({"event": "harness_restarted"}), "harness restarted"),
            (json!({"event": "owner_replica_lost"}), "owner replica lost"),
        ] {
            let id = ActionId::mint();
            let mut log = Log::default();
            log.prompt(id, &PromptAction::text("hi"))
                .chunk("partial")
                .event(event);
            let agent = log.fold().message("1:agent").cloned().unwrap();
            assert_eq!(agent.stop_reason, Some(StopReason::Failed));
            assert_eq!(agent.error.as_deref(), Some(error));
        }
    }

    #[test]
    fn a_turn_failed_by_the_harness_keeps_that_end_whatever_the_agent_answers_after() {
        let id = ActionId::mint();
        let mut log = Log::default();
        log.prompt(id, &PromptAction::text("hi"))
            .chunk("partial")
            .event(json!({"event": TURN_FAILED_EVENT, "failed_turn": id.to_string(),
                          "detail": "BUDGET_EXHAUSTED: spent"}))
            .inc(json!({"jsonrpc": "2.0", "id": id.to_string(), "result": {"stopReason": "cancelled"}}));
        let mut fold = log.fold();
        let agent = fold.message("1:agent").cloned().unwrap();
        assert_eq!(agent.stop_reason, Some(StopReason::Failed));
        assert_eq!(agent.error.as_deref(), Some("BUDGET_EXHAUSTED: spent"));
        let ends = fold.take_turn_ends();
        assert_eq!(ends.len(), 1, "{ends:?}");
        assert_eq!(ends[0].stop_reason, StopReason::Failed);
        // Naming a turn that is not there changes nothing.
        let other = ActionId::mint();
        let mut log = Log::default();
        log.prompt(other, &PromptAction::text("hi")).event(
            json!({"event": TURN_FAILED_EVENT, "failed_turn": ActionId::mint().to_string()}),
        );
        assert_eq!(
            log.fold().message("1:agent").and_then(|m| m.stop_reason),
            None
        );
    }

    #[test]
    fn permission_and_elicitation_parts_carry_their_outcomes() {
        let id = ActionId::mint();
        let mut log = Log::default();
        log.prompt(id, &PromptAction::text("hi"))
            .inc(json!({"jsonrpc": "2.0", "id": 7, "method": "session/request_permission", "params": {
                "sessionId": "s", "toolCall": {"toolCallId": "t"},
                "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"}]}}))
            .inc(json!({"jsonrpc": "2.0", "id": "e1", "method": "elicitation/create", "params": {
                "sessionId": "s", "mode": "url", "elicitationId": "el-1", "url": "https://x", "message": "Sign in"}}));
        let fold = log.fold();
        assert_eq!(
            fold.metadata().pending_interactions,
            vec![JsonRpcId::Number(7), JsonRpcId::Text("e1".into())]
        );
        log.out(acp_frames::permission_response(&JsonRpcId::Number(7), &PermissionAnswer::Selected { option_id: "allow".into() }), None)
            .out(acp_frames::elicitation_response(&JsonRpcId::Text("e1".into()), &ElicitationAnswer::Accept { content: Default::default() }), None)
            .inc(json!({"jsonrpc": "2.0", "method": "elicitation/complete", "params": {"elicitationId": "el-1"}}));
        let fold = log.fold();
        let agent = fold.message("1:agent").unwrap();
        let Part::Permission(permission) = &agent.parts[0] else {
            panic!()
        };
        assert_eq!(permission.outcome, Outcome::Selected);
        assert_eq!(permission.selected_option_id.as_deref(), Some("allow"));
        assert_eq!(permission.options[0].kind, "allow_once");
        let Part::Elicitation(elicitation) = &agent.parts[1] else {
            panic!()
        };
        assert_eq!(elicitation.outcome, Outcome::Completed);
        assert_eq!(elicitation.message, "Sign in");
        assert!(fold.metadata().pending_interactions.is_empty());
    }

    #[test]
    fn an_elicitation_completed_after_it_was_accepted_keeps_the_accepted_answer() {
        let id = ActionId::mint();
        let mut log = Log::default();
        let content = [(
            "account".to_owned(),
            crate::domain::ElicitationValue::Text("me@example.com".into()),
        )]
        .into();
        let answer = ElicitationAnswer::Accept { content };
        log.prompt(id, &PromptAction::text("hi"))
            .inc(json!({"jsonrpc": "2.0", "id": "e1", "method": "elicitation/create", "params": {
                "sessionId": "s", "mode": "url", "elicitationId": "el-1", "url": "https://x", "message": "Sign in"}}))
            .out(acp_frames::elicitation_response(&JsonRpcId::Text("e1".into()), &answer), None);
        let accepted = serde_json::to_string(&answer).unwrap();
        log.inc(json!({"jsonrpc": "2.0", "method": "elicitation/complete", "params": {"elicitationId": "el-1"}}));
        let fold = log.fold();
        let Part::Elicitation(elicitation) = &fold.message("1:agent").unwrap().parts[0] else {
            panic!()
        };
        assert_eq!(elicitation.outcome, Outcome::Completed);
        assert_eq!(elicitation.answer_json, accepted);
        assert!(elicitation.answer_json.contains("me@example.com"));
    }

    #[test]
    fn requests_still_held_when_the_turn_ends_are_released_as_cancelled() {
        let id = ActionId::mint();
        let mut log = Log::default();
        log.prompt(id, &PromptAction::text("hi"))
            .inc(json!({"jsonrpc": "2.0", "id": 1, "method": "session/request_permission", "params": {"options": []}}))
            .end(id, "cancelled");
        let fold = log.fold();
        let Part::Permission(p) = &fold.message("1:agent").unwrap().parts[0] else {
            panic!()
        };
        assert_eq!(p.outcome, Outcome::Cancelled);
        assert_eq!(
            fold.message("1:agent").unwrap().stop_reason,
            Some(StopReason::Cancelled)
        );
    }

    #[test]
    fn a_model_change_its_runtime_died_before_answering_is_rejected_by_the_fault() {
        let (model, option) = (ActionId::mint(), ActionId::mint());
        let mut log = Log::default();
        log.inc(json!({"jsonrpc": "2.0", "id": "harness:1:1", "result": {"sessionId": "s", "configOptions": model_options("fast")}}))
            .out(acp_frames::set_config_option_request(&model, "s", "model", &acp_frames::ConfigValue::Id("smart".into())), Some(model))
            .out(acp_frames::set_config_option_request(&option, "s", "effort", &acp_frames::ConfigValue::Id("high".into())), Some(option));
        let control = |fold: &Fold, id: &str| match &fold.message(id).unwrap().parts[0] {
            Part::Control(c) => c.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            control(&log.fold(), "0:control:1").outcome,
            Outcome::Pending
        );
        log.event(
            json!({"event": "fault", "kind": "exit", "detail": "runtime exited with code 3"}),
        );
        let fold = log.fold();
        for id in ["0:control:1", "0:control:2"] {
            assert_eq!(control(&fold, id).outcome, Outcome::Rejected, "{id}");
            assert_eq!(
                fold.message(id).unwrap().error.as_deref(),
                Some("runtime exited with code 3")
            );
        }
        assert_eq!(
            fold.metadata().model,
            "fast",
            "a change never answered never moves it"
        );
    }

    #[test]
    fn controls_are_user_messages_whose_outcome_follows_the_runtimes_reply() {
        let (model_ok, model_bad, stop, compact) = (
            ActionId::mint(),
            ActionId::mint(),
            ActionId::mint(),
            ActionId::mint(),
        );
        let mut log = Log::default();
        log.inc(json!({"jsonrpc": "2.0", "id": "harness:1:1", "result": {"sessionId": "s", "configOptions": model_options("fast")}}))
            .out(acp_frames::set_config_option_request(&model_ok, "s", "model", &acp_frames::ConfigValue::Id("smart".into())), Some(model_ok))
            .inc(json!({"jsonrpc": "2.0", "id": model_ok.to_string(), "result": {"configOptions": model_options("smart")}}))
            .out(acp_frames::set_config_option_request(&model_bad, "s", "model", &acp_frames::ConfigValue::Id("fast".into())), Some(model_bad))
            .inc(json!({"jsonrpc": "2.0", "id": model_bad.to_string(), "error": {"code": -32602, "message": "no"}}))
            .out(acp_frames::cancel_notification("s"), Some(stop))
            .out(acp_frames::compact_request(&compact, "s"), Some(compact))
            .end(compact, "end_turn");
        let fold = log.fold();
        let control = |id: &str| match &fold.message(id).unwrap().parts[0] {
            Part::Control(c) => c.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            control("0:control:1"),
            ControlPart {
                kind: ControlKind::SetModel,
                value: "smart".into(),
                outcome: Outcome::Accepted
            }
        );
        assert_eq!(control("0:control:2").outcome, Outcome::Rejected);
        assert_eq!(
            control("0:control:3"),
            ControlPart {
                kind: ControlKind::Stop,
                value: String::new(),
                outcome: Outcome::Accepted
            }
        );
        // Only the compact is a turn: the first.
        assert_eq!(control("1:user").kind, ControlKind::Compact);
        assert_eq!(control("1:user").outcome, Outcome::Accepted);
        assert_eq!(
            fold.message("1:agent").unwrap().stop_reason,
            Some(StopReason::EndTurn)
        );
        assert_eq!(fold.turns(), 1);
        assert_eq!(
            fold.message("0:control:2").unwrap().request_id,
            Some(model_bad)
        );
        // A rejected change never moves the model.
        assert_eq!(fold.metadata().model, "smart");
        assert_eq!(fold.metadata().models.len(), 2);
        assert_eq!(fold.metadata().models[1].description.as_deref(), Some("d"));
    }

    #[test]
    fn a_stop_is_no_turn_of_its_own_so_the_next_prompt_is_the_second_turn() {
        let (first, stop, model, second) = (
            ActionId::mint(),
            ActionId::mint(),
            ActionId::mint(),
            ActionId::mint(),
        );
        let mut log = Log::default();
        log.prompt(first, &PromptAction::text("long job"))
            .chunk("working")
            .out(acp_frames::cancel_notification("s"), Some(stop))
            .end(first, "cancelled")
            .out(
                acp_frames::set_config_option_request(
                    &model,
                    "s",
                    "model",
                    &acp_frames::ConfigValue::Id("smart".into()),
                ),
                Some(model),
            )
            .prompt(second, &PromptAction::text("next"))
            .end(second, "end_turn");
        let mut fold = log.fold();
        let ids: Vec<(&str, u32)> = fold
            .messages()
            .iter()
            .map(|m| (m.id.as_str(), m.turn))
            .collect();
        assert_eq!(
            ids,
            vec![
                ("1:user", 1),
                ("1:agent", 1),
                ("1:control:1", 1),
                ("1:control:2", 1),
                ("2:user", 2),
                ("2:agent", 2),
            ]
        );
        assert_eq!(fold.message("1:control:1").unwrap().request_id, Some(stop));
        assert_eq!(fold.turns(), 2);
        let ended: Vec<(u32, Option<ActionId>)> = fold
            .take_turn_ends()
            .into_iter()
            .map(|e| (e.turn, e.request_id))
            .collect();
        assert_eq!(ended, vec![(1, Some(first)), (2, Some(second))]);
    }

    #[test]
    fn a_session_load_replay_adds_nothing() {
        let id = ActionId::mint();
        let mut log = Log::default();
        log.prompt(id, &PromptAction::text("hi"))
            .chunk("answer")
            .end(id, "end_turn");
        let before = log.fold().messages().to_vec();
        log.event(json!({"event": "runtime_started", "epoch": 2}))
            .out(acp_frames::reopen_session_request(json!("harness:2:1"), acp_frames::ReopenMethod::Load, "s", "/"), None)
            .update(json!({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "hi"}}))
            .chunk("answer")
            .inc(json!({"jsonrpc": "2.0", "id": "harness:2:1", "result": {}}));
        assert_eq!(log.fold().messages(), before.as_slice());
    }

    #[test]
    fn folding_the_same_frames_twice_or_one_by_one_gives_identical_output() {
        let id = ActionId::mint();
        let mut log = Log::default();
        log.prompt(id, &PromptAction::text("hi"))
            .chunk("a")
            .chunk("b")
            .end(id, "end_turn");
        let once = log.fold();
        let twice = log.fold();
        assert_eq!(once.messages(), twice.messages());
        assert_eq!(once.metadata(), twice.metadata());
        let mut incremental = Fold::new(DEFAULT_META_KEY);
        let mut changed = Vec::new();
        for entry in &log.entries {
            changed.push(incremental.apply(entry));
        }
        assert_eq!(incremental.messages(), once.messages());
        assert_eq!(changed[0], vec!["1:user".to_owned()]);
        assert_eq!(changed[1], vec!["1:agent".to_owned()]);
        assert_eq!(incremental.head(), 4);
    }

    #[test]
    fn turns_page_oldest_first() {
        assert_eq!(page_turns(5, 0, 2), Some((1, 2)));
        // Agent output before any prompt is turn 0, shown on the first page.
        let mut early = Log::default();
        early.push(
            Direction::FromRuntime,
            json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s",
                   "update": {"sessionUpdate": "agent_message_chunk",
                              "content": {"type": "text", "text": "hello"}}}}),
            None,
        );
        let fold = Fold::of(DEFAULT_META_KEY, &early.entries);
        assert_eq!(fold.turns(), 1);
        let (from, to) = page_turns(fold.turns(), 0, 10).unwrap();
        let ids: Vec<&str> = fold.turn_range(from, to).map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["0:agent"]);
        assert_eq!(page_turns(5, 4, 2), Some((5, 5)));
        assert_eq!(page_turns(5, 5, 2), None);
    }
}
