"""`Client`: the synchronous client. Typed calls to `AgentSessionService` and
`ChannelTranslatorService`, errors raised as `HarnessError`, a `subscribe` that reconnects,
resumes and drops re-sent snapshots, and `run_turn` for "send and wait for the result".
`agent_harness_client.aio.AsyncClient` has the same methods as coroutines."""

from __future__ import annotations

import datetime
import time
from typing import Any, Callable, Iterable, Iterator, List, Mapping, Optional, Sequence, Union, cast

import grpc

from agent_harness_client import _shared, _target, types
from agent_harness_client._errors import HarnessError
from agent_harness_client._shared import AttachmentLike, RequestIdLike
from agent_harness_client.v1 import (
    actions_pb2,
    agent_session_service_pb2 as service_pb2,
    agent_session_service_pb2_grpc as service_grpc,
    channel_pb2,
    session_pb2,
    translator_service_pb2,
    translator_service_pb2_grpc,
)

#: Kept for code written against earlier versions.
Attachment = AttachmentLike


class Client:
    """A connection to agent-harness.

    >>> with Client.from_env() as client:
    ...     session = client.create_session(profile="mock", cwd="/tmp")
    ...     result = client.run_turn(session.id, "hello")
    ...     print(result.stop_reason, result.text)
    """

    def __init__(
        self,
        server: Optional[str] = None,
        token: Optional[str] = None,
        *,
        channel: Optional[grpc.Channel] = None,
        timeout: Optional[float] = 30.0,
        reconnect_for: float = 60.0,
    ) -> None:
        """`server` is a URL, ``http://host:port`` (plaintext) or ``https://host[:port]`` (TLS),
        or a bare ``host:port``; default ``http://127.0.0.1:50051``. A ready `channel` overrides
        it. `token` is sent as ``authorization: Bearer <token>``. `timeout` bounds every unary
        call; `reconnect_for` is how long `subscribe` keeps trying to resubscribe after the
        connection dropped before it raises. A malformed `server` raises HarnessError with
        reason ``INVALID_SERVER_URL``."""
        self._own_channel = channel is None
        if channel is None:
            channel = _target.channel(_target.parse_server(server or _target.DEFAULT_SERVER))
        self._channel = channel
        self._token = token
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout
        self._reconnect_for = reconnect_for
        #: The generated stubs, for anything the helpers below do not cover.
        self.sessions = service_grpc.AgentSessionServiceStub(self._channel)
        self.translator = translator_service_pb2_grpc.ChannelTranslatorServiceStub(self._channel)

    @classmethod
    def from_env(cls, **options: Any) -> "Client":
        """A client of ``AGENT_HARNESS_SERVER`` (a URL as the CLI takes it; default
        ``http://127.0.0.1:50051``) with the token in ``AGENT_HARNESS_TOKEN`` (if set)."""
        server = _target.env_server()
        _target.parse_server(server, _target.SERVER_ENV)  # names the variable if it is malformed
        return cls(server, _target.env_token(), **options)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Waits until the server accepts connections (e.g. just after starting it); raises
        HarnessError UNAVAILABLE when it does not within `timeout` seconds."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise HarnessError(
                grpc.StatusCode.UNAVAILABLE, f"the server did not accept a connection within {timeout:g} s"
            ) from None

    def close(self) -> None:
        if self._own_channel:
            self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _error(self, raw: grpc.RpcError) -> HarnessError:
        return _shared.with_token_hint(HarnessError.from_rpc_error(raw), self._token)

    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError as raw:
            raise self._error(raw) from None

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
    ) -> types.Session:
        request = _shared.create_session_request(profile, cwd, model, name, labels, editors, session_id)
        return types.session(self._call(self.sessions.CreateSession, request).session)

    def get_session(self, session_id: str) -> types.Session:
        response = self._call(self.sessions.GetSession, service_pb2.GetSessionRequest(session_id=session_id))
        return types.session(response.session)

    def fork_session(self, session_id: str, name: Optional[str] = None) -> types.Session:
        """A new session with the context of `session_id`, when its agent supports fork (else a
        HarnessError with reason NOT_SUPPORTED); its transcript starts with the parent's messages,
        marked `inherited`."""
        request = service_pb2.ForkSessionRequest(session_id=session_id)
        if name is not None:
            request.name = name
        return types.session(self._call(self.sessions.ForkSession, request).session)

    def list_sessions(
        self, statuses: Iterable[int] = (), labels: Optional[Mapping[str, str]] = None
    ) -> List[types.Session]:
        """Every visible session (all pages), newest first."""
        sessions: List[types.Session] = []
        token = ""
        while True:
            page = self._call(
                self.sessions.ListSessions,
                service_pb2.ListSessionsRequest(
                    page_size=100, page_token=token, statuses=cast(Any, list(statuses)), labels=dict(labels or {})
                ),
            )
            sessions.extend(types.session(s) for s in page.sessions)
            token = page.next_page_token
            if not token:
                return sessions

    def close_session(self, session_id: str) -> types.Session:
        response = self._call(self.sessions.CloseSession, service_pb2.CloseSessionRequest(session_id=session_id))
        return types.session(response.session)

    def delete_session(self, session_id: str) -> None:
        self._call(self.sessions.DeleteSession, service_pb2.DeleteSessionRequest(session_id=session_id))

    # Control and the queue -----------------------------------------------------------------

    def control(self, request: service_pb2.ControlRequest) -> types.Sent:
        return types.sent(self._call(self.sessions.Control, request))

    def prompt(
        self,
        session_id: str,
        text: str,
        attachments: Iterable[AttachmentLike] = (),
        *,
        interrupt: bool = False,
        action_id: Optional[str] = None,
        only_if_idle: bool = False,
        wait: bool = False,
        timeout: Optional[float] = None,
    ) -> Any:
        """Sends (or queues) a prompt; `interrupt` cancels the running turn first; `only_if_idle`
        refuses (reason SESSION_BUSY, nothing stored) unless the session is idle with an empty
        queue. Returns `Sent`, or with `wait=True` the `TurnResult` once the turn has ended
        (as `run_turn`)."""
        if wait:
            return self.run_turn(
                session_id, text, attachments, interrupt=interrupt, action_id=action_id,
                only_if_idle=only_if_idle, timeout=timeout,
            )
        return self.control(_shared.prompt_request(session_id, text, attachments, interrupt, action_id, only_if_idle))

    def turn_events(
        self,
        session_id: str,
        text: str,
        attachments: Iterable[AttachmentLike] = (),
        *,
        interrupt: bool = False,
        action_id: Optional[str] = None,
        only_if_idle: bool = False,
        timeout: Optional[float] = None,
    ) -> Iterator[types.Event]:
        """Sends a prompt and yields the events of its turn (its messages' snapshots, status and
        queue changes) until its `turn_ended` event, the last one. It survives a server restart
        like `subscribe`; `timeout` (seconds) bounds the whole turn: past it the turn is stopped
        and HarnessError DEADLINE_EXCEEDED raised."""
        head = self.get_session(session_id).head_offset
        sent = self.control(_shared.prompt_request(session_id, text, attachments, interrupt, action_id, only_if_idle))
        turn = _shared.Turn(sent.action_id)
        try:
            for event in self.subscribe(session_id, "messages", after_offset=head, timeout=timeout):
                if turn.concerns(event):
                    yield event
                    if turn.ended is not None:
                        return
        except HarnessError as error:
            self._stop_on_timeout(session_id, turn, error)
            raise

    def run_turn(
        self,
        session_id: str,
        text: str,
        attachments: Iterable[AttachmentLike] = (),
        *,
        interrupt: bool = False,
        action_id: Optional[str] = None,
        only_if_idle: bool = False,
        timeout: Optional[float] = None,
        on_event: Optional[Callable[[types.Event], None]] = None,
    ) -> types.TurnResult:
        """Sends a prompt and waits for its turn to end: the `TurnResult` holds the stop reason,
        the agent's final text, its tool calls and the session's usage. A turn that fails
        returns stop reason FAILED with `error` set (it does not raise); `on_event` sees each
        event of the turn as it comes (e.g. to answer a permission request). When `timeout`
        (seconds) passes first, the turn is stopped and HarnessError DEADLINE_EXCEEDED raised."""
        head = self.get_session(session_id).head_offset
        sent = self.control(_shared.prompt_request(session_id, text, attachments, interrupt, action_id, only_if_idle))
        turn = _shared.Turn(sent.action_id)
        try:
            for event in self.subscribe(session_id, "messages", after_offset=head, timeout=timeout):
                if turn.concerns(event):
                    if on_event is not None:
                        on_event(event)
                    if turn.ended is not None:
                        break
        except HarnessError as error:
            self._stop_on_timeout(session_id, turn, error)
            raise
        return turn.result(self.get_session(session_id).usage)

    def _stop_on_timeout(self, session_id: str, turn: "_shared.Turn", error: HarnessError) -> None:
        """A turn that outlived its `timeout` is stopped before the error is raised: nobody waits
        for it any more, and an agent left running would go on spending."""
        if error.reason == "DEADLINE_EXCEEDED" and turn.ended is None:
            try:
                self.stop(session_id)
            except HarnessError:
                pass

    def get_usage(self, principal: str = "", since: Optional[datetime.datetime] = None) -> service_pb2.GetUsageResponse:
        """What sessions used (tokens, cost per currency), per session, principal, profile and
        source (`sources`: the agents' reports, or the model proxy's reading of the provider's
        answers), with the budget of the principal asked about. `principal` empty: your own (for
        `local`, everyone's)."""
        request = service_pb2.GetUsageRequest(principal=principal)
        if since is not None:
            request.since.FromDatetime(since)
        return self._call(self.sessions.GetUsage, request)

    def stop(self, session_id: str, clear_queue: bool = False) -> types.Sent:
        return self.control(
            service_pb2.ControlRequest(session_id=session_id, stop=actions_pb2.StopAction(clear_queue=clear_queue))
        )

    def respond_to_permission(
        self, session_id: str, request_id: RequestIdLike, option_id: Optional[str] = None
    ) -> types.Sent:
        """Selects `option_id`, or dismisses the request when it is None."""
        return self.control(_shared.permission_request(session_id, request_id, option_id))

    def respond_elicitation(
        self,
        session_id: str,
        request_id: RequestIdLike,
        accept: Optional[Mapping[str, object]] = None,
        *,
        decline: bool = False,
    ) -> types.Sent:
        """Accepts with `accept`'s content, or declines (`decline=True`), or cancels (neither)."""
        return self.control(_shared.elicitation_request(session_id, request_id, accept, decline))

    def get_queue(self, session_id: str) -> List[session_pb2.QueuedAction]:
        return list(self._call(self.sessions.GetQueue, service_pb2.GetQueueRequest(session_id=session_id)).entries)

    def edit_queued_prompt(self, session_id: str, action_id: str, prompt: str) -> session_pb2.QueuedAction:
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

    def read_log(self, session_id: str, after_offset: int = 0) -> List[types.LogEntry]:
        """Every log entry after `after_offset`, all pages."""
        entries: List[types.LogEntry] = []
        while True:
            page = self._call(
                self.sessions.ReadLog,
                service_pb2.ReadLogRequest(session_id=session_id, after_offset=after_offset, limit=5000),
            )
            entries.extend(types.log_entry(e) for e in page.entries)
            if not page.entries or page.entries[-1].offset >= page.head_offset:
                return entries
            after_offset = page.entries[-1].offset

    def get_transcript(self, session_id: str) -> types.Transcript:
        """The whole transcript: every page's messages, the last page's metadata and head."""
        messages: List[types.Message] = []
        token = ""
        while True:
            page = self._call(
                self.sessions.GetTranscript,
                service_pb2.GetTranscriptRequest(session_id=session_id, page_token=token),
            )
            messages.extend(types.message(m) for m in page.messages)
            token = page.next_page_token
            if not token:
                return types.Transcript(messages, page.head_offset, page.metadata)

    def subscribe(
        self,
        session_id: str,
        view: Union[str, int] = "messages",
        after_offset: int = 0,
        *,
        resume: bool = True,
        timeout: Optional[float] = None,
    ) -> Iterator[types.Event]:
        """The session's events from `after_offset` on, forever (break out of the loop to stop).

        When the connection drops or the server restarts or drains, it resubscribes from the
        offset of the last event it received (the resume rule) and drops a message snapshot
        identical to the last one it yielded for that message (a resume may send one again), so
        the caller sees every log entry, message change and turn end once, in order; each
        (re)connection's catch-up ends with a `caught_up` event. Errors that resubscribing
        cannot fix (SESSION_NOT_FOUND, UNAUTHENTICATED, …), a server gone longer than
        `reconnect_for`, or any error with `resume=False`, raise HarnessError. `timeout`
        (seconds) bounds the whole subscription."""
        request_view = _shared.view_value(view)
        deadline = None if timeout is None else time.monotonic() + timeout
        dedupe = _shared.Dedupe()
        cursor = after_offset
        failing_since: Optional[float] = None
        backoff = 0.1
        while True:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            call = self.sessions.Subscribe(
                service_pb2.SubscribeRequest(session_id=session_id, after_offset=cursor, view=cast(Any, request_view)),
                metadata=self._metadata,
                timeout=remaining,
            )
            try:
                for raw in call:
                    failing_since, backoff = None, 0.1
                    cursor = raw.offset
                    if dedupe.fresh(raw):
                        yield types.event(raw)
                error = HarnessError(grpc.StatusCode.UNAVAILABLE, "the stream ended")
            except grpc.RpcError as raw_error:
                error = self._error(raw_error)
            finally:
                call.cancel()
            if not resume or not _shared.resumable(error):
                raise error
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
