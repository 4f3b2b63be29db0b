"""`AsyncClient`: the asyncio twin of `Client` (grpc.aio), with the same methods as coroutines
and `subscribe`/`turn_events` as async iterators. Each method behaves as its namesake on
`agent_harness_client.Client`; see its docstring there.

>>> async with AsyncClient.from_env() as client:
...     session = await client.create_session(profile="mock", cwd="/tmp")
...     result = await client.run_turn(session.id, "hello")
"""

from __future__ import annotations

import asyncio
import datetime
import time
from typing import Any, AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, List, Mapping, Optional, Sequence, Union, cast

import grpc
import grpc.aio

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

__all__ = ["AsyncClient"]


class AsyncClient:
    """A connection to agent-harness for asyncio programs. Create it inside a running event loop
    (grpc.aio binds its channel to the loop)."""

    def __init__(
        self,
        server: Optional[str] = None,
        token: Optional[str] = None,
        *,
        channel: Optional[grpc.aio.Channel] = None,
        timeout: Optional[float] = 30.0,
        reconnect_for: float = 60.0,
    ) -> None:
        self._own_channel = channel is None
        if channel is None:
            channel = _target.channel(_target.parse_server(server or _target.DEFAULT_SERVER), aio=True)
        self._channel = channel
        self._token = token
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout
        self._reconnect_for = reconnect_for
        #: The generated stubs (grpc.aio), for anything the helpers below do not cover.
        self.sessions = service_grpc.AgentSessionServiceStub(self._channel)
        self.translator = translator_service_pb2_grpc.ChannelTranslatorServiceStub(self._channel)

    @classmethod
    def from_env(cls, **options: Any) -> "AsyncClient":
        """A client of ``AGENT_HARNESS_SERVER`` with the token in ``AGENT_HARNESS_TOKEN``."""
        server = _target.env_server()
        _target.parse_server(server, _target.SERVER_ENV)
        return cls(server, _target.env_token(), **options)

    async def wait_ready(self, timeout: float = 30.0) -> None:
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
        except asyncio.TimeoutError:
            raise HarnessError(
                grpc.StatusCode.UNAVAILABLE, f"the server did not accept a connection within {timeout:g} s"
            ) from None

    async def close(self) -> None:
        if self._own_channel:
            await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _error(self, raw: grpc.RpcError) -> HarnessError:
        return _shared.with_token_hint(HarnessError.from_rpc_error(raw), self._token)

    async def _call(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError as raw:
            raise self._error(raw) from None

    # Sessions ------------------------------------------------------------------------------

    async def create_session(
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
        return types.session((await self._call(self.sessions.CreateSession, request)).session)

    async def get_session(self, session_id: str) -> types.Session:
        response = await self._call(self.sessions.GetSession, service_pb2.GetSessionRequest(session_id=session_id))
        return types.session(response.session)

    async def fork_session(self, session_id: str, name: Optional[str] = None) -> types.Session:
        request = service_pb2.ForkSessionRequest(session_id=session_id)
        if name is not None:
            request.name = name
        return types.session((await self._call(self.sessions.ForkSession, request)).session)

    async def list_sessions(
        self, statuses: Iterable[int] = (), labels: Optional[Mapping[str, str]] = None
    ) -> List[types.Session]:
        sessions: List[types.Session] = []
        token = ""
        while True:
            page = await self._call(
                self.sessions.ListSessions,
                service_pb2.ListSessionsRequest(
                    page_size=100, page_token=token, statuses=cast(Any, list(statuses)), labels=dict(labels or {})
                ),
            )
            sessions.extend(types.session(s) for s in page.sessions)
            token = page.next_page_token
            if not token:
                return sessions

    async def close_session(self, session_id: str) -> types.Session:
        request = service_pb2.CloseSessionRequest(session_id=session_id)
        return types.session((await self._call(self.sessions.CloseSession, request)).session)

    async def delete_session(self, session_id: str) -> None:
        await self._call(self.sessions.DeleteSession, service_pb2.DeleteSessionRequest(session_id=session_id))

    # Control and the queue -----------------------------------------------------------------

    async def control(self, request: service_pb2.ControlRequest) -> types.Sent:
        return types.sent(await self._call(self.sessions.Control, request))

    async def prompt(
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
        if wait:
            return await self.run_turn(
                session_id, text, attachments, interrupt=interrupt, action_id=action_id,
                only_if_idle=only_if_idle, timeout=timeout,
            )
        request = _shared.prompt_request(session_id, text, attachments, interrupt, action_id, only_if_idle)
        return await self.control(request)

    async def turn_events(
        self,
        session_id: str,
        text: str,
        attachments: Iterable[AttachmentLike] = (),
        *,
        interrupt: bool = False,
        action_id: Optional[str] = None,
        only_if_idle: bool = False,
        timeout: Optional[float] = None,
    ) -> AsyncIterator[types.Event]:
        head = (await self.get_session(session_id)).head_offset
        request = _shared.prompt_request(session_id, text, attachments, interrupt, action_id, only_if_idle)
        turn = _shared.Turn((await self.control(request)).action_id)
        events = self.subscribe(session_id, "messages", after_offset=head, timeout=timeout)
        try:
            async for event in events:
                if turn.concerns(event):
                    yield event
                    if turn.ended is not None:
                        return
        except HarnessError as error:
            await self._stop_on_timeout(session_id, turn, error)
            raise
        finally:
            await events.aclose()

    async def run_turn(
        self,
        session_id: str,
        text: str,
        attachments: Iterable[AttachmentLike] = (),
        *,
        interrupt: bool = False,
        action_id: Optional[str] = None,
        only_if_idle: bool = False,
        timeout: Optional[float] = None,
        on_event: Optional[Callable[[types.Event], Union[None, Awaitable[None]]]] = None,
    ) -> types.TurnResult:
        """As `Client.run_turn`; `on_event` may be a plain function or a coroutine function."""
        head = (await self.get_session(session_id)).head_offset
        request = _shared.prompt_request(session_id, text, attachments, interrupt, action_id, only_if_idle)
        turn = _shared.Turn((await self.control(request)).action_id)
        events = self.subscribe(session_id, "messages", after_offset=head, timeout=timeout)
        try:
            async for event in events:
                if turn.concerns(event):
                    if on_event is not None:
                        outcome = on_event(event)
                        if asyncio.iscoroutine(outcome):
                            await outcome
                    if turn.ended is not None:
                        break
        except HarnessError as error:
            await self._stop_on_timeout(session_id, turn, error)
            raise
        finally:
            # Closed now, not when collected: the stream is a live call.
            await events.aclose()
        return turn.result((await self.get_session(session_id)).usage)

    async def _stop_on_timeout(self, session_id: str, turn: "_shared.Turn", error: HarnessError) -> None:
        """As `Client`'s: a turn that outlived its `timeout` is stopped before the error is raised."""
        if error.reason == "DEADLINE_EXCEEDED" and turn.ended is None:
            try:
                await self.stop(session_id)
            except HarnessError:
                pass

    async def get_usage(
        self, principal: str = "", since: Optional[datetime.datetime] = None
    ) -> service_pb2.GetUsageResponse:
        """As `Client.get_usage`."""
        request = service_pb2.GetUsageRequest(principal=principal)
        if since is not None:
            request.since.FromDatetime(since)
        return cast(service_pb2.GetUsageResponse, await self._call(self.sessions.GetUsage, request))

    async def stop(self, session_id: str, clear_queue: bool = False) -> types.Sent:
        action = actions_pb2.StopAction(clear_queue=clear_queue)
        return await self.control(service_pb2.ControlRequest(session_id=session_id, stop=action))

    async def respond_to_permission(
        self, session_id: str, request_id: RequestIdLike, option_id: Optional[str] = None
    ) -> types.Sent:
        return await self.control(_shared.permission_request(session_id, request_id, option_id))

    async def respond_elicitation(
        self,
        session_id: str,
        request_id: RequestIdLike,
        accept: Optional[Mapping[str, object]] = None,
        *,
        decline: bool = False,
    ) -> types.Sent:
        return await self.control(_shared.elicitation_request(session_id, request_id, accept, decline))

    async def get_queue(self, session_id: str) -> List[session_pb2.QueuedAction]:
        response = await self._call(self.sessions.GetQueue, service_pb2.GetQueueRequest(session_id=session_id))
        return list(response.entries)

    async def edit_queued_prompt(self, session_id: str, action_id: str, prompt: str) -> session_pb2.QueuedAction:
        request = service_pb2.EditQueuedPromptRequest(session_id=session_id, action_id=action_id, prompt=prompt)
        return (await self._call(self.sessions.EditQueuedPrompt, request)).entry

    async def remove_queued_action(self, session_id: str, action_id: str) -> None:
        request = service_pb2.RemoveQueuedActionRequest(session_id=session_id, action_id=action_id)
        await self._call(self.sessions.RemoveQueuedAction, request)

    # Log, transcript, stream ---------------------------------------------------------------

    async def read_log(self, session_id: str, after_offset: int = 0) -> List[types.LogEntry]:
        entries: List[types.LogEntry] = []
        while True:
            page = await self._call(
                self.sessions.ReadLog,
                service_pb2.ReadLogRequest(session_id=session_id, after_offset=after_offset, limit=5000),
            )
            entries.extend(types.log_entry(e) for e in page.entries)
            if not page.entries or page.entries[-1].offset >= page.head_offset:
                return entries
            after_offset = page.entries[-1].offset

    async def get_transcript(self, session_id: str) -> types.Transcript:
        messages: List[types.Message] = []
        token = ""
        while True:
            page = await self._call(
                self.sessions.GetTranscript,
                service_pb2.GetTranscriptRequest(session_id=session_id, page_token=token),
            )
            messages.extend(types.message(m) for m in page.messages)
            token = page.next_page_token
            if not token:
                return types.Transcript(messages, page.head_offset, page.metadata)

    async def subscribe(
        self,
        session_id: str,
        view: Union[str, int] = "messages",
        after_offset: int = 0,
        *,
        resume: bool = True,
        timeout: Optional[float] = None,
    ) -> AsyncGenerator[types.Event, None]:
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
                async for raw in call:
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
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    # Translator ----------------------------------------------------------------------------

    async def translate_channel_message(
        self, message: channel_pb2.ChannelMessage
    ) -> translator_service_pb2.TranslateChannelMessageResponse:
        request = translator_service_pb2.TranslateChannelMessageRequest(message=message)
        return await self._call(self.translator.TranslateChannelMessage, request)
