"""Runs one turn with the asyncio client and prints the agent's final text and stop reason.

    AGENT_HARNESS_SERVER=http://127.0.0.1:50051 python run_turn_async.py "Say hello"
"""

import asyncio
import os
import sys

from agent_harness_client import HarnessError
from agent_harness_client.aio import AsyncClient


async def main(prompt: str) -> int:
    async with AsyncClient.from_env() as client:
        session = await client.create_session(profile=os.environ.get("PROFILE", "mock"), cwd=os.getcwd())
        result = await client.run_turn(session.id, prompt)
        print(result.text)
        print(f"stop reason: {result.stop_reason.name}")
        return 0 if result.ok else 1


try:
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "hello")))
except HarnessError as error:  # one line, e.g. "UNAVAILABLE: ..." or "INVALID_SERVER_URL: ..."
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)
