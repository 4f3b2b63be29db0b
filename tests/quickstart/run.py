#!/usr/bin/env python3
"""Runs docs/quickstart.md as a reader would: its ```sh blocks in order, in one fresh bash
(`env -i`, nothing of the caller's environment but what is listed below), on a terminal (a
pty), answering the agent's permission question with `1` when `--follow` asks it, as the page
tells the reader to.

    run.py REPO MODEL_FAKES NPM_CACHE

What differs from a reader's machine, and nothing else:
- ANTHROPIC_BASE_URL names a fake Anthropic API (the `model-fakes` binary, started here), so
  the agent's model calls never leave the machine; the page's placeholder key is sent to it.
- After the block that writes harness.toml, npm is pointed at NPM_CACHE, offline (the agents
  stage filled it with the preset's package: there is no registry inside its network namespace).
- CARGO_NET_OFFLINE=true, for the same reason (the build is already fresh).

Checks, besides every block succeeding: both turns ended `end_turn`, the agent asked before
writing and the file holds what the fake model wrote, and the console page was served. Exits 1
saying which failed; the shell's whole output is printed as it runs.
"""

import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time

WORK = "/tmp/harness-quickstart"
TIMEOUT_S = 900
QUESTION = re.compile(rb"choose for permission [^:]*: ")


def blocks(page: str) -> list[str]:
    """The page's ```sh blocks, in order."""
    return re.findall(r"^```sh\n(.*?)^```", page, flags=re.S | re.M)


def npm_offline(cache: str) -> str:
    """Shell lines appending the offline npm cache to the reader's harness.toml."""
    return f"""cat >> harness.toml <<'CI_EOF'

# Added by tests/quickstart/run.py: npx reads the stage's npm cache, offline.
[sandbox]
npm_cache = "{cache}"

[profiles.claude.env]
npm_config_cache = "{cache}"
npm_config_offline = "true"
npm_config_update_notifier = "false"
CI_EOF
"""


def script(page: str, cache: str) -> str:
    parts = ["set -euo pipefail\n"]
    wrote_config = False
    for block in blocks(page):
        parts.append(block)
        if "> harness.toml" in block:
            parts.append(npm_offline(cache))
            wrote_config = True
    if not wrote_config:
        sys.exit("docs/quickstart.md no longer writes harness.toml: update tests/quickstart/run.py")
    return "".join(parts)


def start_fake(binary: str) -> tuple[subprocess.Popen, str]:
    fake = subprocess.Popen(
        [binary, "--api", "anthropic", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert fake.stdout is not None
    base_url = fake.stdout.readline().strip()
    if not base_url.startswith("http://"):
        fake.kill()
        sys.exit(f"model-fakes printed {base_url!r}, not its base URL")
    return fake, base_url


def run_on_a_terminal(argv: list[str], env: dict[str, str], cwd: str) -> tuple[int, bytes]:
    """Runs argv on a pty; answers each permission question with `1`. Its exit code and output."""
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(cwd)
        os.execve(argv[0], argv, env)
    output = bytearray()
    answered = 0
    status = None
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while True:
            if status is None:
                done, waited = os.waitpid(pid, os.WNOHANG)
                if done:
                    status = waited
            if time.monotonic() > deadline:
                sys.stdout.write(f"\n[run.py] the quickstart took over {TIMEOUT_S} s\n")
                break
            # Once bash is gone, only what is already written is read: a process it left
            # behind may hold the terminal open.
            ready, _, _ = select.select([fd], [], [], 0.2 if status is not None else 1.0)
            if not ready:
                if status is not None:
                    break
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            output.extend(chunk)
            sys.stdout.write(chunk.decode("utf-8", "replace"))
            sys.stdout.flush()
            if len(QUESTION.findall(bytes(output))) > answered:
                answered += 1
                os.write(fd, b"1\r")
    finally:
        # Whatever the script left running (the server, its agents) goes with it.
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if status is None:
            _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), bytes(output)


def main() -> int:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    repo, fakes, cache = sys.argv[1:]
    page = open(os.path.join(repo, "docs", "quickstart.md"), encoding="utf-8").read()
    text = script(page, cache)
    shutil.rmtree(WORK, ignore_errors=True)
    fake, base_url = start_fake(fakes)
    script_path = os.path.join(repo, "target", "quickstart.sh")
    os.makedirs(os.path.dirname(script_path), exist_ok=True)
    with open(script_path, "w", encoding="utf-8") as f:
        f.write(text)
    env = {
        "HOME": os.environ["HOME"],
        "PATH": os.environ["PATH"],
        "TERM": "xterm-256color",
        "LANG": "C.UTF-8",
        "ANTHROPIC_BASE_URL": base_url,
        "CARGO_NET_OFFLINE": "true",
    }
    # Where the caller's Rust lives, when not under HOME.
    for key in ("CARGO_HOME", "RUSTUP_HOME", "RUSTUP_TOOLCHAIN"):
        if key in os.environ:
            env[key] = os.environ[key]
    try:
        code, output = run_on_a_terminal(
            ["/bin/bash", "--noprofile", "--norc", script_path], env, repo
        )
    finally:
        fake.terminate()
        fake.wait()
    shown = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", output).decode("utf-8", "replace")
    failures = []
    if code != 0:
        failures.append(f"the script exited {code}")
    for turn in (1, 2):
        if f"turn {turn} ended: end_turn" not in shown:
            failures.append(f"turn {turn} did not end with end_turn")
    if not QUESTION.search(output):
        failures.append("the agent never asked before writing hello.txt")
    if "<title>" not in shown:
        failures.append("the console page was not served")
    written = os.path.join(WORK, "project", "hello.txt")
    if not os.path.isfile(written):
        failures.append(f"{written} was not written")
    for failure in failures:
        print(f"[run.py] FAILED: {failure}", file=sys.stderr)
    if failures:
        log = os.path.join(WORK, "harness.log")
        if os.path.isfile(log):
            print(f"[run.py] the server's log ({log}), last lines:", file=sys.stderr)
            with open(log, encoding="utf-8", errors="replace") as f:
                sys.stderr.writelines(f.readlines()[-40:])
        return 1
    print("[run.py] docs/quickstart.md ran as written: two turns, one permission answered, the console served")
    return 0


if __name__ == "__main__":
    sys.exit(main())
