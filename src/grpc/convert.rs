//! Every conversion between proto messages and domain types, in one place. Decoding validates
//! shape (missing oneofs, bad ids) and answers INVALID_ARGUMENT naming the field.

use std::{
    collections::BTreeMap,
    time::{SystemTime, UNIX_EPOCH},
};

use prost_types::{Struct, Timestamp, value::Kind};
use serde_json::{Map, Number, Value};

use crate::{
    domain::{
        Action, ActionId, ElicitationAnswer, ElicitationValue, Error, JsonRpcId, PermissionAnswer,
        PromptAction, PromptAttachment, Result,
        origin::{ChannelAttachment, ChannelMessage, Origin, TaskAssignment},
    },
    pb::v1 as pb,
    session::{
        ControlInput,
        manager::{CreateInput, ListInput},
    },
    translate::{SkipReason, Translation},
};

fn missing(field: &str) -> Error {
    Error::invalid(format!("{field} is required"))
}

/// A duration on the wire (whole nanoseconds; anything past `i64` seconds is capped).
pub(crate) fn duration_to_pb(duration: std::time::Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
        nanos: duration.subsec_nanos() as i32,
    }
}

pub(crate) fn timestamp(time: SystemTime) -> Timestamp {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    Timestamp {
        seconds: since.as_secs() as i64,
        nanos: since.subsec_nanos() as i32,
    }
}

// ---- actions -------------------------------------------------------------------------------

impl From<pb::PromptAttachment> for PromptAttachment {
    fn from(a: pb::PromptAttachment) -> Self {
        Self {
            uri: a.uri,
            name: a.name,
            mime_type: a.mime_type,
            size: a.size,
        }
    }
}

impl From<&PromptAttachment> for pb::PromptAttachment {
    fn from(a: &PromptAttachment) -> Self {
        Self {
            uri: a.uri.clone(),
            name: a.name.clone(),
            mime_type: a.mime_type.clone(),
            size: a.size,
        }
    }
}

impl From<pb::PromptAction> for PromptAction {
    fn from(p: pb::PromptAction) -> Self {
        Self {
            prompt: p.prompt,
            attachments: p.attachments.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<&PromptAction> for pb::PromptAction {
    fn from(p: &PromptAction) -> Self {
        Self {
            prompt: p.prompt.clone(),
            attachments: p.attachments.iter().map(Into::into).collect(),
        }
    }
}

pub(crate) fn jsonrpc_id_from_pb(id: Option<pb::JsonRpcId>, field: &str) -> Result<JsonRpcId> {
    match id.and_then(|id| id.id) {
        Some(pb::json_rpc_id::Id::Number(n)) => Ok(JsonRpcId::Number(n)),
        Some(pb::json_rpc_id::Id::Text(text)) => Ok(JsonRpcId::Text(text)),
        None => Err(missing(field)),
    }
}

impl From<&JsonRpcId> for pb::JsonRpcId {
    fn from(id: &JsonRpcId) -> Self {
        Self {
            id: Some(match id {
                JsonRpcId::Number(n) => pb::json_rpc_id::Id::Number(*n),
                JsonRpcId::Text(text) => pb::json_rpc_id::Id::Text(text.clone()),
            }),
        }
    }
}

fn elicitation_value_from_pb(key: &str, value: pb::ElicitationValue) -> Result<ElicitationValue> {
    use pb::elicitation_value::Kind as K;
    Ok(match value.kind {
        Some(K::Text(text)) => ElicitationValue::Text(text),
        Some(K::Flag(flag)) => ElicitationValue::Flag(flag),
        Some(K::Integer(n)) => ElicitationValue::Integer(n),
        Some(K::Number(n)) if n.is_finite() => ElicitationValue::Number(n),
        Some(K::Number(_)) => {
            return Err(Error::invalid(format!(
                "respond_elicitation.accept.content[{key:?}] is not a finite number"
            )));
        }
        Some(K::Strings(list)) => ElicitationValue::Strings(list.values),
        None => {
            return Err(missing(&format!(
                "respond_elicitation.accept.content[{key:?}]"
            )));
        }
    })
}

impl TryFrom<pb::ControlRequest> for ControlInput {
    type Error = Error;

    fn try_from(request: pb::ControlRequest) -> Result<Self> {
        control_from_pb(request)
    }
}

/// [`ControlInput::try_from`]: the whole decoding of a Control request.
fn control_from_pb(request: pb::ControlRequest) -> Result<ControlInput> {
    use pb::control_request::Action as A;
    let action = match request.action.ok_or_else(|| missing("action"))? {
        A::Prompt(prompt) => Action::Prompt(prompt.into()),
        A::SetModel(set) => Action::SetModel { model: set.model },
        A::SetConfigOption(set) => Action::SetConfigOption {
            config_id: set.config_id,
            value: set.value,
        },
        A::Compact(_) => Action::Compact,
        A::Stop(stop) => Action::Stop {
            clear_queue: stop.clear_queue,
        },
        A::RespondElicitation(respond) => {
            use pb::respond_elicitation_action::Answer;
            let request_id =
                jsonrpc_id_from_pb(respond.request_id, "respond_elicitation.request_id")?;
            let answer = match respond
                .answer
                .ok_or_else(|| missing("respond_elicitation.answer"))?
            {
                Answer::Accept(accept) => ElicitationAnswer::Accept {
                    content: accept
                        .content
                        .into_iter()
                        .map(|(key, value)| {
                            let value = elicitation_value_from_pb(&key, value)?;
                            Ok((key, value))
                        })
                        .collect::<Result<BTreeMap<_, _>>>()?,
                },
                Answer::Decline(_) => ElicitationAnswer::Decline,
                Answer::Cancel(_) => ElicitationAnswer::Cancel,
            };
            Action::RespondElicitation { request_id, answer }
        }
        A::RespondToPermission(respond) => {
            use pb::respond_to_permission_action::Outcome;
            let request_id =
                jsonrpc_id_from_pb(respond.request_id, "respond_to_permission.request_id")?;
            let answer = match respond
                .outcome
                .ok_or_else(|| missing("respond_to_permission.outcome"))?
            {
                Outcome::SelectedOptionId(option_id) => PermissionAnswer::Selected { option_id },
                Outcome::Cancelled(_) => PermissionAnswer::Cancelled,
            };
            Action::RespondToPermission { request_id, answer }
        }
    };
    let interrupt = match pb::Delivery::try_from(request.delivery) {
        Ok(pb::Delivery::Unspecified | pb::Delivery::Queue) => false,
        Ok(pb::Delivery::Interrupt) => true,
        Err(_) => {
            return Err(Error::invalid(format!(
                "delivery {} is not a Delivery value",
                request.delivery
            )));
        }
    };
    let action_id = request
        .action_id
        .as_deref()
        .map(ActionId::parse_v7)
        .transpose()?;
    Ok(ControlInput {
        session_id: request.session_id,
        action_id,
        context: request.context.map(struct_to_json),
        interrupt,
        expect_idle: expect_idle_from_pb(request.expect)?,
        action,
    })
}

// ---- decoded requests, encoded again for the replica that runs the session -----------------
//
// A routed call is decoded (and so validated) before its session is located, and what travels
// to the owner is the decoded request encoded again: nothing is cloned in case it must go.

impl From<ControlInput> for pb::ControlRequest {
    fn from(input: ControlInput) -> Self {
        use pb::control_request::Action as A;
        let action = match input.action {
            Action::Prompt(prompt) => A::Prompt(pb::PromptAction {
                prompt: prompt.prompt,
                attachments: prompt.attachments.iter().map(Into::into).collect(),
            }),
            Action::SetModel { model } => A::SetModel(pb::SetModelAction { model }),
            Action::SetConfigOption { config_id, value } => {
                A::SetConfigOption(pb::SetConfigOptionAction { config_id, value })
            }
            Action::Compact => A::Compact(pb::CompactAction {}),
            Action::Stop { clear_queue } => A::Stop(pb::StopAction { clear_queue }),
            Action::RespondElicitation { request_id, answer } => {
                use pb::respond_elicitation_action::Answer;
                A::RespondElicitation(pb::RespondElicitationAction {
                    request_id: Some((&request_id).into()),
                    answer: Some(match answer {
                        ElicitationAnswer::Accept { content } => {
                            Answer::Accept(pb::ElicitationAccept {
                                content: content
                                    .into_iter()
                                    .map(|(key, value)| (key, elicitation_value_to_pb(value)))
                                    .collect(),
                            })
                        }
                        ElicitationAnswer::Decline => Answer::Decline(pb::ElicitationDecline {}),
                        ElicitationAnswer::Cancel => Answer::Cancel(pb::ElicitationCancel {}),
                    }),
                })
            }
            Action::RespondToPermission { request_id, answer } => {
                use pb::respond_to_permission_action::Outcome;
                A::RespondToPermission(pb::RespondToPermissionAction {
                    request_id: Some((&request_id).into()),
                    outcome: Some(match answer {
                        PermissionAnswer::Selected { option_id } => {
                            Outcome::SelectedOptionId(option_id)
                        }
                        PermissionAnswer::Cancelled => {
                            Outcome::Cancelled(pb::PermissionCancelled {})
                        }
                    }),
                })
            }
        };
        Self {
            session_id: input.session_id,
            action_id: input.action_id.map(|id| id.to_string()),
            context: input.context.map(json_to_struct),
            delivery: match input.interrupt {
                true => pb::Delivery::Interrupt,
                false => pb::Delivery::Unspecified,
            } as i32,
            expect: match input.expect_idle {
                true => pb::Expect::Idle,
                false => pb::Expect::Unspecified,
            } as i32,
            action: Some(action),
        }
    }
}

fn elicitation_value_to_pb(value: ElicitationValue) -> pb::ElicitationValue {
    use pb::elicitation_value::Kind as K;
    pb::ElicitationValue {
        kind: Some(match value {
            ElicitationValue::Text(text) => K::Text(text),
            ElicitationValue::Flag(flag) => K::Flag(flag),
            ElicitationValue::Integer(n) => K::Integer(n),
            ElicitationValue::Number(n) => K::Number(n),
            ElicitationValue::Strings(values) => K::Strings(pb::StringList { values }),
        }),
    }
}

impl From<CreateInput> for pb::CreateSessionRequest {
    fn from(input: CreateInput) -> Self {
        use pb::create_session_request::Origin as O;
        Self {
            session_id: input.session_id,
            profile: input.profile,
            cwd: input.cwd,
            model: input.model,
            name: input.name,
            origin: input.origin.map(|origin| match origin {
                Origin::Mention(message) => O::Mention(pb::ChannelMessage {
                    message_id: message.message_id,
                    channel_id: message.channel_id,
                    thread_id: message.thread_id,
                    sender_id: message.sender_id,
                    content: message.content,
                    attachments: message
                        .attachments
                        .into_iter()
                        .map(|a| pb::ChannelAttachment {
                            entity_type: a.entity_type,
                            entity_id: a.entity_id,
                        })
                        .collect(),
                }),
                Origin::TaskAssignment(task) => O::TaskAssignment(pb::TaskAssignment {
                    prompt: task.prompt,
                    assigned_by: task.assigned_by,
                }),
            }),
            labels: input.labels.into_iter().collect(),
            editors: input.editors,
        }
    }
}

// ---- JSON <-> google.protobuf.Struct ------------------------------------------------------

pub(crate) fn struct_to_json(s: Struct) -> Map<String, Value> {
    s.fields
        .into_iter()
        .map(|(key, value)| (key, value_to_json(value)))
        .collect()
}

fn json_to_struct(map: Map<String, Value>) -> Struct {
    Struct {
        fields: map
            .into_iter()
            .map(|(key, value)| (key, json_to_value(value)))
            .collect(),
    }
}

fn json_to_value(value: Value) -> prost_types::Value {
    let kind = match value {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Value::String(s) => Kind::StringValue(s),
        Value::Array(values) => Kind::ListValue(prost_types::ListValue {
            values: values.into_iter().map(json_to_value).collect(),
        }),
        Value::Object(map) => Kind::StructValue(json_to_struct(map)),
    };
    prost_types::Value { kind: Some(kind) }
}

fn value_to_json(value: prost_types::Value) -> Value {
    match value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(b),
        // Struct numbers are doubles; integral ones print as integers, as proto JSON does.
        Some(Kind::NumberValue(n)) => {
            if n.fract() == 0.0 && n.abs() < 9.007_199_254_740_992e15 {
                Value::Number(Number::from(n as i64))
            } else {
                Number::from_f64(n).map_or(Value::Null, Value::Number)
            }
        }
        Some(Kind::StringValue(s)) => Value::String(s),
        Some(Kind::ListValue(list)) => {
            Value::Array(list.values.into_iter().map(value_to_json).collect())
        }
        Some(Kind::StructValue(s)) => Value::Object(struct_to_json(s)),
    }
}

// ---- channel messages and translation -----------------------------------------------------

impl From<pb::ChannelMessage> for ChannelMessage {
    fn from(m: pb::ChannelMessage) -> Self {
        Self {
            message_id: m.message_id,
            channel_id: m.channel_id,
            thread_id: m.thread_id,
            sender_id: m.sender_id,
            content: m.content,
            attachments: m
                .attachments
                .into_iter()
                .map(|a| ChannelAttachment::new(a.entity_type, a.entity_id))
                .collect(),
        }
    }
}

impl From<pb::create_session_request::Origin> for Origin {
    fn from(origin: pb::create_session_request::Origin) -> Self {
        use pb::create_session_request::Origin as O;
        match origin {
            O::Mention(message) => Self::Mention(message.into()),
            O::TaskAssignment(task) => Self::TaskAssignment(TaskAssignment {
                prompt: task.prompt,
                assigned_by: task.assigned_by,
            }),
        }
    }
}

impl From<&Translation> for pb::TranslateChannelMessageResponse {
    fn from(t: &Translation) -> Self {
        Self {
            prompt: Some((&t.prompt).into()),
            skipped: t
                .skipped
                .iter()
                .map(|s| pb::SkippedAttachment {
                    index: s.index,
                    entity_type: s.entity_type.clone(),
                    reason: match s.reason {
                        SkipReason::UnsupportedType => pb::SkipReason::UnsupportedType,
                        SkipReason::InvalidEntityId => pb::SkipReason::InvalidEntityId,
                    } as i32,
                })
                .collect(),
        }
    }
}

// ---- sessions, queue, log -----------------------------------------------------------------

impl From<crate::domain::session::SessionStatus> for pb::SessionStatus {
    fn from(status: crate::domain::session::SessionStatus) -> Self {
        use crate::domain::session::SessionStatus as S;
        match status {
            S::Starting => Self::Starting,
            S::Idle => Self::Idle,
            S::Running => Self::Running,
            S::AwaitingInput => Self::AwaitingInput,
            S::Suspended => Self::Suspended,
            S::Disconnected => Self::Disconnected,
            S::Closed => Self::Closed,
        }
    }
}

pub(crate) fn session_status_from_pb(value: i32) -> Result<crate::domain::session::SessionStatus> {
    use crate::domain::session::SessionStatus as S;
    match pb::SessionStatus::try_from(value) {
        Ok(pb::SessionStatus::Starting) => Ok(S::Starting),
        Ok(pb::SessionStatus::Idle) => Ok(S::Idle),
        Ok(pb::SessionStatus::Running) => Ok(S::Running),
        Ok(pb::SessionStatus::AwaitingInput) => Ok(S::AwaitingInput),
        Ok(pb::SessionStatus::Suspended) => Ok(S::Suspended),
        Ok(pb::SessionStatus::Disconnected) => Ok(S::Disconnected),
        Ok(pb::SessionStatus::Closed) => Ok(S::Closed),
        Ok(pb::SessionStatus::Unspecified) | Err(_) => Err(Error::invalid(format!(
            "statuses holds {value}, which is not a session status"
        ))),
    }
}

pub(crate) fn session_to_pb(
    record: &crate::domain::session::SessionRecord,
    head: u64,
) -> pb::AgentSession {
    pb::AgentSession {
        id: record.id_string(),
        name: record.name.clone(),
        owner: record.owner.clone(),
        profile: record.profile.clone(),
        cwd: record.cwd.clone(),
        model: record.model.clone(),
        acp_session_id: record.acp_session_id.clone(),
        status: pb::SessionStatus::from(record.status) as i32,
        status_reason: record.status_reason.clone(),
        created_at: Some(timestamp(record.created_at)),
        updated_at: Some(timestamp(record.updated_at)),
        labels: record.labels.clone().into_iter().collect(),
        profile_fingerprint: record.profile_fingerprint.clone(),
        editors: record.editors.clone(),
        head_offset: head,
        ..Default::default()
    }
}

impl From<pb::CreateSessionRequest> for CreateInput {
    fn from(request: pb::CreateSessionRequest) -> Self {
        Self {
            session_id: request.session_id,
            profile: request.profile,
            cwd: request.cwd,
            model: request.model,
            name: request.name,
            origin: request.origin.map(Into::into),
            labels: request.labels.into_iter().collect(),
            editors: request.editors,
        }
    }
}

impl TryFrom<pb::ListSessionsRequest> for ListInput {
    type Error = Error;

    fn try_from(request: pb::ListSessionsRequest) -> Result<Self> {
        Ok(Self {
            page_size: request.page_size,
            page_token: request.page_token,
            statuses: request
                .statuses
                .into_iter()
                .map(session_status_from_pb)
                .collect::<Result<_>>()?,
            labels: request.labels.into_iter().collect(),
        })
    }
}

impl From<&crate::domain::queue::QueuedEntry> for pb::QueuedAction {
    fn from(entry: &crate::domain::queue::QueuedEntry) -> Self {
        use crate::domain::queue::QueuedWork;
        let (kind, prompt, attachments) = match &entry.work {
            QueuedWork::Prompt(p) => (
                pb::QueuedActionKind::Prompt,
                Some(p.prompt.clone()),
                p.attachments.iter().map(Into::into).collect(),
            ),
            QueuedWork::Compact => (pb::QueuedActionKind::Compact, None, Vec::new()),
        };
        Self {
            action_id: entry.action_id.to_string(),
            kind: kind as i32,
            prompt,
            attachments,
            actor: entry.actor.clone(),
            created_at: Some(timestamp(entry.created_at)),
        }
    }
}

pub(crate) fn queue_to_pb<'a>(
    entries: impl IntoIterator<Item = &'a crate::domain::queue::QueuedEntry>,
) -> pb::GetQueueResponse {
    pb::GetQueueResponse {
        entries: entries.into_iter().map(Into::into).collect(),
    }
}

impl From<&crate::store::LogEntry> for pb::LogEntry {
    fn from(entry: &crate::store::LogEntry) -> Self {
        use crate::store::Direction;
        Self {
            offset: entry.offset,
            direction: match entry.direction {
                Direction::ToRuntime => pb::LogDirection::ToRuntime,
                Direction::FromRuntime => pb::LogDirection::FromRuntime,
                Direction::Event => pb::LogDirection::Event,
            } as i32,
            json: entry.json.clone(),
            actor: entry.actor.clone(),
            action_id: entry.action_id.map(|id| id.to_string()),
            epoch: entry.epoch,
            created_at: Some(timestamp(entry.created_at)),
        }
    }
}

// ---- transcript and streams ---------------------------------------------------------------

impl From<crate::acp::transcript::Outcome> for pb::InteractionOutcome {
    fn from(outcome: crate::acp::transcript::Outcome) -> Self {
        use crate::acp::transcript::Outcome as O;
        match outcome {
            O::Pending => Self::Pending,
            O::Accepted => Self::Accepted,
            O::Rejected => Self::Rejected,
            O::Selected => Self::Selected,
            O::Cancelled => Self::Cancelled,
            O::Declined => Self::Declined,
            O::Completed => Self::Completed,
            O::Errored => Self::Errored,
        }
    }
}

impl From<&crate::acp::transcript::Part> for pb::MessagePart {
    fn from(part: &crate::acp::transcript::Part) -> Self {
        use crate::acp::transcript::{ControlKind, Part};
        use pb::message_part::Kind;
        let kind = match part {
            Part::Text(text) => Kind::Text(pb::TextPart { text: text.clone() }),
            Part::Thought(text) => Kind::Thought(pb::TextPart { text: text.clone() }),
            Part::Attachment(a) => Kind::Attachment(a.into()),
            Part::Tool(t) => Kind::Tool(pb::ToolPart {
                tool_call_id: t.tool_call_id.clone(),
                title: t.title.clone(),
                kind: t.kind.clone(),
                status: t.status.clone(),
                content_json: t.content_json.clone(),
            }),
            Part::Plan(entries) => Kind::Plan(pb::PlanPart {
                entries: entries
                    .iter()
                    .map(|e| pb::PlanEntry {
                        content: e.content.clone(),
                        priority: e.priority.clone(),
                        status: e.status.clone(),
                    })
                    .collect(),
            }),
            Part::Permission(p) => Kind::Permission(pb::PermissionPart {
                request_id: Some((&p.request_id).into()),
                tool_call_json: p.tool_call_json.clone(),
                options: p
                    .options
                    .iter()
                    .map(|o| pb::PermissionOption {
                        option_id: o.option_id.clone(),
                        name: o.name.clone(),
                        kind: o.kind.clone(),
                    })
                    .collect(),
                outcome: pb::InteractionOutcome::from(p.outcome) as i32,
                selected_option_id: p.selected_option_id.clone(),
            }),
            Part::Elicitation(e) => Kind::Elicitation(pb::ElicitationPart {
                request_id: Some((&e.request_id).into()),
                message: e.message.clone(),
                request_json: e.request_json.clone(),
                outcome: pb::InteractionOutcome::from(e.outcome) as i32,
                answer_json: e.answer_json.clone(),
            }),
            Part::Control(c) => Kind::Control(pb::ControlPart {
                kind: match c.kind {
                    ControlKind::SetModel => pb::ControlKind::SetModel,
                    ControlKind::SetConfigOption => pb::ControlKind::SetConfigOption,
                    ControlKind::Compact => pb::ControlKind::Compact,
                    ControlKind::Stop => pb::ControlKind::Stop,
                } as i32,
                value: c.value.clone(),
                outcome: pb::InteractionOutcome::from(c.outcome) as i32,
            }),
            Part::Content { kind, json } => Kind::Content(pb::ContentPart {
                r#type: kind.clone(),
                json: json.clone(),
            }),
            Part::ContextRebuilt(c) => Kind::ContextRebuilt(pb::ContextRebuiltPart {
                reason: c.reason.clone(),
                turns: c.turns,
                bytes: c.bytes,
            }),
        };
        pb::MessagePart { kind: Some(kind) }
    }
}

impl From<crate::acp::transcript::StopReason> for pb::StopReason {
    fn from(reason: crate::acp::transcript::StopReason) -> Self {
        use crate::acp::transcript::StopReason;
        match reason {
            StopReason::EndTurn => Self::EndTurn,
            StopReason::MaxTokens => Self::MaxTokens,
            StopReason::MaxTurnRequests => Self::MaxTurnRequests,
            StopReason::Refusal => Self::Refusal,
            StopReason::Cancelled => Self::Cancelled,
            StopReason::Failed => Self::Failed,
        }
    }
}

impl From<&crate::acp::transcript::TurnEnd> for pb::TurnEnded {
    fn from(end: &crate::acp::transcript::TurnEnd) -> Self {
        Self {
            turn: end.turn,
            request_id: end.request_id.map(|id| id.to_string()).unwrap_or_default(),
            stop_reason: pb::StopReason::from(end.stop_reason) as i32,
            error: end.error.clone(),
        }
    }
}

impl From<&crate::acp::transcript::Message> for pb::TranscriptMessage {
    fn from(m: &crate::acp::transcript::Message) -> Self {
        use crate::acp::transcript::Role;
        Self {
            id: m.id.clone(),
            turn: m.turn,
            role: match m.role {
                Role::User => pb::MessageRole::User,
                Role::Agent => pb::MessageRole::Agent,
            } as i32,
            request_id: m.request_id.map(|id| id.to_string()),
            parts: m.parts.iter().map(Into::into).collect(),
            stop_reason: m.stop_reason.map(|r| pb::StopReason::from(r) as i32),
            error: m.error.clone(),
            actor: m.actor.clone(),
            first_offset: m.first_offset,
            last_offset: m.last_offset,
            inherited: m.inherited,
        }
    }
}

pub(crate) fn metadata_to_pb(
    metadata: &crate::acp::transcript::Metadata,
    status: crate::domain::session::SessionStatus,
) -> pb::SessionMetadata {
    pb::SessionMetadata {
        model: metadata.model.clone(),
        models: metadata
            .models
            .iter()
            .map(|m| pb::ModelOption {
                value: m.value.clone(),
                name: m.name.clone(),
                description: m.description.clone(),
            })
            .collect(),
        config_options_json: metadata.config_options_json.clone(),
        available_commands_json: metadata.available_commands_json.clone(),
        status: pb::SessionStatus::from(status) as i32,
        pending_interactions: metadata
            .pending_interactions
            .iter()
            .map(Into::into)
            .collect(),
        agent_info: agent_info_to_pb(metadata),
        agent_capabilities_json: metadata.agent_capabilities_json.clone(),
        plan_json: metadata.plan_json.clone(),
        usage: usage_to_pb(metadata),
    }
}

pub(crate) fn view_from_pb(value: i32) -> Result<crate::session::subscribe::View> {
    use crate::session::subscribe::View;
    match pb::SubscribeView::try_from(value) {
        Ok(pb::SubscribeView::Unspecified | pb::SubscribeView::All) => Ok(View::All),
        Ok(pb::SubscribeView::Log) => Ok(View::Log),
        Ok(pb::SubscribeView::Messages) => Ok(View::Messages),
        Err(_) => Err(Error::invalid(format!(
            "view {value} is not a SubscribeView"
        ))),
    }
}

pub(crate) fn stream_event_to_pb(
    offset: u64,
    event: &crate::session::subscribe::StreamEvent,
) -> pb::SubscribeResponse {
    use crate::session::subscribe::StreamEvent as E;
    use pb::subscribe_response::Event;
    let event = match event {
        E::Entry(entry) => Event::Entry(pb::LogEntry::from(&***entry)),
        E::Message(message) => Event::Message(pb::TranscriptMessage::from(&**message)),
        E::Queue(queue) => Event::Queue(pb::QueueSnapshot {
            entries: queue.iter().map(Into::into).collect(),
        }),
        E::TurnEnded(end) => Event::TurnEnded(end.into()),
        E::Status { status, reason } => Event::Status(pb::SessionStatusChange {
            status: pb::SessionStatus::from(*status) as i32,
            reason: reason.clone(),
        }),
        E::CaughtUp { head } => Event::CaughtUp(pb::CaughtUp { head_offset: *head }),
        E::Heartbeat { head } => Event::Heartbeat(pb::Heartbeat { head_offset: *head }),
    };
    pb::SubscribeResponse {
        offset,
        event: Some(event),
    }
}

// ---- agent features -----------------------------------------------------------

/// A session with what its agent reported about itself.
pub(crate) fn session_with_reported_to_pb(
    record: &crate::domain::session::SessionRecord,
    head: u64,
    reported: &crate::acp::transcript::Metadata,
) -> pb::AgentSession {
    pb::AgentSession {
        agent_info: agent_info_to_pb(reported),
        agent_capabilities_json: reported.agent_capabilities_json.clone(),
        available_commands_json: reported.available_commands_json.clone(),
        plan_json: reported.plan_json.clone(),
        usage: usage_to_pb(reported),
        models: reported
            .models
            .iter()
            .map(|m| pb::AgentModel {
                value: m.value.clone(),
                name: m.name.clone(),
                description: m.description.clone(),
            })
            .collect(),
        config_options_json: reported.config_options_json.clone(),
        ..session_to_pb(record, head)
    }
}

fn agent_info_to_pb(metadata: &crate::acp::transcript::Metadata) -> Option<pb::AgentInfo> {
    metadata.agent_info.as_ref().map(|info| pb::AgentInfo {
        name: info.name.clone(),
        version: info.version.clone(),
        title: info.title.clone(),
    })
}

fn usage_to_pb(metadata: &crate::acp::transcript::Metadata) -> Option<pb::Usage> {
    metadata.usage.as_ref().map(|usage| pb::Usage {
        used_tokens: usage.used,
        context_size: usage.size,
        cost: usage.cost.as_ref().map(|(amount, currency)| pb::Cost {
            amount: *amount,
            currency: currency.clone(),
        }),
    })
}

fn expect_idle_from_pb(value: i32) -> Result<bool> {
    match pb::Expect::try_from(value) {
        Ok(pb::Expect::Unspecified) => Ok(false),
        Ok(pb::Expect::Idle) => Ok(true),
        Err(_) => Err(Error::invalid(format!(
            "expect {value} is not an Expect value"
        ))),
    }
}

// ---- usage ---------------------------------------------------------------------------------

/// A `since` on the wire: a timestamp before 1970 or out of range is refused.
pub(crate) fn since_from_pb(since: Option<Timestamp>) -> Result<Option<SystemTime>> {
    let Some(since) = since else {
        return Ok(None);
    };
    if since.seconds < 0 || !(0..1_000_000_000).contains(&since.nanos) {
        return Err(Error::invalid("since must be a valid time after 1970"));
    }
    Ok(Some(
        UNIX_EPOCH + std::time::Duration::new(since.seconds as u64, since.nanos as u32),
    ))
}

fn money(micros: i64, currency: &str) -> pb::Money {
    pb::Money {
        amount: crate::domain::usage::micros_to_decimal(micros),
        currency: currency.to_owned(),
    }
}

fn usage_totals_to_pb(totals: &crate::domain::usage::UsageTotals) -> pb::UsageTotals {
    pb::UsageTotals {
        input_tokens: totals.input_tokens,
        output_tokens: totals.output_tokens,
        costs: totals
            .costs
            .iter()
            .map(|(currency, micros)| money(*micros, currency))
            .collect(),
    }
}

fn sources_to_pb(
    by_source: &std::collections::BTreeMap<
        crate::domain::usage::UsageSource,
        crate::domain::usage::UsageTotals,
    >,
) -> Vec<pb::SourceUsage> {
    use crate::domain::usage::UsageSource;
    by_source
        .iter()
        .map(|(source, totals)| pb::SourceUsage {
            source: match source {
                UsageSource::Agent => pb::UsageSource::Agent,
                UsageSource::ModelProxy => pb::UsageSource::ModelProxy,
            } as i32,
            totals: Some(usage_totals_to_pb(totals)),
        })
        .collect()
}

pub(crate) fn usage_report_to_pb(
    answer: &crate::session::metering::UsageAnswer,
) -> pb::GetUsageResponse {
    let report = &answer.report;
    pb::GetUsageResponse {
        sessions: report
            .by_session
            .iter()
            .map(|(id, session)| pb::SessionUsage {
                session_id: id.to_string(),
                principal: session.principal.clone(),
                profile: session.profile.clone(),
                totals: Some(usage_totals_to_pb(&session.totals)),
                sources: sources_to_pb(&session.by_source),
            })
            .collect(),
        principals: report
            .by_principal
            .iter()
            .map(|(principal, totals)| pb::PrincipalUsage {
                principal: principal.clone(),
                totals: Some(usage_totals_to_pb(totals)),
            })
            .collect(),
        profiles: report
            .by_profile
            .iter()
            .map(|(profile, totals)| pb::ProfileUsage {
                profile: profile.clone(),
                totals: Some(usage_totals_to_pb(totals)),
            })
            .collect(),
        sources: sources_to_pb(&report.by_source),
        budget: answer.budget.as_ref().map(|b| pb::BudgetStatus {
            principal: b.principal.clone(),
            period: b.budget.period.as_str().to_owned(),
            period_start: Some(timestamp(b.period_start)),
            cost_limit: b
                .budget
                .cost
                .as_ref()
                .map(|(micros, currency)| money(*micros, currency)),
            token_limit: b.budget.tokens,
            used: Some(usage_totals_to_pb(&b.used)),
            exhausted: b.budget.is_spent(&b.used),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control(action: pb::control_request::Action) -> pb::ControlRequest {
        pb::ControlRequest {
            session_id: "s".into(),
            action: Some(action),
            ..Default::default()
        }
    }

    #[test]
    fn a_control_request_without_an_action_is_invalid() {
        let err = control_from_pb(pb::ControlRequest::default()).unwrap_err();
        assert_eq!(err.code, crate::domain::ErrorCode::InvalidArgument);
        assert!(err.message.contains("action"));
    }

    #[test]
    fn a_non_v7_action_id_is_invalid() {
        let mut request = control(pb::control_request::Action::Compact(pb::CompactAction {}));
        request.action_id = Some("6f1c1c1e-8d3b-4d51-9a47-2f7bb8c1a0d2".into());
        assert!(control_from_pb(request).is_err());
    }

    #[test]
    fn an_answer_without_a_request_id_is_invalid() {
        let request = control(pb::control_request::Action::RespondToPermission(
            pb::RespondToPermissionAction {
                request_id: None,
                outcome: Some(pb::respond_to_permission_action::Outcome::Cancelled(
                    pb::PermissionCancelled {},
                )),
            },
        ));
        assert!(
            control_from_pb(request)
                .unwrap_err()
                .message
                .contains("request_id")
        );
    }

    #[test]
    fn the_agents_id_keeps_its_shape_through_decoding() {
        let request = control(pb::control_request::Action::RespondToPermission(
            pb::RespondToPermissionAction {
                request_id: Some(pb::JsonRpcId {
                    id: Some(pb::json_rpc_id::Id::Number(7)),
                }),
                outcome: Some(pb::respond_to_permission_action::Outcome::SelectedOptionId(
                    "allow".into(),
                )),
            },
        ));
        let input = control_from_pb(request).unwrap();
        assert_eq!(
            input.action,
            Action::RespondToPermission {
                request_id: JsonRpcId::Number(7),
                answer: PermissionAnswer::Selected {
                    option_id: "allow".into()
                }
            }
        );
    }

    #[test]
    fn struct_numbers_that_are_integral_become_json_integers() {
        let s = Struct {
            fields: [
                (
                    "n".to_owned(),
                    prost_types::Value {
                        kind: Some(Kind::NumberValue(3.0)),
                    },
                ),
                (
                    "f".to_owned(),
                    prost_types::Value {
                        kind: Some(Kind::NumberValue(1.5)),
                    },
                ),
            ]
            .into_iter()
            .collect(),
        };
        assert_eq!(
            Value::Object(struct_to_json(s)).to_string(),
            r#"{"f":1.5,"n":3}"#
        );
    }

    #[test]
    fn an_unknown_delivery_value_is_invalid() {
        let mut request = control(pb::control_request::Action::Compact(pb::CompactAction {}));
        request.delivery = 9;
        assert!(control_from_pb(request).is_err());
    }

    /// Decoding what a forwarding replica encoded gives what it decoded: the owner acts on the
    /// very request the caller sent.
    fn forwards_unchanged(request: pb::ControlRequest) {
        let decoded = control_from_pb(request).expect("valid");
        let again = control_from_pb(pb::ControlRequest::from(decoded.clone())).expect("valid");
        assert_eq!(format!("{decoded:?}"), format!("{again:?}"));
    }

    #[test]
    fn every_control_action_is_forwarded_unchanged() {
        use pb::control_request::Action as A;
        let id = Some(pb::JsonRpcId {
            id: Some(pb::json_rpc_id::Id::Text("r-1".into())),
        });
        let context = Struct {
            fields: [(
                "nested".to_owned(),
                json_to_value(serde_json::json!({"a": [1, 2.5, "x", null, true]})),
            )]
            .into_iter()
            .collect(),
        };
        let actions = [
            A::Prompt(pb::PromptAction {
                prompt: "hello".into(),
                attachments: vec![pb::PromptAttachment {
                    uri: "file:///a.txt".into(),
                    name: "a.txt".into(),
                    mime_type: Some("text/plain".into()),
                    size: Some(3),
                }],
            }),
            A::SetModel(pb::SetModelAction { model: "m".into() }),
            A::SetConfigOption(pb::SetConfigOptionAction {
                config_id: "mode".into(),
                value: "ask".into(),
            }),
            A::Compact(pb::CompactAction {}),
            A::Stop(pb::StopAction { clear_queue: true }),
            A::RespondElicitation(pb::RespondElicitationAction {
                request_id: id.clone(),
                answer: Some(pb::respond_elicitation_action::Answer::Accept(
                    pb::ElicitationAccept {
                        content: [
                            ("t", pb::elicitation_value::Kind::Text("x".into())),
                            ("f", pb::elicitation_value::Kind::Flag(true)),
                            ("i", pb::elicitation_value::Kind::Integer(-4)),
                            ("n", pb::elicitation_value::Kind::Number(0.25)),
                            (
                                "s",
                                pb::elicitation_value::Kind::Strings(pb::StringList {
                                    values: vec!["a".into(), "b".into()],
                                }),
                            ),
                        ]
                        .into_iter()
                        .map(|(k, kind)| (k.to_owned(), pb::ElicitationValue { kind: Some(kind) }))
                        .collect(),
                    },
                )),
            }),
            A::RespondElicitation(pb::RespondElicitationAction {
                request_id: id.clone(),
                answer: Some(pb::respond_elicitation_action::Answer::Decline(
                    pb::ElicitationDecline {},
                )),
            }),
            A::RespondToPermission(pb::RespondToPermissionAction {
                request_id: Some(pb::JsonRpcId {
                    id: Some(pb::json_rpc_id::Id::Number(7)),
                }),
                outcome: Some(pb::respond_to_permission_action::Outcome::SelectedOptionId(
                    "allow".into(),
                )),
            }),
            A::RespondToPermission(pb::RespondToPermissionAction {
                request_id: id,
                outcome: Some(pb::respond_to_permission_action::Outcome::Cancelled(
                    pb::PermissionCancelled {},
                )),
            }),
        ];
        for action in actions {
            let mut request = control(action);
            request.action_id = Some(ActionId::mint().to_string());
            request.context = Some(context.clone());
            request.delivery = pb::Delivery::Interrupt as i32;
            request.expect = pb::Expect::Idle as i32;
            forwards_unchanged(request);
        }
    }

    #[test]
    fn a_create_request_is_forwarded_unchanged() {
        let request = pb::CreateSessionRequest {
            session_id: Some(uuid::Uuid::now_v7().to_string()),
            profile: "remote".into(),
            cwd: "/work".into(),
            model: Some("m".into()),
            name: Some("n".into()),
            origin: Some(pb::create_session_request::Origin::Mention(
                pb::ChannelMessage {
                    message_id: "1".into(),
                    channel_id: "c".into(),
                    thread_id: "t".into(),
                    sender_id: "u".into(),
                    content: "hi".into(),
                    attachments: vec![pb::ChannelAttachment {
                        entity_type: "file".into(),
                        entity_id: "f".into(),
                    }],
                },
            )),
            labels: [("team".to_owned(), "a".to_owned())].into_iter().collect(),
            editors: vec!["bob".into()],
        };
        let again = pb::CreateSessionRequest::from(CreateInput::from(request.clone()));
        assert_eq!(again, request);
        let task = pb::CreateSessionRequest {
            origin: Some(pb::create_session_request::Origin::TaskAssignment(
                pb::TaskAssignment {
                    prompt: "do".into(),
                    assigned_by: "boss".into(),
                },
            )),
            ..request
        };
        let again = pb::CreateSessionRequest::from(CreateInput::from(task.clone()));
        assert_eq!(again, task);
    }
}
