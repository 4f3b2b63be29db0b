"""A Python client of agent-harness: typed calls, `HarnessError` with the ErrorInfo
`reason`, and a `subscribe` that resumes by itself. The generated stubs are in `.v1`."""

from agent_harness_client._client import Attachment, Client
from agent_harness_client._errors import ERROR_DOMAIN, HarnessError
from agent_harness_client.v1 import (
    actions_pb2,
    agent_session_service_pb2,
    session_pb2,
    transcript_pb2,
)

__all__ = [
    "Attachment",
    "Client",
    "ERROR_DOMAIN",
    "HarnessError",
    "actions_pb2",
    "agent_session_service_pb2",
    "session_pb2",
    "transcript_pb2",
]
__version__ = "0.1.0"
