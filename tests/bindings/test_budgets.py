"""Binding budgets, enforced on the host: per execution, per run (durably), bytes, and who
may narrow them."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core._bindings.bindings import FunctionBindings
from psych_sandbox_core._bindings.runlog import MemoryRunLog, SQLiteRunLog
from psych_sandbox_core._policy.narrowing import ExecutionRequest, TenantPolicy
from psych_sandbox_core.budgets import BindingBudgets
from psych_sandbox_core.errors import ErrorKind

pytestmark = pytest.mark.anyio

PROFILE = "bind"
LIMITS = ExecutionLimits(cpu_seconds=10, wall_seconds=60.0, grace_seconds=0.5)

UNTIL_SPENT = """
n = 0
while True:
    try:
        await noop()
    except ToolError as exc:
        return [n, exc.kind, exc.message]
    n += 1
"""


def deployment(budgets: BindingBudgets) -> DeploymentConfig:
    return DeploymentConfig(
        profiles={PROFILE: ProfileConfig(backend="subprocess", limits=LIMITS, budgets=budgets)}
    )


def noop() -> None:
    return None


async def test_a_tight_loop_stops_at_the_call_budget() -> None:
    budgets = BindingBudgets(calls_per_execution=25, calls_per_run=100)
    async with Sandbox(deployment(budgets)) as sandbox:
        result = await sandbox.run(
            UNTIL_SPENT, profile=PROFILE, bindings=FunctionBindings({"noop": noop})
        )
    assert result.error is None, result.error
    count, kind, message = result.return_value
    assert (count, kind) == (25, "budget_exhausted")
    assert "25" in message
    assert [c.outcome for c in result.calls] == ["ok"] * 25 + ["budget_exhausted"]


async def test_calling_on_long_after_the_budget_is_spent_ends_the_execution() -> None:
    budgets = BindingBudgets(calls_per_execution=3, calls_per_run=100)
    async with Sandbox(deployment(budgets)) as sandbox:
        result = await sandbox.run(
            "while True:\n    try:\n        await noop()\n    except ToolError:\n        pass",
            profile=PROFILE,
            bindings=FunctionBindings({"noop": noop}),
        )
    assert result.error is not None and result.error.kind is ErrorKind.PROTOCOL_ERROR
    assert "budget" in result.error.message


async def test_the_run_budget_spans_executions() -> None:
    budgets = BindingBudgets(calls_per_execution=5, calls_per_run=7)
    log = SQLiteRunLog()
    async with Sandbox(deployment(budgets), run_log=log) as sandbox:
        first = await sandbox.run(
            UNTIL_SPENT, profile=PROFILE, bindings=FunctionBindings({"noop": noop}), run_id="a"
        )
        second = await sandbox.run(
            UNTIL_SPENT, profile=PROFILE, bindings=FunctionBindings({"noop": noop}), run_id="a"
        )
        other_run = await sandbox.run(
            UNTIL_SPENT, profile=PROFILE, bindings=FunctionBindings({"noop": noop}), run_id="b"
        )
    assert first.return_value[:2] == [5, "budget_exhausted"]
    assert second.return_value[:2] == [2, "budget_exhausted"]
    assert "run" in second.return_value[2]
    assert other_run.return_value[:2] == [5, "budget_exhausted"]
    assert await log.calls_in_run("a") == 7


async def test_argument_bytes_per_call() -> None:
    seen: list[int] = []
    budgets = BindingBudgets(argument_bytes_per_call=1000)
    async with Sandbox(deployment(budgets)) as sandbox:
        result = await sandbox.run(
            """
try:
    await take(data="x" * 5000)
except ToolError as exc:
    big = exc.kind
return [big, await take(data="small")]
""",
            profile=PROFILE,
            bindings=FunctionBindings({"take": lambda data: seen.append(len(data)) or len(data)}),
        )
    assert result.return_value == ["budget_exhausted", 5]
    assert seen == [5]


async def test_total_bytes_per_execution() -> None:
    budgets = BindingBudgets(total_bytes_per_execution=10_000)
    async with Sandbox(deployment(budgets)) as sandbox:
        result = await sandbox.run(
            UNTIL_SPENT.replace("await noop()", "await blob()"),
            profile=PROFILE,
            bindings=FunctionBindings({"blob": lambda: "y" * 3000}),
        )
    count, kind, message = result.return_value
    assert (count, kind) == (3, "budget_exhausted")
    assert "10000" in message


async def test_a_result_over_the_ceiling_without_storage_is_not_paged() -> None:
    budgets = BindingBudgets(result_bytes_per_call=1000)
    async with Sandbox(deployment(budgets)) as sandbox:
        result = await sandbox.run(
            "try:\n    await big()\nexcept ToolError as exc:\n    return [exc.kind, exc.message]",
            profile=PROFILE,
            bindings=FunctionBindings({"big": lambda: "z" * 5000}),
        )
    kind, message = result.return_value
    assert kind == "binding_result_not_paged"
    assert "1000" in message


async def test_under_the_ceiling_the_program_gets_the_whole_result() -> None:
    payload = list(range(100_000))
    async with Sandbox(deployment(BindingBudgets())) as sandbox:
        result = await sandbox.run(
            "rows = await rows()\nreturn [len(rows), sum(rows)]",
            profile=PROFILE,
            bindings=FunctionBindings({"rows": lambda: payload}),
        )
    assert result.return_value == [100_000, sum(payload)]


async def test_tenant_policy_narrows_and_a_request_cannot_carry_budgets() -> None:
    policy = TenantPolicy(budgets=BindingBudgets(calls_per_execution=2, calls_per_run=2))
    async with Sandbox(deployment(BindingBudgets())) as sandbox:
        result = await sandbox.run(
            UNTIL_SPENT, profile=PROFILE, bindings=FunctionBindings({"noop": noop}), policy=policy
        )
    assert result.return_value[:2] == [2, "budget_exhausted"]
    with pytest.raises(pydantic.ValidationError):
        ExecutionRequest.model_validate({"budgets": {"calls_per_execution": 10**9}})


def test_narrowing_never_widens() -> None:
    profile = BindingBudgets(calls_per_execution=10, calls_per_run=10)
    wider = BindingBudgets(calls_per_execution=1000, calls_per_run=5000)
    narrowed = profile.narrowed(wider)
    assert narrowed.calls_per_execution == 10 and narrowed.calls_per_run == 10
    assert narrowed.result_bytes_per_call == profile.result_bytes_per_call


def test_budgets_that_cannot_work_fail_at_configuration() -> None:
    with pytest.raises(pydantic.ValidationError, match="calls_per_run"):
        BindingBudgets(calls_per_execution=10, calls_per_run=5)
    with pytest.raises(pydantic.ValidationError):
        BindingBudgets(result_bytes_per_call=10**9)
    with pytest.raises(pydantic.ValidationError):
        BindingBudgets(calls_per_execution=0)


# ------------------------------------------------------------------ a durable run log
# (a host killed mid-call does not give the allowance back: tests/test_host_faults.py)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_executions_own_run_is_forgotten_when_it_ends() -> None:
    # Found by the soak: a long-lived host kept every call of every run without a run id.
    log = MemoryRunLog()
    async with Sandbox(deployment(BindingBudgets()), run_log=log) as sandbox:
        result = await sandbox.run(
            "await noop()\nawait noop()", profile=PROFILE, bindings=FunctionBindings({"noop": noop})
        )
    assert result.error is None and len(result.calls) == 2, result.error
    assert result.run_id is not None
    assert await log.calls_in_run(result.run_id) == 0
    assert await log.entries(result.run_id) == []


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_run_spanning_executions_is_counted_in_a_durable_log_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No run_log passed: a run with an explicit id is still counted where a restarted host
    # will find it.
    database = tmp_path / "state.sqlite"
    monkeypatch.setenv("PSYCH_SANDBOX_RUN_LOG", str(database))
    config = DeploymentConfig(profiles={"p": ProfileConfig(backend="subprocess")})
    tools = FunctionBindings({"noop": lambda: None})
    async with Sandbox(config) as sandbox:
        result = await sandbox.run(
            "await noop()\nawait noop()", profile="p", run_id="durable", bindings=tools
        )
    assert result.error is None, result.error
    log = SQLiteRunLog(str(database))
    try:
        assert await log.calls_in_run("durable") == 2
    finally:
        await log.aclose()


async def test_arguments_travel_as_utf8_and_the_child_refuses_those_over_the_budget() -> None:
    # 7,811 bytes as UTF-8, within the budget; escaped as ASCII they would be three times
    # the call frame's ceiling (budget plus envelope), and the host would refuse the frame.
    seen: list[int] = []
    budgets = BindingBudgets(argument_bytes_per_call=8000)
    async with Sandbox(deployment(budgets)) as sandbox:
        result = await sandbox.run(
            """
fits = await take(data="é" * 3900)
try:
    await take(data="é" * 4100)
except ToolError as exc:
    return [fits, exc.kind, exc.message]
""",
            profile=PROFILE,
            bindings=FunctionBindings({"take": lambda data: seen.append(len(data)) or len(data)}),
        )
    assert result.error is None, result.error
    fits, kind, message = result.return_value
    assert (fits, kind) == (3900, "budget_exhausted")
    assert "8211 bytes as JSON, over the per-call budget of 8000" in message
    # The larger call never reached the host: refused by the child, no id spent.
    assert seen == [3900] and len(result.calls) == 1
    assert result.calls[0].argument_bytes == len('{"data":""}') + 2 * 3900
