"""The Python client against the real release server: sessions, prompts with
attachments, the queue, permissions, the transcript, typed errors, and a subscribe that survives
a server restart with every event delivered once."""

import queue
import threading

import grpc
import pytest

from agent_harness_client import Client, HarnessError, session_pb2 as svc, transcript_pb2 as tr, types

from conftest import TIMEOUT


class Events:
    """Consumes `client.subscribe(...)` on a thread; the test waits on what arrives."""

    def __init__(self, client: Client, session_id: str, view: str, after_offset: int = 0) -> None:
        self.items: "queue.Queue" = queue.Queue()
        self.seen = []
        self._stream = client.subscribe(session_id, view=view, after_offset=after_offset)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for event in self._stream:
                self.items.put(event)
        except Exception as error:  # surfaced to the test by `until`
            self.items.put(error)

    def until(self, predicate):
        """Events up to and including the first that satisfies `predicate`."""
        while True:
            try:
                event = self.items.get(timeout=TIMEOUT)
            except queue.Empty:
                pytest.fail(f"no matching event within {TIMEOUT} s; seen: {self.seen[-5:]}")
            if isinstance(event, Exception):
                raise event
            self.seen.append(event)
            if predicate(event):
                return event

    def turn_ended(self, action_id: str):
        return self.until(lambda e: e.WhichOneof("event") == "turn_ended" and e.turn_ended.request_id == action_id)


def agent_text(message) -> str:
    return message.text


def test_a_prompt_with_attachments_streams_and_ends_its_turn(client, tmp_path):
    session = client.create_session(profile="mock", cwd=str(tmp_path), labels={"suite": "python"})
    assert session.profile == "mock"
    events = Events(client, session.id, "messages")
    sent = client.prompt(
        session.id,
        "hello\n@chunks 2 8",
        attachments=["https://files.example/a.png", {"uri": "https://files.example/b.txt", "name": "b.txt", "mime_type": "text/plain"}],
    )
    assert sent.status == svc.CONTROL_STATUS_SENT
    ended = events.turn_ended(sent.action_id)
    assert ended.turn_ended.stop_reason == tr.STOP_REASON_END_TURN

    transcript = client.get_transcript(session.id)
    user, agent = transcript.messages
    assert [p.uri for p in user.parts if isinstance(p, types.Attachment)] == [
        "https://files.example/a.png",
        "https://files.example/b.txt",
    ]
    assert agent.request_id == sent.action_id
    assert agent_text(agent).startswith("echo: hello\n@chunks 2 8")
    assert agent.stop_reason == tr.STOP_REASON_END_TURN
    assert [s.id for s in client.list_sessions(labels={"suite": "python"})] == [session.id]


def test_a_second_prompt_queues_behind_a_permission_and_runs_once_it_is_answered(client, tmp_path):
    session = client.create_session(profile="mock", cwd=str(tmp_path))
    events = Events(client, session.id, "messages")
    first = client.prompt(session.id, "@permission Deploy")

    def pending_permission(event):
        return event.message is not None and bool(event.message.pending_permissions)

    held = events.until(pending_permission)
    second = client.prompt(session.id, "and then this")
    assert second.status == svc.CONTROL_STATUS_QUEUED and second.queue_position == 1
    assert [entry.action_id for entry in client.get_queue(session.id)] == [second.action_id]

    permission = held.message.pending_permissions[0]
    assert [o.option_id for o in permission.options][:2] == ["allow-once", "allow-always"]
    client.respond_to_permission(session.id, permission.request_id, "allow-once")
    assert events.turn_ended(first.action_id).turn_ended.stop_reason == tr.STOP_REASON_END_TURN
    assert events.turn_ended(second.action_id).turn_ended.stop_reason == tr.STOP_REASON_END_TURN

    messages = client.get_transcript(session.id).messages
    answered = next(p for p in messages[1].parts if isinstance(p, types.Permission))
    assert answered.outcome == tr.INTERACTION_OUTCOME_SELECTED and answered.selected_option_id == "allow-once"
    assert agent_text(messages[3]) == "echo: and then this"
    assert client.get_queue(session.id) == []


def test_a_fork_starts_with_the_parents_messages_marked_inherited(client, tmp_path):
    parent = client.create_session(profile="mock-fork", cwd=str(tmp_path))
    events = Events(client, parent.id, "messages")
    sent = client.prompt(parent.id, "first question")
    events.turn_ended(sent.action_id)

    forked = client.fork_session(parent.id, name="branch")
    assert forked.id != parent.id
    assert forked.name == "branch"
    inherited = client.get_transcript(forked.id).messages
    assert len(inherited) == 2
    assert all(m.inherited for m in inherited)

    plain = client.create_session(profile="mock", cwd=str(tmp_path))
    with pytest.raises(HarnessError) as refused:
        client.fork_session(plain.id)
    assert refused.value.reason == "NOT_SUPPORTED"


def test_errors_carry_their_code_reason_and_metadata(client, tmp_path):
    with pytest.raises(HarnessError) as missing:
        client.get_session("0190e0e0-0000-7000-8000-000000000000")
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
    assert missing.value.reason == "SESSION_NOT_FOUND"
    assert missing.value.domain == "agent-harness"

    with pytest.raises(HarnessError) as profile:
        client.create_session(profile="no-such-profile", cwd=str(tmp_path))
    assert profile.value.reason == "PROFILE_NOT_FOUND"

    session = client.create_session(profile="mock", cwd=str(tmp_path))
    head = client.get_session(session.id).head_offset
    with pytest.raises(HarnessError) as beyond:
        next(client.subscribe(session.id, view="log", after_offset=head + 100))
    assert beyond.value.code == grpc.StatusCode.OUT_OF_RANGE
    assert beyond.value.reason == "OFFSET_OUT_OF_RANGE"
    assert beyond.value.metadata["head_offset"] == str(head)


def test_subscribe_survives_a_server_restart_with_every_event_once(server, tmp_path):
    client = Client(server.target, timeout=TIMEOUT)
    session = client.create_session(profile="mock-resume", cwd=str(tmp_path))
    events = Events(client, session.id, "log")
    first = client.prompt(session.id, "before the restart\n@chunks 3 16")
    events.turn_ended(first.action_id)

    # The stream is open and idle when the server dies; it comes back on the same port and data.
    server.kill()
    server.start()

    second = client.prompt(session.id, "after the restart\n@chunks 3 16")
    assert events.turn_ended(second.action_id).turn_ended.stop_reason == tr.STOP_REASON_END_TURN

    offsets = [e.entry.offset for e in events.seen if e.WhichOneof("event") == "entry"]
    assert offsets == list(range(1, offsets[-1] + 1)), "every log offset once, in order, no gap"
    assert offsets == [e.offset for e in client.read_log(session.id) if e.offset <= offsets[-1]]
    started = [e for e in events.seen if e.WhichOneof("event") == "entry" and '"runtime_started"' in e.entry.json]
    assert len(started) == 2, "one runtime before the restart, one reopened after it"
    ended = [e.turn_ended.request_id for e in events.seen if e.WhichOneof("event") == "turn_ended"]
    assert ended == [first.action_id, second.action_id]
    client.close()


def test_a_subscription_is_read_on_the_iterating_thread_and_another_thread_can_cancel_it(client, tmp_path):
    from agent_harness_client.v1 import agent_session_service_pb2 as service_pb2

    session = client.create_session(profile="mock", cwd=str(tmp_path))
    call = client.sessions.Subscribe(
        service_pb2.SubscribeRequest(session_id=session.id, view=service_pb2.SUBSCRIBE_VIEW_LOG), timeout=TIMEOUT
    )
    # No hand-over from grpcio's polling thread: the iterating thread reads each event itself.
    assert "SingleThreaded" in type(call).__name__
    assert any(event.WhichOneof("event") == "caught_up" for event in _until_caught_up(call))

    # The stream is idle now; a cancel from another thread ends the wait of the one iterating.
    waiting = threading.Event()
    outcome: "queue.Queue" = queue.Queue()

    def read() -> None:
        waiting.set()
        try:
            outcome.put(next(call))
        except grpc.RpcError as error:
            outcome.put(error.code())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert waiting.wait(TIMEOUT)
    call.cancel()
    assert outcome.get(timeout=TIMEOUT) == grpc.StatusCode.CANCELLED
    reader.join(TIMEOUT)


def _until_caught_up(call):
    for event in call:
        yield event
        if event.WhichOneof("event") == "caught_up":
            return
