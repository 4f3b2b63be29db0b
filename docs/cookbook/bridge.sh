#!/usr/bin/env bash
# An agent on another machine: the harness has a remote profile; a bridge next to the code
# starts the agent from its own profile and dials the harness. Here both run on one host.
set -euo pipefail
PORT="${PORT:-50071}"
# agent-harness: $AGENT_HARNESS, else the one on PATH, else this checkout's release build.
harness="${AGENT_HARNESS:-$(command -v agent-harness || echo "$(cd "$(dirname "$0")/../.." && pwd)/target/release/agent-harness")}"
[[ -x "$harness" ]] || { echo "no agent-harness at $harness: cargo build --release, or set AGENT_HARNESS" >&2; exit 1; }
work="$(mktemp -d)"
pids=()
finish() {
    local status=$?
    kill "${pids[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    if [[ $status -eq 0 ]]; then rm -rf "$work"; else echo "failed; the logs are in $work" >&2; fi
}
trap finish EXIT

# The harness side: a profile whose runtimes run on a bridge labelled pool=sandbox.
cat >"$work/harness.toml" <<'TOML'
[profiles.sandboxed]
kind = "remote"
bridge_labels = { pool = "sandbox" }
bridge_profile = "mock"
TOML
"$harness" serve --listen "127.0.0.1:$PORT" --data-dir "$work/data" --config "$work/harness.toml" 2>"$work/serve.log" &
pids+=($!)
# Serving, or why not (a port taken by another server, say): never a bridge talking to another.
for _ in $(seq 300); do
    grep -q "serving gRPC" "$work/serve.log" && break
    kill -0 "${pids[0]}" 2>/dev/null || { echo "agent-harness serve did not start:" >&2; tail -n 5 "$work/serve.log" >&2; exit 1; }
    sleep 0.1
done

# The other machine: the bridge's own profiles and labels (with tokens configured, add
# --token-file naming a token of kind "runtime").
cat >"$work/bridge.toml" <<'TOML'
[labels]
pool = "sandbox"
[profiles.mock]
args = ["mock-agent", "--resume"]
TOML
echo "command = \"$harness\"" >>"$work/bridge.toml"
"$harness" bridge --connect "http://127.0.0.1:$PORT" --config "$work/bridge.toml" 2>"$work/bridge.log" &
pids+=($!)

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
