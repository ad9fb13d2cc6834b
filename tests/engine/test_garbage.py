"""Executions leave nothing to the garbage collector: their objects go by reference counting as
they end (a cycle would keep a whole execution until a collection pass; see watchers.py)."""

from __future__ import annotations

import pytest
from psych_sandbox_testing.garbage import cyclic_garbage

from psych_sandbox_core import DeploymentConfig, FunctionBindings, ProfileConfig, Sandbox

pytestmark = pytest.mark.anyio

#: Calls in flight together: the host serves them with workers of its own, idle at the end.
CODE_MODE = """
import asyncio
print(sum(await asyncio.gather(*[echo(value=n) for n in range(6)])))
"""


async def echo(value: int) -> int:
    return value


@pytest.mark.parametrize("warm", [0, 1], ids=["cold", "warm"])
async def test_an_execution_leaves_no_cycle_of_its_own(warm: int) -> None:
    config = DeploymentConfig(profiles={"p": ProfileConfig(backend="subprocess", warm=warm)})
    async with Sandbox(config) as sandbox:
        await sandbox.run("1", profile="p")  # first-use caches, made once
        async with cyclic_garbage() as left:
            for program in ("print(2 + 2)", "raise ValueError('no')", CODE_MODE):
                result = await sandbox.run(
                    program, profile="p", bindings=FunctionBindings({"echo": echo})
                )
                assert result.stdout in ("4\n", "", "15\n"), result
    assert left == []
