"""Python types for what the service returns: enum members instead of bare numbers, dataclasses
for transcript messages, parts and stream events. Every wrapper keeps its protobuf as `.pb`, so
anything not wrapped here is still one attribute away.

Enums tolerate numbers this package does not know yet (a newer server): such a value becomes a
member named ``UNKNOWN_<n>`` that still compares equal to its number."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from agent_harness_client.v1 import (
    actions_pb2,
    agent_session_service_pb2 as service_pb2,
    session_pb2,
    transcript_pb2,
)


class _OpenEnum(enum.IntEnum):
    """An IntEnum that turns an unknown number into a pseudo-member instead of raising."""

    @classmethod
    def _missing_(cls, value: object) -> Any:
        if not isinstance(value, int):
            return None
        member = int.__new__(cls, value)
        member._name_ = f"UNKNOWN_{value}"
        member._value_ = value
        return member

    def __str__(self) -> str:
        return self.name


class StopReason(_OpenEnum):
    UNSPECIFIED = 0
    END_TURN = 1
    MAX_TOKENS = 2
    MAX_TURN_REQUESTS = 3
    REFUSAL = 4
    CANCELLED = 5
    FAILED = 6


class SessionStatus(_OpenEnum):
    UNSPECIFIED = 0
    STARTING = 1
    IDLE = 2
    RUNNING = 3
    AWAITING_INPUT = 4
    SUSPENDED = 5
    DISCONNECTED = 6
    CLOSED = 7


class MessageRole(_OpenEnum):
    UNSPECIFIED = 0
    USER = 1
    AGENT = 2


class InteractionOutcome(_OpenEnum):
    UNSPECIFIED = 0
    PENDING = 1
    ACCEPTED = 2
    REJECTED = 3
    SELECTED = 4
    CANCELLED = 5
    DECLINED = 6
    COMPLETED = 7
    ERRORED = 8


class ControlStatus(_OpenEnum):
    UNSPECIFIED = 0
    SENT = 1
    QUEUED = 2


class ControlKind(_OpenEnum):
    UNSPECIFIED = 0
    SET_MODEL = 1
    SET_CONFIG_OPTION = 2
    COMPACT = 3
    STOP = 4


class LogDirection(_OpenEnum):
    UNSPECIFIED = 0
    TO_RUNTIME = 1
    FROM_RUNTIME = 2
    EVENT = 3


#: A JSON-RPC request id of the agent, shape kept: `7` and `"7"` are different requests.
RequestId = Union[int, str]


def request_id(pb: actions_pb2.JsonRpcId) -> RequestId:
    return pb.number if pb.WhichOneof("id") == "number" else pb.text


def _json(text: str) -> Any:
    return json.loads(text) if text else None


# Message parts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    text: str
    pb: transcript_pb2.MessagePart = field(repr=False, compare=False)


@dataclass(frozen=True)
class Thought:
    text: str
    pb: transcript_pb2.MessagePart = field(repr=False, compare=False)


@dataclass(frozen=True)
class Attachment:
    uri: str
    name: str
    mime_type: Optional[str]
    pb: transcript_pb2.MessagePart = field(repr=False, compare=False)


@dataclass(frozen=True)
class ToolCall:
    tool_call_id: str
    title: str
    kind: str
    status: str
    content_json: str
    pb: transcript_pb2.MessagePart = field(repr=False, compare=False)

    @property
    def content(self) -> Any:
        """`content_json` parsed (the ACP tool call content), or None."""
        return _json(self.content_json)


@dataclass(frozen=True)
class PlanEntry:
    content: str
    priority: str
    status: str


@dataclass(frozen=True)
class Plan:
    entries: List[PlanEntry]
    pb: transcript_pb2.MessagePart = field(repr=False, compare=False)


@dataclass(frozen=True)
class PermissionOption:
    option_id: str
    name: str
    kind: str


@dataclass(frozen=True)
class Permission:
    request_id: RequestId
    options: List[PermissionOption]
    outcome: InteractionOutcome
    selected_option_id: Optional[str]
    tool_call_json: str
    pb: transcript_pb2.MessagePart = field(repr=False, compare=False)

    @property
    def pending(self) -> bool:
        return self.outcome == InteractionOutcome.PENDING

    @property
    def tool_call(self) -> Any:
        """`tool_call_json` parsed: the tool call the agent asks about."""
        return _json(self.tool_call_json)


@dataclass(frozen=True)
class Elicitation:
    request_id: RequestId
    message: str
    outcome: InteractionOutcome
    request_json: str
    answer_json: str
    pb: transcript_pb2.MessagePart = field(repr=False, compare=False)

    @property
    def pending(self) -> bool:
        return self.outcome == InteractionOutcome.PENDING


@dataclass(frozen=True)
class Control:
    kind: ControlKind
    value: str
    outcome: InteractionOutcome
    pb: transcript_pb2.MessagePart = field(repr=False, compare=False)


@dataclass(frozen=True)
class Content:
    """A content block other than text (an image, a resource, …), as ACP JSON."""

    type: str
    json: str
    pb: transcript_pb2.MessagePart = field(repr=False, compare=False)


@dataclass(frozen=True)
class OtherPart:
    """A part this package does not wrap (e.g. a newer server's); read `.pb`."""

    kind: Optional[str]
    pb: transcript_pb2.MessagePart = field(repr=False, compare=False)


Part = Union[Text, Thought, Attachment, ToolCall, Plan, Permission, Elicitation, Control, Content, OtherPart]


def part(pb: transcript_pb2.MessagePart) -> Part:
    kind = pb.WhichOneof("kind")
    if kind == "text":
        return Text(pb.text.text, pb)
    if kind == "thought":
        return Thought(pb.thought.text, pb)
    if kind == "attachment":
        a = pb.attachment
        return Attachment(a.uri, a.name, a.mime_type if a.HasField("mime_type") else None, pb)
    if kind == "tool":
        t = pb.tool
        return ToolCall(t.tool_call_id, t.title, t.kind, t.status, t.content_json, pb)
    if kind == "plan":
        return Plan([PlanEntry(e.content, e.priority, e.status) for e in pb.plan.entries], pb)
    if kind == "permission":
        p = pb.permission
        return Permission(
            request_id(p.request_id),
            [PermissionOption(o.option_id, o.name, o.kind) for o in p.options],
            InteractionOutcome(p.outcome),
            p.selected_option_id if p.HasField("selected_option_id") else None,
            p.tool_call_json,
            pb,
        )
    if kind == "elicitation":
        e = pb.elicitation
        return Elicitation(request_id(e.request_id), e.message, InteractionOutcome(e.outcome), e.request_json, e.answer_json, pb)
    if kind == "control":
        c = pb.control
        return Control(ControlKind(c.kind), c.value, InteractionOutcome(c.outcome), pb)
    if kind == "content":
        return Content(pb.content.type, pb.content.json, pb)
    return OtherPart(kind, pb)


# Messages, usage, events ----------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """A transcript message: a user's prompt or the agent's reply to it (`request_id` is the
    prompt's action id)."""

    id: str
    turn: int
    role: MessageRole
    request_id: Optional[str]
    parts: List[Part]
    stop_reason: Optional[StopReason]
    error: Optional[str]
    actor: str
    first_offset: int
    last_offset: int
    inherited: bool
    pb: transcript_pb2.TranscriptMessage = field(repr=False, compare=False)

    @property
    def text(self) -> str:
        """The text parts, joined: what the agent said (or the user's prompt)."""
        return "".join(p.text for p in self.parts if isinstance(p, Text))

    @property
    def tool_calls(self) -> List[ToolCall]:
        return [p for p in self.parts if isinstance(p, ToolCall)]

    @property
    def pending_permissions(self) -> List[Permission]:
        return [p for p in self.parts if isinstance(p, Permission) and p.pending]

    @property
    def pending_elicitations(self) -> List[Elicitation]:
        return [p for p in self.parts if isinstance(p, Elicitation) and p.pending]


def message(pb: transcript_pb2.TranscriptMessage) -> Message:
    return Message(
        id=pb.id,
        turn=pb.turn,
        role=MessageRole(pb.role),
        request_id=pb.request_id if pb.HasField("request_id") else None,
        parts=[part(p) for p in pb.parts],
        stop_reason=StopReason(pb.stop_reason) if pb.HasField("stop_reason") else None,
        error=pb.error if pb.HasField("error") else None,
        actor=pb.actor,
        first_offset=pb.first_offset,
        last_offset=pb.last_offset,
        inherited=pb.inherited,
        pb=pb,
    )


@dataclass(frozen=True)
class Usage:
    """What the agent last reported about its context (and cost, when it sends one)."""

    used_tokens: int
    context_size: int
    cost_amount: Optional[float]
    cost_currency: Optional[str]


def usage(pb: session_pb2.Usage) -> Usage:
    has_cost = pb.HasField("cost")
    return Usage(
        pb.used_tokens,
        pb.context_size,
        pb.cost.amount if has_cost else None,
        pb.cost.currency if has_cost else None,
    )


@dataclass(frozen=True)
class LogEntry:
    offset: int
    direction: LogDirection
    json: str
    actor: str
    action_id: Optional[str]
    epoch: int
    pb: transcript_pb2.LogEntry = field(repr=False, compare=False)

    @property
    def frame(self) -> Any:
        """The frame's JSON, parsed."""
        return json.loads(self.json)


def log_entry(pb: transcript_pb2.LogEntry) -> LogEntry:
    return LogEntry(
        pb.offset,
        LogDirection(pb.direction),
        pb.json,
        pb.actor,
        pb.action_id if pb.HasField("action_id") else None,
        pb.epoch,
        pb,
    )


@dataclass(frozen=True)
class TurnEnded:
    turn: int
    request_id: str
    stop_reason: StopReason
    error: Optional[str]


@dataclass(frozen=True)
class StatusChange:
    status: SessionStatus
    reason: str


@dataclass(frozen=True)
class Event:
    """One event of a subscription. `kind` names which field is set: ``"entry"``,
    ``"message"``, ``"queue"``, ``"status"``, ``"caught_up"``, ``"heartbeat"`` or
    ``"turn_ended"``. `offset` is the resume cursor."""

    offset: int
    kind: Optional[str]
    pb: service_pb2.SubscribeResponse = field(repr=False, compare=False)
    entry: Optional[LogEntry] = None
    message: Optional[Message] = None
    queue: Optional[List[session_pb2.QueuedAction]] = None
    status: Optional[StatusChange] = None
    head_offset: Optional[int] = None
    turn_ended: Optional[TurnEnded] = None

    def WhichOneof(self, name: str) -> Optional[str]:  # noqa: N802 - the protobuf spelling
        """Kept so code written against the raw protobuf events still runs."""
        return self.pb.WhichOneof(name)


def event(pb: service_pb2.SubscribeResponse) -> Event:
    kind = pb.WhichOneof("event")
    if kind == "entry":
        return Event(pb.offset, kind, pb, entry=log_entry(pb.entry))
    if kind == "message":
        return Event(pb.offset, kind, pb, message=message(pb.message))
    if kind == "queue":
        return Event(pb.offset, kind, pb, queue=list(pb.queue.entries))
    if kind == "status":
        return Event(pb.offset, kind, pb, status=StatusChange(SessionStatus(pb.status.status), pb.status.reason))
    if kind == "caught_up":
        return Event(pb.offset, kind, pb, head_offset=pb.caught_up.head_offset)
    if kind == "heartbeat":
        return Event(pb.offset, kind, pb, head_offset=pb.heartbeat.head_offset)
    if kind == "turn_ended":
        t = pb.turn_ended
        ended = TurnEnded(t.turn, t.request_id, StopReason(t.stop_reason), t.error if t.HasField("error") else None)
        return Event(pb.offset, kind, pb, turn_ended=ended)
    return Event(pb.offset, kind, pb)


@dataclass(frozen=True)
class TurnResult:
    """What `run_turn` (or `prompt(..., wait=True)`) returns once the turn has ended."""

    #: The prompt's action id (the agent message's `request_id`).
    action_id: str
    turn: int
    stop_reason: StopReason
    #: Set when the turn failed (stop reason FAILED).
    error: Optional[str]
    #: The agent's final text: its message's text parts, joined.
    text: str
    tool_calls: List[ToolCall]
    #: The session's usage after the turn, when the agent reports it.
    usage: Optional[Usage]
    #: The agent's final message (None if the turn ended before the agent said anything).
    message: Optional[Message]

    @property
    def ok(self) -> bool:
        return self.stop_reason == StopReason.END_TURN

    @property
    def request_id(self) -> str:
        return self.action_id


@dataclass(frozen=True)
class Session:
    """A session as the service describes it; the fields not listed are on `.pb`."""

    id: str
    name: str
    profile: str
    cwd: str
    model: str
    status: SessionStatus
    status_reason: str
    labels: Dict[str, str]
    head_offset: int
    usage: Optional[Usage]
    pb: session_pb2.AgentSession = field(repr=False, compare=False)

    def __getattr__(self, name: str) -> Any:
        if name == "pb":
            raise AttributeError(name)
        return getattr(self.pb, name)


def session(pb: session_pb2.AgentSession) -> Session:
    return Session(
        pb.id,
        pb.name,
        pb.profile,
        pb.cwd,
        pb.model,
        SessionStatus(pb.status),
        pb.status_reason,
        dict(pb.labels),
        pb.head_offset,
        usage(pb.usage) if pb.HasField("usage") else None,
        pb,
    )


@dataclass(frozen=True)
class Sent:
    """The answer to a Control action: SENT (its frame is in the log and went to the agent) or
    QUEUED at `queue_position` (1 is next)."""

    action_id: str
    status: ControlStatus
    queue_position: int
    pb: service_pb2.ControlResponse = field(repr=False, compare=False)


def sent(pb: service_pb2.ControlResponse) -> Sent:
    return Sent(pb.action_id, ControlStatus(pb.status), pb.queue_position, pb)


@dataclass(frozen=True)
class Transcript:
    messages: List[Message]
    head_offset: int
    #: The session metadata (model, config options, commands, plan, usage) as protobuf.
    metadata: transcript_pb2.SessionMetadata = field(repr=False)

    @property
    def usage(self) -> Optional[Usage]:
        return usage(self.metadata.usage) if self.metadata.HasField("usage") else None
