"""An ACP client on the Python SDK (agent-client-protocol 0.12.1) driving `agent-harness acp`.

Usage: sdk_client.py AGENT_HARNESS_BIN CWD (the server from AGENT_HARNESS_SERVER).

It prints one line per thing it saw, for tests/it/acp_agent.rs to check:
  SESSION <id>          the session it made
  AGENT <text>          an agent message chunk
  REPLAYED <text>       an agent message chunk replayed by session/load
  ANSWERED <option>     it answered a permission request itself
  WAITING               it waits on a permission that someone else must answer
  WITHDRAWN             the agent withdrew the request it waited on ($/cancel_request)
  OK                    everything went as expected
"""

import asyncio
import asyncio.subprocess as aio_subprocess
import sys
from typing import Any

from acp import PROTOCOL_VERSION, Client, RequestError, connect_to_agent, text_block
from acp.schema import (
    AgentMessageChunk,
    AllowedOutcome,
    ClientCapabilities,
    Implementation,
    RequestPermissionResponse,
    TextContentBlock,
)


def say(line: str) -> None:
    print(line, flush=True)


class HarnessClient(Client):
    def __init__(self) -> None:
        self.prefix = "AGENT"
        # "answer": choose allow-once here; "wait": leave it to someone else.
        self.permissions = "answer"
        self.withdrawn = asyncio.Event()

    async def request_permission(self, session_id: str, tool_call: Any, options: list, **kwargs: Any):
        if self.permissions == "answer":
            say("ANSWERED allow-once")
            return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id="allow-once"))
        say("WAITING")
        await self.withdrawn.wait()
        say("WITHDRAWN")
        raise RequestError(-32800, "request cancelled")

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if isinstance(update, AgentMessageChunk) and isinstance(update.content, TextContentBlock):
            say(f"{self.prefix} {update.content.text}")

    def observe(self, event: Any) -> None:
        # The SDK has no handler for `$/cancel_request`; a stream observer sees it.
        message = getattr(event, "message", None) or {}
        if message.get("method") == "$/cancel_request":
            self.withdrawn.set()


async def start(program: str, client: HarnessClient):
    proc = await asyncio.create_subprocess_exec(
        program, "acp", "--profile", "mock", stdin=aio_subprocess.PIPE, stdout=aio_subprocess.PIPE
    )
    conn = connect_to_agent(client, proc.stdin, proc.stdout, observers=[client.observe])
    init = await conn.initialize(
        protocol_version=PROTOCOL_VERSION,
        client_capabilities=ClientCapabilities(),
        client_info=Implementation(name="sdk-client", title="SDK client", version="0.1.0"),
    )
    assert init.agent_info is not None and init.agent_info.name == "agent-harness", init
    return proc, conn


async def stop(proc, conn) -> None:
    await conn.close()
    proc.stdin.close()
    await proc.wait()


async def main(program: str, cwd: str) -> int:
    client = HarnessClient()
    proc, conn = await start(program, client)
    session = await conn.new_session(mcp_servers=[], cwd=cwd)
    say(f"SESSION {session.session_id}")

    done = await conn.prompt(session_id=session.session_id, prompt=[text_block("hello")])
    assert done.stop_reason == "end_turn", done

    done = await conn.prompt(session_id=session.session_id, prompt=[text_block("@permission")])
    assert done.stop_reason == "end_turn", done

    client.permissions = "wait"
    done = await conn.prompt(session_id=session.session_id, prompt=[text_block("@permission")])
    assert done.stop_reason == "end_turn", done
    assert client.withdrawn.is_set()
    await stop(proc, conn)

    # A new process loads the session: its history comes first, then it goes on.
    again = HarnessClient()
    again.prefix = "REPLAYED"
    proc, conn = await start(program, again)
    await conn.load_session(session_id=session.session_id, cwd=cwd, mcp_servers=[])
    again.prefix = "AGENT"
    done = await conn.prompt(session_id=session.session_id, prompt=[text_block("after load")])
    assert done.stop_reason == "end_turn", done
    await stop(proc, conn)
    say("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main(sys.argv[1], sys.argv[2])))
