#!/usr/bin/env bash
# README's two jq filters for `buf curl` output ("Reading buf curl output"), run on real output of
# a real server: the ErrorInfo strings of an error, and every `…Json` string field parsed.
# Needs AGENT_HARNESS_BIN, buf at .tools/npm/node_modules/.bin/buf, and jq (python3 -m json.tool
# cannot run jq filters, so without jq this says so and exits 0).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUF="$ROOT/.tools/npm/node_modules/.bin/buf"
if ! command -v jq >/dev/null; then
    echo "    jq is not installed: README's jq lines not checked (apt-get install jq)"
    exit 0
fi
error_filter='.details[] | select(.type == "google.rpc.ErrorInfo") | .value | @base64d | [splits("[\u0000-\u001f]+")] | map(select(. != "")) | join(" ")'
json_filter='walk(if type == "object" then with_entries(if (.key | endswith("Json")) and (.value | type) == "string" then .value |= fromjson else . end) else . end)'
for filter in "$error_filter" "$json_filter"; do
    grep -qF -- "jq -r '$filter'" "$ROOT/README.md" || grep -qF -- "jq '$filter'" "$ROOT/README.md" ||
        { echo "README.md no longer shows the jq filter: $filter" >&2; exit 1; }
done

work="$(mktemp -d)"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$AGENT_HARNESS_BIN" serve --listen "127.0.0.1:$port" --data-dir "$work/data" 2>"$work/serve.log" &
server=$!
trap 'kill "$server" 2>/dev/null; wait; rm -rf "$work"' EXIT
api="http://127.0.0.1:$port/agent_harness.v1.AgentSessionService"
call() { "$BUF" curl --protocol grpc --http2-prior-knowledge -d "$2" "$api/$1"; }
for _ in $(seq 100); do call ListSessions '{}' >/dev/null 2>&1 && break; sleep 0.1; done

# (buf curl exits 40 on the error, which pipefail would take for the pipeline's status.)
reason="$({ call GetSession '{"sessionId": "0190e0e0-0000-7000-8000-000000000000"}' 2>&1 >/dev/null || true; } |
    jq -r "$error_filter")"
[[ "$reason" == "SESSION_NOT_FOUND agent-harness" ]] || { echo "error filter gave: $reason" >&2; exit 1; }

session="$(call CreateSession "{\"profile\": \"mock\", \"cwd\": \"$work\"}" | jq -r .session.id)"
call Control "{\"sessionId\": \"$session\", \"prompt\": {\"prompt\": \"hi\\n@tool t1\\n@plan Read | Fix\"}}" >/dev/null
# Wait for the turn's end on the stream (the transcript is complete after it).
# (grep leaves at the first match; the stream then ends with the server.)
grep -m1 -q '"turnEnded"' < <(timeout 20 "$BUF" curl --protocol grpc --http2-prior-knowledge \
    -d "{\"sessionId\": \"$session\", \"view\": \"SUBSCRIBE_VIEW_LOG\"}" "$api/Subscribe")
parsed="$(call GetTranscript "{\"sessionId\": \"$session\"}" | jq "$json_filter")"
jq -e '.metadata.planJson[0].content == "Read" and
       ([.messages[].parts[]? | select(.tool) | .tool.contentJson[0].content.text] == ["done"])' \
    <<<"$parsed" >/dev/null || { echo "the Json filter did not parse the fields: $parsed" >&2; exit 1; }
echo "    README's jq lines: the ErrorInfo of an error read ($reason); planJson and contentJson parsed"
