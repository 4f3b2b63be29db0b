"""One exception type for every error the service returns, decoded from `google.rpc.ErrorInfo`."""

from __future__ import annotations

from typing import Mapping, Optional

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

#: The `ErrorInfo.domain` of every error agent-harness returns.
ERROR_DOMAIN = "agent-harness"


class HarnessError(Exception):
    """A failed call. Branch on `reason` (e.g. ``"SESSION_NOT_FOUND"``, ``"QUEUE_FULL"``), never on
    the message text; `code` is the gRPC status code and `metadata` the reason's details
    (e.g. ``{"head_offset": "12"}`` for ``OFFSET_OUT_OF_RANGE``; see errors.proto).

    `reason` is always set: the service's `ErrorInfo.reason` when it sent one (then `domain` is
    ``"agent-harness"``), else the status code's name, e.g. ``"UNAVAILABLE"`` while the server
    restarts or ``"DEADLINE_EXCEEDED"``. Reasons are strings, so a reason added by a newer server
    needs no newer client. Mistakes in the client's own setup (a malformed server URL) are
    raised as this type too, with `code` INVALID_ARGUMENT and reason ``"INVALID_SERVER_URL"``."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        reason: Optional[str] = None,
        metadata: Optional[Mapping[str, str]] = None,
        domain: Optional[str] = None,
    ) -> None:
        reason = reason or code.name
        # One line, whatever the server put in the message.
        super().__init__(f"{reason}: {' '.join(message.split())}")
        self.code = code
        self.message = message
        self.reason: str = reason
        self.metadata = dict(metadata or {})
        self.domain = domain

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "HarnessError":
        """Decodes the status details of a failed call (a `grpc.Call` error)."""
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        message = error.details() if hasattr(error, "details") else str(error)
        reason = metadata = domain = None
        try:
            status = rpc_status.from_call(error)
        except (ValueError, AttributeError):
            status = None
        for detail in status.details if status is not None else ():
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason, metadata, domain = info.reason, dict(info.metadata), info.domain
                break
        if not message and code == grpc.StatusCode.UNAVAILABLE:
            message = "the server is not reachable"
        return cls(code, message or "", reason, metadata, domain)

    @property
    def from_service(self) -> bool:
        """Whether the service chose this error (it carried an ErrorInfo), rather than the
        transport (a dropped connection, a server restarting, a deadline)."""
        return self.domain == ERROR_DOMAIN
