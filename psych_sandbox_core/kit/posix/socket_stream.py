"""A connected socket as an anyio byte stream, waited on with anyio.wait_readable and
wait_writable.

Not anyio's own Unix socket stream: on asyncio it waits on a future the event loop's reader
callback completes, and a receive cancelled in the loop turn where the socket became readable
has that callback complete a cancelled future, which raises InvalidStateError (logged by the
loop, or raised out of aclose: anyio issue 1267), and leaves the reader registered. Here a
wait is anyio's own, removed however it ends.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable

import anyio
import anyio.lowlevel
from anyio.abc import ByteStream

__all__ = ["SocketByteStream"]


class SocketByteStream(ByteStream):
    """``sock`` (connected; made non-blocking here) as a byte stream. ``owned``: whether the
    stream closes it and shuts its sending side; otherwise whoever handed it over does both
    (a backend's channel socket), and ``send_eof`` and ``aclose`` leave it as it is."""

    def __init__(self, sock: socket.socket, *, owned: bool = True) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._owned = owned
        self._closed = False

    @classmethod
    async def connect_unix(cls, path: str) -> SocketByteStream:
        """A stream connected to the Unix socket at ``path`` (OSError if it cannot be)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            while True:
                try:
                    sock.connect(path)
                except BlockingIOError:
                    # The listener's queue is full: wait for room, then try again.
                    await anyio.wait_writable(sock)
                else:
                    return cls(sock)
        except BaseException:
            sock.close()
            raise

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while True:
            try:
                data = self._sock.recv(max_bytes)
            except BlockingIOError:
                await self._wait(anyio.wait_readable)
                continue
            except OSError as exc:
                raise self._broken() from exc
            if not data:
                raise anyio.EndOfStream
            return data

    async def send(self, item: bytes) -> None:
        view = memoryview(item)
        while view:
            try:
                sent = self._sock.send(view)
            except BlockingIOError:
                await self._wait(anyio.wait_writable)
                continue
            except OSError as exc:
                raise self._broken() from exc
            view = view[sent:]

    async def send_eof(self) -> None:
        if not self._owned:
            return
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            raise self._broken() from exc

    async def aclose(self) -> None:
        if self._owned and not self._closed:
            self._closed = True
            # Whoever waits on the socket is told it closed, before it is.
            anyio.notify_closing(self._sock)
            self._sock.close()
        await anyio.lowlevel.checkpoint()

    async def _wait(self, wait: Callable[[socket.socket], Awaitable[None]]) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        await wait(self._sock)

    def _broken(self) -> Exception:
        return anyio.ClosedResourceError() if self._closed else anyio.BrokenResourceError()
