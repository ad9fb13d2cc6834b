"""The control channel between host and child, whatever the transport.

A backend picks a :class:`ChannelListener`: an inherited socket where processes inherit file
descriptors, a Unix socket in a directory bind-mounted into a container, or a loopback TCP
socket with a one-time token where neither is available (channel_loopback.py). The child
is handed one string (``fd:N``, ``unix:PATH``, ``tcp:HOST:PORT``) and the bootstrap is the
same source in every case. Once connected, :class:`FrameChannel` reads bounded frames and
writes host frames.
"""

from __future__ import annotations

import os
import socket
import time
from abc import ABC, abstractmethod
from pathlib import Path

import anyio
from anyio.abc import ByteStream

from ..errors import ProtocolViolation
from ..protocol import ChildFrame, HostFrame, decode_child_frame, encode_host_frame
from ..protocol.framing import HANDSHAKE_CEILINGS, FrameCeilings, check_length, frame_kind
from ..protocol.limits import MAX_CHILD_FRAME_BYTES, MAX_FRAME_HEAD_BYTES


class ChannelListener(ABC):
    """One execution's channel as offered to a child, before the child has connected."""

    #: What the bootstrap receives as ``channel=...``.
    child_spec: str
    #: File descriptors the child must inherit.
    inherited_fds: tuple[int, ...] = ()

    @abstractmethod
    async def accept(self) -> ByteStream | socket.socket:
        """Wait for the child to connect; the caller bounds this with a deadline. A plain
        socket is the fast path (see FrameChannel); any anyio byte stream works."""

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

    def spoken(self) -> bool:
        """Whether the child has written to the channel (a byte peeked, not consumed); False
        at end of stream. A backend that cannot otherwise tell when its sandbox is up (bwrap)
        takes the bootstrap's first byte as the sign."""
        try:
            return bool(self._host.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except OSError:
            return False

    async def wait_spoken(self) -> None:
        """Return once the child has written to the channel. At end of stream (every holder
        of the child's end is gone) it never returns: the child's exit decides then."""
        await anyio.wait_readable(self._host)
        if not self.spoken():
            await anyio.sleep_forever()

    def remap_child_fd(self, number: int) -> None:
        """Tell the child the descriptor number it will see (when a launcher renumbers it)."""
        self.child_spec = f"fd:{number}"

    async def accept(self) -> ByteStream | socket.socket:
        # Already connected: the child holds the other end from birth.
        return self._host

    def after_spawn(self) -> None:
        if self._child.fileno() >= 0:
            self._child.close()

    async def aclose(self) -> None:
        self.after_spawn()
        self._host.close()


class UnixSocketChannel(ChannelListener):
    """A listening Unix socket in a per-execution directory, for children in their own mount
    namespace or container: the directory is bind-mounted and the child connects by path."""

    def __init__(self, directory: Path, *, child_path: str | None = None) -> None:
        self.path = directory / "control.sock"
        self.child_spec = f"unix:{child_path or self.path}"
        self._listener: socket.socket | None = None

    async def open(self, mode: int = 0o666) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(self.path))
            listener.listen()
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        # The child may run as another uid; only it can reach this directory anyway.
        os.chmod(self.path, mode)

    async def accept(self) -> socket.socket:
        # Waited for with anyio.wait_readable, and the connection read on its socket as an
        # inherited one is (FrameChannel): not anyio's Unix listener and stream, whose
        # reader callback, on asyncio, completes a future already cancelled when a wait is
        # cancelled in the loop turn its socket turns readable (InvalidStateError).
        listener = self._listener
        assert listener is not None, "open() first"
        while True:
            try:
                connection, _ = listener.accept()
            except BlockingIOError:
                await anyio.wait_readable(listener)
                continue
            except OSError as exc:
                raise anyio.BrokenResourceError from exc
            break
        # One connection per execution: nobody else gets to connect afterwards.
        self._close_listener()
        return connection

    def _close_listener(self) -> None:
        if self._listener is not None:
            anyio.notify_closing(self._listener)
            self._listener.close()
            self._listener = None

    async def aclose(self) -> None:
        self._close_listener()
        self.path.unlink(missing_ok=True)


#: A child that keeps frames coming without ever making us wait must not starve the event loop
#: (the wall-clock timer of every execution runs on it): yield after this many frames, or
#: this many bytes, read without waiting.
FRAMES_BETWEEN_CHECKPOINTS = 256
BYTES_BETWEEN_CHECKPOINTS = 1024 * 1024

#: Frames up to this long are decoded on the event loop: their shape is bounded by their
#: length (a few thousand elements at most), so they cost well under a millisecond, and the
#: binding round trip's hot path stays free of thread hops. Longer frames are decoded on a
#: worker thread; their depth and element limits bound that work too, so no decode holds
#: the interpreter lock (and so the loop) for more than tens of milliseconds.
INLINE_DECODE_BYTES = 64 * 1024

#: The share of the host's time the decoding of one channel's large frames may take: after
#: each, the reader rests for the rest of its share before reading on. A program that floods
#: its channel with the heaviest frames it may send then holds the interpreter lock a bounded
#: fraction of the time, and every other execution's clock keeps its accuracy.
LARGE_DECODE_SHARE = 0.25

#: The share of the event loop one channel's frames may take while they keep coming: the
#: loop time spent on them is owed (decoding, and answering: the time from one frame's
#: hand-over to the next read, counted up to ANSWER_SECONDS, since a reader that is not
#: asked for the next frame, a warm child waiting for its program, is idle, not busy), the
#: debt drains at this share of the time that passes, and beyond a burst's worth the reader
#: rests until it is paid. A program making its calls at any honest pace never rests; one
#: flooding its channel with the costliest small frames leaves the loop free for every other
#: execution's clock.
LOOP_SHARE = 0.5
LOOP_BURST_SECONDS = 0.02
ANSWER_SECONDS = 0.002

#: Largest single read: a larger request makes the allocator map and unmap memory per read.
_READ_BYTES = 65536


class FrameChannel:
    """Bounded frame reading and host frame writing over a connected channel.

    Over a plain socket (the inherited-descriptor transport) it does non-blocking I/O on the
    socket itself, which is the binding round trip's hot path; over any other anyio byte
    stream it reads from the stream. Either way a line is held to its kind's ceiling
    (``ceilings``, see protocol/framing.py) while it arrives, from its first bytes on.
    """

    def __init__(
        self, transport: ByteStream | socket.socket, ceilings: FrameCeilings = HANDSHAKE_CEILINGS
    ) -> None:
        self._sock: socket.socket | None = None
        self._stream: ByteStream | None = None
        if isinstance(transport, socket.socket):
            transport.setblocking(False)
            self._sock = transport
        else:
            self._stream = transport
        #: What each kind of frame may weigh; the host narrows it once the terms are known.
        self.ceilings = ceilings
        self._buffer = bytearray()
        self._scanned = 0
        self._kind: str | None = None
        self._frames_without_wait = 0
        self._bytes_without_wait = 0
        self._drained = False
        self.bytes_received = 0
        #: Loop time this channel's frames are owed (see LOOP_SHARE), as of ``_settled``;
        #: and when the last frame was handed over.
        self._owed = 0.0
        self._settled = time.perf_counter()
        self._handed_over: float | None = None

    async def receive(self) -> ChildFrame | None:
        """The next child frame, or None at a clean end of stream.

        A line that passes its kind's ceiling is cut off rather than buffered. Anything
        malformed, too long, too deep or too wide raises ProtocolViolation.
        """
        if self._handed_over is not None:
            now = time.perf_counter()
            self._owe(min(now - self._handed_over, ANSWER_SECONDS), now)
            self._handed_over = None
        line = await self._line()
        if line is None:
            return None
        self.bytes_received += len(line) + 1
        if len(line) > INLINE_DECODE_BYTES:
            frame, spent = await anyio.to_thread.run_sync(_timed_decode, line, self.ceilings)
            await anyio.sleep(spent * (1 / LARGE_DECODE_SHARE - 1))
            now = time.perf_counter()
        else:
            started = time.perf_counter()
            frame = decode_child_frame(line, self.ceilings)
            now = time.perf_counter()
            self._owe(now - started, now)
            if self._owed > LOOP_BURST_SECONDS:
                await anyio.sleep((self._owed - LOOP_BURST_SECONDS) / LOOP_SHARE)
                now = time.perf_counter()
        self._handed_over = now
        return frame

    def _owe(self, spent: float, now: float) -> None:
        """Add ``spent`` to the debt, drained up to ``now`` first."""
        self._owed = max(0.0, self._owed - (now - self._settled) * LOOP_SHARE) + spent
        self._settled = now

    async def _line(self) -> bytes | None:
        buffer = self._buffer
        while True:
            index = buffer.find(b"\n", self._scanned)
            if index >= 0:
                line = bytes(buffer[:index])
                del buffer[: index + 1]
                self._scanned = 0
                self._kind = None
                self._frames_without_wait += 1
                if self._frames_without_wait >= FRAMES_BETWEEN_CHECKPOINTS:
                    await self._checkpoint()
                return line
            self._scanned = len(buffer)
            if buffer:
                if self._kind is None:
                    self._kind = frame_kind(bytes(buffer[:MAX_FRAME_HEAD_BYTES]), complete=False)
                if self._kind is not None:
                    check_length(self._kind, len(buffer), self.ceilings)
            if len(buffer) >= MAX_CHILD_FRAME_BYTES:
                raise _too_long()
            chunk = await self._read(min(_READ_BYTES, MAX_CHILD_FRAME_BYTES + 1 - len(buffer)))
            if chunk is None:
                continue
            if not chunk:
                if buffer:
                    raise _cut_short()
                return None
            buffer += chunk
            self._bytes_without_wait += len(chunk)
            if self._bytes_without_wait >= BYTES_BETWEEN_CHECKPOINTS:
                await self._checkpoint()

    async def _read(self, want: int) -> bytes | None:
        """Up to ``want`` bytes; b"" at the end of the stream (or a reset: the child's exit
        status says how it ended); None when the socket had nothing after all."""
        if self._stream is not None:
            try:
                data = await self._stream.receive(want)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                return b""
            self._waited()
            return data
        sock = self._sock
        assert sock is not None
        if self._drained:
            # The last read emptied the socket: in a request/reply exchange nothing new is
            # there yet, so wait first instead of paying for a read that must fail.
            self._drained = False
            self._waited()
            await anyio.wait_readable(sock)
        try:
            data = sock.recv(want)
        except BlockingIOError:
            self._drained = True
            return None
        except OSError:
            return b""
        self._drained = len(data) < want
        return data

    def _waited(self) -> None:
        self._frames_without_wait = 0
        self._bytes_without_wait = 0

    async def _checkpoint(self) -> None:
        self._waited()
        await anyio.lowlevel.checkpoint()

    async def send(self, frame: HostFrame) -> None:
        data = encode_host_frame(frame)
        if self._stream is not None:
            await self._stream.send(data)
            return
        sock = self._sock
        assert sock is not None
        view = memoryview(data)
        while view:
            try:
                sent = sock.send(view)
            except BlockingIOError:
                await anyio.wait_writable(sock)
                continue
            except OSError as exc:
                raise anyio.BrokenResourceError("the child closed the channel") from exc
            view = view[sent:]

    async def aclose(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()
        elif self._sock is not None:
            # A reply waiting for room (a program that never reads them fills the socket)
            # or a read waiting for a frame gives up now: a closed descriptor wakes nobody.
            anyio.notify_closing(self._sock)
            self._sock.close()


def _too_long() -> ProtocolViolation:
    return ProtocolViolation(
        f"child sent a frame longer than {MAX_CHILD_FRAME_BYTES} bytes without a newline"
    )


def _cut_short() -> ProtocolViolation:
    return ProtocolViolation("child closed the channel in the middle of a frame")


def _timed_decode(line: bytes, ceilings: FrameCeilings) -> tuple[ChildFrame, float]:
    """A frame decoded, and the CPU time the decoding took (its thread's own)."""
    started = time.thread_time()
    frame = decode_child_frame(line, ceilings)
    return frame, time.thread_time() - started
