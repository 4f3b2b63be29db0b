"""Streams a session into a chat channel: each agent reply is posted to an incoming webhook
(Slack, Mattermost, Teams and most others take `{"text": ...}`) when its turn ends, and each
permission request as soon as the agent asks.

    python chat_stream.py SESSION_ID https://hooks.example/T000/B000 [TURNS]
"""

import json
import sys
import urllib.request

from agent_harness_client import Client, MessageRole


def post(webhook: str, text: str) -> None:
    body = json.dumps({"text": text}).encode()
    request = urllib.request.Request(webhook, data=body, headers={"content-type": "application/json"})
    urllib.request.urlopen(request, timeout=10).close()


def main(session_id: str, webhook: str, turns: int = 0) -> None:
    with Client.from_env() as client:
        replies = {}  # request id -> the agent's latest message snapshot
        asked = set()  # permission requests already posted
        ended = 0
        # From now on; `subscribe` resumes by itself and drops re-sent snapshots, so a restart
        # of the server posts nothing twice.
        start = client.get_session(session_id).head_offset
        print(f"streaming session {session_id} from offset {start}", flush=True)
        for event in client.subscribe(session_id, "messages", after_offset=start):
            if event.message is not None and event.message.role is MessageRole.AGENT:
                replies[event.message.request_id] = event.message
                for permission in event.message.pending_permissions:
                    if permission.request_id not in asked:
                        asked.add(permission.request_id)
                        title = (permission.tool_call or {}).get("title", "a tool call")
                        post(webhook, f"The agent asks permission: {title}")
            elif event.turn_ended is not None:
                reply = replies.pop(event.turn_ended.request_id, None)
                status = event.turn_ended.stop_reason.name
                post(webhook, f"{reply.text if reply else ''}\n_{status}_")
                ended += 1
                if turns and ended >= turns:
                    return


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
