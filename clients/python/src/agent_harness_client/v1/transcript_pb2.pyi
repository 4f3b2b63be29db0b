import datetime

from agent_harness_client.v1 import actions_pb2 as _actions_pb2
from agent_harness_client.v1 import session_pb2 as _session_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LogDirection(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOG_DIRECTION_UNSPECIFIED: _ClassVar[LogDirection]
    LOG_DIRECTION_TO_RUNTIME: _ClassVar[LogDirection]
    LOG_DIRECTION_FROM_RUNTIME: _ClassVar[LogDirection]
    LOG_DIRECTION_EVENT: _ClassVar[LogDirection]

class MessageRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MESSAGE_ROLE_UNSPECIFIED: _ClassVar[MessageRole]
    MESSAGE_ROLE_USER: _ClassVar[MessageRole]
    MESSAGE_ROLE_AGENT: _ClassVar[MessageRole]

class StopReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STOP_REASON_UNSPECIFIED: _ClassVar[StopReason]
    STOP_REASON_END_TURN: _ClassVar[StopReason]
    STOP_REASON_MAX_TOKENS: _ClassVar[StopReason]
    STOP_REASON_MAX_TURN_REQUESTS: _ClassVar[StopReason]
    STOP_REASON_REFUSAL: _ClassVar[StopReason]
    STOP_REASON_CANCELLED: _ClassVar[StopReason]
    STOP_REASON_FAILED: _ClassVar[StopReason]

class InteractionOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INTERACTION_OUTCOME_UNSPECIFIED: _ClassVar[InteractionOutcome]
    INTERACTION_OUTCOME_PENDING: _ClassVar[InteractionOutcome]
    INTERACTION_OUTCOME_ACCEPTED: _ClassVar[InteractionOutcome]
    INTERACTION_OUTCOME_REJECTED: _ClassVar[InteractionOutcome]
    INTERACTION_OUTCOME_SELECTED: _ClassVar[InteractionOutcome]
    INTERACTION_OUTCOME_CANCELLED: _ClassVar[InteractionOutcome]
    INTERACTION_OUTCOME_DECLINED: _ClassVar[InteractionOutcome]
    INTERACTION_OUTCOME_COMPLETED: _ClassVar[InteractionOutcome]
    INTERACTION_OUTCOME_ERRORED: _ClassVar[InteractionOutcome]

class ControlKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTROL_KIND_UNSPECIFIED: _ClassVar[ControlKind]
    CONTROL_KIND_SET_MODEL: _ClassVar[ControlKind]
    CONTROL_KIND_SET_CONFIG_OPTION: _ClassVar[ControlKind]
    CONTROL_KIND_COMPACT: _ClassVar[ControlKind]
    CONTROL_KIND_STOP: _ClassVar[ControlKind]
LOG_DIRECTION_UNSPECIFIED: LogDirection
LOG_DIRECTION_TO_RUNTIME: LogDirection
LOG_DIRECTION_FROM_RUNTIME: LogDirection
LOG_DIRECTION_EVENT: LogDirection
MESSAGE_ROLE_UNSPECIFIED: MessageRole
MESSAGE_ROLE_USER: MessageRole
MESSAGE_ROLE_AGENT: MessageRole
STOP_REASON_UNSPECIFIED: StopReason
STOP_REASON_END_TURN: StopReason
STOP_REASON_MAX_TOKENS: StopReason
STOP_REASON_MAX_TURN_REQUESTS: StopReason
STOP_REASON_REFUSAL: StopReason
STOP_REASON_CANCELLED: StopReason
STOP_REASON_FAILED: StopReason
INTERACTION_OUTCOME_UNSPECIFIED: InteractionOutcome
INTERACTION_OUTCOME_PENDING: InteractionOutcome
INTERACTION_OUTCOME_ACCEPTED: InteractionOutcome
INTERACTION_OUTCOME_REJECTED: InteractionOutcome
INTERACTION_OUTCOME_SELECTED: InteractionOutcome
INTERACTION_OUTCOME_CANCELLED: InteractionOutcome
INTERACTION_OUTCOME_DECLINED: InteractionOutcome
INTERACTION_OUTCOME_COMPLETED: InteractionOutcome
INTERACTION_OUTCOME_ERRORED: InteractionOutcome
CONTROL_KIND_UNSPECIFIED: ControlKind
CONTROL_KIND_SET_MODEL: ControlKind
CONTROL_KIND_SET_CONFIG_OPTION: ControlKind
CONTROL_KIND_COMPACT: ControlKind
CONTROL_KIND_STOP: ControlKind

class LogEntry(_message.Message):
    __slots__ = ("offset", "direction", "json", "actor", "action_id", "epoch", "created_at")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ACTION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    offset: int
    direction: LogDirection
    json: str
    actor: str
    action_id: str
    epoch: int
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, offset: _Optional[int] = ..., direction: _Optional[_Union[LogDirection, str]] = ..., json: _Optional[str] = ..., actor: _Optional[str] = ..., action_id: _Optional[str] = ..., epoch: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class TranscriptMessage(_message.Message):
    __slots__ = ("id", "turn", "role", "request_id", "parts", "stop_reason", "error", "actor", "first_offset", "last_offset", "inherited")
    ID_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    INHERITED_FIELD_NUMBER: _ClassVar[int]
    id: str
    turn: int
    role: MessageRole
    request_id: str
    parts: _containers.RepeatedCompositeFieldContainer[MessagePart]
    stop_reason: StopReason
    error: str
    actor: str
    first_offset: int
    last_offset: int
    inherited: bool
    def __init__(self, id: _Optional[str] = ..., turn: _Optional[int] = ..., role: _Optional[_Union[MessageRole, str]] = ..., request_id: _Optional[str] = ..., parts: _Optional[_Iterable[_Union[MessagePart, _Mapping]]] = ..., stop_reason: _Optional[_Union[StopReason, str]] = ..., error: _Optional[str] = ..., actor: _Optional[str] = ..., first_offset: _Optional[int] = ..., last_offset: _Optional[int] = ..., inherited: _Optional[bool] = ...) -> None: ...

class MessagePart(_message.Message):
    __slots__ = ("text", "thought", "attachment", "tool", "plan", "permission", "elicitation", "control", "content", "context_rebuilt")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    THOUGHT_FIELD_NUMBER: _ClassVar[int]
    ATTACHMENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    ELICITATION_FIELD_NUMBER: _ClassVar[int]
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_REBUILT_FIELD_NUMBER: _ClassVar[int]
    text: TextPart
    thought: TextPart
    attachment: _actions_pb2.PromptAttachment
    tool: ToolPart
    plan: PlanPart
    permission: PermissionPart
    elicitation: ElicitationPart
    control: ControlPart
    content: ContentPart
    context_rebuilt: ContextRebuiltPart
    def __init__(self, text: _Optional[_Union[TextPart, _Mapping]] = ..., thought: _Optional[_Union[TextPart, _Mapping]] = ..., attachment: _Optional[_Union[_actions_pb2.PromptAttachment, _Mapping]] = ..., tool: _Optional[_Union[ToolPart, _Mapping]] = ..., plan: _Optional[_Union[PlanPart, _Mapping]] = ..., permission: _Optional[_Union[PermissionPart, _Mapping]] = ..., elicitation: _Optional[_Union[ElicitationPart, _Mapping]] = ..., control: _Optional[_Union[ControlPart, _Mapping]] = ..., content: _Optional[_Union[ContentPart, _Mapping]] = ..., context_rebuilt: _Optional[_Union[ContextRebuiltPart, _Mapping]] = ...) -> None: ...

class TextPart(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class ToolPart(_message.Message):
    __slots__ = ("tool_call_id", "title", "kind", "status", "content_json")
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_JSON_FIELD_NUMBER: _ClassVar[int]
    tool_call_id: str
    title: str
    kind: str
    status: str
    content_json: str
    def __init__(self, tool_call_id: _Optional[str] = ..., title: _Optional[str] = ..., kind: _Optional[str] = ..., status: _Optional[str] = ..., content_json: _Optional[str] = ...) -> None: ...

class PlanPart(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[PlanEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[PlanEntry, _Mapping]]] = ...) -> None: ...

class PlanEntry(_message.Message):
    __slots__ = ("content", "priority", "status")
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    content: str
    priority: str
    status: str
    def __init__(self, content: _Optional[str] = ..., priority: _Optional[str] = ..., status: _Optional[str] = ...) -> None: ...

class PermissionPart(_message.Message):
    __slots__ = ("request_id", "tool_call_json", "options", "outcome", "selected_option_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_JSON_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    SELECTED_OPTION_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: _actions_pb2.JsonRpcId
    tool_call_json: str
    options: _containers.RepeatedCompositeFieldContainer[PermissionOption]
    outcome: InteractionOutcome
    selected_option_id: str
    def __init__(self, request_id: _Optional[_Union[_actions_pb2.JsonRpcId, _Mapping]] = ..., tool_call_json: _Optional[str] = ..., options: _Optional[_Iterable[_Union[PermissionOption, _Mapping]]] = ..., outcome: _Optional[_Union[InteractionOutcome, str]] = ..., selected_option_id: _Optional[str] = ...) -> None: ...

class PermissionOption(_message.Message):
    __slots__ = ("option_id", "name", "kind")
    OPTION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    option_id: str
    name: str
    kind: str
    def __init__(self, option_id: _Optional[str] = ..., name: _Optional[str] = ..., kind: _Optional[str] = ...) -> None: ...

class ElicitationPart(_message.Message):
    __slots__ = ("request_id", "message", "request_json", "outcome", "answer_json")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_JSON_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    ANSWER_JSON_FIELD_NUMBER: _ClassVar[int]
    request_id: _actions_pb2.JsonRpcId
    message: str
    request_json: str
    outcome: InteractionOutcome
    answer_json: str
    def __init__(self, request_id: _Optional[_Union[_actions_pb2.JsonRpcId, _Mapping]] = ..., message: _Optional[str] = ..., request_json: _Optional[str] = ..., outcome: _Optional[_Union[InteractionOutcome, str]] = ..., answer_json: _Optional[str] = ...) -> None: ...

class ControlPart(_message.Message):
    __slots__ = ("kind", "value", "outcome")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    kind: ControlKind
    value: str
    outcome: InteractionOutcome
    def __init__(self, kind: _Optional[_Union[ControlKind, str]] = ..., value: _Optional[str] = ..., outcome: _Optional[_Union[InteractionOutcome, str]] = ...) -> None: ...

class ContextRebuiltPart(_message.Message):
    __slots__ = ("reason", "turns", "bytes")
    REASON_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    reason: str
    turns: int
    bytes: int
    def __init__(self, reason: _Optional[str] = ..., turns: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class ContentPart(_message.Message):
    __slots__ = ("type", "json")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    type: str
    json: str
    def __init__(self, type: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class TurnEnded(_message.Message):
    __slots__ = ("turn", "request_id", "stop_reason", "error")
    TURN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    turn: int
    request_id: str
    stop_reason: StopReason
    error: str
    def __init__(self, turn: _Optional[int] = ..., request_id: _Optional[str] = ..., stop_reason: _Optional[_Union[StopReason, str]] = ..., error: _Optional[str] = ...) -> None: ...

class SessionMetadata(_message.Message):
    __slots__ = ("model", "models", "config_options_json", "available_commands_json", "status", "pending_interactions", "agent_info", "agent_capabilities_json", "plan_json", "usage")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_OPTIONS_JSON_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_COMMANDS_JSON_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PENDING_INTERACTIONS_FIELD_NUMBER: _ClassVar[int]
    AGENT_INFO_FIELD_NUMBER: _ClassVar[int]
    AGENT_CAPABILITIES_JSON_FIELD_NUMBER: _ClassVar[int]
    PLAN_JSON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    model: str
    models: _containers.RepeatedCompositeFieldContainer[ModelOption]
    config_options_json: str
    available_commands_json: str
    status: _session_pb2.SessionStatus
    pending_interactions: _containers.RepeatedCompositeFieldContainer[_actions_pb2.JsonRpcId]
    agent_info: _session_pb2.AgentInfo
    agent_capabilities_json: str
    plan_json: str
    usage: _session_pb2.Usage
    def __init__(self, model: _Optional[str] = ..., models: _Optional[_Iterable[_Union[ModelOption, _Mapping]]] = ..., config_options_json: _Optional[str] = ..., available_commands_json: _Optional[str] = ..., status: _Optional[_Union[_session_pb2.SessionStatus, str]] = ..., pending_interactions: _Optional[_Iterable[_Union[_actions_pb2.JsonRpcId, _Mapping]]] = ..., agent_info: _Optional[_Union[_session_pb2.AgentInfo, _Mapping]] = ..., agent_capabilities_json: _Optional[str] = ..., plan_json: _Optional[str] = ..., usage: _Optional[_Union[_session_pb2.Usage, _Mapping]] = ...) -> None: ...

class ModelOption(_message.Message):
    __slots__ = ("value", "name", "description")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    value: str
    name: str
    description: str
    def __init__(self, value: _Optional[str] = ..., name: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...
