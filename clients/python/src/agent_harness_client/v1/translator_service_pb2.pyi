from agent_harness_client.v1 import actions_pb2 as _actions_pb2
from agent_harness_client.v1 import channel_pb2 as _channel_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SkipReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SKIP_REASON_UNSPECIFIED: _ClassVar[SkipReason]
    SKIP_REASON_UNSUPPORTED_TYPE: _ClassVar[SkipReason]
    SKIP_REASON_INVALID_ENTITY_ID: _ClassVar[SkipReason]
SKIP_REASON_UNSPECIFIED: SkipReason
SKIP_REASON_UNSUPPORTED_TYPE: SkipReason
SKIP_REASON_INVALID_ENTITY_ID: SkipReason

class TranslateChannelMessageRequest(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: _channel_pb2.ChannelMessage
    def __init__(self, message: _Optional[_Union[_channel_pb2.ChannelMessage, _Mapping]] = ...) -> None: ...

class TranslateChannelMessageResponse(_message.Message):
    __slots__ = ("prompt", "skipped")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    prompt: _actions_pb2.PromptAction
    skipped: _containers.RepeatedCompositeFieldContainer[SkippedAttachment]
    def __init__(self, prompt: _Optional[_Union[_actions_pb2.PromptAction, _Mapping]] = ..., skipped: _Optional[_Iterable[_Union[SkippedAttachment, _Mapping]]] = ...) -> None: ...

class SkippedAttachment(_message.Message):
    __slots__ = ("index", "entity_type", "reason")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ENTITY_TYPE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    index: int
    entity_type: str
    reason: SkipReason
    def __init__(self, index: _Optional[int] = ..., entity_type: _Optional[str] = ..., reason: _Optional[_Union[SkipReason, str]] = ...) -> None: ...
