"""What the synchronous and the asyncio client share: request builders, the resume decision, the
snapshot dedupe and the bookkeeping of one turn. Nothing here does I/O."""

from __future__ import annotations

import hashlib
from typing import Dict, Iterable, Mapping, Optional, Union

import grpc

from agent_harness_client import types
from agent_harness_client._errors import HarnessError
from agent_harness_client.v1 import (
    actions_pb2,
    agent_session_service_pb2 as service_pb2,
    session_pb2,
)

#: What `prompt` accepts as an attachment: a URI, a dict of `PromptAttachment` fields, or one.
AttachmentLike = Union[str, Mapping[str, object], actions_pb2.PromptAttachment]
#: A permission's or elicitation's request id: as the transcript gives it, or the protobuf.
RequestIdLike = Union[int, str, actions_pb2.JsonRpcId]

VIEWS = {
    "all": service_pb2.SUBSCRIBE_VIEW_ALL,
    "log": service_pb2.SUBSCRIBE_VIEW_LOG,
    "messages": service_pb2.SUBSCRIBE_VIEW_MESSAGES,
}


def attachment(value: AttachmentLike) -> actions_pb2.PromptAttachment:
    if isinstance(value, actions_pb2.PromptAttachment):
        return value
    if isinstance(value, str):
        name = value.split("?")[0].rstrip("/").rsplit("/", 1)[-1] or value
        return actions_pb2.PromptAttachment(uri=value, name=name)
    return actions_pb2.PromptAttachment(**value)  # type: ignore[arg-type]


def request_id(value: RequestIdLike) -> actions_pb2.JsonRpcId:
    """The agent's request id, shape kept: `7` and `"7"` are different requests."""
    if isinstance(value, actions_pb2.JsonRpcId):
        return value
    if isinstance(value, int):
        return actions_pb2.JsonRpcId(number=value)
    return actions_pb2.JsonRpcId(text=value)


def elicitation_value(value: object) -> actions_pb2.ElicitationValue:
    if isinstance(value, bool):
        return actions_pb2.ElicitationValue(flag=value)
    if isinstance(value, int):
        return actions_pb2.ElicitationValue(integer=value)
    if isinstance(value, float):
        return actions_pb2.ElicitationValue(number=value)
    if isinstance(value, (list, tuple)):
        return actions_pb2.ElicitationValue(strings=actions_pb2.StringList(values=[str(v) for v in value]))
    return actions_pb2.ElicitationValue(text=str(value))


def create_session_request(
    profile: str,
    cwd: str,
    model: Optional[str],
    name: Optional[str],
    labels: Optional[Mapping[str, str]],
    editors: Iterable[str],
    session_id: Optional[str],
) -> service_pb2.CreateSessionRequest:
    request = service_pb2.CreateSessionRequest(profile=profile, cwd=cwd, labels=dict(labels or {}), editors=list(editors))
    if model is not None:
        request.model = model
    if name is not None:
        request.name = name
    if session_id is not None:
        request.session_id = session_id
    return request


def prompt_request(
    session_id: str,
    text: str,
    attachments: Iterable[AttachmentLike],
    interrupt: bool,
    action_id: Optional[str],
    only_if_idle: bool = False,
) -> service_pb2.ControlRequest:
    request = service_pb2.ControlRequest(
        session_id=session_id,
        prompt=actions_pb2.PromptAction(prompt=text, attachments=[attachment(a) for a in attachments]),
        delivery=session_pb2.DELIVERY_INTERRUPT if interrupt else session_pb2.DELIVERY_QUEUE,
    )
    if only_if_idle:
        request.expect = session_pb2.EXPECT_IDLE
    if action_id is not None:
        request.action_id = action_id
    return request


def permission_request(session_id: str, rid: RequestIdLike, option_id: Optional[str]) -> service_pb2.ControlRequest:
    action = actions_pb2.RespondToPermissionAction(request_id=request_id(rid))
    if option_id is None:
        action.cancelled.SetInParent()
    else:
        action.selected_option_id = option_id
    return service_pb2.ControlRequest(session_id=session_id, respond_to_permission=action)


def elicitation_request(
    session_id: str, rid: RequestIdLike, accept: Optional[Mapping[str, object]], decline: bool
) -> service_pb2.ControlRequest:
    action = actions_pb2.RespondElicitationAction(request_id=request_id(rid))
    if accept is not None:
        action.accept.SetInParent()
        for key, value in accept.items():
            action.accept.content[key].CopyFrom(elicitation_value(value))
    elif decline:
        action.decline.SetInParent()
    else:
        action.cancel.SetInParent()
    return service_pb2.ControlRequest(session_id=session_id, respond_elicitation=action)


def view_value(view: Union[str, int]) -> int:
    return VIEWS[view] if isinstance(view, str) else view


def resumable(error: HarnessError) -> bool:
    """A dropped connection, a restarting or draining server: resubscribing can succeed. A status
    the service itself chose (it carries an ErrorInfo) is final, except DRAINING and
    REPLICA_UNAVAILABLE (both UNAVAILABLE: go on elsewhere)."""
    if error.code == grpc.StatusCode.UNAVAILABLE:
        return True
    if error.from_service:
        return False
    return error.code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED)


def with_token_hint(error: HarnessError, token: Optional[str]) -> HarnessError:
    if error.code == grpc.StatusCode.UNAUTHENTICATED and not token:
        return HarnessError(
            error.code,
            "the server wants a token and none was given: set AGENT_HARNESS_TOKEN (or pass token=...)",
            error.reason,
            error.metadata,
            error.domain,
        )
    return error


class Dedupe:
    """Resuming is at-least-once for message snapshots: after a reconnect the server may send a
    snapshot again. This drops a snapshot identical to the last one seen for its message id, and a
    log entry at or below the last offset seen, so the caller sees every change once."""

    def __init__(self) -> None:
        self._snapshots: Dict[str, bytes] = {}
        self._last_entry = 0

    def fresh(self, event: service_pb2.SubscribeResponse) -> bool:
        kind = event.WhichOneof("event")
        if kind == "message":
            digest = hashlib.sha256(event.message.SerializeToString(deterministic=True)).digest()
            if self._snapshots.get(event.message.id) == digest:
                return False
            self._snapshots[event.message.id] = digest
        elif kind == "entry":
            if event.entry.offset <= self._last_entry:
                return False
            self._last_entry = event.entry.offset
        return True


class Turn:
    """Follows one prompt's turn through a MESSAGES stream: its agent message and its end."""

    def __init__(self, action_id: str) -> None:
        self.action_id = action_id
        self.message: Optional[types.Message] = None
        self.ended: Optional[types.TurnEnded] = None

    def concerns(self, event: types.Event) -> bool:
        """Whether the event belongs to this turn (and remembers what it says)."""
        if event.message is not None:
            if event.message.request_id != self.action_id:
                return False
            if event.message.role == types.MessageRole.AGENT:
                self.message = event.message
            return True
        if event.turn_ended is not None and event.turn_ended.request_id == self.action_id:
            self.ended = event.turn_ended
            return True
        return event.kind in ("status", "queue")

    def result(self, usage: Optional[types.Usage]) -> types.TurnResult:
        assert self.ended is not None
        message = self.message
        return types.TurnResult(
            action_id=self.action_id,
            turn=self.ended.turn,
            stop_reason=self.ended.stop_reason,
            error=self.ended.error if self.ended.error is not None else (message.error if message else None),
            text=message.text if message else "",
            tool_calls=message.tool_calls if message else [],
            usage=usage,
            message=message,
        )


def session_usage(session: session_pb2.AgentSession) -> Optional[types.Usage]:
    return types.usage(session.usage) if session.HasField("usage") else None
