"""Honest programs at the edges of what a frame can carry get a program failure they can act
on, never a protocol error meant for forgers, nor an exception out of run()."""

from __future__ import annotations

import pytest

from psych_sandbox_core import ErrorKind, FunctionBindings, Sandbox
from psych_sandbox_core.cli import main as cli_main

from ..conftest import PROFILE, config, run

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize("code", [152, 134, 137])
async def test_an_exit_code_above_128_is_not_mistaken_for_a_signal(code: int) -> None:
    result = await run(f"import os\nos._exit({code})")
    assert result.error is not None
    assert result.error.kind is ErrorKind.WORKER_EXIT
    assert f"status {code}" in result.error.message


async def test_a_real_abort_is_abort() -> None:
    result = await run("import os\nos.abort()")
    assert result.error is not None and result.error.kind is ErrorKind.ABORT


@pytest.mark.parametrize(
    ("source", "type_name"),
    [
        ("x = 1\x00", "ValueError"),
        ("-" * 100_000 + "1", "SyntaxError"),
    ],
)
async def test_a_program_the_compiler_refuses_is_an_exception(source: str, type_name: str) -> None:
    result = await run(source)
    assert result.error is not None and result.error.kind is ErrorKind.EXCEPTION
    assert result.error.exception_type == type_name


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("v = []\nfor _ in range(150):\n    v = [v]\nv", "nested deeper"),
        ("'\\ud800'", "lone surrogate"),
    ],
)
async def test_a_value_no_frame_can_carry_is_invalid_output(source: str, needle: str) -> None:
    result = await run(source)
    assert result.error is not None and result.error.kind is ErrorKind.INVALID_OUTPUT
    assert needle in result.error.message


@pytest.mark.parametrize(
    ("source", "needle"),
    [("x" * (5 * 1024 * 1024), "characters"), ("y = '\ud800'", "lone surrogate")],
)
async def test_a_program_text_no_frame_can_carry_is_refused_as_data(
    source: str, needle: str, tmp_path: object
) -> None:
    result = await run(source)
    # Refused before it ran: its own kind, not an exception the program never raised.
    assert result.error is not None and result.error.kind is ErrorKind.PROGRAM_REJECTED
    assert needle in result.error.message and "nothing was run" in result.error.message
    assert result.error.traceback is None and result.error.exception_type is None
    assert "traceback" not in result.error.guidance
    assert result.stdout == "" and result.return_value is None


async def test_arguments_no_frame_can_carry_fail_in_the_program_without_spending_a_call() -> None:
    program = (
        "deep = []\n"
        "for _ in range(150):\n"
        "    deep = [deep]\n"
        "outcomes = []\n"
        "for arguments in ({'x': deep}, {'x': '\\ud800'}):\n"
        "    try:\n"
        "        await echo(**arguments)\n"
        "    except TypeError as exc:\n"
        "        outcomes.append('TypeError')\n"
        "try:\n"
        "    await echo(x='a' * (20 * 1024 * 1024))\n"
        "except ToolError as exc:\n"
        "    outcomes.append(exc.kind)\n"
        "outcomes.append(await echo(x=1))\n"
        "outcomes"
    )
    tools = FunctionBindings({"echo": lambda x: x})
    async with Sandbox(config()) as sandbox:
        result = await sandbox.run(program, profile=PROFILE, bindings=tools)
    assert result.error is None, result.error
    assert result.return_value == ["TypeError", "TypeError", "budget_exhausted", 1]
    # Only the last call reached the host.
    assert [call.name for call in result.calls] == ["echo"]


async def test_a_tool_named_like_a_builtin_does_not_hide_it() -> None:
    tools = FunctionBindings({"print": lambda text: f"tool:{text}"})
    async with Sandbox(config()) as sandbox:
        result = await sandbox.run(
            "print('still the builtin')\nawait call_tool('print', {'text': 'x'})",
            profile=PROFILE,
            bindings=tools,
        )
    assert result.error is None, result.error
    assert result.stdout == "still the builtin\n"
    assert result.return_value == "tool:x"


@pytest.mark.parametrize("value", ["inf", "1e400", "nan", "0", "-1"])
def test_cli_refuses_a_timeout_that_is_not_a_finite_positive_number(
    value: str, tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["run", "-", "--timeout", value]) == 2


async def test_a_blocking_plain_function_tool_does_not_stall_other_executions() -> None:
    import threading

    import anyio

    other_finished = threading.Event()

    def wait_for_the_other() -> bool:
        # Blocks this tool's caller; if it blocked the event loop, the other execution could
        # never finish and this would give up after ten seconds.
        return other_finished.wait(10)

    tools = FunctionBindings({"wait_for_the_other": wait_for_the_other})
    results = {}
    async with Sandbox(config()) as sandbox:

        async def blocked() -> None:
            results["blocked"] = await sandbox.run(
                "await wait_for_the_other()", profile=PROFILE, bindings=tools
            )

        async def other() -> None:
            results["other"] = await sandbox.run("print('done')", profile=PROFILE)
            other_finished.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(blocked)
            tg.start_soon(other)
    assert results["other"].error is None
    assert results["blocked"].error is None, results["blocked"].error
    assert results["blocked"].return_value is True
