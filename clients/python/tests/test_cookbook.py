"""docs/cookbook.md: each recipe's file runs against a real server, and the page shows each file
verbatim (the doc and the tested code cannot drift apart)."""

import http.server
import json
import os
import pathlib
import queue
import re
import socket
import subprocess
import threading
import time
import uuid

import pytest

from agent_harness_client import Client, InteractionOutcome, StopReason, types

from conftest import TIMEOUT, free_port
from test_ergonomics import EXAMPLES_PYTHON

ROOT = pathlib.Path(__file__).resolve().parents[3]
COOKBOOK = ROOT / "docs" / "cookbook"
BLOCK = re.compile(r"<!-- the file (\S+), verbatim -->\n```[a-z]*\n(.*?)```", re.S)


def recipe_env(server_url=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_HARNESS_")}
    binary = os.environ["AGENT_HARNESS_BIN"]
    # The recipes call `agent-harness` by name, as a user with it installed would.
    env["PATH"] = f"{pathlib.Path(binary).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHON"] = EXAMPLES_PYTHON
    if server_url:
        env["AGENT_HARNESS_SERVER"] = server_url
    return env


def start_recipe(name, *args, env):
    return subprocess.Popen(
        [EXAMPLES_PYTHON, str(COOKBOOK / name), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )


def test_the_cookbook_shows_every_recipe_file_verbatim():
    page = (ROOT / "docs" / "cookbook.md").read_text()
    shown = dict(BLOCK.findall(page))
    files = sorted(p.relative_to(ROOT).as_posix() for p in COOKBOOK.iterdir() if p.is_file())
    assert sorted(shown) == files, "every file in docs/cookbook/ is shown once in docs/cookbook.md"
    for path, text in shown.items():
        assert text == (ROOT / path).read_text(), f"docs/cookbook.md shows an old {path}: run python3 tests/clients/cookbook_sync.py"


def test_the_ci_recipe_exits_0_on_a_good_turn_and_1_on_a_failed_one(server, tmp_path):
    env = recipe_env(f"http://{server.target}")
    env["AGENT_CWD"] = str(tmp_path)
    good = subprocess.run(
        [EXAMPLES_PYTHON, str(COOKBOOK / "ci_turn.py"), "Review it"], capture_output=True, text=True,
        env=env, timeout=TIMEOUT,
    )
    assert good.returncode == 0, good.stderr
    assert good.stdout.startswith("echo: Review it")
    failed = subprocess.run(
        [EXAMPLES_PYTHON, str(COOKBOOK / "ci_turn.py"), "@error -32603 the build is broken"],
        capture_output=True, text=True, env=env, timeout=TIMEOUT,
    )
    assert failed.returncode == 1
    assert failed.stderr.startswith("::error::the turn ended FAILED: ") and "the build is broken" in failed.stderr
    env["AGENT_PROFILE"] = "no-such-profile"
    refused = subprocess.run(
        [EXAMPLES_PYTHON, str(COOKBOOK / "ci_turn.py"), "x"], capture_output=True, text=True, env=env, timeout=TIMEOUT,
    )
    assert refused.returncode == 2
    assert refused.stderr.startswith("::error::agent-harness: PROFILE_NOT_FOUND: ")


class Webhook:
    """A chat channel's incoming webhook: records each JSON body posted to it."""

    def __init__(self):
        self.posts: "queue.Queue" = queue.Queue()
        posts = self.posts

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["content-length"]))
                posts.put(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def next(self):
        return self.posts.get(timeout=TIMEOUT)["text"]


def test_the_chat_recipe_posts_each_reply_once_and_each_permission_question(server, client, tmp_path):
    hook = Webhook()
    session = client.create_session(profile="mock", cwd=str(tmp_path))
    bot = start_recipe("chat_stream.py", session.id, hook.url, "2", env=recipe_env(f"http://{server.target}"))
    try:
        # The recipe streams from the head it reads at start: prompt once it says so.
        assert bot.stdout.readline().startswith(f"streaming session {session.id} from offset ")
        first = client.prompt(session.id, "@permission Deploy")
        assert hook.next() == "The agent asks permission: Deploy"
        held = client.get_transcript(session.id).messages[-1].pending_permissions[0]
        client.respond_to_permission(session.id, held.request_id, "allow-once")
        assert hook.next().endswith("\n_END_TURN_")
        client.prompt(session.id, "second\n@chunks 2 4")
        assert hook.next().startswith("echo: second")
        assert bot.wait(timeout=TIMEOUT) == 0, bot.stderr.read()
        assert hook.posts.empty()
        assert first.status == types.ControlStatus.SENT
    finally:
        bot.kill()
        hook.server.shutdown()


def test_the_permission_bot_allows_reads_and_rejects_the_rest(server, client, tmp_path):
    session = client.create_session(profile="mock", cwd=str(tmp_path))
    bot = start_recipe("permission_bot.py", session.id, "2", env=recipe_env(f"http://{server.target}"))
    try:
        read = client.run_turn(session.id, "@permission-kind read Read the notes", timeout=TIMEOUT)
        deploy = client.run_turn(session.id, "@permission Deploy to production", timeout=TIMEOUT)
        assert bot.wait(timeout=TIMEOUT) == 0, bot.stderr.read()
        lines = bot.stdout.read().splitlines()
    finally:
        bot.kill()
    assert lines == ["allow-once: Read the notes", "reject-once: Deploy to production"]
    (allowed,) = [p for p in read.message.parts if isinstance(p, types.Permission)]
    (rejected,) = [p for p in deploy.message.parts if isinstance(p, types.Permission)]
    assert (allowed.outcome, allowed.selected_option_id) == (InteractionOutcome.SELECTED, "allow-once")
    assert (rejected.outcome, rejected.selected_option_id) == (InteractionOutcome.SELECTED, "reject-once")
    assert read.stop_reason is StopReason.END_TURN


def test_the_bridge_recipe_runs_a_turn_on_an_agent_the_bridge_started(tmp_path):
    env = recipe_env()
    env["PORT"] = str(free_port())
    done = subprocess.run(
        ["bash", str(COOKBOOK / "bridge.sh")], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["END_TURN: echo: hello from afar", "runtime on bridge: True"]


def test_the_replicas_recipe_drives_a_session_through_the_replica_that_does_not_own_it(tmp_path):
    url = os.environ.get("AGENT_HARNESS_TEST_DATABASE_URL")
    if not url:
        pytest.skip("AGENT_HARNESS_TEST_DATABASE_URL is not set (scripts/test sets it when PostgreSQL is up)")
    # A schema of its own (as the server's PostgreSQL tests do), so the recipe's sessions meet no
    # other test's.
    schema = f"cookbook_{uuid.uuid4().hex[:12]}"
    subprocess.run(["psql", "-q", url, "-c", f"CREATE SCHEMA {schema}"], check=True, timeout=TIMEOUT)
    separator = "&" if "?" in url else "?"
    env = recipe_env()
    env.update({
        "DATABASE_URL": f"{url}{separator}options=-c%20search_path%3D{schema}",
        "PORT_A": str(free_port()),
        "PORT_B": str(free_port()),
    })
    try:
        done = subprocess.run(
            ["bash", str(COOKBOOK / "replicas.sh")], capture_output=True, text=True, env=env, timeout=90, cwd=tmp_path
        )
    finally:
        subprocess.run(["psql", "-q", url, "-c", f"DROP SCHEMA {schema} CASCADE"], timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == "END_TURN: echo: hello from the other replica"
    assert second.startswith("replica B sees 1 session ")


def test_a_recipe_whose_server_cannot_start_says_why_at_once_and_keeps_its_logs(tmp_path):
    env = recipe_env()
    # Another program holds the port: the recipe must not go on and talk to it.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env["PORT"] = str(taken.getsockname()[1])
        started = time.monotonic()
        done = subprocess.run(
            ["bash", str(COOKBOOK / "bridge.sh")], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path
        )
    assert done.returncode != 0
    assert "agent-harness serve did not start" in done.stderr, done.stderr
    assert "the logs are in" in done.stderr, done.stderr
    assert time.monotonic() - started < 30, "said at once, not after a client's wait"


def test_a_recipe_runs_the_binary_agent_harness_names_when_none_is_on_path(tmp_path):
    env = recipe_env()
    binary = os.environ["AGENT_HARNESS_BIN"]
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != str(pathlib.Path(binary).parent))
    env["AGENT_HARNESS"] = binary
    env["PORT"] = str(free_port())
    done = subprocess.run(
        ["bash", str(COOKBOOK / "bridge.sh")], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["END_TURN: echo: hello from afar", "runtime on bridge: True"]
