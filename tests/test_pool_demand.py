"""The warm pool's policy on the fake backend: how many children it keeps for the demand it
sees, and a program that finds none ready waiting for one on its way rather than starting a
second cold. Which child served which program is judged from the launches themselves."""

from __future__ import annotations

import anyio
import pytest
from anyio.abc import TaskGroup

from psych_sandbox_core.errors import ErrorKind
from psych_sandbox_core.grading import Level
from psych_sandbox_core.host import ExecutionPlan
from psych_sandbox_core.pool import WarmPool, WarmSettings
from psych_sandbox_core.protocol import RunFrame
from psych_sandbox_core.result import BackendIdentity, ExecutionResult
from psych_sandbox_core.terms import ExecutionLimits
from psych_sandbox_core.testing.fake_backend import FakeBackend, ScriptedChild

pytestmark = pytest.mark.anyio

LIMITS = ExecutionLimits(wall_seconds=30.0, grace_seconds=0.1)
BUDGET = 1 << 40


def plan(source: str) -> ExecutionPlan:
    return ExecutionPlan(
        source=source,
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


def gated(index: int) -> dict[str, anyio.Event]:
    return {str(index): anyio.Event()}


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
    gates = gated(0)
    children = Children(**gates)
    backend = FakeBackend(children.script)
    async with anyio.create_task_group() as tg:
        pool = WarmPool(backend, LIMITS, WarmSettings(2, BUDGET, 60.0), tg)
        pool.refill(force=True)  # one child on its way, held at its start
        results, done = start_run(tg, pool, "one")
        await anyio.wait_all_tasks_blocked()
        status = pool.status()
        assert (status.ready, status.preparing, status.waiting) == (0, 1, 1)
        assert len(backend.launched) == 1  # nothing started cold meanwhile
        gates["0"].set()
        await done.wait()
        assert (pool.status().runs, pool.status().started_cold) == (1, 0)
        tg.cancel_scope.cancel()
    assert results[0].return_value == "one", results[0].error
    assert children.served == {0: "one"}
    assert backend.live == 0


async def test_with_none_on_its_way_a_program_starts_one_and_waits_for_it() -> None:
    gates = gated(0)
    children = Children(**gates)
    backend = FakeBackend(children.script)
    async with anyio.create_task_group() as tg:
        pool = WarmPool(backend, LIMITS, WarmSettings(1, BUDGET, 60.0), tg)
        results, done = start_run(tg, pool, "one")
        await anyio.wait_all_tasks_blocked()
        status = pool.status()
        assert (status.ready, status.preparing, status.waiting) == (0, 1, 1)
        gates["0"].set()
        await done.wait()
        tg.cancel_scope.cancel()
    assert results[0].return_value == "one", results[0].error
    assert children.served == {0: "one"}
    assert backend.live == 0


async def test_a_child_that_looks_stuck_is_not_waited_for() -> None:
    # Child 0 starts at once (the pool learns how long a start takes here); child 1, the
    # refill after the first program, never reports: the second program starts cold (2).
    gates = gated(1)
    children = Children(**gates)
    backend = FakeBackend(children.script)
    async with anyio.create_task_group() as tg:
        pool = WarmPool(backend, LIMITS, WarmSettings(1, BUDGET, 60.0), tg)
        await pool.wait_ready()
        first = await pool.run(plan("one"))
        assert pool.status().preparing == 1  # child 1, held
        second = await pool.run(plan("two"))
        assert (pool.status().runs, pool.status().started_cold) == (2, 1)
        tg.cancel_scope.cancel()
    assert (first.return_value, second.return_value) == ("one", "two")
    assert children.served == {0: "one", 2: "two"}
    assert backend.live == 0


async def test_a_child_handed_to_a_caller_that_went_away_is_kept_for_the_next() -> None:
    gates = gated(0)
    children = Children(**gates)
    backend = FakeBackend(children.script)
    async with anyio.create_task_group() as tg:
        pool = WarmPool(backend, LIMITS, WarmSettings(1, BUDGET, 60.0), tg)
        with anyio.CancelScope() as caller:
            tg.start_soon(_cancel_when_blocked, caller)
            await pool.run(plan("never"))
        assert caller.cancelled_caught
        gates["0"].set()
        await pool.wait_ready()
        assert pool.status().ready == 1
        result = await pool.run(plan("next"))
        tg.cancel_scope.cancel()
    assert result.return_value == "next", result.error
    assert children.served == {0: "next"}
    assert backend.live == 0


async def _cancel_when_blocked(scope: anyio.CancelScope) -> None:
    await anyio.wait_all_tasks_blocked()
    scope.cancel()


async def test_the_pool_keeps_what_demand_calls_for_within_its_size() -> None:
    children = Children()
    backend = FakeBackend(children.script)
    async with anyio.create_task_group() as tg:
        pool = WarmPool(backend, LIMITS, WarmSettings(3, BUDGET, 60.0), tg)
        for source in ("a", "b", "c"):
            await pool.wait_ready()
            await pool.run(plan(source))
        await anyio.wait_all_tasks_blocked()
        # One program at a time: one child serving, one more ready for the next.
        status = pool.status()
        assert status.target == 2 and status.ready + status.preparing == 2, status
        async with anyio.create_task_group() as callers:
            for source in ("d", "e", "f", "g"):
                callers.start_soon(pool.run, plan(source))
        await anyio.wait_all_tasks_blocked()
        # Four at once: as many as the size allows, never more.
        status = pool.status()
        assert status.target == 3 and status.ready + status.preparing == 3, status
        tg.cancel_scope.cancel()
    assert sorted(children.served.values()) == list("abcdefg")
    assert backend.live == 0


async def test_ready_children_beyond_what_demand_calls_for_are_discarded() -> None:
    children = Children()
    backend = FakeBackend(children.script)
    async with anyio.create_task_group() as tg:
        pool = WarmPool(backend, LIMITS, WarmSettings(3, BUDGET, 60.0), tg)
        await pool.wait_ready()
        async with anyio.create_task_group() as callers:
            for source in ("a", "b", "c"):
                callers.start_soon(pool.run, plan(source))
        await anyio.wait_all_tasks_blocked()
        assert pool.status().ready == 3 and backend.live == 3
        # Three at once was longer ago than the idle window: one at a time is the demand now.
        for n in (2, 3):
            pool._last_at[n] -= 61.0
        pool.refill()
        await anyio.wait_all_tasks_blocked()
        status = pool.status()
        assert status.target == 2 and (status.ready, status.preparing) == (2, 0), status
        # The one discarded was torn down without a program.
        assert backend.live == 2
        await pool.run(plan("d"))
        tg.cancel_scope.cancel()
    assert sorted(children.served.values()) == list("abcd")
    assert backend.live == 0


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
