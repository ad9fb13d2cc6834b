"""Handing a running program's stdout and stderr to the caller while it runs.

The drains (output.StreamCapture) must never wait for anyone: a child blocked on a full pipe
stalls, and its wall clock runs on. So a capture hands each piece of program output it keeps
to an :class:`OutputRelay` without waiting: the relay queues it, at most
:data:`QUEUE_BYTES` pending, and delivers the queue to the caller's callback from a task of
its own, in the order the pieces arrived, in chunks of at most :data:`CHUNK_BYTES` (small
pieces of one stream in a row are joined). While the queue is full, arriving bytes are
dropped from the stream and counted; the next chunk delivered for that stream says how many
(:attr:`OutputChunk.skipped_bytes`), and if none follows, a last empty chunk does.

What is streamed is what the program wrote, as it came (the end marker of a warm run and
anything written after the program ended are not); what the result keeps is decided by the
capture caps and the preview budget exactly as without a callback.

The callback is either an ``async`` function, awaited by the relay's task, or a plain one,
called in a worker thread, so a slow or blocking callback holds up only the delivery, never
the drains or the event loop. One chunk is delivered at a time. :meth:`Sandbox.run` returns
after the last chunk was delivered; if the callback raised, nothing more is delivered, the
execution runs to its end all the same, and run() raises that exception afterwards.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal

import anyio

#: The largest chunk one callback receives: a flood costs few calls, and one call never
#: hands over more than a terminal or a socket takes in a write.
CHUNK_BYTES = 64 * 1024
#: What may wait for a callback that is behind, over both streams: past it, output is
#: dropped (and counted) rather than held, so a stuck callback costs this much memory at most.
QUEUE_BYTES = 1024 * 1024

StreamName = Literal["stdout", "stderr"]


@dataclass(frozen=True)
class OutputChunk:
    """A piece of one of the program's streams, as it arrived."""

    stream: StreamName
    data: bytes
    #: Bytes of this stream dropped just before ``data`` because the callback was behind.
    skipped_bytes: int = 0


#: What ``on_output`` may be: called with each chunk, in order, one at a time.
OutputCallback = Callable[[OutputChunk], Awaitable[None]] | Callable[[OutputChunk], None]


class OutputRelay:
    """Queues program output for a callback without ever making the drains wait."""

    def __init__(self, callback: OutputCallback) -> None:
        self._callback = callback
        self._is_async = _is_async(callback)
        #: [stream, bytearray, skipped] entries waiting for the callback.
        self._pending: deque[tuple[StreamName, bytearray, int]] = deque()
        self._queued = 0
        self._skipped: dict[StreamName, int] = {"stdout": 0, "stderr": 0}
        self._wake = anyio.Event()
        self._closed = False
        #: What the callback raised, if it did (raised again by whoever runs the relay).
        self.failure: BaseException | None = None

    def listener(self, stream: StreamName) -> Callable[[bytes], None]:
        """What a capture calls with each piece of ``stream`` it keeps; returns at once."""

        def offer(data: bytes) -> None:
            self.offer(stream, data)

        return offer

    def offer(self, stream: StreamName, data: bytes) -> None:
        if self._closed or self.failure is not None or not data:
            return
        room = QUEUE_BYTES - self._queued
        if room < len(data):
            self._skipped[stream] += len(data) - max(room, 0)
            data = data[: max(room, 0)]
            if not data:
                return
        self._queued += len(data)
        pending = self._pending
        last = pending[-1] if pending else None
        if (
            last is not None
            and last[0] == stream
            and not self._skipped[stream]
            and len(last[1]) + len(data) <= CHUNK_BYTES
        ):
            last[1].extend(data)
        else:
            # A drop since the last piece of this stream is said before the next one.
            skipped, self._skipped[stream] = self._skipped[stream], 0
            for start in range(0, len(data), CHUNK_BYTES):
                pending.append((stream, bytearray(data[start : start + CHUNK_BYTES]), skipped))
                skipped = 0
        self._wake.set()

    def _close(self) -> None:
        self._closed = True
        for stream, skipped in self._skipped.items():
            if skipped and self.failure is None:
                # Nothing came after the drop to carry its count: an empty chunk does.
                self._pending.append((stream, bytearray(), skipped))
                self._skipped[stream] = 0
        self._wake.set()

    async def _deliver(self) -> None:
        while True:
            if not self._pending:
                if self._closed:
                    return
                await self._wake.wait()
                self._wake = anyio.Event()
                continue
            stream, data, skipped = self._pending.popleft()
            self._queued -= len(data)
            chunk = OutputChunk(stream, bytes(data), skipped)
            try:
                if self._is_async:
                    await self._callback(chunk)  # type: ignore[misc]
                else:
                    await anyio.to_thread.run_sync(self._callback, chunk)
            except Exception as exc:
                # Nothing more is delivered; the execution goes on to its end regardless.
                self.failure = exc
                self._pending.clear()
                self._queued = 0
                return


@asynccontextmanager
async def relaying(callback: OutputCallback | None) -> AsyncIterator[OutputRelay | None]:
    """An :class:`OutputRelay` delivering to ``callback`` for the duration of the block (None
    without one). On a normal exit every queued chunk is delivered before the block ends, and
    an exception the callback raised is raised then."""
    if callback is None:
        yield None
        return
    relay = OutputRelay(callback)
    async with anyio.create_task_group() as delivery:
        delivery.start_soon(relay._deliver)
        try:
            yield relay
        finally:
            relay._close()
    if relay.failure is not None:
        raise relay.failure


def _is_async(callback: object) -> bool:
    if inspect.iscoroutinefunction(callback):
        return True
    call = getattr(callback, "__call__", None)  # noqa: B004 - an object with async __call__
    return call is not None and inspect.iscoroutinefunction(call)
