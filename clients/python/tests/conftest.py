"""The real release server for the client tests: started as a process on a free loopback port
with its own data dir, killable and restartable on the same port and data."""

import os
import pathlib
import socket
import subprocess
import time

import grpc
import pytest

from agent_harness_client import Client

#: How long any one wait in these tests may take before the test fails as hung.
TIMEOUT = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, tmp: pathlib.Path, extra_args=(), config=None) -> None:
        self.extra_args = list(extra_args)
        self.bin = os.environ.get("AGENT_HARNESS_BIN")
        if not self.bin:
            pytest.fail("AGENT_HARNESS_BIN must name the agent-harness binary (scripts/test sets it)")
        self.port = free_port()
        self.data = tmp / "data"
        self.log = tmp / "server.log"
        self.config = tmp / "config.toml"
        # `mock-resume`: the mock agent with session/resume, so a session reopens after a restart.
        # `mock-fork`: the mock agent with session/fork.
        self.config.write_text(
            config if config is not None else
            f'[profiles.mock-resume]\ncommand = "{self.bin}"\nargs = ["mock-agent", "--resume"]\n'
            f'[profiles.mock-fork]\ncommand = "{self.bin}"\nargs = ["mock-agent", "--resume", "--fork"]\n'
        )
        self.process = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        log = open(self.log, "ab")
        self.process = subprocess.Popen(
            [self.bin, "serve", "--listen", self.target, "--data-dir", str(self.data), "--config", str(self.config), *self.extra_args],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        )
        log.close()
        deadline = time.monotonic() + TIMEOUT
        while True:
            if self.process.poll() is not None:
                pytest.fail(f"the server exited: {self.log.read_text()[-2000:]}")
            with grpc.insecure_channel(self.target) as channel:
                try:
                    grpc.channel_ready_future(channel).result(timeout=0.5)
                    return
                except grpc.FutureTimeoutError:
                    pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server did not listen on {self.target}")

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=TIMEOUT)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def server(tmp_path_factory):
    # The server's files (data dir, config, log) apart from the test's tmp_path, which the
    # tests give their sessions as cwd: a cwd holding the server's files is refused.
    server = Server(tmp_path_factory.mktemp("server"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def client(server):
    with Client(server.target, timeout=TIMEOUT) as client:
        yield client
