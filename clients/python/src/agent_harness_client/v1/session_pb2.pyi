import datetime

from agent_harness_client.v1 import actions_pb2 as _actions_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SessionStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_STATUS_UNSPECIFIED: _ClassVar[SessionStatus]
    SESSION_STATUS_STARTING: _ClassVar[SessionStatus]
    SESSION_STATUS_IDLE: _ClassVar[SessionStatus]
    SESSION_STATUS_RUNNING: _ClassVar[SessionStatus]
    SESSION_STATUS_AWAITING_INPUT: _ClassVar[SessionStatus]
    SESSION_STATUS_SUSPENDED: _ClassVar[SessionStatus]
    SESSION_STATUS_DISCONNECTED: _ClassVar[SessionStatus]
    SESSION_STATUS_CLOSED: _ClassVar[SessionStatus]

class Delivery(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DELIVERY_UNSPECIFIED: _ClassVar[Delivery]
    DELIVERY_QUEUE: _ClassVar[Delivery]
    DELIVERY_INTERRUPT: _ClassVar[Delivery]

class Expect(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXPECT_UNSPECIFIED: _ClassVar[Expect]
    EXPECT_IDLE: _ClassVar[Expect]

class ControlStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTROL_STATUS_UNSPECIFIED: _ClassVar[ControlStatus]
    CONTROL_STATUS_SENT: _ClassVar[ControlStatus]
    CONTROL_STATUS_QUEUED: _ClassVar[ControlStatus]

class QueuedActionKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QUEUED_ACTION_KIND_UNSPECIFIED: _ClassVar[QueuedActionKind]
    QUEUED_ACTION_KIND_PROMPT: _ClassVar[QueuedActionKind]
    QUEUED_ACTION_KIND_COMPACT: _ClassVar[QueuedActionKind]
SESSION_STATUS_UNSPECIFIED: SessionStatus
SESSION_STATUS_STARTING: SessionStatus
SESSION_STATUS_IDLE: SessionStatus
SESSION_STATUS_RUNNING: SessionStatus
SESSION_STATUS_AWAITING_INPUT: SessionStatus
SESSION_STATUS_SUSPENDED: SessionStatus
SESSION_STATUS_DISCONNECTED: SessionStatus
SESSION_STATUS_CLOSED: SessionStatus
DELIVERY_UNSPECIFIED: Delivery
DELIVERY_QUEUE: Delivery
DELIVERY_INTERRUPT: Delivery
EXPECT_UNSPECIFIED: Expect
EXPECT_IDLE: Expect
CONTROL_STATUS_UNSPECIFIED: ControlStatus
CONTROL_STATUS_SENT: ControlStatus
CONTROL_STATUS_QUEUED: ControlStatus
QUEUED_ACTION_KIND_UNSPECIFIED: QueuedActionKind
QUEUED_ACTION_KIND_PROMPT: QueuedActionKind
QUEUED_ACTION_KIND_COMPACT: QueuedActionKind

class AgentSession(_message.Message):
    __slots__ = ("id", "name", "owner", "profile", "cwd", "model", "acp_session_id", "status", "status_reason", "created_at", "updated_at", "labels", "profile_fingerprint", "editors", "head_offset", "agent_info", "agent_capabilities_json", "available_commands_json", "plan_json", "usage", "models", "config_options_json")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ACP_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATUS_REASON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    EDITORS_FIELD_NUMBER: _ClassVar[int]
    HEAD_OFFSET_FIELD_NUMBER: _ClassVar[int]
    AGENT_INFO_FIELD_NUMBER: _ClassVar[int]
    AGENT_CAPABILITIES_JSON_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_COMMANDS_JSON_FIELD_NUMBER: _ClassVar[int]
    PLAN_JSON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_OPTIONS_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    owner: str
    profile: str
    cwd: str
    model: str
    acp_session_id: str
    status: SessionStatus
    status_reason: str
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    labels: _containers.ScalarMap[str, str]
    profile_fingerprint: str
    editors: _containers.RepeatedScalarFieldContainer[str]
    head_offset: int
    agent_info: AgentInfo
    agent_capabilities_json: str
    available_commands_json: str
    plan_json: str
    usage: Usage
    models: _containers.RepeatedCompositeFieldContainer[AgentModel]
    config_options_json: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., owner: _Optional[str] = ..., profile: _Optional[str] = ..., cwd: _Optional[str] = ..., model: _Optional[str] = ..., acp_session_id: _Optional[str] = ..., status: _Optional[_Union[SessionStatus, str]] = ..., status_reason: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., profile_fingerprint: _Optional[str] = ..., editors: _Optional[_Iterable[str]] = ..., head_offset: _Optional[int] = ..., agent_info: _Optional[_Union[AgentInfo, _Mapping]] = ..., agent_capabilities_json: _Optional[str] = ..., available_commands_json: _Optional[str] = ..., plan_json: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., models: _Optional[_Iterable[_Union[AgentModel, _Mapping]]] = ..., config_options_json: _Optional[str] = ...) -> None: ...

class AgentModel(_message.Message):
    __slots__ = ("value", "name", "description")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    value: str
    name: str
    description: str
    def __init__(self, value: _Optional[str] = ..., name: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class AgentInfo(_message.Message):
    __slots__ = ("name", "version", "title")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    title: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., title: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("used_tokens", "context_size", "cost")
    USED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_SIZE_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    used_tokens: int
    context_size: int
    cost: Cost
    def __init__(self, used_tokens: _Optional[int] = ..., context_size: _Optional[int] = ..., cost: _Optional[_Union[Cost, _Mapping]] = ...) -> None: ...

class Cost(_message.Message):
    __slots__ = ("amount", "currency")
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    CURRENCY_FIELD_NUMBER: _ClassVar[int]
    amount: float
    currency: str
    def __init__(self, amount: _Optional[float] = ..., currency: _Optional[str] = ...) -> None: ...

class QueuedAction(_message.Message):
    __slots__ = ("action_id", "kind", "prompt", "attachments", "actor", "created_at")
    ACTION_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    ATTACHMENTS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    action_id: str
    kind: QueuedActionKind
    prompt: str
    attachments: _containers.RepeatedCompositeFieldContainer[_actions_pb2.PromptAttachment]
    actor: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, action_id: _Optional[str] = ..., kind: _Optional[_Union[QueuedActionKind, str]] = ..., prompt: _Optional[str] = ..., attachments: _Optional[_Iterable[_Union[_actions_pb2.PromptAttachment, _Mapping]]] = ..., actor: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
