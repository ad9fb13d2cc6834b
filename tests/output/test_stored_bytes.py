"""Every byte stored for a program is paid from its byte budget before it is stored: paged
tool results and attachments. Judged from the host, by the size of the blob store on disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core._bindings.bindings import FunctionBindings, ToolCallError
from psych_sandbox_core._output.blobstore import FilesystemBlobStore
from psych_sandbox_core.budgets import BindingBudgets
from psych_sandbox_core.errors import ErrorKind

pytestmark = pytest.mark.anyio

PROFILE = "bytes"
MiB = 1024 * 1024
BUDGET = 16 * MiB
#: Each result is over the per-call ceiling, so it is stored and handed over by handle.
RESULT = "x" * (3 * MiB)


def deployment() -> DeploymentConfig:
    return DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(
                backend="subprocess",
                limits=ExecutionLimits(cpu_seconds=10, wall_seconds=60.0, grace_seconds=0.5),
                budgets=BindingBudgets(
                    result_bytes_per_call=64 * 1024, total_bytes_per_execution=BUDGET
                ),
            )
        }
    )


def big_tool() -> FunctionBindings:
    """A tool returning RESULT, that gives up after ten calls: were the budget not enforced,
    the test would fail at once instead of filling the disk."""
    calls = [0]

    def big() -> str:
        calls[0] += 1
        if calls[0] > 10:
            raise ToolCallError("tool_error", "the budget should have stopped this by now")
        return RESULT

    return FunctionBindings({"big": big})


def stored_bytes(root: Path) -> int:
    """Everything the blob store holds, measured on disk."""
    return sum(
        os.path.getsize(os.path.join(top, name))
        for top, _, names in os.walk(root)
        for name in names
    )


PAGE_UNTIL_REFUSED = """
handles = []
while True:
    try:
        handles.append(await big())
    except ToolError as exc:
        refused = exc
        break
"""


async def test_paging_until_the_budget_is_spent_is_refused_and_nothing_more_is_stored(
    tmp_path: Path,
) -> None:
    async with Sandbox(deployment(), blob_store=FilesystemBlobStore(tmp_path)) as sandbox:
        result = await sandbox.run(
            PAGE_UNTIL_REFUSED + "return [len(handles), refused.kind, refused.message]",
            profile=PROFILE,
            bindings=big_tool(),
        )
    assert result.error is None, result.error
    count, kind, message = result.return_value
    assert kind == "budget_exhausted"
    assert "not stored" in message
    # Five whole results fit in 16 MiB; the sixth was refused rather than stored.
    assert count == 5
    assert [c.outcome for c in result.calls] == ["ok"] * 5 + ["budget_exhausted"]
    assert stored_bytes(tmp_path) <= BUDGET


async def test_attachments_are_paid_from_the_same_budget(tmp_path: Path) -> None:
    # After five results about 1 MiB is left: a small file fits, a large one is skipped.
    source = PAGE_UNTIL_REFUSED + (
        "open('small.bin', 'wb').write(b's' * (256 * 1024))\n"
        "open('large.bin', 'wb').write(b'l' * (2 * 1024 * 1024))\n"
        "return len(handles)"
    )
    stores = {"kept": tmp_path / "kept", "required": tmp_path / "required"}
    results = {}
    for name, root in stores.items():
        async with Sandbox(deployment(), blob_store=FilesystemBlobStore(root)) as sandbox:
            results[name] = await sandbox.run(
                source,
                profile=PROFILE,
                bindings=big_tool(),
                require_preservation=name == "required",
            )
    result, required = results["kept"], results["required"]
    assert result.error is None, result.error
    assert result.return_value == 5
    assert [a.path for a in result.artifacts] == ["small.bin"]
    assert [(s.path, s.reason) for s in result.skipped_artifacts] == [
        ("large.bin", "budget_exhausted")
    ]
    # Preservation required: the bytes are not stored, and the execution says so.
    assert required.error is not None
    assert required.error.kind is ErrorKind.ARTIFACTS_UNAVAILABLE, required.error
    assert "large.bin" in required.error.message and "byte budget" in required.error.message
    for root in stores.values():
        assert stored_bytes(root) <= BUDGET
