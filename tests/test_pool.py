"""Warm children: launched and graded ahead, each given exactly one program, torn down like
any other; nothing of one program reaches the next, and nothing outlives the Sandbox."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox

from .conftest import FAST_LIMITS, marker, pids_with, wait_for_pids

pytestmark = pytest.mark.anyio
WARM = "warm"


def warm_config(size: int = 1, **limits: object) -> DeploymentConfig:
    return DeploymentConfig(
        profiles={
            WARM: ProfileConfig(
                backend="subprocess",
                warm=size,
                limits=ExecutionLimits(**{**FAST_LIMITS, **limits}),  # type: ignore[arg-type]
            )
        }
    )


def children_of_this_process() -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("PPid:") and int(line.split()[1]) == os.getpid():
                found.add(int(entry))
    return found


PROGRAM = """
import os
seen = globals().get("SEEN")
SEEN = os.getpid()
with open("mine.txt", "a") as fh:
    fh.write("x")
[seen, os.listdir("."), os.getcwd()]
"""


async def test_each_warm_child_runs_one_program_and_nothing_carries_over() -> None:
    async with Sandbox(warm_config()) as sandbox:
        results = []
        for _ in range(3):
            await sandbox.warmed(WARM)
            results.append(await sandbox.run(PROGRAM, profile=WARM))
    for result in results:
        assert result.error is None, result.error
        seen, listing, _ = result.return_value
        assert seen is None  # no global from an earlier program
        assert listing == ["mine.txt"]  # a fresh workspace
        assert result.level == "process"
    # Three programs, three workspaces of their own.
    assert len({result.return_value[2] for result in results}) == 3


async def test_a_program_given_to_a_warm_child_has_its_own_wall_clock() -> None:
    async with Sandbox(warm_config(wall_seconds=0.5)) as sandbox:
        await sandbox.warmed(WARM)
        # The child waited longer than the wall clock before getting its program: the clock
        # starts with the program.
        with anyio.move_on_after(1.0):
            await anyio.Event().wait()
        result = await sandbox.run("1 + 1", profile=WARM)
    assert result.error is None, result.error
    assert result.return_value == 2


async def test_prepared_children_do_not_outlive_the_sandbox() -> None:
    before = children_of_this_process()
    async with Sandbox(warm_config(size=2)) as sandbox:
        await sandbox.run("1", profile=WARM)
        await sandbox.warmed(WARM)
        assert children_of_this_process() - before, "no child was kept warm"
    assert children_of_this_process() - before == set()


async def test_cancelling_the_caller_ends_the_warm_execution() -> None:
    mark = marker()
    program = (
        "import subprocess, sys\n"
        f"subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)', {mark!r}])\n"
    )
    async with Sandbox(warm_config(wall_seconds=30.0)) as sandbox:
        await sandbox.warmed(WARM)
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: sandbox.run(program, profile=WARM))
            await wait_for_pids(mark, present=True)
            tg.cancel_scope.cancel()
        assert await wait_for_pids(mark, present=False) == []
    assert pids_with(mark) == []
