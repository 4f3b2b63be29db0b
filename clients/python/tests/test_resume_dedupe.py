"""Resuming is at-least-once for message snapshots; both packages drop a re-sent identical one.
The server is killed (kill -9) in the middle of a turn while a Python and a TypeScript caller
subscribe to MESSAGES, and restarted on the same data dir and port."""

import base64
import json
import os
import pathlib
import queue
import subprocess
import threading

import grpc
import pytest

from agent_harness_client import Client, MessageRole, StopReason, transcript_pb2

from conftest import TIMEOUT
from test_client import Events


class NodeSubscriber:
    """clients/typescript/test/subscribe-messages.mjs, run where the package is installed."""

    def __init__(self, base_url, session_id):
        folder = os.environ.get("AGENT_HARNESS_TS_DIR")
        if not folder:
            pytest.fail("AGENT_HARNESS_TS_DIR must name a folder where @agent-harness/client is installed (scripts/test sets it)")
        script = pathlib.Path(folder) / "test" / "subscribe-messages.mjs"
        self.process = subprocess.Popen(
            ["node", str(script), base_url, session_id], cwd=folder,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.lines: "queue.Queue" = queue.Queue()
        self.seen = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def until(self, predicate):
        while True:
            try:
                event = self.lines.get(timeout=TIMEOUT)
            except queue.Empty:
                pytest.fail(f"the TypeScript subscriber saw nothing matching in {TIMEOUT} s; last: {self.seen[-3:]}")
            if event is None:
                pytest.fail(f"the TypeScript subscriber ended: {self.process.stderr.read()}")
            self.seen.append(event)
            if predicate(event):
                return event

    def snapshots(self):
        return [
            (e["id"], transcript_pb2.TranscriptMessage.FromString(base64.b64decode(e["pb"])))
            for e in self.seen if e["kind"] == "message"
        ]

    def stop(self):
        self.process.kill()
        self.process.wait()


def no_identical_repeat(snapshots):
    """Per message id, each snapshot differs from the one before it."""
    last = {}
    for message_id, snapshot in snapshots:
        assert last.get(message_id) != snapshot, f"{message_id} was delivered twice unchanged"
        last[message_id] = snapshot
    return last


def test_after_a_kill_mid_turn_each_caller_sees_every_snapshot_change_once(server, tmp_path):
    client = Client(f"http://{server.target}", timeout=TIMEOUT)
    session = client.create_session(profile="mock-resume", cwd=str(tmp_path))
    client.run_turn(session.id, "before the kill\n@chunks 3 8", timeout=TIMEOUT)

    python = Events(client, session.id, "messages")
    node = NodeSubscriber(f"http://{server.target}", session.id)
    sent = client.prompt(session.id, "during the kill\n@chunks 2 8\n@sleep 30000")

    def streaming(text_of):
        return lambda e: text_of(e).startswith("echo: during the kill") and len(text_of(e)) > len("echo: during the kill\n@chunks 2 8\n@sleep 30000")

    python.until(lambda e: e.message is not None and e.message.role is MessageRole.AGENT
                 and streaming(lambda x: x.message.text)(e))
    node.until(lambda e: e["kind"] == "message" and e["id"].endswith(":agent") and streaming(lambda x: x["text"])(e))

    server.kill()
    server.start()

    # The turn the kill cut short is closed (FAILED) after the restart; both callers see that.
    ended = python.turn_ended(sent.action_id).turn_ended
    assert ended.stop_reason is StopReason.FAILED
    node.until(lambda e: e["kind"] == "turnEnded" and e["requestId"] == sent.action_id)
    node.stop()

    final = {m.id: m.pb for m in client.get_transcript(session.id).messages}
    python_snapshots = [(e.message.id, e.message.pb) for e in python.seen if e.message is not None]
    for seen in (python_snapshots, node.snapshots()):
        last = no_identical_repeat(seen)
        assert last == final, "each caller ends with the transcript's final snapshots"
    client.close()


class Dropped(grpc.RpcError):
    """What a stream raises when its connection drops."""

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "the connection dropped (injected by the test)"


class DropAfterFirstSnapshot:
    """The first Subscribe stream loses its connection right after its first message snapshot;
    every later stream is the server's, recorded raw (before the package's dedupe)."""

    def __init__(self, real):
        self.real = real
        self.streams = 0
        self.raw_after_drop = []

    def __call__(self, request, **options):
        call = self.real(request, **options)
        self.streams += 1
        return self._first(call) if self.streams == 1 else self._recorded(call)

    class _Stream:
        def __init__(self, call, events):
            self.call, self.events = call, events

        def __iter__(self):
            return self.events

        def cancel(self):
            self.call.cancel()

    def _first(self, call):
        def events():
            for event in call:
                yield event
                if event.WhichOneof("event") == "message":
                    raise Dropped()
        return self._Stream(call, events())

    def _recorded(self, call):
        def events():
            for event in call:
                self.raw_after_drop.append(event)
                yield event
        return self._Stream(call, events())


def test_a_snapshot_the_server_sends_again_after_a_resume_reaches_the_caller_once(server, tmp_path):
    client = Client(f"http://{server.target}", timeout=TIMEOUT)
    session = client.create_session(profile="mock", cwd=str(tmp_path))
    client.run_turn(session.id, "a turn to catch up on\n@chunks 3 8", timeout=TIMEOUT)
    client.sessions.Subscribe = DropAfterFirstSnapshot(client.sessions.Subscribe)

    seen = []
    for event in client.subscribe(session.id, "messages"):
        seen.append(event)
        if event.kind == "caught_up":
            break

    # A snapshot sent during catch-up carries the resume cursor, so resuming from it makes the
    # server send that snapshot again (at-least-once); the package drops the identical copy.
    first = seen[0].message
    resent = [e.message for e in client.sessions.Subscribe.raw_after_drop if e.WhichOneof("event") == "message"]
    assert client.sessions.Subscribe.streams == 2
    assert resent[0].id == first.id and resent[0] == first.pb, "the server did send the snapshot again"
    snapshots = [(e.message.id, e.message.pb) for e in seen if e.message is not None]
    last = no_identical_repeat(snapshots)
    assert last == {m.id: m.pb for m in client.get_transcript(session.id).messages}
    client.close()
