"""The loopback channel with a one-time token, over real sockets: the good token connects
once; a wrong, replayed or late one is refused; strangers cannot stall the child; nothing is
left listening."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import anyio
import pytest

from psych_sandbox_core import ExecutionLimits, Sandbox
from psych_sandbox_core._policy.profiles import DeploymentConfig, ProfileConfig
from psych_sandbox_core._policy.registry import BackendRegistry
from psych_sandbox_core.errors import ProtocolViolation
from psych_sandbox_core.grading import Level, Mechanisms
from psych_sandbox_core.kit import child_environment
from psych_sandbox_core.kit.backend import Backend, Launched, LaunchRequest
from psych_sandbox_core.kit.channel import FrameChannel
from psych_sandbox_core.kit.channel_loopback import MAX_REFUSED_CONNECTIONS, LoopbackTokenChannel
from psych_sandbox_core.kit.exit_status import ExitStatus
from psych_sandbox_core.kit.hookspecs import hookimpl
from psych_sandbox_core.kit.posix.process import ManagedProcess
from psych_sandbox_core.kit.posix.removal import remove_tree
from psych_sandbox_core.kit.posix.workspace import create_workspace

pytestmark = pytest.mark.anyio


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _port(channel: LoopbackTokenChannel) -> int:
    kind, host, port = channel.child_spec.split(":")
    assert (kind, host) == ("tcp", "127.0.0.1")
    return int(port)


def _token(channel: LoopbackTokenChannel) -> bytes:
    assert channel.child_stdin.endswith(b"\n")
    return channel.child_stdin[:-1]


async def _connect(channel: LoopbackTokenChannel) -> anyio.abc.SocketStream:
    return await anyio.connect_tcp("127.0.0.1", _port(channel))


async def _closed_by_host(stream: anyio.abc.SocketStream) -> bool:
    """Whether the host closed this connection (EOF or reset)."""
    with anyio.fail_after(10):
        try:
            return await stream.receive() == b""
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return True


def _listening(port: int) -> bool:
    probe = socket.socket()
    try:
        probe.connect(("127.0.0.1", port))
    except ConnectionRefusedError:
        return False
    finally:
        probe.close()
    return True


async def test_the_token_is_not_on_the_command_line_and_connects_once() -> None:
    channel = LoopbackTokenChannel()
    await channel.open()
    token = _token(channel)
    assert len(token) == 32 and token.decode() not in channel.child_spec
    port = _port(channel)
    async with anyio.create_task_group() as tg:
        accepted: list[anyio.abc.ByteStream] = []

        async def accept() -> None:
            accepted.append(await channel.accept())

        tg.start_soon(accept)
        child = await _connect(channel)
        await child.send(token + b"\n" + b'{"type":"hello"')
    host = accepted[0]
    # Bytes sent behind the token in the same segment are not lost.
    assert await host.receive() == b'{"type":"hello"'
    await host.send(b"pong")
    assert await child.receive() == b"pong"
    # Replayed: the port closed at the first good token.
    assert not _listening(port)
    await child.aclose()
    await host.aclose()
    await channel.aclose()


async def test_a_wrong_token_is_refused_and_the_child_still_connects() -> None:
    channel = LoopbackTokenChannel()
    await channel.open()
    other = LoopbackTokenChannel()  # another execution's token is as wrong as any
    async with anyio.create_task_group() as tg:
        accepted: list[anyio.abc.ByteStream] = []

        async def accept() -> None:
            accepted.append(await channel.accept())

        tg.start_soon(accept)
        for wrong in (_token(other), b"", b"x" * 200, _token(channel)[:-1]):
            stranger = await _connect(channel)
            await stranger.send(wrong + b"\n")
            assert await _closed_by_host(stranger)
            await stranger.aclose()
        child = await _connect(channel)
        await child.send(channel.child_stdin)
    assert channel.refused == 4
    await accepted[0].send(b"ok")
    assert await child.receive() == b"ok"
    await child.aclose()
    await accepted[0].aclose()
    await channel.aclose()


async def test_a_silent_stranger_does_not_stall_the_child() -> None:
    channel = LoopbackTokenChannel()
    await channel.open()
    silent = await _connect(channel)  # connects first and never speaks
    async with anyio.create_task_group() as tg:
        accepted: list[anyio.abc.ByteStream] = []

        async def accept() -> None:
            accepted.append(await channel.accept())

        tg.start_soon(accept)
        child = await _connect(channel)
        await child.send(channel.child_stdin)
    # The child won while the stranger still held its connection; the stranger is dropped.
    assert await _closed_by_host(silent)
    await silent.aclose()
    await child.aclose()
    await accepted[0].aclose()


async def test_a_late_token_is_refused_and_ends_the_channel() -> None:
    clock = Clock()
    channel = LoopbackTokenChannel(lifetime_seconds=30, clock=clock)
    await channel.open()
    port = _port(channel)
    clock.now += 30.5
    async with anyio.create_task_group() as tg:
        failures: list[BaseException] = []

        async def accept() -> None:
            try:
                await channel.accept()
            except ProtocolViolation as exc:
                failures.append(exc)

        tg.start_soon(accept)
        child = await _connect(channel)
        await child.send(channel.child_stdin)
        assert await _closed_by_host(child)
    assert "late token" in str(failures[0])
    assert not _listening(port)
    await child.aclose()
    await channel.aclose()


async def test_a_stream_of_wrong_tokens_ends_the_channel() -> None:
    channel = LoopbackTokenChannel()
    await channel.open()
    async with anyio.create_task_group() as tg:
        failures: list[BaseException] = []

        async def accept() -> None:
            try:
                await channel.accept()
            except ProtocolViolation as exc:
                failures.append(exc)

        tg.start_soon(accept)
        for _ in range(MAX_REFUSED_CONNECTIONS):
            stranger = await _connect(channel)
            await stranger.send(b"guess\n")
            assert await _closed_by_host(stranger)
            await stranger.aclose()
    assert "no valid token" in str(failures[0])
    await channel.aclose()


def test_only_loopback() -> None:
    with pytest.raises(ValueError, match="loopback only"):
        LoopbackTokenChannel(host="0.0.0.0")


async def test_frames_flow_over_it() -> None:
    """The channel carries the protocol like any other transport: a hello frame read by the
    host's FrameChannel."""
    from psych_sandbox_core.protocol.frames import HelloFrame

    channel = LoopbackTokenChannel()
    await channel.open()
    hello = (
        b'{"type":"hello","protocol":1,"report":{"uid":-1,"euid":-1,"gid":-1,"pid":7,'
        b'"canary_readable":null,"network":{"ipv4":"skipped","ipv6":"skipped",'
        b'"interfaces_up":[]},"limits":[],"capabilities":null,'
        b'"sees_foreign_processes":null,"python":"3.12.0","platform":"win32"}}\n'
    )
    async with anyio.create_task_group() as tg:
        accepted: list[anyio.abc.ByteStream] = []

        async def accept() -> None:
            accepted.append(await channel.accept())

        tg.start_soon(accept)
        child = await _connect(channel)
        await child.send(channel.child_stdin + hello)
    frames = FrameChannel(accepted[0])
    frame = await frames.receive()
    assert isinstance(frame, HelloFrame) and frame.report.platform == "win32"
    await frames.aclose()
    await child.aclose()


# ---------------------------------------------------------------- any backend can use it


class LoopbackBackend(Backend):
    """A minimal backend of the kind a third party targeting another OS would write: a plain
    process in its own session, its channel the token channel (nothing inherited)."""

    id: ClassVar[str] = "loopbacktest"
    claims: ClassVar[Level] = Level.NONE

    def unavailable_reason(self) -> str | None:
        return None

    @asynccontextmanager
    async def launch(self, request: LaunchRequest) -> AsyncIterator[Launched]:
        workspace = create_workspace()
        channel = LoopbackTokenChannel()
        process: ManagedProcess | None = None
        try:
            await channel.open()
            process = await ManagedProcess.spawn(
                [
                    sys.executable,
                    "-I",
                    "-u",
                    *request.bootstrap_command(sys.executable),
                    f"channel={channel.child_spec}",
                    "probe=" + json.dumps(request.probe.as_json_object()),
                ],
                env=child_environment(workspace),
                cwd=workspace,
                with_stdin=True,
            )
            assert process.stdin is not None
            await process.stdin.send(channel.child_stdin)
            await process.stdin.aclose()
            yield _Launched(process, channel)
        finally:
            with anyio.CancelScope(shield=True):
                if process is not None:
                    await process.aclose()
                await channel.aclose()
                remove_tree(workspace)


class _Launched(Launched):
    def __init__(self, process: ManagedProcess, channel: LoopbackTokenChannel) -> None:
        self.process, self.channel = process, channel
        self.mechanisms = Mechanisms()
        self.stdout, self.stderr = process.stdout, process.stderr

    async def wait_exited(self) -> None:
        await self.process.wait_exited()

    async def terminate(self, grace_seconds: float) -> None:
        await self.process.terminate(grace_seconds)

    async def finish(self) -> ExitStatus:
        return await self.process.kill_and_reap()


class _Plugin:
    @staticmethod
    @hookimpl
    def psych_sandbox_register_backends(registry: Any) -> None:
        registry.add(LoopbackBackend)


async def test_a_backend_runs_programs_over_the_token_channel() -> None:
    registry = BackendRegistry()
    registry.register_plugin(_Plugin(), "loopback-test")
    config = DeploymentConfig(
        profiles={
            "lo": ProfileConfig(
                backend="loopbacktest",
                required_level=Level.NONE,
                limits=ExecutionLimits(cpu_seconds=10, wall_seconds=60.0),
            )
        }
    )
    async with Sandbox(config, registry=registry) as sandbox:
        result = await sandbox.run("print('hi')\nreturn 6 * 7", profile="lo")
    assert result.error is None, result.error
    assert (result.return_value, result.stdout) == (42, "hi\n")
