#!/usr/bin/env bash
# Two replicas on one PostgreSQL database. A session created through one is driven through the
# other: the write is forwarded to the replica that owns the session, the stream is served from
# the database. Any replica answers any call; put them behind one load balancer.
set -euo pipefail
DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/harness}"
PORT_A="${PORT_A:-50061}" PORT_B="${PORT_B:-50062}"
work="$(mktemp -d)"
agent-harness serve --database-url "$DATABASE_URL" --listen "127.0.0.1:$PORT_A" --data-dir "$work/a" 2>"$work/a.log" &
replica_a=$!
agent-harness serve --database-url "$DATABASE_URL" --listen "127.0.0.1:$PORT_B" --data-dir "$work/b" 2>"$work/b.log" &
replica_b=$!
trap 'kill "$replica_a" "$replica_b"; wait; rm -rf "$work"' EXIT

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
