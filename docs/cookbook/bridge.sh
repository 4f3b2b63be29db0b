#!/usr/bin/env bash
# An agent on another machine: the harness has a remote profile; a bridge next to the code
# starts the agent from its own profile and dials the harness. Here both run on one host.
set -euo pipefail
PORT="${PORT:-50051}"
work="$(mktemp -d)"

# The harness side: a profile whose runtimes run on a bridge labelled pool=sandbox.
cat >"$work/harness.toml" <<'TOML'
[profiles.sandboxed]
kind = "remote"
bridge_labels = { pool = "sandbox" }
bridge_profile = "mock"
TOML
agent-harness serve --listen "127.0.0.1:$PORT" --data-dir "$work/data" --config "$work/harness.toml" 2>"$work/serve.log" &
harness=$!

# The other machine: the bridge's own profiles and labels (with tokens configured, add
# --token-file naming a token of kind "runtime").
cat >"$work/bridge.toml" <<'TOML'
[labels]
pool = "sandbox"
[profiles.mock]
command = "agent-harness"
args = ["mock-agent", "--resume"]
TOML
agent-harness bridge --connect "http://127.0.0.1:$PORT" --config "$work/bridge.toml" 2>"$work/bridge.log" &
bridge=$!
trap 'kill "$bridge" "$harness"; wait; rm -rf "$work"' EXIT

# A client does not know or care where the agent runs.
# The agent works in a directory of its own: never one holding the bridge's config or token.
mkdir "$work/code"
"${PYTHON:-python3}" - "$PORT" "$work/code" <<'PY'
import sys
from agent_harness_client import Client

with Client(f"http://127.0.0.1:{sys.argv[1]}") as client:
    client.wait_ready()
    session = client.create_session(profile="sandboxed", cwd=sys.argv[2])  # waits for the bridge
    result = client.run_turn(session.id, "hello from afar")
    started = next(e.frame for e in client.read_log(session.id) if '"runtime_started"' in e.json)
    print(f"{result.stop_reason.name}: {result.text}")
    print("runtime on bridge:", "bridge" in str(started))
PY
