"""Reading a service's NDJSON stream as hostile input.

A service is not infrastructure: the limits it was sent are a request to it, not a property of
it. So the bytes are metered as the HTTP stack hands them over, before any line is assembled:
a line longer than the per-event ceiling is refused while it arrives (a line that never ends
is never allocated), the whole stream has a byte ceiling of its own, and lines and blank
lines are counted against separate ceilings, since a stream can stay inside its bytes and still
be millions of (empty) lines. The failure names whichever ceiling was spent. Parsing is
synchronous, so the reader hands the event loop back every few hundred lines: a hostile chunk
of tiny lines must not disable the wall-clock timeout that is to end it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

import anyio

from .wire import MAX_EVENT_BYTES

#: Lines handed out between two yields to the event loop.
LINES_BETWEEN_CHECKPOINTS = 256


@dataclass(frozen=True)
class StreamCeilings:
    """What one execution's stream may weigh."""

    #: Longest line, newline excluded.
    line_bytes: int = MAX_EVENT_BYTES
    #: Every byte of the stream, newlines included.
    stream_bytes: int = 1024 * 1024 * 1024
    #: Lines of any kind.
    lines: int = 4_000_000
    #: Empty lines (the service never sends one; a few are tolerated).
    blank_lines: int = 1024


class StreamCeilingSpent(Exception):
    """The service's stream passed one of its ceilings; ``ceiling`` names which."""

    def __init__(self, ceiling: str, message: str) -> None:
        super().__init__(message)
        self.ceiling = ceiling


class LineSplitter:
    """Sans-I/O: bytes in, complete lines out, every ceiling checked on the bytes as fed."""

    def __init__(self, ceilings: StreamCeilings) -> None:
        self.ceilings = ceilings
        self._partial = bytearray()
        self.bytes_seen = 0
        self.lines_seen = 0
        self.blank_lines_seen = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        ceilings = self.ceilings
        self.bytes_seen += len(chunk)
        if self.bytes_seen > ceilings.stream_bytes:
            raise StreamCeilingSpent(
                "stream_bytes",
                f"the service's stream passed its byte ceiling ({ceilings.stream_bytes} bytes)",
            )
        lines: list[bytes] = []
        start = 0
        while True:
            index = chunk.find(b"\n", start)
            if index < 0:
                break
            if len(self._partial) + index - start > ceilings.line_bytes:
                raise self._too_long()
            line = (
                bytes(self._partial) + chunk[start:index] if self._partial else (chunk[start:index])
            )
            self._partial.clear()
            start = index + 1
            self.lines_seen += 1
            if self.lines_seen > ceilings.lines:
                raise StreamCeilingSpent(
                    "lines", f"the service's stream passed its line ceiling ({ceilings.lines})"
                )
            if not line.strip():
                self.blank_lines_seen += 1
                if self.blank_lines_seen > ceilings.blank_lines:
                    raise StreamCeilingSpent(
                        "blank_lines",
                        "the service's stream passed its blank-line ceiling "
                        f"({ceilings.blank_lines})",
                    )
                continue
            lines.append(line)
        rest = len(chunk) - start
        # Checked before the rest is kept: a line that never ends is cut off here.
        if len(self._partial) + rest > ceilings.line_bytes:
            raise self._too_long()
        self._partial += chunk[start:]
        return lines

    def end(self) -> None:
        """The stream ended; a line cut short is a malformed stream."""
        if self._partial:
            raise StreamCeilingSpent(
                "cut_short", "the service's stream ended in the middle of a line"
            )

    def _too_long(self) -> StreamCeilingSpent:
        return StreamCeilingSpent(
            "line_bytes",
            f"the service sent a line longer than {self.ceilings.line_bytes} bytes "
            "(its per-event ceiling)",
        )


async def lines_of(
    chunks: AsyncIterator[bytes], splitter: LineSplitter, *, stall_seconds: float
) -> AsyncGenerator[bytes, None]:
    """The complete lines of a byte stream, yielding to the event loop every
    LINES_BETWEEN_CHECKPOINTS lines whatever the chunks hold. TimeoutError when no byte
    arrives for ``stall_seconds`` (a byte-a-second drip is held to the whole stream's
    ceilings and to the execution's wall clock instead)."""
    since_checkpoint = 0
    while True:
        with anyio.fail_after(stall_seconds):
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
        for line in splitter.feed(chunk):
            yield line
            since_checkpoint += 1
            if since_checkpoint >= LINES_BETWEEN_CHECKPOINTS:
                since_checkpoint = 0
                await anyio.lowlevel.checkpoint()
        # Blank lines are dropped by the splitter, so a chunk of them yields nothing above:
        # one checkpoint per chunk as well.
        await anyio.lowlevel.checkpoint()
    splitter.end()
