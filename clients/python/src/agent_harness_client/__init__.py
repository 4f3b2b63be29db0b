"""A Python client of agent-harness.

- `Client` (synchronous) and `agent_harness_client.aio.AsyncClient` (asyncio), with the same
  methods; `Client.from_env()` reads ``AGENT_HARNESS_SERVER`` and ``AGENT_HARNESS_TOKEN``.
- `run_turn` / `prompt(..., wait=True)`: send a prompt and get a `TurnResult`.
- `subscribe`: events that resume by themselves after a restart, each change seen once.
- Python types (`StopReason`, `Message`, `Event`, …) with the protobuf on `.pb`; the generated
  stubs are in `agent_harness_client.v1`.
- One exception type, `HarnessError`, with `reason` for every error.
"""

from agent_harness_client._client import Attachment, Client
from agent_harness_client._errors import ERROR_DOMAIN, HarnessError
from agent_harness_client.types import (
    ControlKind,
    ControlStatus,
    Elicitation,
    Event,
    InteractionOutcome,
    LogDirection,
    LogEntry,
    Message,
    MessageRole,
    Permission,
    Sent,
    Session,
    SessionStatus,
    StopReason,
    Text,
    ToolCall,
    Transcript,
    TurnEnded,
    TurnResult,
    Usage,
)
from agent_harness_client.v1 import (
    actions_pb2,
    agent_session_service_pb2,
    session_pb2,
    transcript_pb2,
)

__all__ = [
    "Attachment",
    "Client",
    "ControlKind",
    "ControlStatus",
    "ERROR_DOMAIN",
    "Elicitation",
    "Event",
    "HarnessError",
    "InteractionOutcome",
    "LogDirection",
    "LogEntry",
    "Message",
    "MessageRole",
    "Permission",
    "Sent",
    "Session",
    "SessionStatus",
    "StopReason",
    "Text",
    "ToolCall",
    "Transcript",
    "TurnEnded",
    "TurnResult",
    "Usage",
    "actions_pb2",
    "agent_session_service_pb2",
    "session_pb2",
    "transcript_pb2",
]
__version__ = "0.2.0"
