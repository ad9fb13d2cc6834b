"""Host work done on a program's behalf (read_tool_output pattern searches) is limited by the
execution's own budget and counted in its usage, judged from the host: the kernel's rusage of
this process's reaped children, not anything the program says."""

from __future__ import annotations

import resource
from pathlib import Path
from typing import Any

import pytest

from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core._bindings.bindings import FunctionBindings
from psych_sandbox_core._output.blobstore import FilesystemBlobStore
from psych_sandbox_core._output.pattern_search import PatternSearchError, search_bytes
from psych_sandbox_core.budgets import BindingBudgets
from psych_sandbox_core.errors import ErrorKind

pytestmark = pytest.mark.anyio

PROFILE = "work"
MiB = 1024 * 1024
#: Far beyond the CPU limits below: only a limit derived from the budget can stop a search.
DEADLINE = 120.0
#: Backtracks for longer than any test waits: (a+)+$ against a's with no end.
EVIL = "a" * 5000 + "!"
CATASTROPHIC = r"(a+)+$"


def deployment(cpu_seconds: int, memory_bytes: int | None = 512 * MiB) -> DeploymentConfig:
    return DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(
                backend="subprocess",
                limits=ExecutionLimits(
                    cpu_seconds=cpu_seconds,
                    wall_seconds=300.0,
                    grace_seconds=0.5,
                    memory_bytes=memory_bytes,
                ),
                budgets=BindingBudgets(result_bytes_per_call=1000),
            )
        }
    )


def children_cpu() -> float:
    """CPU of every child this process has reaped, as the kernel accounted it."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def run(config: DeploymentConfig, tmp_path: Path, source: str, tools: Any) -> Any:
    async with Sandbox(
        config, blob_store=FilesystemBlobStore(tmp_path), pattern_deadline_seconds=DEADLINE
    ) as sandbox:
        return await sandbox.run(source, profile=PROFILE, bindings=FunctionBindings(tools))


SEARCH_FOREVER = f"""
handle = await evil()
kinds = []
while True:
    try:
        await read_tool_output(handle, pattern={CATASTROPHIC!r})
    except ToolError as exc:
        kinds.append(exc.kind)
"""


async def test_a_catastrophic_pattern_is_stopped_by_the_execution_cpu_budget(
    tmp_path: Path,
) -> None:
    before = children_cpu()
    result = await run(deployment(2), tmp_path, SEARCH_FOREVER, {"evil": lambda: EVIL})
    reaped = children_cpu() - before
    assert result.error is not None
    assert result.error.kind is ErrorKind.TIMEOUT, result.error
    assert "CPU limit of 2 s" in result.error.message
    assert "searching tool results" in result.error.message
    host = result.usage.host_cpu_seconds
    # The search was stopped by what was left of the 2 s budget, not by the 120 s deadline.
    assert 1.0 < host <= 2.2, result.usage
    # The kernel's own count: the search child and the sandbox's first process were both
    # reaped by this process, so their CPU is in its children's rusage.
    sandbox_cpu = result.usage.cpu_seconds or 0.0
    assert reaped - sandbox_cpu - 0.1 <= host <= reaped + 0.01, (reaped, result.usage)
    # The execution as a whole met its CPU limit (a scheduler tick of slack).
    assert host + sandbox_cpu <= 2 + 0.5, result.usage


async def test_the_program_own_cpu_leaves_less_for_its_searches(tmp_path: Path) -> None:
    source = (
        "import time\n"
        "t = time.process_time()\n"
        "while time.process_time() - t < 1.5:\n    pass\n" + SEARCH_FOREVER
    )
    result = await run(deployment(2), tmp_path, source, {"evil": lambda: EVIL})
    assert result.error is not None
    assert result.error.kind is ErrorKind.TIMEOUT, result.error
    assert result.usage.measured_by == "host", result.usage
    assert result.usage.cpu_seconds is not None and result.usage.cpu_seconds >= 1.5
    # Only what the program had not spent itself went to searching.
    assert 0 < result.usage.host_cpu_seconds < 0.8, result.usage


async def test_ordinary_searches_are_counted_and_the_program_goes_on(tmp_path: Path) -> None:
    source = """
handle = await rows()
found = []
for _ in range(3):
    answer = await read_tool_output(handle, pattern=r"row-1\\d\\b", max_matches=1)
    found.append(answer["total_matches"])
return found
"""
    rows = [f"row-{i}" for i in range(200)]
    before = children_cpu()
    result = await run(deployment(10), tmp_path, source, {"rows": lambda: rows})
    reaped = children_cpu() - before
    assert result.error is None, result.error
    assert result.return_value == [10, 10, 10]
    # Three interpreters started and searched: never free, and never more than the kernel saw.
    assert 0 < result.usage.host_cpu_seconds <= reaped + 0.01, (reaped, result.usage)


async def test_the_search_child_gets_the_profile_memory_limit(tmp_path: Path) -> None:
    big = "a" * (48 * MiB)
    source = """
handle = await big()
try:
    return (await read_tool_output(handle, pattern="b"))["total_matches"]
except ToolError as exc:
    return [exc.kind, exc.message]
"""
    small = await run(deployment(10, 96 * MiB), tmp_path / "small", source, {"big": lambda: big})
    assert small.error is None, small.error
    kind, message = small.return_value
    assert kind == "invalid_arguments" and "more memory than allowed" in message
    # The same search with room to work finds nothing, as it should.
    roomy = await run(deployment(10, 1024 * MiB), tmp_path / "roomy", source, {"big": lambda: big})
    assert roomy.error is None, roomy.error
    assert roomy.return_value == 0


async def test_search_bytes_reports_the_kernel_cost_of_a_stopped_search() -> None:
    costs: list[float] = []
    before = children_cpu()
    with pytest.raises(PatternSearchError) as caught:
        await search_bytes(
            EVIL.encode(),
            CATASTROPHIC,
            cpu_seconds=0.5,
            deadline_seconds=DEADLINE,
            on_cost=costs.append,
        )
    reaped = children_cpu() - before
    assert caught.value.reason == "cpu"
    assert costs == [caught.value.cpu_seconds]
    # Around the 0.5 s allowance: the profiling timer and the kernel's CPU accounting are
    # coarse under load (0.39 s was seen with the suite's two workers busy).
    assert 0.3 < costs[0] <= 0.6
    assert abs(costs[0] - reaped) < 0.01, (costs, reaped)
