"""A docker execution leaves nothing to the garbage collector: the race between its streams'
end markers and the container's exit, and the workers that served its calls, end without
keeping the execution in a reference cycle (watchers.py)."""

from __future__ import annotations

import pytest
from docker_support import PROFILE, config
from psych_sandbox_core import FunctionBindings, Sandbox
from psych_sandbox_testing.garbage import cyclic_garbage

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("engine")]

CODE_MODE = """
import asyncio
print(sum(await asyncio.gather(*[echo(value=n) for n in range(6)])))
"""


async def echo(value: int) -> int:
    return value


async def test_a_docker_execution_leaves_no_cycle_of_its_own() -> None:
    bindings = FunctionBindings({"echo": echo})
    async with Sandbox(config()) as sandbox:
        await sandbox.run("1", profile=PROFILE)
        async with cyclic_garbage() as left:
            printed = await sandbox.run("print(2 + 2)", profile=PROFILE)
            called = await sandbox.run(CODE_MODE, profile=PROFILE, bindings=bindings)
    assert (printed.stdout, called.stdout) == ("4\n", "15\n"), (printed, called)
    assert left == []
