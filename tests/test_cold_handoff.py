"""A cold execution run in a task group (the Sandbox's): on a backend that allows it, its result
comes before its teardown, which the group finishes; the group's end cancels an execution in
flight, which is torn down and still ends in a result."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from psych_sandbox_core.errors import ErrorKind
from psych_sandbox_core.grading import Level
from psych_sandbox_core.host import ExecutionPlan, execute
from psych_sandbox_core.protocol import RunFrame
from psych_sandbox_core.result import BackendIdentity, ExecutionResult
from psych_sandbox_core.terms import ExecutionLimits
from psych_sandbox_core.testing.fake_backend import FakeBackend, ScriptedChild

pytestmark = pytest.mark.anyio


def plan(**changes: Any) -> ExecutionPlan:
    fields: dict[str, Any] = {
        "source": "the program",
        "limits": ExecutionLimits(wall_seconds=30.0, grace_seconds=0.1),
        "profile": "p",
        "backend_identity": BackendIdentity(id="fake", distribution=None, version=None),
        "claimed_level": Level.NONE,
    }
    fields.update(changes)
    return ExecutionPlan(**fields)


def script_lingering(release: anyio.Event) -> Any:
    async def script(child: ScriptedChild) -> None:
        await child.hello()
        run = await child.receive()
        assert isinstance(run, RunFrame)
        marker = b"" if run.end_marker is None else run.end_marker.encode()
        await child.stdout(b"out\n" + marker)
        await child.stderr(marker)
        await child.returned(2)
        await release.wait()  # still alive after its result

    return script


async def test_a_cold_result_comes_before_the_teardown_the_group_finishes() -> None:
    release = anyio.Event()
    backend = FakeBackend(script_lingering(release), early_result_ok=True)
    async with anyio.create_task_group() as tg:
        result = await execute(backend, plan(), tg)
        assert backend.launched[0].status is None  # not exited yet
        assert backend.live == 1
        release.set()
    assert result.error is None and result.return_value == 2 and result.stdout == "out\n"
    assert backend.launched[0].status is not None and backend.launched[0].status.code == 0
    assert backend.live == 0


async def test_without_early_results_the_cold_result_waits_for_the_teardown() -> None:
    release = anyio.Event()
    release.set()
    backend = FakeBackend(script_lingering(release))
    async with anyio.create_task_group() as tg:
        result = await execute(backend, plan(), tg)
        assert backend.live == 0
    assert result.error is None and result.return_value == 2


async def test_the_groups_end_cancels_a_cold_execution_in_flight() -> None:
    started = anyio.Event()

    async def script(child: ScriptedChild) -> None:
        await child.hello()
        await child.receive()
        started.set()
        await child.sleep_forever()

    backend = FakeBackend(script)
    results: list[ExecutionResult] = []

    async def caller(group: anyio.abc.TaskGroup) -> None:
        results.append(await execute(backend, plan(), group))

    async with anyio.create_task_group() as outer, anyio.create_task_group() as sandbox_group:
        outer.start_soon(caller, sandbox_group)
        await started.wait()
        sandbox_group.cancel_scope.cancel()  # the Sandbox closing
    assert backend.live == 0
    [result] = results
    assert result.error is not None and result.error.kind is ErrorKind.CANCELLED
