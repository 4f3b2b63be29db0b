"""A bot that answers permission requests by rule: tool calls that only read are allowed once,
everything else is rejected. A request someone answered first (console, CLI) is skipped.

    python permission_bot.py SESSION_ID [ANSWERS]
"""

import sys

from agent_harness_client import Client, HarnessError, Permission

ALLOWED_KINDS = {"read", "search", "fetch"}


def decide(permission: Permission) -> str:
    """The option to pick: the first `allow_*` for an allowed kind, else the first `reject_*`."""
    tool_call = permission.tool_call or {}
    wanted = "allow" if tool_call.get("kind") in ALLOWED_KINDS else "reject"
    return next(o.option_id for o in permission.options if o.kind.startswith(wanted))


def main(session_id: str, answers: int = 0) -> None:
    answered = set()
    with Client.from_env() as client:
        for event in client.subscribe(session_id, "messages", after_offset=0):
            for permission in event.message.pending_permissions if event.message else []:
                if permission.request_id in answered:
                    continue
                answered.add(permission.request_id)
                option = decide(permission)
                try:
                    client.respond_to_permission(session_id, permission.request_id, option)
                except HarnessError as error:
                    if error.reason != "PERMISSION_NOT_PENDING":  # answered elsewhere first: fine
                        raise
                print(f"{option}: {(permission.tool_call or {}).get('title')}", flush=True)
                if answers and len(answered) >= answers:
                    return


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
