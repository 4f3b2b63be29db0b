"""The Python package as people use it: the examples, `from_env`, `run_turn` on both clients,
Python types instead of raw protobuf, and one clear error for every mistake."""

import asyncio
import hashlib
import os
import pathlib
import subprocess
import sys
import time

import grpc
import pytest

from agent_harness_client import (
    Client,
    HarnessError,
    InteractionOutcome,
    SessionStatus,
    StopReason,
    types,
)
from agent_harness_client.aio import AsyncClient
from agent_harness_client.v1 import (
    agent_session_service_pb2 as service_pb2,
    session_pb2,
    transcript_pb2,
    usage_pb2,
)

from conftest import TIMEOUT, Server

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
#: The interpreter that runs the examples: scripts/test passes a fresh venv where only
#: `pip install ./clients/python` was run; by default the one running the tests.
EXAMPLES_PYTHON = os.environ.get("AGENT_HARNESS_EXAMPLES_PYTHON", sys.executable)


def run_example(name, server, cwd, *args, env_extra=None):
    # The examples work in their own cwd: `cwd` must not hold the server's files.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_HARNESS_")}
    env.update({"AGENT_HARNESS_SERVER": f"http://{server.target}", **(env_extra or {})})
    return subprocess.run(
        [EXAMPLES_PYTHON, str(EXAMPLES / name), *args],
        capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=str(cwd),
    )


@pytest.mark.parametrize("example", ["run_turn_async.py", "run_turn_sync.py"])
def test_each_example_runs_a_turn_and_prints_the_final_text_and_stop_reason(server, example, tmp_path):
    done = run_example(example, server, tmp_path, "Say hello\n@chunks 2 4")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "echo: Say hello"
    assert lines[-1] == "stop reason: END_TURN"


@pytest.mark.parametrize("example", ["run_turn_async.py", "run_turn_sync.py"])
def test_an_example_given_a_malformed_server_url_says_so_in_one_line(server, example, tmp_path):
    done = run_example(example, server, tmp_path, env_extra={"AGENT_HARNESS_SERVER": "htp:/127.0.0.1"})
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "error: INVALID_SERVER_URL: AGENT_HARNESS_SERVER 'htp:/127.0.0.1' is not a server URL;"
        " want http://host:port or https://host[:port]"
    ]


def test_from_env_takes_an_http_url_and_the_token_from_the_environment(server, monkeypatch, tmp_path):
    monkeypatch.setenv("AGENT_HARNESS_SERVER", f"http://{server.target}")
    monkeypatch.delenv("AGENT_HARNESS_TOKEN", raising=False)
    with Client.from_env(timeout=TIMEOUT) as client:
        session = client.create_session(profile="mock", cwd=str(tmp_path))
        assert [s.id for s in client.list_sessions()] == [session.id]

    async def main():
        async with AsyncClient.from_env(timeout=TIMEOUT) as client:
            return (await client.get_session(session.id)).id

    assert asyncio.run(main()) == session.id
    # The URL form the CLI and the TypeScript package take works as a plain argument too.
    with Client(f"http://{server.target}", timeout=TIMEOUT) as client:
        assert client.get_session(session.id).id == session.id


def test_a_missing_token_says_in_one_line_which_variable_to_set(tmp_path, monkeypatch):
    token = "s3cret-token"
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        f'[[tokens]]\nsha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\nprincipal = "ada"\nkind = "user"\n'
    )
    server = Server(tmp_path, extra_args=["--tokens-file", str(tokens)], config="")
    server.start()
    try:
        monkeypatch.setenv("AGENT_HARNESS_SERVER", f"http://{server.target}")
        monkeypatch.delenv("AGENT_HARNESS_TOKEN", raising=False)
        with Client.from_env(timeout=TIMEOUT) as client, pytest.raises(HarnessError) as refused:
            client.list_sessions()
        assert refused.value.reason == "UNAUTHENTICATED"
        assert str(refused.value) == (
            "UNAUTHENTICATED: the server wants a token and none was given:"
            " set AGENT_HARNESS_TOKEN (or pass token=...)"
        )
        monkeypatch.setenv("AGENT_HARNESS_TOKEN", token)
        with Client.from_env(timeout=TIMEOUT) as client:
            assert client.list_sessions() == []
    finally:
        server.stop()


def test_run_turn_returns_the_stop_reason_final_text_tool_calls_and_usage(client, tmp_path):
    session = client.create_session(profile="mock", cwd=str(tmp_path))
    result = client.run_turn(session.id, "Build it\n@tool t1\n@usage 53000 200000 0.045 USD", timeout=TIMEOUT)
    assert result.stop_reason is StopReason.END_TURN and result.ok
    assert result.error is None
    assert result.text.startswith("echo: Build it")
    assert [(t.tool_call_id, t.title) for t in result.tool_calls] == [("t1", "Run t1")]
    assert result.usage == types.Usage(53000, 200000, 0.045, "USD")
    assert result.message is not None and result.message.request_id == result.action_id
    # The protobuf is one attribute away.
    assert isinstance(result.message.pb, transcript_pb2.TranscriptMessage)
    assert result.message.pb.stop_reason == transcript_pb2.STOP_REASON_END_TURN


def test_a_failed_turn_is_a_result_with_its_error_not_an_exception(client, tmp_path):
    session = client.create_session(profile="mock", cwd=str(tmp_path))
    result = client.prompt(session.id, "@error -32603 it broke badly", wait=True, timeout=TIMEOUT)
    assert result.stop_reason is StopReason.FAILED and not result.ok
    assert "it broke badly" in result.error


def test_turn_events_yield_the_turns_snapshots_and_end_with_its_turn_ended(client, tmp_path):
    session = client.create_session(profile="mock", cwd=str(tmp_path))
    events = list(client.turn_events(session.id, "Stream it\n@chunks 3 4", timeout=TIMEOUT))
    assert events[-1].kind == "turn_ended"
    assert events[-1].turn_ended.stop_reason is StopReason.END_TURN
    agent = [e.message for e in events if e.message is not None and e.message.role == types.MessageRole.AGENT]
    assert agent and agent[-1].text.startswith("echo: Stream it")
    assert all(e.kind in ("message", "status", "queue", "turn_ended") for e in events)


def test_a_permission_is_answered_from_on_event_while_run_turn_waits(client, tmp_path):
    session = client.create_session(profile="mock", cwd=str(tmp_path))
    answered = []

    def on_event(event):
        if event.message is not None:
            for permission in event.message.pending_permissions:
                assert permission.outcome is InteractionOutcome.PENDING
                client.respond_to_permission(session.id, permission.request_id, permission.options[0].option_id)
                answered.append(permission.request_id)

    result = client.run_turn(session.id, "@permission Deploy", on_event=on_event, timeout=TIMEOUT)
    assert result.ok and len(answered) == 1
    permission = next(p for p in result.message.parts if isinstance(p, types.Permission))
    assert permission.outcome is InteractionOutcome.SELECTED and permission.selected_option_id == "allow-once"


def test_the_async_client_has_the_same_methods_and_runs_a_turn(server, tmp_path):
    sync_methods = {n for n in dir(Client) if not n.startswith("_")} - {"from_env"}
    async_methods = {n for n in dir(AsyncClient) if not n.startswith("_")} - {"from_env"}
    assert sync_methods == async_methods

    async def main():
        async with AsyncClient(f"http://{server.target}", timeout=TIMEOUT) as client:
            session = await client.create_session(profile="mock", cwd=str(tmp_path))
            assert session.status in (SessionStatus.IDLE, SessionStatus.STARTING)
            kinds = [e.kind async for e in client.turn_events(session.id, "one", timeout=TIMEOUT)]
            result = await client.prompt(session.id, "two\n@chunks 2 4", wait=True, timeout=TIMEOUT)
            return session.id, kinds, result, await client.get_transcript(session.id)

    session_id, kinds, result, transcript = asyncio.run(main())
    assert kinds[-1] == "turn_ended"
    assert result.ok and result.text.startswith("echo: two")
    assert [m.role.name for m in transcript.messages] == ["USER", "AGENT", "USER", "AGENT"]
    assert transcript.messages[-1].stop_reason is StopReason.END_TURN


def test_unavailable_while_the_server_is_down_is_a_harness_error_with_a_reason(server, tmp_path):
    client = Client(f"http://{server.target}", timeout=TIMEOUT)
    session = client.create_session(profile="mock-resume", cwd=str(tmp_path))
    events = client.subscribe(session.id, "messages", resume=False)
    assert next(events).kind in ("message", "caught_up", "status", "queue")
    server.kill()
    with pytest.raises(HarnessError) as dropped:
        for _ in events:
            pass
    assert dropped.value.code == grpc.StatusCode.UNAVAILABLE
    assert dropped.value.reason == "UNAVAILABLE"
    with pytest.raises(HarnessError) as down:
        client.get_session(session.id)
    assert down.value.reason == "UNAVAILABLE" and not down.value.from_service
    assert "\n" not in str(down.value)
    client.close()


def test_the_python_enums_name_every_value_the_protocol_defines():
    pairs = [
        (types.StopReason, transcript_pb2.StopReason, "STOP_REASON_"),
        (types.SessionStatus, session_pb2.SessionStatus, "SESSION_STATUS_"),
        (types.MessageRole, transcript_pb2.MessageRole, "MESSAGE_ROLE_"),
        (types.InteractionOutcome, transcript_pb2.InteractionOutcome, "INTERACTION_OUTCOME_"),
        (types.ControlStatus, session_pb2.ControlStatus, "CONTROL_STATUS_"),
        (types.ControlKind, transcript_pb2.ControlKind, "CONTROL_KIND_"),
        (types.LogDirection, transcript_pb2.LogDirection, "LOG_DIRECTION_"),
    ]
    for python, proto, prefix in pairs:
        assert {m.name: m.value for m in python} == {
            v.name[len(prefix):]: v.number for v in proto.DESCRIPTOR.values
        }, python.__name__
    # A number a newer server sends is kept, with a name that says so, not an exception.
    assert types.StopReason(42) == 42 and types.StopReason(42).name == "UNKNOWN_42"


def _snapshot(message_id, text, offset):
    return service_pb2.SubscribeResponse(
        offset=offset,
        message=transcript_pb2.TranscriptMessage(
            id=message_id, parts=[transcript_pb2.MessagePart(text=transcript_pb2.TextPart(text=text))]
        ),
    )


def test_the_dedupe_drops_only_a_snapshot_identical_to_the_last_one_of_its_message():
    from agent_harness_client._shared import Dedupe

    dedupe = Dedupe()
    seen = [
        dedupe.fresh(e)
        for e in [
            _snapshot("1:agent", "a", 5),
            _snapshot("1:agent", "a", 5),  # re-sent after a resume: dropped
            _snapshot("1:user", "q", 5),  # another message: kept
            _snapshot("1:agent", "ab", 6),  # a change: kept
            _snapshot("1:agent", "ab", 6),  # dropped
            service_pb2.SubscribeResponse(offset=6, caught_up=service_pb2.CaughtUp(head_offset=6)),
            service_pb2.SubscribeResponse(offset=6, caught_up=service_pb2.CaughtUp(head_offset=6)),
        ]
    ]
    assert seen == [True, False, True, True, False, True, True]


def test_a_run_turn_that_times_out_stops_its_turn_and_get_usage_sums_by_source(client, tmp_path):
    session = client.create_session(profile="mock", cwd=str(tmp_path))
    # Held on a permission nobody answers: past the timeout the turn is stopped, not left running.
    try:
        client.run_turn(session.id, "@permission Deploy", timeout=1.0)
        raise AssertionError("the turn should have timed out")
    except HarnessError as error:
        assert error.reason == "DEADLINE_EXCEEDED"
    deadline = time.monotonic() + TIMEOUT
    while client.get_session(session.id).status != SessionStatus.IDLE:
        assert time.monotonic() < deadline, "the timed-out turn was not stopped"
        time.sleep(0.05)
    transcript = client.get_transcript(session.id)
    agent = [m for m in transcript.messages if m.role == types.MessageRole.AGENT]
    assert agent[0].stop_reason is StopReason.CANCELLED
    # Usage: the agent's reports, said so.
    client.run_turn(session.id, "count\n@usage 100 200000 0.25 USD", timeout=TIMEOUT)
    usage = client.get_usage()
    assert [p.profile for p in usage.profiles] == ["mock"]
    assert [s.source for s in usage.sources] == [usage_pb2.USAGE_SOURCE_AGENT]
