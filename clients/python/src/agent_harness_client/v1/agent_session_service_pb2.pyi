import datetime

from agent_harness_client.v1 import actions_pb2 as _actions_pb2
from agent_harness_client.v1 import channel_pb2 as _channel_pb2
from agent_harness_client.v1 import session_pb2 as _session_pb2
from agent_harness_client.v1 import transcript_pb2 as _transcript_pb2
from agent_harness_client.v1 import usage_pb2 as _usage_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubscribeView(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUBSCRIBE_VIEW_UNSPECIFIED: _ClassVar[SubscribeView]
    SUBSCRIBE_VIEW_ALL: _ClassVar[SubscribeView]
    SUBSCRIBE_VIEW_LOG: _ClassVar[SubscribeView]
    SUBSCRIBE_VIEW_MESSAGES: _ClassVar[SubscribeView]
SUBSCRIBE_VIEW_UNSPECIFIED: SubscribeView
SUBSCRIBE_VIEW_ALL: SubscribeView
SUBSCRIBE_VIEW_LOG: SubscribeView
SUBSCRIBE_VIEW_MESSAGES: SubscribeView

class CreateSessionRequest(_message.Message):
    __slots__ = ("session_id", "profile", "cwd", "model", "name", "mention", "task_assignment", "labels", "editors")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MENTION_FIELD_NUMBER: _ClassVar[int]
    TASK_ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    EDITORS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    profile: str
    cwd: str
    model: str
    name: str
    mention: _channel_pb2.ChannelMessage
    task_assignment: _channel_pb2.TaskAssignment
    labels: _containers.ScalarMap[str, str]
    editors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., profile: _Optional[str] = ..., cwd: _Optional[str] = ..., model: _Optional[str] = ..., name: _Optional[str] = ..., mention: _Optional[_Union[_channel_pb2.ChannelMessage, _Mapping]] = ..., task_assignment: _Optional[_Union[_channel_pb2.TaskAssignment, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., editors: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateSessionResponse(_message.Message):
    __slots__ = ("session", "first_action_id")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    FIRST_ACTION_ID_FIELD_NUMBER: _ClassVar[int]
    session: _session_pb2.AgentSession
    first_action_id: str
    def __init__(self, session: _Optional[_Union[_session_pb2.AgentSession, _Mapping]] = ..., first_action_id: _Optional[str] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _session_pb2.AgentSession
    def __init__(self, session: _Optional[_Union[_session_pb2.AgentSession, _Mapping]] = ...) -> None: ...

class ForkSessionRequest(_message.Message):
    __slots__ = ("session_id", "name")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    name: str
    def __init__(self, session_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class ForkSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _session_pb2.AgentSession
    def __init__(self, session: _Optional[_Union[_session_pb2.AgentSession, _Mapping]] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "statuses", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    statuses: _containers.RepeatedScalarFieldContainer[_session_pb2.SessionStatus]
    labels: _containers.ScalarMap[str, str]
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., statuses: _Optional[_Iterable[_Union[_session_pb2.SessionStatus, str]]] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions", "next_page_token")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[_session_pb2.AgentSession]
    next_page_token: str
    def __init__(self, sessions: _Optional[_Iterable[_Union[_session_pb2.AgentSession, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _session_pb2.AgentSession
    def __init__(self, session: _Optional[_Union[_session_pb2.AgentSession, _Mapping]] = ...) -> None: ...

class DeleteSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class DeleteSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ControlRequest(_message.Message):
    __slots__ = ("session_id", "action_id", "context", "delivery", "expect", "prompt", "set_model", "set_config_option", "compact", "stop", "respond_elicitation", "respond_to_permission")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    EXPECT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SET_MODEL_FIELD_NUMBER: _ClassVar[int]
    SET_CONFIG_OPTION_FIELD_NUMBER: _ClassVar[int]
    COMPACT_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    RESPOND_ELICITATION_FIELD_NUMBER: _ClassVar[int]
    RESPOND_TO_PERMISSION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    action_id: str
    context: _struct_pb2.Struct
    delivery: _session_pb2.Delivery
    expect: _session_pb2.Expect
    prompt: _actions_pb2.PromptAction
    set_model: _actions_pb2.SetModelAction
    set_config_option: _actions_pb2.SetConfigOptionAction
    compact: _actions_pb2.CompactAction
    stop: _actions_pb2.StopAction
    respond_elicitation: _actions_pb2.RespondElicitationAction
    respond_to_permission: _actions_pb2.RespondToPermissionAction
    def __init__(self, session_id: _Optional[str] = ..., action_id: _Optional[str] = ..., context: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., delivery: _Optional[_Union[_session_pb2.Delivery, str]] = ..., expect: _Optional[_Union[_session_pb2.Expect, str]] = ..., prompt: _Optional[_Union[_actions_pb2.PromptAction, _Mapping]] = ..., set_model: _Optional[_Union[_actions_pb2.SetModelAction, _Mapping]] = ..., set_config_option: _Optional[_Union[_actions_pb2.SetConfigOptionAction, _Mapping]] = ..., compact: _Optional[_Union[_actions_pb2.CompactAction, _Mapping]] = ..., stop: _Optional[_Union[_actions_pb2.StopAction, _Mapping]] = ..., respond_elicitation: _Optional[_Union[_actions_pb2.RespondElicitationAction, _Mapping]] = ..., respond_to_permission: _Optional[_Union[_actions_pb2.RespondToPermissionAction, _Mapping]] = ...) -> None: ...

class ControlResponse(_message.Message):
    __slots__ = ("action_id", "status", "queue_position")
    ACTION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    action_id: str
    status: _session_pb2.ControlStatus
    queue_position: int
    def __init__(self, action_id: _Optional[str] = ..., status: _Optional[_Union[_session_pb2.ControlStatus, str]] = ..., queue_position: _Optional[int] = ...) -> None: ...

class GetQueueRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class GetQueueResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[_session_pb2.QueuedAction]
    def __init__(self, entries: _Optional[_Iterable[_Union[_session_pb2.QueuedAction, _Mapping]]] = ...) -> None: ...

class EditQueuedPromptRequest(_message.Message):
    __slots__ = ("session_id", "action_id", "prompt")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    action_id: str
    prompt: str
    def __init__(self, session_id: _Optional[str] = ..., action_id: _Optional[str] = ..., prompt: _Optional[str] = ...) -> None: ...

class EditQueuedPromptResponse(_message.Message):
    __slots__ = ("entry",)
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    entry: _session_pb2.QueuedAction
    def __init__(self, entry: _Optional[_Union[_session_pb2.QueuedAction, _Mapping]] = ...) -> None: ...

class RemoveQueuedActionRequest(_message.Message):
    __slots__ = ("session_id", "action_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    action_id: str
    def __init__(self, session_id: _Optional[str] = ..., action_id: _Optional[str] = ...) -> None: ...

class RemoveQueuedActionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReadLogRequest(_message.Message):
    __slots__ = ("session_id", "after_offset", "limit")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    after_offset: int
    limit: int
    def __init__(self, session_id: _Optional[str] = ..., after_offset: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ReadLogResponse(_message.Message):
    __slots__ = ("entries", "head_offset")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    HEAD_OFFSET_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[_transcript_pb2.LogEntry]
    head_offset: int
    def __init__(self, entries: _Optional[_Iterable[_Union[_transcript_pb2.LogEntry, _Mapping]]] = ..., head_offset: _Optional[int] = ...) -> None: ...

class GetTranscriptRequest(_message.Message):
    __slots__ = ("session_id", "page_size", "page_token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    page_size: int
    page_token: str
    def __init__(self, session_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class GetTranscriptResponse(_message.Message):
    __slots__ = ("messages", "metadata", "head_offset", "next_page_token")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    HEAD_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_transcript_pb2.TranscriptMessage]
    metadata: _transcript_pb2.SessionMetadata
    head_offset: int
    next_page_token: str
    def __init__(self, messages: _Optional[_Iterable[_Union[_transcript_pb2.TranscriptMessage, _Mapping]]] = ..., metadata: _Optional[_Union[_transcript_pb2.SessionMetadata, _Mapping]] = ..., head_offset: _Optional[int] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("session_id", "after_offset", "view")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    after_offset: int
    view: SubscribeView
    def __init__(self, session_id: _Optional[str] = ..., after_offset: _Optional[int] = ..., view: _Optional[_Union[SubscribeView, str]] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("offset", "entry", "message", "queue", "status", "caught_up", "heartbeat", "turn_ended")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CAUGHT_UP_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    TURN_ENDED_FIELD_NUMBER: _ClassVar[int]
    offset: int
    entry: _transcript_pb2.LogEntry
    message: _transcript_pb2.TranscriptMessage
    queue: QueueSnapshot
    status: SessionStatusChange
    caught_up: CaughtUp
    heartbeat: Heartbeat
    turn_ended: _transcript_pb2.TurnEnded
    def __init__(self, offset: _Optional[int] = ..., entry: _Optional[_Union[_transcript_pb2.LogEntry, _Mapping]] = ..., message: _Optional[_Union[_transcript_pb2.TranscriptMessage, _Mapping]] = ..., queue: _Optional[_Union[QueueSnapshot, _Mapping]] = ..., status: _Optional[_Union[SessionStatusChange, _Mapping]] = ..., caught_up: _Optional[_Union[CaughtUp, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., turn_ended: _Optional[_Union[_transcript_pb2.TurnEnded, _Mapping]] = ...) -> None: ...

class QueueSnapshot(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[_session_pb2.QueuedAction]
    def __init__(self, entries: _Optional[_Iterable[_Union[_session_pb2.QueuedAction, _Mapping]]] = ...) -> None: ...

class SessionStatusChange(_message.Message):
    __slots__ = ("status", "reason")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    status: _session_pb2.SessionStatus
    reason: str
    def __init__(self, status: _Optional[_Union[_session_pb2.SessionStatus, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class CaughtUp(_message.Message):
    __slots__ = ("head_offset",)
    HEAD_OFFSET_FIELD_NUMBER: _ClassVar[int]
    head_offset: int
    def __init__(self, head_offset: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("head_offset",)
    HEAD_OFFSET_FIELD_NUMBER: _ClassVar[int]
    head_offset: int
    def __init__(self, head_offset: _Optional[int] = ...) -> None: ...

class GetUsageRequest(_message.Message):
    __slots__ = ("principal", "since")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    principal: str
    since: _timestamp_pb2.Timestamp
    def __init__(self, principal: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetUsageResponse(_message.Message):
    __slots__ = ("sessions", "principals", "profiles", "budget", "sources")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    PRINCIPALS_FIELD_NUMBER: _ClassVar[int]
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[_usage_pb2.SessionUsage]
    principals: _containers.RepeatedCompositeFieldContainer[_usage_pb2.PrincipalUsage]
    profiles: _containers.RepeatedCompositeFieldContainer[_usage_pb2.ProfileUsage]
    budget: _usage_pb2.BudgetStatus
    sources: _containers.RepeatedCompositeFieldContainer[_usage_pb2.SourceUsage]
    def __init__(self, sessions: _Optional[_Iterable[_Union[_usage_pb2.SessionUsage, _Mapping]]] = ..., principals: _Optional[_Iterable[_Union[_usage_pb2.PrincipalUsage, _Mapping]]] = ..., profiles: _Optional[_Iterable[_Union[_usage_pb2.ProfileUsage, _Mapping]]] = ..., budget: _Optional[_Union[_usage_pb2.BudgetStatus, _Mapping]] = ..., sources: _Optional[_Iterable[_Union[_usage_pb2.SourceUsage, _Mapping]]] = ...) -> None: ...
