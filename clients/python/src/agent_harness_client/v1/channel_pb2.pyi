from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChannelMessage(_message.Message):
    __slots__ = ("message_id", "channel_id", "thread_id", "sender_id", "content", "attachments")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    ATTACHMENTS_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    channel_id: str
    thread_id: str
    sender_id: str
    content: str
    attachments: _containers.RepeatedCompositeFieldContainer[ChannelAttachment]
    def __init__(self, message_id: _Optional[str] = ..., channel_id: _Optional[str] = ..., thread_id: _Optional[str] = ..., sender_id: _Optional[str] = ..., content: _Optional[str] = ..., attachments: _Optional[_Iterable[_Union[ChannelAttachment, _Mapping]]] = ...) -> None: ...

class ChannelAttachment(_message.Message):
    __slots__ = ("entity_type", "entity_id")
    ENTITY_TYPE_FIELD_NUMBER: _ClassVar[int]
    ENTITY_ID_FIELD_NUMBER: _ClassVar[int]
    entity_type: str
    entity_id: str
    def __init__(self, entity_type: _Optional[str] = ..., entity_id: _Optional[str] = ...) -> None: ...

class TaskAssignment(_message.Message):
    __slots__ = ("prompt", "assigned_by")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_BY_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    assigned_by: str
    def __init__(self, prompt: _Optional[str] = ..., assigned_by: _Optional[str] = ...) -> None: ...
