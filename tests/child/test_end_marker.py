"""The end marker a warm child writes after its program: recognised across chunk boundaries,
never shown, and what follows it dropped and counted."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from psych_sandbox_core._output.capture import StreamCapture
from psych_sandbox_core.protocol import ChildLimits, RunFrame

MARKER = b"<psych-sandbox-end:0123456789abcdef0123456789abcdef>"


def fed(chunks: list[bytes], cap: int = 1 << 20) -> StreamCapture:
    capture = StreamCapture(cap, MARKER)
    for chunk in chunks:
        capture.feed(chunk)
    return capture


@pytest.mark.parametrize("split", range(0, len(MARKER) + 1))
def test_the_marker_is_found_wherever_a_chunk_boundary_cuts_it(split: int) -> None:
    stream = b"hello\n" + MARKER + b"late"
    cut = len(b"hello\n") + split
    capture = fed([stream[:cut], stream[cut:]])
    assert capture.marker_seen
    assert capture.data == b"hello\n"
    assert capture.total_bytes == 6
    assert capture.after_end_bytes == 4


def test_one_byte_at_a_time() -> None:
    stream = b"a<psych" + MARKER + b"xyz"
    capture = fed([stream[i : i + 1] for i in range(len(stream))])
    assert capture.marker_seen and capture.data == b"a<psych"
    assert capture.after_end_bytes == 3


def test_a_prefix_that_is_not_the_marker_is_kept_at_the_end() -> None:
    capture = fed([b"out", MARKER[:10]])
    assert not capture.marker_seen
    assert capture.data == b"out"  # held back: may still become the marker
    capture.end()
    assert capture.data == b"out" + MARKER[:10]
    assert capture.after_end_bytes == 0


def test_without_a_marker_nothing_is_held_back() -> None:
    capture = StreamCapture(100)
    capture.feed(b"<psych-sandbox-end:")
    assert capture.data == b"<psych-sandbox-end:"


def test_after_the_marker_everything_is_counted_not_kept() -> None:
    capture = fed([b"x" + MARKER, b"y" * 1000, MARKER])
    assert capture.data == b"x"
    assert capture.after_end_bytes == 1000 + len(MARKER)


def test_the_run_frame_takes_only_a_printable_marker() -> None:
    limits = ChildLimits(
        cpu_seconds=None,
        memory_bytes=None,
        file_size_bytes=None,
        processes=None,
        return_value_bytes=1024,
    )
    frame = RunFrame(source="1", tools=[], limits=limits, end_marker=MARKER.decode())
    assert frame.end_marker == MARKER.decode()
    assert RunFrame(source="1", tools=[], limits=limits).end_marker is None
    for bad in ("short", "with space " * 3, "\n" * 20, "x" * 129):
        with pytest.raises(ValidationError):
            RunFrame(source="1", tools=[], limits=limits, end_marker=bad)
