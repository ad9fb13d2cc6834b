"""Streaming: a running program's output reaches ``on_output`` while it runs, a callback
that is stuck never holds up the child, the result is the same with or without one, and the
CLI shows output as it arrives."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import anyio
import pytest
from psych_sandbox_testing.cli_run import cli_at_ready

from psych_sandbox_core import FunctionBindings, OutputChunk, Sandbox
from psych_sandbox_core._output.streaming import QUEUE_BYTES

from ..conftest import PROFILE, config, marker, pids_with

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # trio: the stuck callback's test
async def test_output_reaches_the_callback_while_the_program_runs_and_the_result_is_kept(
    anyio_backend: str,
) -> None:
    chunks: list[OutputChunk] = []
    first_line = anyio.Event()

    async def on_output(chunk: OutputChunk) -> None:
        chunks.append(chunk)
        if b"".join(c.data for c in chunks if c.stream == "stdout").startswith(b"one\n"):
            first_line.set()

    async def seen() -> str:
        # Answered only once the callback had the line printed before the call: output
        # delivered only at the end would leave the program waiting here for ever.
        await first_line.wait()
        return "seen"

    source = (
        "import sys\nprint('one')\nsys.stderr.write('err\\n')\n"
        "print(await seen())\nprint('x' * 5000)\n'done'"
    )
    async with Sandbox(config(stdout_bytes=1000)) as sandbox:
        result = await sandbox.run(
            source, profile=PROFILE, bindings=FunctionBindings({"seen": seen}), on_output=on_output
        )
        plain = await sandbox.run(
            source, profile=PROFILE, bindings=FunctionBindings({"seen": seen})
        )
    assert result.ok and result.return_value == "done", result.error
    streamed = b"".join(c.data for c in chunks if c.stream == "stdout")
    assert streamed == b"one\nseen\n" + b"x" * 5000 + b"\n"
    assert b"".join(c.data for c in chunks if c.stream == "stderr") == b"err\n"
    assert all(c.skipped_bytes == 0 for c in chunks)
    # The capture cap and the preview are the same as without a callback.
    assert result.stdout_info.dropped_bytes and result.stdout_info.total_bytes == len(streamed)
    # (The attachment handle names each execution's own copy.)
    for stream in ("stdout_info", "stderr_info"):
        assert getattr(result, stream).model_copy(update={"attachment": None}) == getattr(
            plain, stream
        ).model_copy(update={"attachment": None})
    assert (result.stdout, result.stderr) == (plain.stdout, plain.stderr)


@pytest.mark.parametrize("anyio_backend", ["trio"])  # asyncio: the test above
async def test_a_stuck_callback_never_holds_up_the_child(anyio_backend: str) -> None:
    release = threading.Event()
    chunks: list[OutputChunk] = []

    def on_output(chunk: OutputChunk) -> None:  # called in a worker thread
        chunks.append(chunk)
        release.wait()

    def finished() -> None:
        # Reached only if the child could write all its output while the callback was stuck.
        release.set()

    total = 4 * QUEUE_BYTES
    source = f"import sys\nsys.stdout.write('y' * {total})\nsys.stdout.flush()\nawait finished()\n"
    async with Sandbox(config()) as sandbox:
        result = await sandbox.run(
            source,
            profile=PROFILE,
            bindings=FunctionBindings({"finished": finished}),
            on_output=on_output,
        )
    assert result.ok, result.error
    assert result.stdout_info.total_bytes == total
    # What the callback could not take was dropped and said, never held: every byte is
    # either delivered or counted, and at most the queue's bound waited behind the stuck call.
    delivered = sum(len(c.data) for c in chunks)
    assert delivered + sum(c.skipped_bytes for c in chunks) == total
    assert delivered <= len(chunks[0].data) + QUEUE_BYTES
    assert set(b"".join(c.data for c in chunks)) == {ord("y")}


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_callback_that_raises_is_raised_after_the_execution_ended(
    anyio_backend: str,
) -> None:
    mark = marker()

    def on_output(chunk: OutputChunk) -> None:
        raise RuntimeError("the callback broke")

    async with Sandbox(config()) as sandbox:
        with pytest.raises(RuntimeError, match="the callback broke"):
            await sandbox.run(f"print({mark!r})\n{mark!r}", profile=PROFILE, on_output=on_output)
    assert pids_with(mark) == []


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_cli_shows_output_as_it_arrives(tmp_path: Path, anyio_backend: str) -> None:
    files, tmpdir = tmp_path / "files", tmp_path / "tmp"
    files.mkdir()
    tmpdir.mkdir()
    # The program prints, then blocks until the CLI is interrupted.
    cli = await cli_at_ready("print('first line')\n", config(), PROFILE, files, tmpdir)
    try:
        assert cli.stdout is not None
        # Had the output been held until the end, this line would come only once the wall
        # clock ended the run, and the report below would say timeout, not cancelled.
        line = await anyio.to_thread.run_sync(cli.stdout.readline)
        assert line == "  | first line\n"
        cli.send_signal(signal.SIGINT)
        out, err = await anyio.to_thread.run_sync(cli.communicate)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.communicate()
    assert "\u25c6 failed: cancelled: " in out, (out, err)
    assert "first line" not in out  # shown once, as it arrived


def test_live_output_shows_whole_lines_under_the_gutter_and_steers_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from psych_sandbox_core.cli import render as cli_render

    monkeypatch.setattr(cli_render, "LIVE_STREAM_BYTES", 40)
    live = cli_render.LiveOutput()
    # A line and a character split across chunks, a forged report line, a control; stdout
    # past the bound, stderr with a drop.
    for chunk in (
        OutputChunk("stdout", b"caf\xc3"),
        OutputChunk("stdout", b"\xa9 ok\n\xe2\x97\x86 returned: 1\x1b[2J\npart"),
        OutputChunk("stderr", b"err\n"),
        OutputChunk("stdout", b"ial end\nnot shown\n"),
        OutputChunk("stderr", b"late\n", skipped_bytes=7),
        OutputChunk("stdout", b"nor this\n"),
    ):
        live(chunk)
    live.finish()
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "  | café ok",
        "  | \\u25c6 returned: 1\\x1b[2J",
        "  | partial end",
        "\u25c6 stdout: more than 40 bytes; the rest is not shown as it arrives",
    ]
    assert err.splitlines() == [
        "  | err",
        "\u25c6 stderr: 7 bytes came faster than they could be shown",
        "  | late",
    ]
    # Neither was shown whole: the report shows both again, as their previews.
    assert live.incomplete == {"stdout", "stderr"}
