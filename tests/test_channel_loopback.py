"""The loopback channel with a one-time token, over real sockets: the good token connects
once; a wrong, replayed or late one is refused; strangers cannot stall the child; nothing is
left listening."""

from __future__ import annotations

import socket

import anyio
import pytest

from psych_sandbox_core.channel import FrameChannel
from psych_sandbox_core.channel_loopback import (
    MAX_REFUSED_CONNECTIONS,
    LoopbackTokenChannel,
)
from psych_sandbox_core.errors import ProtocolViolation

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
