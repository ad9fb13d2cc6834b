"""Warm children: launched and graded ahead, each given exactly one program, torn down like
any other; nothing of one program reaches the next, and nothing outlives the Sandbox."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from psych_sandbox_testing.host import execution_cgroups_here

from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core.kit.phases import recording
from psych_sandbox_core.kit.posix.launched import ProcessLaunched

from ..conftest import FAST_LIMITS, marker, pids_with, wait_for_pids

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


def automatic_config(**profile: object) -> DeploymentConfig:
    """A profile that does not say ``warm``: the pool is the Sandbox's default."""
    return DeploymentConfig(
        profiles={
            WARM: ProfileConfig(
                backend="subprocess",
                limits=ExecutionLimits(**FAST_LIMITS),  # type: ignore[arg-type]
                **profile,  # type: ignore[arg-type]
            )
        }
    )


async def wait_exited(pids: set[int]) -> None:
    """Return once every process in ``pids`` has exited (the kernel says so through a
    pidfd each; no polling)."""
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            await anyio.wait_readable(fd)
        finally:
            os.close(fd)


async def ended(children: set[int]) -> None:
    """Children of cold executions whose results came back before their teardown end on
    their own, within the teardown's bound: one prepared and waiting would not."""
    with anyio.fail_after(10):
        await wait_exited(children)


async def test_a_long_lived_sandbox_keeps_children_prepared_by_default() -> None:
    before = children_of_this_process()
    async with Sandbox(automatic_config()) as sandbox:
        first = await sandbox.run("1", profile=WARM)
        # One program so far: nothing is prepared that might never be used. (Its child may
        # still be ending, its result handed back before its teardown: it ends on its own.)
        status = sandbox.warm_status(WARM)
        assert status is not None and (status.ready, status.preparing) == (0, 0)
        await ended(children_of_this_process() - before)
        second = await sandbox.run("2", profile=WARM)
        status = sandbox.warm_status(WARM)
        assert status is not None and status.ready + status.preparing >= 1
        assert status.size == 2
        await sandbox.warmed(WARM)
        prepared = children_of_this_process() - before
        assert prepared, "no child was kept prepared"
        third = await sandbox.run("3", profile=WARM)
    assert [r.return_value for r in (first, second, third)] == [1, 2, 3]
    assert children_of_this_process() - before == set()


async def test_warm_zero_prepares_nothing() -> None:
    before = children_of_this_process()
    async with Sandbox(automatic_config(warm=0)) as sandbox:
        for _ in range(3):
            await sandbox.run("1", profile=WARM)
        assert sandbox.warm_status(WARM) is None
        await sandbox.warmed(WARM)  # nothing to wait for
        await ended(children_of_this_process() - before)


async def test_the_pool_never_holds_more_memory_than_its_budget() -> None:
    # How much one prepared child holds here, as the host measures it.
    async with Sandbox(automatic_config(warm=1)) as sandbox:
        await sandbox.warmed(WARM)
        one = sandbox.warm_status(WARM)
    assert one is not None and one.ready == 1 and one.held_bytes > 0
    for budget in (1, one.held_bytes * 5 // 2, 1 << 40):
        async with Sandbox(automatic_config(warm=4, warm_memory_bytes=budget)) as sandbox:
            for _ in range(3):
                await sandbox.warmed(WARM)
                status = sandbox.warm_status(WARM)
                assert status is not None
                assert status.held_bytes <= budget and status.ready <= 4, status
                result = await sandbox.run("6 * 7", profile=WARM)
                assert result.return_value == 42, result.error
        if budget == 1:
            assert status.ready == 0  # not even one fits: every run starts cold
        if budget == 1 << 40:
            assert status.ready >= 1


async def test_an_idle_pool_shrinks_to_nothing_and_fills_again() -> None:
    before = children_of_this_process()
    async with Sandbox(automatic_config(warm=1, warm_idle_seconds=0.2)) as sandbox:
        await sandbox.warmed(WARM)
        prepared = children_of_this_process() - before
        assert prepared
        # No program comes: the prepared child is discarded, torn down like any other.
        await wait_exited(prepared)
        status = sandbox.warm_status(WARM)
        assert status is not None and status.ready == 0
        # The next program runs (cold) and the pool fills again.
        assert (await sandbox.run("5", profile=WARM)).return_value == 5
        await sandbox.warmed(WARM)
        assert children_of_this_process() - before - prepared
    assert children_of_this_process() - before == set()


#: Whether this host gives an execution a cgroup of its own (root, a writable hierarchy):
#: what a subprocess child needs to hand a warm result back before its teardown.
CGROUPS = execution_cgroups_here()


@pytest.mark.skipif(not CGROUPS, reason="no per-execution cgroups on this host")
@pytest.mark.parametrize("leaves_a_process", [False, True], ids=["ended", "left-a-process"])
async def test_a_warm_result_comes_before_the_teardown_only_when_nothing_of_the_program_is_left(
    leaves_a_process: bool,
) -> None:
    source = "open('a.txt', 'w').write('x')\n"
    if leaves_a_process:
        source += (
            "import subprocess, sys\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        )
    async with Sandbox(warm_config()) as sandbox:
        with recording() as reached:
            await sandbox.warmed(WARM)
            result = await sandbox.run(source + "'done'", profile=WARM)
    points = [point for point, _ in reached]
    assert result.error is None, result.error
    assert result.return_value == "done"
    # The host walks this backend's workspace: the files are there either way.
    assert [(a.path, a.size_bytes) for a in result.artifacts] == [("a.txt", 1)]
    if not leaves_a_process:
        assert points.index("result handed back") < points.index("reaped"), points
    # With a process left, either path is right: the early one only once the kernel had
    # already ended it with the pid namespace's init (the bootstrap exits right after its
    # result); which one is decided by the cgroup, as below.


class _Checked(ProcessLaunched):  # type: ignore[type-arg]
    """Only the process checks of a started child, without a process."""

    async def terminate(self, grace_seconds: float) -> None:
        raise NotImplementedError

    async def finish(self) -> Any:
        raise NotImplementedError


class _Cgroup:
    """Stands in for an execution's cgroup: only its process list is read here."""

    def __init__(self, *states: set[int] | None) -> None:
        self.states = list(states)

    def processes(self) -> set[int] | None:
        return self.states.pop(0)


@pytest.mark.parametrize(
    ("before", "at_marker", "early"),
    [
        ({10, 11, 12}, {10, 11, 12}, True),
        ({10, 11, 12}, {10}, True),  # the child's own, exiting after its result
        ({10, 11, 12}, {10, 11, 13}, False),  # one the program started
        ({10, 11, 12}, None, False),  # unreadable: never taken for "only its own"
        (None, {10}, False),
    ],
)
def test_only_the_childs_own_processes_let_a_walked_result_come_early(
    before: set[int] | None, at_marker: set[int] | None, early: bool
) -> None:
    launched = object.__new__(_Checked)
    launched.cgroup = _Cgroup(before, at_marker)  # type: ignore[assignment]
    launched._before_program = None
    assert launched.before_program() is (before is not None)
    assert launched.only_processes_from_before() is early


def test_a_prepared_childs_processes_are_noted_once_as_it_is_graded() -> None:
    # Noted off the program's path when the child is graded; the program's own turn (the
    # marker decided) reads nothing more, so the list is the one from before any program.
    launched = object.__new__(_Checked)
    launched.cgroup = _Cgroup({10, 11}, {10, 11, 13})  # type: ignore[assignment]
    launched._before_program = None
    assert launched.before_program()
    assert launched.before_program()
    assert not launched.only_processes_from_before()  # 13 came after
