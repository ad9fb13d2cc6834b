"""What a program sees and what comes back: top-level await, return values, line numbers,
traceback filtering, __future__ isolation and the program-side failure kinds."""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from psych_sandbox_core import ErrorKind, Sandbox
from psych_sandbox_core._engine import host
from psych_sandbox_core.protocol.limits import MAX_CHILD_FRAME_BYTES

from ..conftest import PROFILE, config, run

pytestmark = pytest.mark.anyio


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


async def test_prints_and_last_expression_value() -> None:
    result = await run("print('hello')\nimport sys\nprint('oops', file=sys.stderr)\n6 * 7\n")
    assert result.error is None
    assert result.stdout == "hello\n"
    assert result.stderr == "oops\n"
    assert result.return_value == 42


async def test_top_level_return_wins_over_later_statements() -> None:
    result = await run(
        src("""
        x = [1, 2]
        if x:
            return {"first": x[0], "nested": [None, True, 1.5, "s"]}
        99
    """)
    )
    assert result.error is None
    assert result.return_value == {"first": 1, "nested": [None, True, 1.5, "s"]}


async def test_no_value_when_last_statement_is_not_an_expression() -> None:
    result = await run("x = 5\n")
    assert result.error is None and result.return_value is None


async def test_top_level_await_async_for_and_async_with() -> None:
    result = await run(
        src("""
        import asyncio
        import contextlib

        async def numbers():
            for i in range(3):
                await asyncio.sleep(0)
                yield i

        @contextlib.asynccontextmanager
        async def scope():
            yield 10

        total = 0
        async for n in numbers():
            total += n
        async with scope() as base:
            total += base
        await asyncio.sleep(0)
        [x async for x in numbers()], total
    """)
    )
    assert result.error is None, result.error
    assert result.return_value == [[0, 1, 2], 13]


async def test_module_names_behave_like_a_script() -> None:
    result = await run(
        src("""
        counter = 0
        def bump():
            global counter
            counter += 1
        bump(); bump()
        class Point:
            scale = 2
        y: int = counter * Point.scale
        z: int
        [counter, y, __name__, "z" in globals()]
    """)
    )
    assert result.error is None, result.error
    assert result.return_value == [2, 4, "__main__", False]


# ---------------------------------------------------------------- line numbers


@pytest.mark.parametrize(
    "prefix",
    [
        "",
        "# a comment\n\n\n",
        '"""A docstring."""\n',
        "from __future__ import annotations\n# then a comment\n",
        "import asyncio\nawait asyncio.sleep(0)\n",
    ],
    ids=["bare", "comments", "docstring", "future", "async"],
)
async def test_traceback_line_numbers_are_the_programs_lines(prefix: str) -> None:
    body = src("""
        def helper(n):
            return 10 / n

        value = 1
        helper(value - 1)
    """)
    source = prefix + body
    lines = source.splitlines()
    raising = lines.index("    return 10 / n") + 1
    calling = lines.index("helper(value - 1)") + 1
    result = await run(source)
    error = result.error
    assert error is not None and error.kind is ErrorKind.EXCEPTION
    assert error.exception_type == "ZeroDivisionError"
    assert error.line == raising
    frames = re.findall(r'File "([^"]*)", line (\d+)', error.traceback or "")
    assert frames == [("<program>", str(calling)), ("<program>", str(raising))]
    # The source line shown under each frame is the model's own text.
    assert "helper(value - 1)" in (error.traceback or "")


async def test_traceback_hides_the_bootstrap_and_the_event_loop() -> None:
    result = await run(
        src("""
        import asyncio
        import json

        async def inner():
            await asyncio.sleep(0)
            json.loads("{not json")

        await asyncio.gather(inner())
    """)
    )
    error = result.error
    assert error is not None and error.exception_type == "JSONDecodeError"
    files = set(re.findall(r'File "([^"]*)"', error.traceback or ""))
    # Only the model's frames: no bootstrap, no asyncio, no json internals.
    assert files == {"<program>"}
    assert error.line == 6


async def test_chained_exceptions_are_filtered_too() -> None:
    result = await run(
        src("""
        import json
        try:
            json.loads("nope")
        except ValueError as exc:
            raise RuntimeError("wrapped") from exc
    """)
    )
    error = result.error
    assert error is not None and error.exception_type == "RuntimeError"
    text = error.traceback or ""
    assert "direct cause" in text and "JSONDecodeError" in text
    assert set(re.findall(r'File "([^"]*)"', text)) == {"<program>"}
    assert error.line == 5


@pytest.mark.parametrize(
    ("source", "line", "column"),
    [
        ("x = 1\ny = 2\nif x:\n    z = (\n", 4, 9),
        ("a = 1\nb = a +\n", 2, 8),
        ("x = 1\nyield x\n", 2, 1),
        ("from __future__ import braces\n", 1, 1),
    ],
    ids=["unclosed", "dangling-operator", "top-level-yield", "future-braces"],
)
async def test_syntax_error_reports_the_programs_line_and_column(
    source: str, line: int, column: int
) -> None:
    result = await run(source)
    error = result.error
    assert error is not None and error.kind is ErrorKind.EXCEPTION
    assert error.exception_type == "SyntaxError"
    assert (error.line, error.column) == (line, column)
    assert "<program>" in (error.traceback or "")
    # Nothing ran: a syntax error is found before any statement executes.
    assert result.stdout == ""


# ---------------------------------------------------------------- __future__ isolation

ANNOTATIONS_PROBE = src("""
    def f(x: int) -> list:
        return x
    f.__annotations__["x"] is int
""")


async def test_bootstrap_future_imports_do_not_leak_into_the_program(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = host.bootstrap_source()
    poisoned = "from __future__ import annotations\n" + original
    monkeypatch.setattr(host, "bootstrap_source", lambda: poisoned)
    # The poisoned bootstrap is really the one that ran: its annotations are strings.
    result = await run(
        "import sys\ntype(getattr(sys.modules['__main__'], 'annotations', None)).__name__"
    )
    assert result.error is None and result.return_value == "_Feature"
    result = await run(ANNOTATIONS_PROBE)
    assert result.error is None, result.error
    assert result.return_value is True, "the bootstrap's __future__ flags reached the program"


async def test_a_programs_own_future_import_applies_to_it() -> None:
    result = await run("from __future__ import annotations\n" + ANNOTATIONS_PROBE)
    assert result.error is None
    assert result.return_value is False  # its own future import stringifies annotations


# ---------------------------------------------------------------- return values


@pytest.mark.parametrize(
    ("source", "type_name"),
    [
        ("{1, 2}", "set"),
        ("object()", "object"),
        ("float('nan')", "float"),
        ("{'k': b'bytes'}", "dict"),
    ],
)
async def test_a_value_that_is_not_json_is_invalid_output(source: str, type_name: str) -> None:
    result = await run(source)
    error = result.error
    assert error is not None and error.kind is ErrorKind.INVALID_OUTPUT
    assert f"type {type_name}" in error.message
    assert result.return_value is None


async def test_a_value_over_the_cap_is_output_limit() -> None:
    result = await run("'x' * 5000", return_value_bytes=4096)
    error = result.error
    assert error is not None and error.kind is ErrorKind.OUTPUT_LIMIT
    assert "4096" in error.message and "5002" in error.message
    assert result.return_value is None
    ok = await run("'x' * 4094", return_value_bytes=4096)
    assert ok.error is None and ok.return_value == "x" * 4094


async def test_largest_allowed_return_value_survives_worst_case_escaping() -> None:
    from psych_sandbox_core.protocol.limits import max_return_value_bytes

    cap = max_return_value_bytes()
    # Each control character costs six bytes as JSON; inside value_json it is escaped again.
    count = (cap - 2) // 6
    result = await run(f"'\\x01' * {count}", return_value_bytes=cap, wall_seconds=60.0)
    assert result.error is None, result.error
    assert result.return_value == "\x01" * count
    assert cap * 6 < MAX_CHILD_FRAME_BYTES


async def test_system_exit_zero_is_success_and_nonzero_is_an_exception() -> None:
    ok = await run("print('bye')\nraise SystemExit(0)")
    assert ok.error is None and ok.stdout == "bye\n"
    failed = await run("import sys\nsys.exit(3)")
    assert failed.error is not None and failed.error.kind is ErrorKind.EXCEPTION
    assert failed.error.exception_type == "SystemExit"


async def test_memory_error_is_memory_limit() -> None:
    result = await run("x = bytearray(2 * 1024 ** 3)", memory_bytes=256 * 1024 * 1024)
    error = result.error
    assert error is not None and error.kind is ErrorKind.MEMORY_LIMIT
    assert error.line == 1


async def test_output_is_captured_separately_and_capped() -> None:
    result = await run(
        "import sys\nsys.stdout.write('o' * 10000)\nsys.stderr.write('e' * 300)\n",
        stdout_bytes=1000,
        stderr_bytes=100,
    )
    assert result.error is None
    # What reaches the model is a preview of what was captured; the counts are exact.
    assert result.stdout.startswith("o" * 100) and "e" * 10 not in result.stdout
    assert result.stderr.startswith("e" * 50) and "o" * 10 not in result.stderr
    assert result.stdout_info.total_bytes == 10000
    assert result.stdout_info.captured_bytes == 1000
    assert result.stdout_info.dropped_bytes == 9000
    assert result.stderr_info.total_bytes == 300


async def test_printed_frames_are_just_output() -> None:
    forged = json.dumps(
        {
            "type": "result",
            "outcome": "returned",
            "value_json": "666",
            "error": None,
            "detail": None,
        }
    )
    result = await run(f"print({forged!r})\n1")
    assert result.error is None and result.return_value == 1
    assert result.stdout.strip() == forged


async def test_nothing_survives_between_runs() -> None:
    async with Sandbox(config()) as sandbox:
        first = await sandbox.run("import builtins\nbuiltins.LEFTOVER = 1\n", profile=PROFILE)
        second = await sandbox.run(
            "import builtins\nhasattr(builtins, 'LEFTOVER')", profile=PROFILE
        )
    assert first.error is None and second.return_value is False
