"""Capturing a child's stdout and stderr, and previewing them for the model.

Two numbers per stream answer two questions. The *capture cap* bounds what this process
holds at all: a :class:`StreamCapture` keeps the first and the last bytes of the stream
(a head and a ring-buffered tail, together never more than the cap) and keeps draining past
it, so the child never blocks on a full pipe. The *preview budget* bounds what reaches the
model: :func:`make_preview` cuts a deterministic head and tail out of what was captured and
says how many bytes and lines were left out between them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from anyio import Event
from anyio.abc import ByteReceiveStream
from pydantic import BaseModel, ConfigDict, Field

#: How much one receive asks for. Large enough that a flood costs few wake-ups, small enough
#: that one chunk is a negligible addition to the cap in memory.
READ_CHUNK = 256 * 1024


class StreamCapture:
    """Holds at most ``cap`` bytes of a stream: its head and its tail, and counts the rest.

    Half of the cap (rounded up) is the head, the other half a tail that always holds the
    most recent bytes. While the stream fits in the cap nothing is lost and the two halves
    join seamlessly; past it, the middle is counted (bytes and newlines) but not kept.
    """

    def __init__(
        self,
        cap: int,
        end_marker: bytes | None = None,
        listener: Callable[[bytes], None] | None = None,
    ) -> None:
        if cap < 0:
            raise ValueError("the capture cap cannot be negative")
        if end_marker is not None and not end_marker:
            raise ValueError("an end marker cannot be empty")
        self.cap = cap
        #: The child writes this after the program ended: what precedes it is the program's
        #: output, what follows was written by something it left behind (dropped, counted).
        self.end_marker = end_marker
        self.marker_seen = False
        self.after_end_bytes = 0
        #: Bytes that may be the start of the marker, held back until the next chunk says.
        self._held = b""
        self.head_cap = (cap + 1) // 2
        self.tail_cap = cap - self.head_cap
        self._head = bytearray()
        self._tail = bytearray()
        self.total_bytes = 0
        self.total_newlines = 0
        #: The last byte seen, to count a final line that has no newline.
        self._last = b""
        #: Shown each piece of program output as it is kept (streaming.py); never waits.
        self.listener = listener

    def feed(self, data: bytes) -> None:
        marker = self.end_marker
        if marker is None:
            self._keep(data)
            return
        if self.marker_seen:
            self.after_end_bytes += len(data)
            return
        data = self._held + data
        found = data.find(marker)
        if found >= 0:
            self._held = b""
            self.marker_seen = True
            self.after_end_bytes += len(data) - found - len(marker)
            self._keep(data[:found])
            return
        # The marker may straddle chunks: hold back the longest tail that starts it.
        hold = min(len(data), len(marker) - 1)
        while hold and not data.endswith(marker[:hold]):
            hold -= 1
        self._held = data[len(data) - hold :]
        self._keep(data[: len(data) - hold])

    def end(self) -> None:
        """The stream ended: bytes held back as a possible marker start were output."""
        held, self._held = self._held, b""
        self._keep(held)

    def passed_unseen(self, byte_count: int, newline_count: int) -> None:
        """Count ``byte_count`` bytes (``newline_count`` newlines) of the stream that went by
        between its head and its tail without reaching this host (a relay that forwards
        only what a capture keeps): dropped, as if read and not kept."""
        byte_count = max(0, byte_count)
        self.total_bytes += byte_count
        self.total_newlines += min(max(0, newline_count), byte_count)

    def _keep(self, data: bytes) -> None:
        if not data:
            return
        self.total_bytes += len(data)
        self.total_newlines += data.count(b"\n")
        self._last = data[-1:]
        if self.listener is not None:
            self.listener(data)
        room = self.head_cap - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if not data or self.tail_cap == 0:
            return
        if len(data) >= self.tail_cap:
            self._tail = bytearray(data[-self.tail_cap :])
        else:
            self._tail += data
            excess = len(self._tail) - self.tail_cap
            if excess > 0:
                del self._tail[:excess]

    @property
    def head(self) -> bytes:
        return bytes(self._head)

    @property
    def tail(self) -> bytes:
        return bytes(self._tail)

    @property
    def captured_bytes(self) -> int:
        return len(self._head) + len(self._tail)

    @property
    def dropped_bytes(self) -> int:
        """Bytes between the head and the tail that were counted but not kept."""
        return self.total_bytes - self.captured_bytes

    @property
    def dropped_lines(self) -> int:
        """Newlines among the dropped bytes."""
        return self.total_newlines - self._head.count(b"\n") - self._tail.count(b"\n")

    @property
    def total_lines(self) -> int:
        return self.total_newlines + (1 if self._last not in (b"", b"\n") else 0)

    @property
    def truncated(self) -> bool:
        return self.dropped_bytes > 0

    @property
    def data(self) -> bytes:
        """What was kept: the whole stream when it fit, else head and tail joined."""
        return bytes(self._head) + bytes(self._tail)

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")

    async def drain(self, stream: ByteReceiveStream, marked: Event | None = None) -> None:
        """Read until EOF, keeping what fits: the child never blocks on a full pipe.
        ``marked`` is set once the end marker went by (reading goes on, to count)."""
        from anyio import BrokenResourceError, ClosedResourceError, EndOfStream

        try:
            while True:
                self.feed(await stream.receive(READ_CHUNK))
                if marked is not None and self.marker_seen:
                    marked.set()
        except (EndOfStream, BrokenResourceError, ClosedResourceError):
            return
        finally:
            self.end()


@dataclass(frozen=True)
class Preview:
    """What the model sees of one stream, and exactly what it does not."""

    text: str
    #: Bytes of the stream that the preview shows (head plus tail).
    shown_bytes: int
    #: Bytes between the shown head and tail, whether dropped at capture or cut here.
    omitted_bytes: int
    #: Newlines among the omitted bytes.
    omitted_lines: int


def omission_marker(omitted_bytes: int, omitted_lines: int) -> str:
    return f"\n[... {omitted_bytes} bytes, {omitted_lines} lines omitted ...]\n"


def make_preview(capture: StreamCapture, budget: int) -> Preview:
    """A deterministic head and tail of the captured bytes, at most ``budget`` bytes shown.

    The same bytes and budget give the same preview. Cuts are moved back to a UTF-8 character
    boundary so the preview never shows a torn character; the marker between the halves
    counts everything not shown, including what the capture cap already dropped.
    """
    return preview_of(
        capture.head, capture.tail, capture.dropped_bytes, capture.dropped_lines, budget
    )


def preview_of(head: bytes, tail: bytes, gap_bytes: int, gap_lines: int, budget: int) -> Preview:
    """:func:`make_preview` of a head and a tail with ``gap_bytes`` (``gap_lines`` newlines)
    already left out between them."""
    if gap_bytes == 0 and len(head) + len(tail) <= budget:
        whole = head + tail
        return Preview(whole.decode("utf-8", errors="replace"), len(whole), 0, 0)
    if gap_bytes == 0:
        # Everything was captured but exceeds the budget: cut from the whole.
        whole = head + tail
        head, tail = whole, b""
        head_budget = (budget + 1) // 2
        tail_budget = budget - head_budget
        cut_head = head[: _boundary(head, head_budget)]
        rest = head[len(cut_head) :]
        start = _tail_start(rest, tail_budget)
        shown_tail = rest[start:]
        omitted = rest[:start]
    else:
        head_budget = min(len(head), (budget + 1) // 2)
        tail_budget = min(len(tail), budget - head_budget)
        cut_head = head[: _boundary(head, head_budget)]
        start = _tail_start(tail, tail_budget)
        shown_tail = tail[start:]
        omitted = head[len(cut_head) :] + tail[:start]
    omitted_bytes = gap_bytes + len(omitted)
    omitted_lines = gap_lines + omitted.count(b"\n")
    text = (
        cut_head.decode("utf-8", errors="replace")
        + omission_marker(omitted_bytes, omitted_lines)
        + shown_tail.decode("utf-8", errors="replace")
    )
    return Preview(text, len(cut_head) + len(shown_tail), omitted_bytes, omitted_lines)


def _boundary(data: bytes, limit: int) -> int:
    """The largest cut <= limit that does not end inside a UTF-8 character."""
    cut = max(0, min(limit, len(data)))
    lead = cut - 1
    # Continuation bytes are 10xxxxxx; a character has at most three of them.
    while lead >= 0 and cut - lead <= 3 and data[lead] & 0xC0 == 0x80:
        lead -= 1
    if lead < 0:
        return cut
    first = data[lead]
    width = 1
    if first >> 5 == 0b110:
        width = 2
    elif first >> 4 == 0b1110:
        width = 3
    elif first >> 3 == 0b11110:
        width = 4
    return lead if lead + width > cut else cut


def _tail_start(data: bytes, budget: int) -> int:
    """Where a tail of at most ``budget`` bytes begins without splitting a character."""
    budget = max(0, min(budget, len(data)))
    start = len(data) - budget
    moved = 0
    while start < len(data) and moved < 4 and data[start] & 0xC0 == 0x80:
        start += 1
        moved += 1
    return start if moved < 4 else len(data) - budget


# ---------------------------------------------------------------- the deployment's settings

_KiB = 1024
_MiB = 1024 * _KiB
_Positive = Annotated[int, Field(gt=0)]


class OutputPolicy(BaseModel):
    """How output reaches the model and how it is kept (a profile's ``output`` table).

    The capture caps themselves are execution limits (``stdout_bytes``, ``stderr_bytes``).
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    #: Bytes of each stream the model sees: a head and a tail with the middle counted.
    preview_bytes: _Positive = 16 * _KiB
    #: Attachments up to this size are kept inline (in memory, with the run's record);
    #: larger ones go to the blob store.
    inline_bytes: _Positive = 16 * _KiB
    #: Fail with artifacts_unavailable rather than keep only a preview of something too large
    #: to keep inline when no blob store can hold it.
    require_preservation: bool = False
    #: Collect the files the program leaves in its workspace.
    collect_artifacts: bool = True
    #: Only collect under this folder of the workspace (relative); None collects everything.
    artifacts_folder: str | None = None
    #: Largest single artifact, and all artifacts of one execution together.
    artifact_bytes: _Positive = 8 * _MiB
    artifacts_total_bytes: _Positive = 32 * _MiB
    #: Most artifacts one execution may hand back.
    max_artifacts: _Positive = 256
    #: Offer programs the read_output binding: a later execution of the same tenant and run
    #: pages an earlier one's output (a truncated stdout, say) by its attachment handle.
    read_output: bool = False
