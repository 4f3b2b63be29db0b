#!/usr/bin/env bash
# Two replicas on one PostgreSQL database. A session created through one is driven through the
# other: the write is forwarded to the replica that owns the session, the stream is served from
# the database. Any replica answers any call; put them behind one load balancer.
# The database must exist: `createdb -h 127.0.0.1 -U postgres harness` (or set DATABASE_URL).
set -euo pipefail
DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/harness}"
PORT_A="${PORT_A:-50061}" PORT_B="${PORT_B:-50062}"
# agent-harness: $AGENT_HARNESS, else the one on PATH, else this checkout's release build.
harness="${AGENT_HARNESS:-$(command -v agent-harness || echo "$(cd "$(dirname "$0")/../.." && pwd)/target/release/agent-harness")}"
[[ -x "$harness" ]] || { echo "no agent-harness at $harness: cargo build --release, or set AGENT_HARNESS" >&2; exit 1; }
work="$(mktemp -d)"
pids=()
finish() {
    local status=$?
    kill "${pids[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    if [[ $status -eq 0 ]]; then rm -rf "$work"; else echo "failed; the servers' logs are in $work" >&2; fi
}
trap finish EXIT
# Starts `agent-harness serve ARGS…` logging to LOG, and waits until it serves (or says why not).
serve() {
    local log="$1"; shift
    "$harness" serve "$@" 2>"$log" &
    pids+=($!)
    for _ in $(seq 300); do
        grep -q "serving gRPC" "$log" && return 0
        kill -0 "${pids[-1]}" 2>/dev/null || break
        sleep 0.1
    done
    echo "agent-harness serve did not start; the end of $log:" >&2
    tail -n 5 "$log" >&2
    exit 1
}
serve "$work/a.log" --database-url "$DATABASE_URL" --listen "127.0.0.1:$PORT_A" --data-dir "$work/a"
serve "$work/b.log" --database-url "$DATABASE_URL" --listen "127.0.0.1:$PORT_B" --data-dir "$work/b"

"${PYTHON:-python3}" - "$PORT_A" "$PORT_B" <<'PY'
import os, sys
from agent_harness_client import Client

a, b = (Client(f"http://127.0.0.1:{port}") for port in sys.argv[1:3])
a.wait_ready()
b.wait_ready()
session = a.create_session(profile="mock", cwd=os.getcwd())
result = b.run_turn(session.id, "hello from the other replica")
print(f"{result.stop_reason.name}: {result.text}")
print("replica B sees", [s.id for s in b.list_sessions()].count(session.id), "session", session.id)
PY
