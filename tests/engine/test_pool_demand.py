"""The warm pool's policy on the fake backend: how many children it keeps for the demand it
sees, and a program that finds none ready waiting for one on its way rather than starting a
second cold. Which child served which program is judged from the launches themselves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import pytest
from anyio.abc import TaskGroup
from psych_sandbox_testing.fake_backend import FakeBackend, ScriptedChild

from psych_sandbox_core._engine.host import ExecutionPlan
from psych_sandbox_core._engine.pool import WarmPool, WarmSettings
from psych_sandbox_core._engine.program import Program
from psych_sandbox_core.errors import ErrorKind
from psych_sandbox_core.grading import Level
from psych_sandbox_core.protocol import RunFrame
from psych_sandbox_core.result import BackendIdentity, ExecutionResult
from psych_sandbox_core.terms import ExecutionLimits

pytestmark = pytest.mark.anyio

LIMITS = ExecutionLimits(wall_seconds=30.0, grace_seconds=0.1)
BUDGET = 1 << 40


def plan(source: str) -> ExecutionPlan:
    return ExecutionPlan(
        program=Program(source=source),
        limits=LIMITS,
        profile="p",
        backend_identity=BackendIdentity(id="fake", distribution=None, version=None),
        claimed_level=Level.NONE,
    )


class Children:
    """Fake children numbered in launch order; each reports only once its gate is open (no
    gate: at once), and records the program it was given."""

    def __init__(self, **gates: anyio.Event) -> None:
        self.gates = {int(index): gate for index, gate in gates.items()}
        self.served: dict[int, str] = {}
        self._launched = 0

    async def script(self, child: ScriptedChild) -> None:
        index = self._launched
        self._launched += 1
        gate = self.gates.get(index)
        if gate is not None:
            await gate.wait()
        await child.hello()
        frame = await child.receive()
        if isinstance(frame, RunFrame):
            self.served[index] = frame.source
            await child.returned(frame.source)


@dataclass
class Setup:
    pool: WarmPool
    tg: TaskGroup
    children: Children
    backend: FakeBackend
    #: The gate of the child held at its start, if one is.
    gate: anyio.Event


@asynccontextmanager
async def pool_of(size: int, held: int | None = None) -> AsyncIterator[Setup]:
    """A pool of ``size`` on fake children (child ``held`` held at its start until its gate is
    set); nothing of it left once the block is done."""
    gate = anyio.Event()
    children = Children(**({} if held is None else {str(held): gate}))
    backend = FakeBackend(children.script)
    async with anyio.create_task_group() as tg:
        pool = WarmPool(backend, LIMITS, WarmSettings(size, BUDGET, 60.0), tg)
        yield Setup(pool, tg, children, backend, gate)
        tg.cancel_scope.cancel()
    assert backend.live == 0


async def run_into(
    pool: WarmPool, source: str, results: list[ExecutionResult], done: anyio.Event
) -> None:
    results.append(await pool.run(plan(source)))
    done.set()


def start_run(
    tg: TaskGroup, pool: WarmPool, source: str
) -> tuple[list[ExecutionResult], anyio.Event]:
    results: list[ExecutionResult] = []
    done = anyio.Event()
    tg.start_soon(run_into, pool, source, results, done)
    return results, done


async def test_a_program_waits_for_the_child_on_its_way_rather_than_start_one_cold() -> None:
    async with pool_of(2, held=0) as it:
        it.pool.refill(force=True)  # one child on its way, held at its start
        results, done = start_run(it.tg, it.pool, "one")
        await anyio.wait_all_tasks_blocked()
        status = it.pool.status()
        assert (status.ready, status.preparing, status.waiting) == (0, 1, 1)
        assert len(it.backend.launched) == 1  # nothing started cold meanwhile
        it.gate.set()
        await done.wait()
        assert (it.pool.status().runs, it.pool.status().started_cold) == (1, 0)
    assert results[0].return_value == "one", results[0].error
    assert it.children.served == {0: "one"}


async def test_with_none_on_its_way_a_program_starts_one_and_waits_for_it() -> None:
    async with pool_of(1, held=0) as it:
        results, done = start_run(it.tg, it.pool, "one")
        await anyio.wait_all_tasks_blocked()
        status = it.pool.status()
        assert (status.ready, status.preparing, status.waiting) == (0, 1, 1)
        it.gate.set()
        await done.wait()
    assert results[0].return_value == "one", results[0].error
    assert it.children.served == {0: "one"}


async def test_a_child_that_looks_stuck_is_not_waited_for() -> None:
    # Child 0 starts at once (the pool learns how long a start takes here); child 1, the
    # refill after the first program, never reports: the second program starts cold (2).
    async with pool_of(1, held=1) as it:
        await it.pool.wait_ready()
        first = await it.pool.run(plan("one"))
        assert it.pool.status().preparing == 1  # child 1, held
        second = await it.pool.run(plan("two"))
        assert (it.pool.status().runs, it.pool.status().started_cold) == (2, 1)
    assert (first.return_value, second.return_value) == ("one", "two")
    assert it.children.served == {0: "one", 2: "two"}


async def test_a_child_handed_to_a_caller_that_went_away_is_kept_for_the_next() -> None:
    async with pool_of(1, held=0) as it:
        with anyio.CancelScope() as caller:
            it.tg.start_soon(_cancel_when_blocked, caller)
            await it.pool.run(plan("never"))
        assert caller.cancelled_caught
        it.gate.set()
        await it.pool.wait_ready()
        assert it.pool.status().ready == 1
        result = await it.pool.run(plan("next"))
    assert result.return_value == "next", result.error
    assert it.children.served == {0: "next"}


async def _cancel_when_blocked(scope: anyio.CancelScope) -> None:
    await anyio.wait_all_tasks_blocked()
    scope.cancel()


async def test_the_pool_keeps_what_demand_calls_for_within_its_size() -> None:
    async with pool_of(3) as it:
        for source in ("a", "b", "c"):
            await it.pool.wait_ready()
            await it.pool.run(plan(source))
        await anyio.wait_all_tasks_blocked()
        # One program at a time: one child serving, one more ready for the next.
        status = it.pool.status()
        assert status.target == 2 and status.ready + status.preparing == 2, status
        async with anyio.create_task_group() as callers:
            for source in ("d", "e", "f", "g"):
                callers.start_soon(it.pool.run, plan(source))
        await anyio.wait_all_tasks_blocked()
        # Four at once: as many as the size allows, never more.
        status = it.pool.status()
        assert status.target == 3 and status.ready + status.preparing == 3, status
    assert sorted(it.children.served.values()) == list("abcdefg")


async def test_ready_children_beyond_what_demand_calls_for_are_discarded() -> None:
    async with pool_of(3) as it:
        await it.pool.wait_ready()
        async with anyio.create_task_group() as callers:
            for source in ("a", "b", "c"):
                callers.start_soon(it.pool.run, plan(source))
        await anyio.wait_all_tasks_blocked()
        assert it.pool.status().ready == 3 and it.backend.live == 3
        # Three at once was longer ago than the idle window: one at a time is the demand now.
        for n in (2, 3):
            it.pool._last_at[n] -= 61.0
        it.pool.refill()
        await anyio.wait_all_tasks_blocked()
        status = it.pool.status()
        assert status.target == 2 and (status.ready, status.preparing) == (2, 0), status
        # The one discarded was torn down without a program.
        assert it.backend.live == 2
        await it.pool.run(plan("d"))
    assert sorted(it.children.served.values()) == list("abcd")


async def test_a_backend_that_cannot_start_a_child_gives_a_result_not_a_wait() -> None:
    backend = FakeBackend(Children().script, unavailable="no children here")
    async with anyio.create_task_group() as tg:
        pool = WarmPool(backend, LIMITS, WarmSettings(2, BUDGET, 60.0), tg)
        with anyio.fail_after(10):
            results = [await pool.run(plan(source)) for source in ("a", "b")]
        tg.cancel_scope.cancel()
    for result in results:
        assert result.error is not None and result.error.kind is ErrorKind.BACKEND_NOT_READY
        assert "no children here" in result.error.message
    assert backend.live == 0
