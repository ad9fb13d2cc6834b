"""The cold-path timing hook: points are recorded only inside ``recording()``, only for the
context that records, and a cold execution reaches the host's points in their order."""

from __future__ import annotations

import anyio
import pytest
from psych_sandbox_testing.fake_backend import FakeBackend, ScriptedChild

from psych_sandbox_core._engine.host import ExecutionPlan, execute
from psych_sandbox_core._engine.program import Program
from psych_sandbox_core.grading import Level
from psych_sandbox_core.kit.phases import Marks, mark, recording
from psych_sandbox_core.result import BackendIdentity
from psych_sandbox_core.terms import ExecutionLimits

pytestmark = pytest.mark.anyio


def test_nothing_is_kept_unless_a_caller_records() -> None:
    mark("unrecorded")  # no recorder: nothing to append to, nothing raised
    with recording() as marks:
        mark("a")
        mark("b")
    mark("after")
    assert [point for point, _ in marks] == ["a", "b"]
    assert marks[0][1] <= marks[1][1]


async def test_a_recording_sees_its_own_tasks_and_no_one_elses() -> None:
    outside_done = anyio.Event()
    go = anyio.Event()

    async def elsewhere() -> None:  # started before the recording: another caller's work
        await go.wait()
        mark("someone else's")
        outside_done.set()

    async def own() -> None:
        mark("own task")

    async with anyio.create_task_group() as tg:
        tg.start_soon(elsewhere)
        marks: Marks
        with recording() as marks:
            async with anyio.create_task_group() as inner:
                inner.start_soon(own)
            go.set()
            await outside_done.wait()
    assert [point for point, _ in marks] == ["own task"]


async def test_a_cold_execution_reaches_the_hosts_points_in_order() -> None:
    async def script(child: ScriptedChild) -> None:
        await child.hello()
        await child.receive()
        await child.returned(None)

    plan = ExecutionPlan(
        program=Program(source="pass"),
        limits=ExecutionLimits(wall_seconds=30.0, grace_seconds=0.1),
        profile="p",
        backend_identity=BackendIdentity(id="fake", distribution=None, version=None),
        claimed_level=Level.NONE,
    )
    with recording() as marks:
        result = await execute(FakeBackend(script), plan)
    assert result.error is None
    points = [point for point, _ in marks]
    # (No probe targets: this backend never asks for them, so none are made.)
    assert points == [
        "start",
        "connected",
        "hello",
        "run sent",
        "result frame",
        "exited",
        "reaped",
        "streams drained",
        "launch left",
        "probe targets removed",
        "result",
    ]
    times = [at for _, at in marks]
    assert times == sorted(times)
