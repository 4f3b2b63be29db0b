import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UsageSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    USAGE_SOURCE_UNSPECIFIED: _ClassVar[UsageSource]
    USAGE_SOURCE_AGENT: _ClassVar[UsageSource]
    USAGE_SOURCE_MODEL_PROXY: _ClassVar[UsageSource]
USAGE_SOURCE_UNSPECIFIED: UsageSource
USAGE_SOURCE_AGENT: UsageSource
USAGE_SOURCE_MODEL_PROXY: UsageSource

class Money(_message.Message):
    __slots__ = ("amount", "currency")
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    CURRENCY_FIELD_NUMBER: _ClassVar[int]
    amount: str
    currency: str
    def __init__(self, amount: _Optional[str] = ..., currency: _Optional[str] = ...) -> None: ...

class UsageTotals(_message.Message):
    __slots__ = ("input_tokens", "output_tokens", "costs")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COSTS_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    output_tokens: int
    costs: _containers.RepeatedCompositeFieldContainer[Money]
    def __init__(self, input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., costs: _Optional[_Iterable[_Union[Money, _Mapping]]] = ...) -> None: ...

class SessionUsage(_message.Message):
    __slots__ = ("session_id", "principal", "profile", "totals", "sources")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    principal: str
    profile: str
    totals: UsageTotals
    sources: _containers.RepeatedCompositeFieldContainer[SourceUsage]
    def __init__(self, session_id: _Optional[str] = ..., principal: _Optional[str] = ..., profile: _Optional[str] = ..., totals: _Optional[_Union[UsageTotals, _Mapping]] = ..., sources: _Optional[_Iterable[_Union[SourceUsage, _Mapping]]] = ...) -> None: ...

class PrincipalUsage(_message.Message):
    __slots__ = ("principal", "totals")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    principal: str
    totals: UsageTotals
    def __init__(self, principal: _Optional[str] = ..., totals: _Optional[_Union[UsageTotals, _Mapping]] = ...) -> None: ...

class ProfileUsage(_message.Message):
    __slots__ = ("profile", "totals")
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    profile: str
    totals: UsageTotals
    def __init__(self, profile: _Optional[str] = ..., totals: _Optional[_Union[UsageTotals, _Mapping]] = ...) -> None: ...

class BudgetStatus(_message.Message):
    __slots__ = ("principal", "period", "period_start", "cost_limit", "token_limit", "used", "exhausted")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    PERIOD_FIELD_NUMBER: _ClassVar[int]
    PERIOD_START_FIELD_NUMBER: _ClassVar[int]
    COST_LIMIT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LIMIT_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    principal: str
    period: str
    period_start: _timestamp_pb2.Timestamp
    cost_limit: Money
    token_limit: int
    used: UsageTotals
    exhausted: bool
    def __init__(self, principal: _Optional[str] = ..., period: _Optional[str] = ..., period_start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cost_limit: _Optional[_Union[Money, _Mapping]] = ..., token_limit: _Optional[int] = ..., used: _Optional[_Union[UsageTotals, _Mapping]] = ..., exhausted: _Optional[bool] = ...) -> None: ...

class SourceUsage(_message.Message):
    __slots__ = ("source", "totals")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    source: UsageSource
    totals: UsageTotals
    def __init__(self, source: _Optional[_Union[UsageSource, str]] = ..., totals: _Optional[_Union[UsageTotals, _Mapping]] = ...) -> None: ...
