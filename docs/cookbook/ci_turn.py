"""A CI step: run one turn, print the agent's answer, and fail the job unless the turn ended
normally. Server and token come from AGENT_HARNESS_SERVER and AGENT_HARNESS_TOKEN."""

import os
import sys

from agent_harness_client import Client, HarnessError


def main(prompt: str) -> int:
    try:
        with Client.from_env() as client:
            session = client.create_session(
                profile=os.environ.get("AGENT_PROFILE", "mock"),
                cwd=os.environ.get("AGENT_CWD", os.getcwd()),  # a path on the harness's machine
                labels={"ci-run": os.environ.get("GITHUB_RUN_ID", "local")},
            )
            result = client.run_turn(session.id, prompt, timeout=float(os.environ.get("TURN_TIMEOUT", "1800")))
            client.close_session(session.id)
    except HarnessError as error:  # unreachable server, bad token, unknown profile, timeout, ...
        print(f"::error::agent-harness: {error}", file=sys.stderr)
        return 2
    print(result.text)
    if not result.ok:
        print(f"::error::the turn ended {result.stop_reason.name}: {result.error or ''}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
