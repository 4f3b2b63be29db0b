"""Runs one turn with the synchronous client and prints the agent's final text and stop reason.

    AGENT_HARNESS_SERVER=http://127.0.0.1:50051 python run_turn_sync.py "Say hello"
"""

import os
import sys

from agent_harness_client import Client, HarnessError


def main(prompt: str) -> int:
    with Client.from_env() as client:
        session = client.create_session(profile=os.environ.get("PROFILE", "mock"), cwd=os.getcwd())
        result = client.run_turn(session.id, prompt)
        print(result.text)
        print(f"stop reason: {result.stop_reason.name}")
        return 0 if result.ok else 1


try:
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "hello"))
except HarnessError as error:  # one line, e.g. "UNAVAILABLE: ..." or "INVALID_SERVER_URL: ..."
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)
