"""Capture cap and preview budget: head and tail kept, the middle counted exactly."""

from __future__ import annotations

import pytest

from psych_sandbox_core._output.capture import StreamCapture, make_preview, omission_marker

from ..conftest import run


def fed(data: bytes, cap: int, chunk: int = 7) -> StreamCapture:
    capture = StreamCapture(cap)
    for start in range(0, len(data), chunk):
        capture.feed(data[start : start + chunk])
    return capture


def test_capture_keeps_head_and_tail_within_the_cap() -> None:
    data = b"".join(b"line %04d\n" % i for i in range(1000))
    for chunk in (1, 7, 4096, len(data)):
        capture = fed(data, 100, chunk)
        assert capture.head == data[:50] and capture.tail == data[-50:]
        assert capture.captured_bytes == 100
        assert capture.total_bytes == len(data)
        assert capture.dropped_bytes == len(data) - 100
        assert capture.dropped_lines == data[50:-50].count(b"\n")
        assert capture.total_lines == 1000


def test_capture_that_fits_keeps_everything() -> None:
    capture = fed(b"abc\ndef", 100)
    assert capture.data == b"abc\ndef" and not capture.truncated
    assert capture.total_lines == 2
    preview = make_preview(capture, 100)
    assert preview.text == "abc\ndef" and preview.omitted_bytes == 0


def test_preview_is_a_deterministic_head_and_tail_with_counts() -> None:
    data = b"".join(b"row %d\n" % i for i in range(500))
    capture = fed(data, 1000)
    preview = make_preview(capture, 100)
    assert preview == make_preview(fed(data, 1000, 13), 100)
    head, _, tail = preview.text.partition(
        omission_marker(preview.omitted_bytes, preview.omitted_lines)
    )
    assert data.startswith(head.encode()) and data.endswith(tail.encode())
    assert preview.shown_bytes == len(head.encode()) + len(tail.encode()) == 100
    assert preview.omitted_bytes == len(data) - 100
    assert preview.omitted_lines == data.count(b"\n") - head.count("\n") - tail.count("\n")


def test_preview_of_captured_bytes_under_budget_but_truncated_still_marks_gap() -> None:
    capture = fed(b"x" * 1000, 10)
    preview = make_preview(capture, 100)
    assert preview.shown_bytes == 10 and preview.omitted_bytes == 990
    assert "[... 990 bytes, 0 lines omitted ...]" in preview.text


def test_preview_never_tears_a_character() -> None:
    data = "é€😀".encode() * 200
    for budget in range(1, 40):
        preview = make_preview(fed(data, 4000), budget)
        assert "\ufffd" not in preview.text
        assert preview.shown_bytes <= budget
    capture = fed(data, 33)  # capture cuts mid-character too
    assert "\ufffd" not in make_preview(capture, 20).text


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # both loops drain in the conformance suite
async def test_result_reports_captured_shown_and_dropped(anyio_backend: str) -> None:
    result = await run(
        "import sys\nfor i in range(100000): sys.stdout.write('%06d\\n' % i)",
        stdout_bytes=4096,
    )
    info = result.stdout_info
    assert result.error is None
    assert info.total_bytes == 700000 and info.total_lines == 100000
    assert info.captured_bytes == 4096 and info.dropped_bytes == 700000 - 4096
    assert info.shown_bytes <= 4096
    assert info.omitted_bytes == info.total_bytes - info.shown_bytes
    assert result.stdout.startswith("000000\n") and result.stdout.endswith("099999\n")
    assert f"[... {info.omitted_bytes} bytes, {info.omitted_lines} lines omitted ...]" in (
        result.stdout
    )
