"""The server address as users write it (the CLI's and the TypeScript package's form, a URL like
``http://127.0.0.1:50051`` or ``https://harness.example``) turned into a gRPC target, and the
environment defaults."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple
from urllib.parse import urlsplit

import grpc
import grpc.experimental

from agent_harness_client._errors import HarnessError

#: The server when neither an argument nor AGENT_HARNESS_SERVER names one (the CLI's default).
DEFAULT_SERVER = "http://127.0.0.1:50051"
SERVER_ENV = "AGENT_HARNESS_SERVER"
TOKEN_ENV = "AGENT_HARNESS_TOKEN"


@dataclass(frozen=True)
class Target:
    #: ``host:port`` for grpc.
    address: str
    tls: bool


def parse_server(server: str, source: str = "server") -> Target:
    """``http://host[:port]`` (plaintext, port 80 unless given), ``https://host[:port]`` (TLS,
    443), or a bare ``host:port`` (plaintext, the form older versions took)."""
    text = server.strip()
    if "://" not in text:
        host, sep, port = text.rpartition(":")
        if sep and host and port.isdigit() and "/" not in text:
            return Target(text, tls=False)
        raise _bad(server, source)
    try:
        url = urlsplit(text)
        url_port = url.port
    except ValueError:
        raise _bad(server, source) from None
    if url.scheme not in ("http", "https") or not url.hostname or url.path not in ("", "/") or url.query:
        raise _bad(server, source)
    tls = url.scheme == "https"
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    return Target(f"{host}:{url_port or (443 if tls else 80)}", tls)


def _bad(server: str, source: str) -> HarnessError:
    return HarnessError(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"{source} {server!r} is not a server URL; want http://host:port or https://host[:port]",
        reason="INVALID_SERVER_URL",
    )


def channel(target: Target, aio: bool = False) -> grpc.Channel:
    # Keepalive pings notice a server that vanished (kill -9, a cut network) on an idle stream.
    options: List[Tuple[str, Any]] = [("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000)]
    if not aio:
        # grpcio hands every streamed message of a synchronous call from its polling thread to
        # the reading thread, which costs tens of microseconds per Subscribe event; read on the
        # caller's thread instead (the package only iterates and cancels its streams, which this
        # mode supports). The package README says so under Latency.
        options.append((grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1))
    module = grpc.aio if aio else grpc
    if target.tls:
        return module.secure_channel(target.address, grpc.ssl_channel_credentials(), options=options)
    return module.insecure_channel(target.address, options=options)


def env_server() -> str:
    return os.environ.get(SERVER_ENV) or DEFAULT_SERVER


def env_token() -> Optional[str]:
    return os.environ.get(TOKEN_ENV) or None
