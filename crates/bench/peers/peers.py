"""The peer comparison of agent-harness-bench with a Python client (`--only peers`,
docs/benchmarks.md): one Python process drives the same ACP agent (the Python SDK's example
agent) through

  direct         the agent's stdio, JSON-RPC lines
  harness-log    agent-harness: Control, then the response entry on a LOG-view Subscribe
  harness-msgs   agent-harness: Control, then TurnEnded on a MESSAGES-view Subscribe
  sandbox-agent  Rivet sandbox-agent: POST /v1/acp/{id} (answered with the response), SSE open

and times each turn from sending the prompt to seeing its end, exactly as peers.mjs does with
Node (same warm-up, same turn counts, same interleaved blocks). acpx exists only as a Node
library, so it is not driven from here.

Written as a user who cares about latency would write it: the synchronous grpcio API over one
channel (the package's `Client`), the Subscribe stream opened before the prompt and read as an
iterator; http.client with one keep-alive connection for the POSTs and one for the SSE stream,
which a thread reads (and drops) throughout, as the Node client's event loop does.

Inputs (environment): as peers.mjs (PEERS_AGENT, PEERS_HARNESS, PEERS_CWD, PEERS_SCRATCH,
PEERS_SANDBOX_AGENT, PEERS_SANDBOX_PORT, PEERS_SANDBOX_VERSION, PEERS_TURNS, PEERS_WARMUP,
PEERS_BLOCKS, PEERS_SYSTEMS). Prints one JSON object on stdout: per system, the sorted samples in
microseconds, and the versions it ran. A system that fails is reported under "errors"; the bench
bounds the whole run with its own timeout.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
import traceback
from importlib import metadata
from typing import Callable, Dict, List, Tuple

import grpc

from agent_harness_client import Client
from agent_harness_client.v1 import agent_session_service_pb2 as service_pb2
from agent_harness_client.v1 import transcript_pb2

env = os.environ
AGENT: List[str] = json.loads(env["PEERS_AGENT"])
CWD = env["PEERS_CWD"]
SCRATCH = env["PEERS_SCRATCH"]
TURNS = int(env.get("PEERS_TURNS", "1000"))
WARMUP = int(env.get("PEERS_WARMUP", "50"))
BLOCKS = int(env.get("PEERS_BLOCKS", "4"))
WANTED = env.get("PEERS_SYSTEMS", "direct,harness-log,harness-msgs,sandbox-agent").split(",")
TEXT = "ping"
TIMEOUT_S = 60.0

Turn = Callable[[], int]
Close = Callable[[], None]


def micros(start: int) -> int:
    return (time.perf_counter_ns() - start) // 1000


# ---------------------------------------------------------------------------------------------
# direct: JSON-RPC lines over the agent's stdio.


def direct() -> Tuple[Turn, Close]:
    child = subprocess.Popen(
        AGENT, cwd=CWD, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert child.stdin is not None and child.stdout is not None
    stdin, stdout = child.stdin, child.stdout
    next_id = 0

    def call(method: str, params: dict) -> dict:
        nonlocal next_id
        call_id = next_id
        next_id += 1
        stdin.write((json.dumps({"jsonrpc": "2.0", "id": call_id, "method": method, "params": params}) + "\n").encode())
        stdin.flush()
        for line in stdout:
            frame = json.loads(line)
            # Notifications (session/update) are read and dropped, as the Node client does.
            if "method" not in frame and frame.get("id") == call_id:
                return frame
        raise RuntimeError(f"direct {method}: the agent closed its stdout")

    call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    session_id = call("session/new", {"cwd": CWD, "mcpServers": []})["result"]["sessionId"]
    prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": TEXT}]}

    def turn() -> int:
        start = time.perf_counter_ns()
        answer = call("session/prompt", prompt)
        if "result" not in answer:
            raise RuntimeError(f"direct: {answer}")
        return micros(start)

    def close() -> None:
        child.kill()
        child.wait()

    return turn, close


# ---------------------------------------------------------------------------------------------
# agent-harness through its Python package (grpcio, synchronous API, one channel).


def harness(view: str) -> Tuple[Turn, Close]:
    client = Client(f"http://{env['PEERS_HARNESS']}", timeout=TIMEOUT_S)
    client.wait_ready(TIMEOUT_S)
    session = client.create_session(profile="echo", cwd=CWD)
    stream = client.sessions.Subscribe(
        service_pb2.SubscribeRequest(
            session_id=session.id,
            after_offset=session.head_offset,
            view=service_pb2.SUBSCRIBE_VIEW_LOG if view == "log" else service_pb2.SUBSCRIBE_VIEW_MESSAGES,
        )
    )
    for event in stream:
        if event.WhichOneof("event") == "caught_up":
            break
    from_runtime = transcript_pb2.LOG_DIRECTION_FROM_RUNTIME

    def answered(event: service_pb2.SubscribeResponse, action_id: str) -> bool:
        if event.WhichOneof("event") != "entry":
            return False
        entry = event.entry
        if entry.direction != from_runtime or entry.action_id != action_id:
            return False
        frame = json.loads(entry.json)
        return "method" not in frame and frame.get("id") == action_id

    def ended(event: service_pb2.SubscribeResponse, action_id: str) -> bool:
        return event.WhichOneof("event") == "turn_ended" and event.turn_ended.request_id == action_id

    matches = answered if view == "log" else ended

    def turn() -> int:
        start = time.perf_counter_ns()
        action_id = client.prompt(session.id, TEXT).action_id
        for event in stream:
            if matches(event, action_id):
                return micros(start)
        raise RuntimeError("the harness stream ended")

    def close() -> None:
        stream.cancel()
        client.close()

    return turn, close


# ---------------------------------------------------------------------------------------------
# Rivet sandbox-agent: its `pi` slot runs a two-line script that execs the same agent.


def sandbox_agent() -> Tuple[Turn, Close]:
    data = os.path.join(SCRATCH, "sandbox", "data")
    slot = os.path.join(data, "sandbox-agent", "bin", "agent_processes")
    os.makedirs(slot, exist_ok=True)
    script = os.path.join(slot, "pi-acp")
    with open(script, "w") as f:
        f.write(f"#!/bin/sh\nexec {shlex.join(AGENT)} \"$@\"\n")
    os.chmod(script, 0o755)
    port = int(env["PEERS_SANDBOX_PORT"])
    server = subprocess.Popen(
        [env["PEERS_SANDBOX_AGENT"], "server", "--no-token", "--no-telemetry", "-H", "127.0.0.1", "-p", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={
            "PATH": env["PATH"],
            "SANDBOX_AGENT_REQUIRE_PREINSTALL": "1",
            "XDG_DATA_HOME": data,
            "HOME": os.path.join(SCRATCH, "sandbox"),
        },
    )
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            probe = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
            probe.request("GET", "/v1/health")
            probe.getresponse().read()
            probe.close()
            break
        except OSError:
            if time.monotonic() > deadline:
                server.kill()
                raise RuntimeError("sandbox-agent did not listen")
            time.sleep(0.05)

    # One keep-alive connection for every POST (TCP_NODELAY is http.client's default).
    posts = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    path = "/v1/acp/bench?agent=pi"
    headers = {"content-type": "application/json"}
    next_id = 0

    def call(method: str, params: dict) -> dict:
        nonlocal next_id
        body = json.dumps({"jsonrpc": "2.0", "id": next_id, "method": method, "params": params}).encode()
        next_id += 1
        posts.request("POST", path, body, headers)
        answer = json.loads(posts.getresponse().read())
        if "result" not in answer:
            raise RuntimeError(f"sandbox-agent {method}: {answer}")
        return answer["result"]

    call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    session_id = call("session/new", {"cwd": CWD, "mcpServers": []})["sessionId"]
    # The SSE stream carries the agent's notifications; a thread reads (and drops) it throughout.
    events = http.client.HTTPConnection("127.0.0.1", port, timeout=None)
    events.request("GET", "/v1/acp/bench", headers={"accept": "text/event-stream"})
    sse = events.getresponse()
    if sse.status != 200:
        raise RuntimeError(f"sandbox-agent SSE: {sse.status}")

    def drain() -> None:
        try:
            while sse.read1(65536):
                pass
        except (OSError, ValueError, http.client.HTTPException):
            pass  # closed at the end

    drainer = threading.Thread(target=drain, name="sse-drain", daemon=True)
    drainer.start()
    prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": TEXT}]}

    def turn() -> int:
        start = time.perf_counter_ns()
        call("session/prompt", prompt)
        return micros(start)

    def close() -> None:
        server.kill()
        server.wait()
        drainer.join(5)
        posts.close()
        events.close()

    return turn, close


# ---------------------------------------------------------------------------------------------

SYSTEMS: Dict[str, Callable[[], Tuple[Turn, Close]]] = {
    "direct": direct,
    "harness-log": lambda: harness("log"),
    "harness-msgs": lambda: harness("messages"),
    "sandbox-agent": sandbox_agent,
}


def version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def failure() -> str:
    return traceback.format_exc()


def main() -> None:
    drivers: Dict[str, Tuple[Turn, Close]] = {}
    samples: Dict[str, List[int]] = {}
    errors: Dict[str, str] = {}
    for name in WANTED:
        try:
            drivers[name] = SYSTEMS[name]()
            samples[name] = []
        except Exception:
            errors[name] = failure()
    live = list(drivers)
    for name in live:
        turn = drivers[name][0]
        for _ in range(WARMUP):
            try:
                turn()
            except Exception:
                errors[name] = failure()
                break
    per_block = max(1, math.ceil(TURNS / BLOCKS))
    for _ in range(BLOCKS):
        for name in live:
            if name in errors:
                continue
            turn = drivers[name][0]
            for _ in range(per_block):
                try:
                    samples[name].append(turn())
                except Exception:
                    errors[name] = failure()
                    break
    for name in live:
        try:
            drivers[name][1]()
        except Exception:
            pass  # closing is best effort
    for values in samples.values():
        values.sort()
    report = {
        "python": platform.python_version(),
        "versions": {
            "agent-harness-client": version("agent-harness-client"),
            "grpcio": grpc.__version__,
            "@sandbox-agent/cli-linux-x64": env.get("PEERS_SANDBOX_VERSION", "unknown"),
        },
        "samples": samples,
        "errors": errors,
    }
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
