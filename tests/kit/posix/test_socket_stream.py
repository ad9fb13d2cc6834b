"""A socket as a byte stream (socket_stream.py): waited on with anyio's own waits, so a
receive cancelled as its socket turns readable leaves nothing behind; and a stream that
carries both ways and reports its end."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from anyio.abc import ByteStream

from psych_sandbox_core.kit.posix.socket_stream import SocketByteStream

pytestmark = pytest.mark.anyio


def _receive_cancelled_as_readable(make: Callable[[socket.socket], ByteStream]) -> list[object]:
    """Cancel a receive in the very loop turn its socket turns readable (another socket's
    reader callback, ready first in that turn, cancels it); what the loop's exception
    handler was handed meanwhile."""

    async def main() -> list[object]:
        loop = asyncio.get_running_loop()
        errors: list[object] = []
        loop.set_exception_handler(lambda _, context: errors.append(context))
        first, first_peer = socket.socketpair()
        mine, mine_peer = socket.socketpair()
        first.setblocking(False)
        stream = make(mine)
        scope = anyio.CancelScope()
        loop.add_reader(first, scope.cancel)

        async def receive() -> None:
            with scope:
                await stream.receive()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(receive)
                await anyio.wait_all_tasks_blocked()
                # Both readable before the loop next polls, the canceller's first.
                first_peer.send(b"x")
                mine_peer.send(b"y")
            await stream.aclose()
            for _ in range(3):
                await anyio.sleep(0)
        finally:
            loop.remove_reader(first)
            for sock in (first, first_peer, mine_peer):
                sock.close()
        return errors

    return anyio.run(main, backend="asyncio")


def test_a_receive_cancelled_as_its_socket_turns_readable_leaves_nothing_to_report() -> None:
    # anyio's own Unix socket stream hands the loop an InvalidStateError here.
    assert _receive_cancelled_as_readable(SocketByteStream) == []


async def test_the_engine_socket_carries_both_ways_and_reports_its_end(tmp_path: Path) -> None:
    path = str(tmp_path / "engine.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    try:
        stream = await SocketByteStream.connect_unix(path)
        peer, _ = listener.accept()
        payload = b"z" * (4 * 1024 * 1024)  # more than a socket buffer: sends wait for room

        async def drain() -> bytes:
            received = bytearray()
            while len(received) < len(payload):
                received += await anyio.to_thread.run_sync(peer.recv, 1 << 20)
            return bytes(received)

        async with anyio.create_task_group() as tg:
            got: list[bytes] = []

            async def collect() -> None:
                got.append(await drain())

            tg.start_soon(collect)
            await stream.send(payload)
        assert got == [payload]
        peer.sendall(b"reply")
        assert await stream.receive() == b"reply"
        await stream.send_eof()
        assert peer.recv(1) == b""
        peer.close()
        with pytest.raises(anyio.EndOfStream):
            await stream.receive()
        await stream.aclose()
        with pytest.raises(anyio.ClosedResourceError):
            await stream.receive()
    finally:
        listener.close()
