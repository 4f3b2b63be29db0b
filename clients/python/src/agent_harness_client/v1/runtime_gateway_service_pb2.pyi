import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ConnectRequest(_message.Message):
    __slots__ = ("hello", "spawned", "spawn_failed", "stdout", "exited", "ack")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    SPAWNED_FIELD_NUMBER: _ClassVar[int]
    SPAWN_FAILED_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    hello: BridgeHello
    spawned: RuntimeSpawned
    spawn_failed: RuntimeSpawnFailed
    stdout: RuntimeStdout
    exited: RuntimeExited
    ack: LineAck
    def __init__(self, hello: _Optional[_Union[BridgeHello, _Mapping]] = ..., spawned: _Optional[_Union[RuntimeSpawned, _Mapping]] = ..., spawn_failed: _Optional[_Union[RuntimeSpawnFailed, _Mapping]] = ..., stdout: _Optional[_Union[RuntimeStdout, _Mapping]] = ..., exited: _Optional[_Union[RuntimeExited, _Mapping]] = ..., ack: _Optional[_Union[LineAck, _Mapping]] = ...) -> None: ...

class ConnectResponse(_message.Message):
    __slots__ = ("spawn", "stdin", "kill", "ack")
    SPAWN_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    KILL_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    spawn: SpawnRuntime
    stdin: RuntimeStdin
    kill: KillRuntime
    ack: LineAck
    def __init__(self, spawn: _Optional[_Union[SpawnRuntime, _Mapping]] = ..., stdin: _Optional[_Union[RuntimeStdin, _Mapping]] = ..., kill: _Optional[_Union[KillRuntime, _Mapping]] = ..., ack: _Optional[_Union[LineAck, _Mapping]] = ...) -> None: ...

class BridgeHello(_message.Message):
    __slots__ = ("bridge_id", "labels", "profiles", "version", "running")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BRIDGE_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    bridge_id: str
    labels: _containers.ScalarMap[str, str]
    profiles: _containers.RepeatedScalarFieldContainer[str]
    version: str
    running: _containers.RepeatedCompositeFieldContainer[BridgeRuntime]
    def __init__(self, bridge_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., profiles: _Optional[_Iterable[str]] = ..., version: _Optional[str] = ..., running: _Optional[_Iterable[_Union[BridgeRuntime, _Mapping]]] = ...) -> None: ...

class BridgeRuntime(_message.Message):
    __slots__ = ("runtime_key", "last_stdin_seq", "last_stdout_seq", "session_id")
    RUNTIME_KEY_FIELD_NUMBER: _ClassVar[int]
    LAST_STDIN_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_STDOUT_SEQ_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    runtime_key: str
    last_stdin_seq: int
    last_stdout_seq: int
    session_id: str
    def __init__(self, runtime_key: _Optional[str] = ..., last_stdin_seq: _Optional[int] = ..., last_stdout_seq: _Optional[int] = ..., session_id: _Optional[str] = ...) -> None: ...

class SpawnRuntime(_message.Message):
    __slots__ = ("runtime_key", "profile", "cwd", "session_id", "owner")
    RUNTIME_KEY_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    runtime_key: str
    profile: str
    cwd: str
    session_id: str
    owner: str
    def __init__(self, runtime_key: _Optional[str] = ..., profile: _Optional[str] = ..., cwd: _Optional[str] = ..., session_id: _Optional[str] = ..., owner: _Optional[str] = ...) -> None: ...

class RuntimeSpawned(_message.Message):
    __slots__ = ("runtime_key",)
    RUNTIME_KEY_FIELD_NUMBER: _ClassVar[int]
    runtime_key: str
    def __init__(self, runtime_key: _Optional[str] = ...) -> None: ...

class RuntimeSpawnFailed(_message.Message):
    __slots__ = ("runtime_key", "error", "stderr_tail")
    RUNTIME_KEY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    STDERR_TAIL_FIELD_NUMBER: _ClassVar[int]
    runtime_key: str
    error: str
    stderr_tail: str
    def __init__(self, runtime_key: _Optional[str] = ..., error: _Optional[str] = ..., stderr_tail: _Optional[str] = ...) -> None: ...

class RuntimeStdout(_message.Message):
    __slots__ = ("runtime_key", "seq", "line")
    RUNTIME_KEY_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    runtime_key: str
    seq: int
    line: bytes
    def __init__(self, runtime_key: _Optional[str] = ..., seq: _Optional[int] = ..., line: _Optional[bytes] = ...) -> None: ...

class RuntimeStdin(_message.Message):
    __slots__ = ("runtime_key", "seq", "line")
    RUNTIME_KEY_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    runtime_key: str
    seq: int
    line: bytes
    def __init__(self, runtime_key: _Optional[str] = ..., seq: _Optional[int] = ..., line: _Optional[bytes] = ...) -> None: ...

class RuntimeExited(_message.Message):
    __slots__ = ("runtime_key", "code", "signal", "stderr_tail")
    RUNTIME_KEY_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    STDERR_TAIL_FIELD_NUMBER: _ClassVar[int]
    runtime_key: str
    code: int
    signal: int
    stderr_tail: str
    def __init__(self, runtime_key: _Optional[str] = ..., code: _Optional[int] = ..., signal: _Optional[int] = ..., stderr_tail: _Optional[str] = ...) -> None: ...

class KillRuntime(_message.Message):
    __slots__ = ("runtime_key", "stop_grace")
    RUNTIME_KEY_FIELD_NUMBER: _ClassVar[int]
    STOP_GRACE_FIELD_NUMBER: _ClassVar[int]
    runtime_key: str
    stop_grace: _duration_pb2.Duration
    def __init__(self, runtime_key: _Optional[str] = ..., stop_grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class LineAck(_message.Message):
    __slots__ = ("runtime_key", "seq")
    RUNTIME_KEY_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    runtime_key: str
    seq: int
    def __init__(self, runtime_key: _Optional[str] = ..., seq: _Optional[int] = ...) -> None: ...
