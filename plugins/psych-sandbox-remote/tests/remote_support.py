"""Helpers for the remote backend's tests: real ``psych-sandbox serve`` processes on loopback,
and deliberately malicious services speaking just enough HTTP to be believed."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from psych_sandbox_core import (
    DeploymentConfig,
    ExecutionLimits,
    ExecutionResult,
    Level,
    ProfileConfig,
    Sandbox,
)
from psych_sandbox_core.kit.relay import PROTOCOL_VERSION
from psych_sandbox_testing.requirements import needs

from psych_sandbox_remote.wire import REMOTE_PROTOCOL_VERSION, Description

PROFILE = "far"
FAST_LIMITS: dict[str, Any] = {"cpu_seconds": 10, "wall_seconds": 60.0, "grace_seconds": 0.5}
TOKEN_ENV = "PSYCH_TEST_REMOTE_TOKEN"

requires_bwrap = needs(
    shutil.which("bwrap") is not None, "bwrap-root", "bubblewrap is not installed"
)


def new_token() -> str:
    return "tok-" + secrets.token_hex(16)


@dataclass
class Served:
    """A running ``psych-sandbox serve``; its output is kept in files for the leak test."""

    process: subprocess.Popen[bytes]
    url: str
    stdout: Path
    stderr: Path
    #: Its own temporary directory (its TMPDIR).
    tmpdir: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        """Gone without a word (SIGKILL): its children die with it (bwrap's die-with-parent)."""
        self.process.kill()
        self.process.wait()

    def output(self) -> str:
        return self.stdout.read_text(errors="replace") + self.stderr.read_text(errors="replace")


SERVE_CONFIG = """
[profiles.{profile}]
backend = "bwrap"
{serve}
"""


@contextmanager
def serving(
    tmp: Path,
    tokens: dict[str, str],
    *,
    serve_table: str = "",
    profile_table: str = "",
    name: str = "serve",
    config_text: str | None = None,
) -> Iterator[Served]:
    """A real ``psych-sandbox serve`` of the profile ``sandbox`` on a free loopback port,
    stopped afterwards."""
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / f"{name}.toml"
    config.write_text(
        config_text
        if config_text is not None
        else SERVE_CONFIG.format(profile="sandbox", serve=profile_table)
        + ("\n[serve]\n" + serve_table if serve_table else "")
    )
    stdout, stderr = tmp / f"{name}.out", tmp / f"{name}.err"
    env = {
        **os.environ,
        "PSYCH_SANDBOX_SERVE_TOKENS": ",".join(f"{t}={v}" for t, v in tokens.items()),
    }
    env.pop(TOKEN_ENV, None)
    # Its own temporary directory: what a killed service leaves is found there.
    tmpdir = tmp / f"{name}-tmp"
    env["TMPDIR"] = str(tmpdir)
    os.makedirs(tmpdir, mode=0o755, exist_ok=True)
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "psych_sandbox_core.cli",
                "serve",
                "--profile",
                "sandbox",
                "--listen",
                "127.0.0.1:0",
                "--config",
                str(config),
            ],
            stdout=out,
            stderr=err,
            env=env,
        )
    served = Served(process, "", stdout, stderr, tmpdir)
    try:
        served.url = _wait_listening(served)
        yield served
    finally:
        served.stop()


def _wait_listening(served: Served) -> str:
    """The URL the service printed once it listens (read from its stderr file, which it
    writes before serving; the process is watched so a failure ends the wait)."""
    import time

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(r"listening on (http://\S+) ", served.stderr.read_text())
        if found:
            return found.group(1)
        if served.process.poll() is not None:
            raise AssertionError(f"serve exited: {served.output()}")
        # No notification exists for "a line was written to a file": a bounded poll.
        time.sleep(0.05)
    raise AssertionError(f"serve never listened: {served.output()}")


def client_config(
    urls: str | list[str],
    *,
    token_env: str | None = TOKEN_ENV,
    options: dict[str, Any] | None = None,
    warm: int | None = None,
    **limits: Any,
) -> DeploymentConfig:
    return DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(
                backend="remote",
                options={"url": urls, "token_env": token_env, **(options or {})},
                limits=ExecutionLimits(**{**FAST_LIMITS, **limits}),
                warm=warm,
            )
        }
    )


async def run(config: DeploymentConfig, source: str, **kwargs: Any) -> ExecutionResult:
    async with Sandbox(config) as sandbox:
        return await sandbox.run(source, profile=PROFILE, **kwargs)


# ------------------------------------------------------------------ malicious services


def description(**changes: Any) -> bytes:
    base = Description(
        protocol=REMOTE_PROTOCOL_VERSION,
        child_protocol=PROTOCOL_VERSION,
        backend="hostile",
        level=Level.ISOLATED,
        limits=ExecutionLimits(),
        capacity=1,
        in_flight=0,
    )
    return base.model_copy(update=changes).model_dump_json().encode()


@dataclass
class Hostile:
    """A service whose answer to a start request is ``stream`` (a coroutine writing raw bytes
    after the status line and headers); it counts what it was asked."""

    stream: Callable[[Callable[[bytes], Awaitable[None]]], Awaitable[None]]
    describe: Callable[[int], tuple[int, bytes]] = lambda _: (200, description())
    start_status: int = 200
    start_body: bytes = b""
    requests: dict[str, int] = field(default_factory=dict)
    url: str = ""
    #: Bytes the stream managed to write before the client went away.
    written: int = 0
    #: What the client wrote to the child's channel.
    channel_bodies: list[bytes] = field(default_factory=list)


async def _read_request(stream: anyio.abc.SocketStream) -> tuple[str, str, bytes]:
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        chunk = await stream.receive()
        buffer += chunk
        if len(buffer) > 1 << 20:
            raise ValueError("request head too large")
    head, _, rest = buffer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    while len(rest) < length:
        rest += await stream.receive()
    return method, path, rest


def _response(status: int, body: bytes, content_type: str = "application/json") -> bytes:
    return (
        f"HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode() + body


@asynccontextmanager
async def hostile_service(hostile: Hostile) -> AsyncIterator[Hostile]:
    """Serve ``hostile`` on a loopback port for the duration (one request per connection)."""

    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                method, path, body = await _read_request(stream)
            except (anyio.EndOfStream, anyio.BrokenResourceError, ValueError):
                return
            key = f"{method} {path.split('/')[-1] if path.count('/') > 3 else path}"
            hostile.requests[key] = hostile.requests.get(key, 0) + 1
            if path.endswith("/channel"):
                hostile.channel_bodies.append(body)
            try:
                if path == "/v1/description":
                    status, body = hostile.describe(hostile.requests[key])
                    await stream.send(_response(status, body))
                elif path == "/v1/executions" and method == "POST":
                    if hostile.start_status != 200:
                        await stream.send(_response(hostile.start_status, hostile.start_body))
                        return
                    await stream.send(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\n"
                        b"connection: close\r\n\r\n"
                    )

                    async def send(data: bytes) -> None:
                        await stream.send(data)
                        hostile.written += len(data)

                    await hostile.stream(send)
                else:
                    await stream.send(_response(404, b'{"error":"not_found","message":"no"}'))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                return

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    hostile.url = f"http://127.0.0.1:{port}"
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        try:
            yield hostile
        finally:
            tg.cancel_scope.cancel()
    await listener.aclose()


def started(execution: str = "a" * 32, **mechanisms: bool) -> bytes:
    import json

    event = {"type": "started", "execution": execution, "mechanisms": mechanisms, "host_uid": 0}
    return json.dumps(event).encode() + b"\n"


def heartbeat(execution: str = "a" * 32) -> bytes:
    return b'{"type":"heartbeat","execution":"' + execution.encode() + b'"}\n'


def hello(euid: int, **report: Any) -> bytes:
    """A child's hello frame with a report as a contained child would give (bar ``report``)."""
    from psych_sandbox_core.kit.relay import ContainmentReport, HelloFrame

    data: dict[str, Any] = {
        "uid": euid,
        "euid": euid,
        "gid": euid,
        "pid": 2,
        "canary_readable": False,
        "network": {"ipv4": "unreachable", "ipv6": "unreachable", "interfaces_up": []},
        "limits": [],
        "capabilities": "0000000000000000",
        "sees_foreign_processes": False,
        "python": "3",
        "platform": "linux",
        **report,
    }
    frame = HelloFrame(type="hello", protocol=1, report=ContainmentReport.model_validate(data))
    return frame.model_dump_json().encode() + b"\n"


def channel(data: bytes, execution: str = "a" * 32) -> bytes:
    import base64
    import json

    event = {"type": "channel", "execution": execution, "data": base64.b64encode(data).decode()}
    return json.dumps(event).encode() + b"\n"
