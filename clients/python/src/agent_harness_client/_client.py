"""`Client`: typed calls to `AgentSessionService` and `ChannelTranslatorService`, errors raised as
`HarnessError`, and a `subscribe` that reconnects and resumes by itself."""

from __future__ import annotations

import time
from typing import Iterable, Iterator, Mapping, Optional, Sequence, Union

import grpc

from agent_harness_client._errors import HarnessError
from agent_harness_client.v1 import (
    actions_pb2,
    agent_session_service_pb2 as service_pb2,
    agent_session_service_pb2_grpc as service_grpc,
    channel_pb2,
    session_pb2,
    transcript_pb2,
    translator_service_pb2,
    translator_service_pb2_grpc,
)

#: What `prompt` accepts as an attachment: a URI, a dict of `PromptAttachment` fields, or one.
Attachment = Union[str, Mapping[str, object], actions_pb2.PromptAttachment]

_VIEWS = {
    "all": service_pb2.SUBSCRIBE_VIEW_ALL,
    "log": service_pb2.SUBSCRIBE_VIEW_LOG,
    "messages": service_pb2.SUBSCRIBE_VIEW_MESSAGES,
}


def _attachment(value: Attachment) -> actions_pb2.PromptAttachment:
    if isinstance(value, actions_pb2.PromptAttachment):
        return value
    if isinstance(value, str):
        name = value.split("?")[0].rstrip("/").rsplit("/", 1)[-1] or value
        return actions_pb2.PromptAttachment(uri=value, name=name)
    return actions_pb2.PromptAttachment(**value)


def _request_id(value: Union[int, str, actions_pb2.JsonRpcId]) -> actions_pb2.JsonRpcId:
    """The agent's request id, shape kept: `7` and `"7"` are different requests."""
    if isinstance(value, actions_pb2.JsonRpcId):
        return value
    if isinstance(value, int):
        return actions_pb2.JsonRpcId(number=value)
    return actions_pb2.JsonRpcId(text=value)


def _elicitation_value(value: object) -> actions_pb2.ElicitationValue:
    if isinstance(value, bool):
        return actions_pb2.ElicitationValue(flag=value)
    if isinstance(value, int):
        return actions_pb2.ElicitationValue(integer=value)
    if isinstance(value, float):
        return actions_pb2.ElicitationValue(number=value)
    if isinstance(value, (list, tuple)):
        return actions_pb2.ElicitationValue(strings=actions_pb2.StringList(values=[str(v) for v in value]))
    return actions_pb2.ElicitationValue(text=str(value))


class Client:
    """A connection to agent-harness.

    >>> with Client("127.0.0.1:50051", token=None) as client:
    ...     session = client.create_session(profile="mock", cwd="/tmp")
    ...     client.prompt(session.id, "hello")
    ...     for event in client.subscribe(session.id, view="messages"):
    ...         if event.WhichOneof("event") == "turn_ended":
    ...             break
    """

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        token: Optional[str] = None,
        *,
        channel: Optional[grpc.Channel] = None,
        timeout: Optional[float] = 30.0,
        reconnect_for: float = 60.0,
    ) -> None:
        """`target` is `host:port` (plaintext) unless a ready `channel` is given (e.g. one made
        with `grpc.secure_channel` for TLS). `token` is sent as `authorization: Bearer <token>`.
        `timeout` bounds every unary call; `reconnect_for` is how long `subscribe` keeps trying
        to resubscribe after the connection dropped before it raises."""
        self._own_channel = channel is None
        self._channel = channel if channel is not None else grpc.insecure_channel(target)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout
        self._reconnect_for = reconnect_for
        #: The generated stubs, for anything the helpers below do not cover.
        self.sessions = service_grpc.AgentSessionServiceStub(self._channel)
        self.translator = translator_service_pb2_grpc.ChannelTranslatorServiceStub(self._channel)

    def close(self) -> None:
        if self._own_channel:
            self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method, request):
        try:
            return method(request, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError as error:
            raise HarnessError.from_rpc_error(error) from None

    # Sessions ------------------------------------------------------------------------------

    def create_session(
        self,
        profile: str,
        cwd: str,
        *,
        model: Optional[str] = None,
        name: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        editors: Sequence[str] = (),
        session_id: Optional[str] = None,
    ) -> session_pb2.AgentSession:
        request = service_pb2.CreateSessionRequest(
            profile=profile, cwd=cwd, labels=dict(labels or {}), editors=list(editors)
        )
        if model is not None:
            request.model = model
        if name is not None:
            request.name = name
        if session_id is not None:
            request.session_id = session_id
        return self._call(self.sessions.CreateSession, request).session

    def get_session(self, session_id: str) -> session_pb2.AgentSession:
        return self._call(self.sessions.GetSession, service_pb2.GetSessionRequest(session_id=session_id)).session

    def fork_session(self, session_id: str, name: Optional[str] = None) -> session_pb2.AgentSession:
        """A new session with the context of `session_id`, when its agent supports fork (else a
        HarnessError with reason NOT_SUPPORTED); its transcript starts with the parent's messages,
        marked `inherited`."""
        request = service_pb2.ForkSessionRequest(session_id=session_id)
        if name is not None:
            request.name = name
        return self._call(self.sessions.ForkSession, request).session

    def list_sessions(
        self, statuses: Iterable[int] = (), labels: Optional[Mapping[str, str]] = None
    ) -> list[session_pb2.AgentSession]:
        """Every visible session (all pages), newest first."""
        sessions, token = [], ""
        while True:
            page = self._call(
                self.sessions.ListSessions,
                service_pb2.ListSessionsRequest(
                    page_size=100, page_token=token, statuses=list(statuses), labels=dict(labels or {})
                ),
            )
            sessions.extend(page.sessions)
            token = page.next_page_token
            if not token:
                return sessions

    def close_session(self, session_id: str) -> session_pb2.AgentSession:
        return self._call(self.sessions.CloseSession, service_pb2.CloseSessionRequest(session_id=session_id)).session

    def delete_session(self, session_id: str) -> None:
        self._call(self.sessions.DeleteSession, service_pb2.DeleteSessionRequest(session_id=session_id))

    # Control and the queue -----------------------------------------------------------------

    def control(self, request: service_pb2.ControlRequest) -> service_pb2.ControlResponse:
        return self._call(self.sessions.Control, request)

    def prompt(
        self,
        session_id: str,
        text: str,
        attachments: Iterable[Attachment] = (),
        *,
        interrupt: bool = False,
        action_id: Optional[str] = None,
    ) -> service_pb2.ControlResponse:
        """Sends (or queues) a prompt; `interrupt` cancels the running turn first."""
        request = service_pb2.ControlRequest(
            session_id=session_id,
            prompt=actions_pb2.PromptAction(prompt=text, attachments=[_attachment(a) for a in attachments]),
            delivery=session_pb2.DELIVERY_INTERRUPT if interrupt else session_pb2.DELIVERY_QUEUE,
        )
        if action_id is not None:
            request.action_id = action_id
        return self.control(request)

    def stop(self, session_id: str, clear_queue: bool = False) -> service_pb2.ControlResponse:
        return self.control(
            service_pb2.ControlRequest(session_id=session_id, stop=actions_pb2.StopAction(clear_queue=clear_queue))
        )

    def respond_to_permission(
        self,
        session_id: str,
        request_id: Union[int, str, actions_pb2.JsonRpcId],
        option_id: Optional[str] = None,
    ) -> service_pb2.ControlResponse:
        """Selects `option_id`, or dismisses the request when it is None."""
        action = actions_pb2.RespondToPermissionAction(request_id=_request_id(request_id))
        if option_id is None:
            action.cancelled.SetInParent()
        else:
            action.selected_option_id = option_id
        return self.control(service_pb2.ControlRequest(session_id=session_id, respond_to_permission=action))

    def respond_elicitation(
        self,
        session_id: str,
        request_id: Union[int, str, actions_pb2.JsonRpcId],
        accept: Optional[Mapping[str, object]] = None,
        *,
        decline: bool = False,
    ) -> service_pb2.ControlResponse:
        """Accepts with `accept`'s content, or declines (`decline=True`), or cancels (neither)."""
        action = actions_pb2.RespondElicitationAction(request_id=_request_id(request_id))
        if accept is not None:
            action.accept.SetInParent()
            for key, value in accept.items():
                action.accept.content[key].CopyFrom(_elicitation_value(value))
        elif decline:
            action.decline.SetInParent()
        else:
            action.cancel.SetInParent()
        return self.control(service_pb2.ControlRequest(session_id=session_id, respond_elicitation=action))

    def get_queue(self, session_id: str) -> list[service_pb2.QueuedAction]:
        return list(self._call(self.sessions.GetQueue, service_pb2.GetQueueRequest(session_id=session_id)).entries)

    def edit_queued_prompt(self, session_id: str, action_id: str, prompt: str) -> service_pb2.QueuedAction:
        return self._call(
            self.sessions.EditQueuedPrompt,
            service_pb2.EditQueuedPromptRequest(session_id=session_id, action_id=action_id, prompt=prompt),
        ).entry

    def remove_queued_action(self, session_id: str, action_id: str) -> None:
        self._call(
            self.sessions.RemoveQueuedAction,
            service_pb2.RemoveQueuedActionRequest(session_id=session_id, action_id=action_id),
        )

    # Log, transcript, stream ---------------------------------------------------------------

    def read_log(self, session_id: str, after_offset: int = 0) -> list[transcript_pb2.LogEntry]:
        """Every log entry after `after_offset`, all pages."""
        entries = []
        while True:
            page = self._call(
                self.sessions.ReadLog,
                service_pb2.ReadLogRequest(session_id=session_id, after_offset=after_offset, limit=5000),
            )
            entries.extend(page.entries)
            if not page.entries or page.entries[-1].offset >= page.head_offset:
                return entries
            after_offset = page.entries[-1].offset

    def get_transcript(self, session_id: str) -> service_pb2.GetTranscriptResponse:
        """The whole transcript: every page's messages, the last page's metadata and head."""
        whole = service_pb2.GetTranscriptResponse()
        token = ""
        while True:
            page = self._call(
                self.sessions.GetTranscript,
                service_pb2.GetTranscriptRequest(session_id=session_id, page_token=token),
            )
            whole.messages.extend(page.messages)
            whole.metadata.CopyFrom(page.metadata)
            whole.head_offset = page.head_offset
            token = page.next_page_token
            if not token:
                return whole

    def subscribe(
        self, session_id: str, view: Union[str, int] = "messages", after_offset: int = 0
    ) -> Iterator[service_pb2.SubscribeResponse]:
        """The session's events from `after_offset` on, forever (break out of the loop to stop).

        When the connection drops or the server restarts or drains, it resubscribes from the
        offset of the last event it yielded (the resume rule), so the caller sees every
        entry, message snapshot and turn end once, in order; each (re)connection's catch-up ends
        with a `caught_up` event. Errors that resubscribing cannot fix (SESSION_NOT_FOUND,
        UNAUTHENTICATED, …) and a server gone longer than `reconnect_for` raise HarnessError."""
        view_value = _VIEWS[view] if isinstance(view, str) else view
        cursor = after_offset
        failing_since: Optional[float] = None
        backoff = 0.1
        while True:
            call = self.sessions.Subscribe(
                service_pb2.SubscribeRequest(session_id=session_id, after_offset=cursor, view=view_value),
                metadata=self._metadata,
            )
            try:
                for event in call:
                    failing_since, backoff = None, 0.1
                    cursor = event.offset
                    yield event
                error: HarnessError = HarnessError(grpc.StatusCode.UNAVAILABLE, "the stream ended")
            except grpc.RpcError as raw:
                error = HarnessError.from_rpc_error(raw)
                if not _resumable(error):
                    raise error from None
            finally:
                call.cancel()
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since > self._reconnect_for:
                raise error
            time.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    # Translator ----------------------------------------------------------------------------

    def translate_channel_message(
        self, message: channel_pb2.ChannelMessage
    ) -> translator_service_pb2.TranslateChannelMessageResponse:
        return self._call(
            self.translator.TranslateChannelMessage,
            translator_service_pb2.TranslateChannelMessageRequest(message=message),
        )


def _resumable(error: HarnessError) -> bool:
    """A dropped connection, a restarting or draining server: resubscribing can succeed. A status
    the service itself chose (it carries an ErrorInfo) is final, except DRAINING."""
    if error.code == grpc.StatusCode.UNAVAILABLE:
        return True
    if error.reason is not None:
        return False
    return error.code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED)
