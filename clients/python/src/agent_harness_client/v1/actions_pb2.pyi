from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PromptAttachment(_message.Message):
    __slots__ = ("uri", "name", "mime_type", "size")
    URI_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    uri: str
    name: str
    mime_type: str
    size: int
    def __init__(self, uri: _Optional[str] = ..., name: _Optional[str] = ..., mime_type: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class PromptAction(_message.Message):
    __slots__ = ("prompt", "attachments")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    ATTACHMENTS_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    attachments: _containers.RepeatedCompositeFieldContainer[PromptAttachment]
    def __init__(self, prompt: _Optional[str] = ..., attachments: _Optional[_Iterable[_Union[PromptAttachment, _Mapping]]] = ...) -> None: ...

class SetModelAction(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class SetConfigOptionAction(_message.Message):
    __slots__ = ("config_id", "value")
    CONFIG_ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    config_id: str
    value: str
    def __init__(self, config_id: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class CompactAction(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StopAction(_message.Message):
    __slots__ = ("clear_queue",)
    CLEAR_QUEUE_FIELD_NUMBER: _ClassVar[int]
    clear_queue: bool
    def __init__(self, clear_queue: _Optional[bool] = ...) -> None: ...

class JsonRpcId(_message.Message):
    __slots__ = ("number", "text")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    number: int
    text: str
    def __init__(self, number: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class RespondElicitationAction(_message.Message):
    __slots__ = ("request_id", "accept", "decline", "cancel")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_FIELD_NUMBER: _ClassVar[int]
    DECLINE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    request_id: JsonRpcId
    accept: ElicitationAccept
    decline: ElicitationDecline
    cancel: ElicitationCancel
    def __init__(self, request_id: _Optional[_Union[JsonRpcId, _Mapping]] = ..., accept: _Optional[_Union[ElicitationAccept, _Mapping]] = ..., decline: _Optional[_Union[ElicitationDecline, _Mapping]] = ..., cancel: _Optional[_Union[ElicitationCancel, _Mapping]] = ...) -> None: ...

class ElicitationAccept(_message.Message):
    __slots__ = ("content",)
    class ContentEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ElicitationValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ElicitationValue, _Mapping]] = ...) -> None: ...
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    content: _containers.MessageMap[str, ElicitationValue]
    def __init__(self, content: _Optional[_Mapping[str, ElicitationValue]] = ...) -> None: ...

class ElicitationDecline(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ElicitationCancel(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ElicitationValue(_message.Message):
    __slots__ = ("text", "flag", "integer", "number", "strings")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    INTEGER_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    STRINGS_FIELD_NUMBER: _ClassVar[int]
    text: str
    flag: bool
    integer: int
    number: float
    strings: StringList
    def __init__(self, text: _Optional[str] = ..., flag: _Optional[bool] = ..., integer: _Optional[int] = ..., number: _Optional[float] = ..., strings: _Optional[_Union[StringList, _Mapping]] = ...) -> None: ...

class StringList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, values: _Optional[_Iterable[str]] = ...) -> None: ...

class RespondToPermissionAction(_message.Message):
    __slots__ = ("request_id", "selected_option_id", "cancelled")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SELECTED_OPTION_ID_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    request_id: JsonRpcId
    selected_option_id: str
    cancelled: PermissionCancelled
    def __init__(self, request_id: _Optional[_Union[JsonRpcId, _Mapping]] = ..., selected_option_id: _Optional[str] = ..., cancelled: _Optional[_Union[PermissionCancelled, _Mapping]] = ...) -> None: ...

class PermissionCancelled(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
