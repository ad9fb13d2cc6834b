"""The control channel between host and child, whatever the transport.

A backend picks a :class:`ChannelListener`: an inherited socket where processes inherit file
descriptors, a Unix socket in a directory bind-mounted into a container, or a loopback TCP
socket with a one-time token where neither is available. The child is handed one string
(``fd:N``, ``unix:PATH``, ``tcp:HOST:PORT:TOKEN``) and the bootstrap is the same source in
every case. Once connected, :class:`FrameChannel` reads bounded frames and writes host frames.
"""

from __future__ import annotations

import hmac
import os
import secrets
import socket
from abc import ABC, abstractmethod
from pathlib import Path

import anyio
from anyio.abc import ByteStream, SocketListener, SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

from .errors import ProtocolViolation
from .protocol import ChildFrame, HostFrame, decode_child_frame, encode_host_frame
from .protocol.limits import MAX_CHILD_FRAME_BYTES


class ChannelListener(ABC):
    """One execution's channel as offered to a child, before the child has connected."""

    #: What the bootstrap receives as ``channel=...``.
    child_spec: str
    #: File descriptors the child must inherit.
    inherited_fds: tuple[int, ...] = ()

    @abstractmethod
    async def accept(self) -> ByteStream:
        """Wait for the child to connect; the caller bounds this with a deadline."""

    def after_spawn(self) -> None:  # noqa: B027 - most transports have nothing to release
        """Release what only the child needed (e.g. our copy of its inherited descriptor)."""

    @abstractmethod
    async def aclose(self) -> None: ...


class InheritedSocketChannel(ChannelListener):
    """A socket pair; the child inherits one end by descriptor number."""

    def __init__(self) -> None:
        self._host, self._child = socket.socketpair()
        self._child.set_inheritable(True)
        self.child_spec = f"fd:{self._child.fileno()}"
        self.inherited_fds = (self._child.fileno(),)
        self._stream: SocketStream | None = None

    def remap_child_fd(self, number: int) -> None:
        """Tell the child the descriptor number it will see (when a launcher renumbers it)."""
        self.child_spec = f"fd:{number}"

    async def accept(self) -> ByteStream:
        if self._stream is None:
            self._stream = await SocketStream.from_socket(self._host)
        return self._stream

    def after_spawn(self) -> None:
        if self._child.fileno() >= 0:
            self._child.close()

    async def aclose(self) -> None:
        self.after_spawn()
        if self._stream is not None:
            await self._stream.aclose()
        else:
            self._host.close()


class UnixSocketChannel(ChannelListener):
    """A listening Unix socket in a per-execution directory, for children in their own mount
    namespace or container: the directory is bind-mounted and the child connects by path."""

    def __init__(self, directory: Path, *, child_path: str | None = None) -> None:
        self.path = directory / "control.sock"
        self.child_spec = f"unix:{child_path or self.path}"
        self._listener: SocketListener | None = None

    async def open(self, mode: int = 0o666) -> None:
        self._listener = await anyio.create_unix_listener(self.path)
        # The child may run as another uid; only it can reach this directory anyway.
        os.chmod(self.path, mode)

    async def accept(self) -> ByteStream:
        assert self._listener is not None, "open() first"
        stream: SocketStream = await self._listener.accept()
        # One connection per execution: nobody else gets to connect afterwards.
        await self._listener.aclose()
        return stream

    async def aclose(self) -> None:
        if self._listener is not None:
            await self._listener.aclose()
        self.path.unlink(missing_ok=True)


class LoopbackTokenChannel(ChannelListener):
    """A loopback TCP listener; the first line the child sends must be a one-time token."""

    def __init__(self) -> None:
        self._token = secrets.token_hex(16)
        self._listener: SocketListener | None = None
        self.child_spec = ""

    async def open(self) -> None:
        multi = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        listener = multi.listeners[0]
        assert isinstance(listener, SocketListener)
        self._listener = listener
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        self.child_spec = f"tcp:127.0.0.1:{port}:{self._token}"

    async def accept(self) -> ByteStream:
        assert self._listener is not None, "open() first"
        while True:
            stream = await self._listener.accept()
            buffered = BufferedByteReceiveStream(stream)
            try:
                presented = await buffered.receive_until(b"\n", 64)
            except Exception:
                await stream.aclose()
                continue
            if hmac.compare_digest(presented, self._token.encode()):
                await self._listener.aclose()
                return _Prebuffered(stream, buffered)
            await stream.aclose()

    async def aclose(self) -> None:
        if self._listener is not None:
            await self._listener.aclose()


class _Prebuffered(ByteStream):
    """A stream whose first bytes were already read into a buffer while checking the token."""

    def __init__(self, stream: ByteStream, buffered: BufferedByteReceiveStream) -> None:
        self._stream = stream
        self._buffered = buffered

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self._buffered.receive(max_bytes)

    async def send(self, item: bytes) -> None:
        await self._stream.send(item)

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()


class FrameChannel:
    """Bounded frame reading and host frame writing over a connected stream."""

    def __init__(self, stream: ByteStream) -> None:
        self._stream = stream
        self._buffered = BufferedByteReceiveStream(stream)
        self.bytes_received = 0

    async def receive(self) -> ChildFrame | None:
        """The next child frame, or None at a clean end of stream.

        Bytes are bounded as they arrive: a line that never ends is cut off at the ceiling
        rather than buffered. Anything malformed raises ProtocolViolation.
        """
        try:
            line = await self._buffered.receive_until(b"\n", MAX_CHILD_FRAME_BYTES)
        except anyio.DelimiterNotFound:
            raise ProtocolViolation(
                f"child sent a frame longer than {MAX_CHILD_FRAME_BYTES} bytes without a newline"
            ) from None
        except anyio.IncompleteRead:
            if self._buffered.buffer:
                raise ProtocolViolation(
                    "child closed the channel in the middle of a frame"
                ) from None
            return None
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return None
        self.bytes_received += len(line) + 1
        return decode_child_frame(line)

    async def send(self, frame: HostFrame) -> None:
        await self._stream.send(encode_host_frame(frame))

    async def aclose(self) -> None:
        await self._stream.aclose()
