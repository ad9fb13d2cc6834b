"""The stream reader, without a network: ceilings on the bytes as fed, and the loop handed
back while a hostile chunk of tiny lines is parsed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from psych_sandbox_remote.stream import (
    LINES_BETWEEN_CHECKPOINTS,
    LineSplitter,
    StreamCeilings,
    StreamCeilingSpent,
    lines_of,
)


def test_a_line_is_refused_before_it_passes_its_ceiling() -> None:
    splitter = LineSplitter(StreamCeilings(line_bytes=100))
    assert splitter.feed(b"x" * 60) == []
    with pytest.raises(StreamCeilingSpent) as caught:
        splitter.feed(b"x" * 41)
    assert caught.value.ceiling == "line_bytes"


def test_lines_split_across_chunks_and_within_them() -> None:
    splitter = LineSplitter(StreamCeilings())
    assert splitter.feed(b'{"a":') == []
    assert splitter.feed(b'1}\n{"b":2}\n\n{"c"') == [b'{"a":1}', b'{"b":2}']
    assert splitter.blank_lines_seen == 1
    with pytest.raises(StreamCeilingSpent) as caught:
        splitter.end()
    assert caught.value.ceiling == "cut_short"


@pytest.mark.parametrize(
    ("ceilings", "chunk", "spent"),
    [
        (StreamCeilings(stream_bytes=1000), b"{}\n" * 400, "stream_bytes"),
        (StreamCeilings(lines=10), b"{}\n" * 11, "lines"),
        (StreamCeilings(blank_lines=10), b"\n" * 11, "blank_lines"),
        (StreamCeilings(blank_lines=10), b" \n" * 11, "blank_lines"),
    ],
)
def test_each_ceiling_names_itself(ceilings: StreamCeilings, chunk: bytes, spent: str) -> None:
    with pytest.raises(StreamCeilingSpent) as caught:
        LineSplitter(ceilings).feed(chunk)
    assert caught.value.ceiling == spent


@pytest.mark.anyio
async def test_the_reader_hands_the_loop_back_within_one_chunk() -> None:
    lines = 20 * LINES_BETWEEN_CHECKPOINTS

    async def one_chunk() -> AsyncIterator[bytes]:
        # Everything at once, without awaiting: only the reader's own checkpoints let other
        # tasks (the wall-clock timer among them) run while it parses.
        yield b"{}\n" * lines

    turns = 0
    done = False

    async def other_task() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(other_task)
        await anyio.lowlevel.checkpoint()
        before = turns
        count = 0
        async for _ in lines_of(one_chunk(), LineSplitter(StreamCeilings()), stall_seconds=5):
            count += 1
        done = True
    assert count == lines
    assert turns - before >= lines // LINES_BETWEEN_CHECKPOINTS - 1
