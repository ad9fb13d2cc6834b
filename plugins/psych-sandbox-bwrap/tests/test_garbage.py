"""A bwrap execution leaves nothing to the garbage collector (its start is a race between the
child reaching its channel and its exit, and the loser must not keep the launch in a cycle)."""

from __future__ import annotations

import pytest
from bwrap_support import PROFILE, config, requires_bwrap
from psych_sandbox_core import Sandbox
from psych_sandbox_testing.garbage import cyclic_garbage

pytestmark = [pytest.mark.anyio, requires_bwrap]


async def test_a_bwrap_execution_leaves_no_cycle_of_its_own() -> None:
    async with Sandbox(config()) as sandbox:
        await sandbox.run("1", profile=PROFILE)
        async with cyclic_garbage() as left:
            result = await sandbox.run("print(2 + 2)", profile=PROFILE)
    assert result.stdout == "4\n", result
    assert left == []
