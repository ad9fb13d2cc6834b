"""Results over the per-call ceiling: handles on the frame, reads by window and pattern, and
who may read them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core._bindings.bindings import FunctionBindings
from psych_sandbox_core._output.blobstore import BlobAddress, BlobNotFound, FilesystemBlobStore
from psych_sandbox_core.budgets import BindingBudgets

pytestmark = pytest.mark.anyio

PROFILE = "bind"
CEILING = 2000
ROWS = [{"id": i, "name": f"row-{i}", "note": "é" * (i % 3)} for i in range(400)]


def deployment() -> DeploymentConfig:
    return DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(
                backend="subprocess",
                limits=ExecutionLimits(cpu_seconds=10, wall_seconds=60.0, grace_seconds=0.5),
                budgets=BindingBudgets(result_bytes_per_call=CEILING),
            )
        }
    )


def tools() -> FunctionBindings:
    return FunctionBindings({"rows": lambda: ROWS, "small": lambda: {"carries": "handle"}})


async def run(sandbox: Sandbox, source: str, **kw: Any) -> Any:
    return await sandbox.run(source, profile=PROFILE, bindings=tools(), **kw)


async def test_an_oversized_result_is_a_handle_that_refuses_to_be_data(tmp_path: Path) -> None:
    async with Sandbox(deployment(), blob_store=FilesystemBlobStore(tmp_path)) as sandbox:
        result = await run(
            sandbox,
            """
rows = await rows()
refusals = []
for attempt in (lambda: len(rows), lambda: list(rows), lambda: rows[0], lambda: rows.get("x")):
    try:
        attempt()
    except TypeError as exc:
        refusals.append("read_tool_output" in str(exc))
return [type(rows).__name__, refusals, rows.to_json(), await small()]
""",
        )
    assert result.error is None, result.error
    kind, refusals, descriptor, small = result.return_value
    assert kind == "ToolResultHandle"
    assert refusals == [True, True, True, True]
    # Only an opaque id, the tool and the size cross: nothing about the storage.
    assert set(descriptor) == {"id", "tool", "bytes"}
    assert str(tmp_path) not in json.dumps(result.return_value)
    assert small == {"carries": "handle"}
    assert [c.carries for c in result.calls] == ["handle", "value"]


async def test_windows_reassemble_the_whole_result(tmp_path: Path) -> None:
    async with Sandbox(deployment(), blob_store=FilesystemBlobStore(tmp_path)) as sandbox:
        result = await run(
            sandbox,
            """
import json
handle = await rows()
text, offset = "", 0
while True:
    window = await read_tool_output(handle=handle, offset=offset, length=700)
    text += window["text"]
    offset = window["next_offset"]
    if window["eof"]:
        break
return json.loads(text)
""",
        )
    assert result.error is None, result.error
    assert result.return_value == ROWS
    assert all(c.outcome == "ok" for c in result.calls)


async def test_a_pattern_search_finds_matches_with_offsets(tmp_path: Path) -> None:
    async with Sandbox(deployment(), blob_store=FilesystemBlobStore(tmp_path)) as sandbox:
        result = await run(
            sandbox,
            """
handle = await rows()
found = await read_tool_output(handle, pattern=r"row-3\\d\\b", max_matches=5)
first = found["matches"][0]
window = await read_tool_output(handle, offset=first["offset"], length=first["length"])
return [found["total_matches"], found["truncated"], [m["text"] for m in found["matches"]],
        window["text"]]
""",
        )
    assert result.error is None, result.error
    total, truncated, texts, window = result.return_value
    assert total == 10 and truncated
    assert texts == [f"row-3{i}" for i in range(5)]
    assert window == "row-30"


async def test_handles_are_readable_only_by_the_execution_that_made_them(tmp_path: Path) -> None:
    store = FilesystemBlobStore(tmp_path)
    reader = """
try:
    await read_tool_output(handle=STOLEN, offset=0, length=10)
except ToolError as exc:
    return exc.kind
"""
    async with Sandbox(deployment(), blob_store=store) as sandbox:
        minted = await run(sandbox, "return (await rows()).to_json()", run_id="run-a")
        stolen = minted.return_value
        same_run = await run(sandbox, reader.replace("STOLEN", repr(stolen)), run_id="run-a")
        other_run = await run(sandbox, reader.replace("STOLEN", repr(stolen)), run_id="run-b")
        other_tenant = await run(
            sandbox, reader.replace("STOLEN", repr(stolen)), run_id="run-a", tenant="t2"
        )
        made_up = await run(
            sandbox, reader.replace("STOLEN", repr({"id": "x" * 24})), run_id="run-a"
        )
    assert minted.error is None, minted.error
    for denied in (same_run, other_run, other_tenant, made_up):
        assert denied.return_value == "handle_denied", denied


async def test_the_blob_address_folds_in_tenant_and_run(tmp_path: Path) -> None:
    store = FilesystemBlobStore(tmp_path)
    await store.put(BlobAddress("t1", "r1", "k"), b"secret")
    assert await store.read(BlobAddress("t1", "r1", "k")) == b"secret"
    for other in (BlobAddress("t2", "r1", "k"), BlobAddress("t1", "r2", "k")):
        with pytest.raises(BlobNotFound):
            await store.read(other)


async def test_bad_read_arguments_say_what_was_wrong(tmp_path: Path) -> None:
    async with Sandbox(deployment(), blob_store=FilesystemBlobStore(tmp_path)) as sandbox:
        result = await run(
            sandbox,
            """
handle = await rows()
out = []
for kwargs in ({"offset": -1}, {"pattern": "("}, {"pattern": "a", "offset": 0},
               {"bogus": 1}, {"length": "10"}):
    try:
        await read_tool_output(handle, **kwargs)
    except ToolError as exc:
        out.append(exc.kind)
try:
    await read_tool_output(None)
except ToolError as exc:
    out.append(exc.kind)
return out
""",
        )
    assert result.return_value == ["invalid_arguments"] * 6


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_catastrophic_patterns_are_killed_and_nobody_else_waits(tmp_path: Path) -> None:
    evil = FunctionBindings({"evil": lambda: "a" * 5000 + "!"})
    program = """
handle = await evil()
try:
    await read_tool_output(handle, pattern=r"(a+)+$")
except ToolError as exc:
    return [exc.kind, exc.message]
"""
    results: list[Any] = []
    config = DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(
                backend="subprocess",
                limits=ExecutionLimits(cpu_seconds=10, wall_seconds=60.0, grace_seconds=0.5),
                budgets=BindingBudgets(result_bytes_per_call=1000),
            )
        }
    )
    async with Sandbox(
        config, blob_store=FilesystemBlobStore(tmp_path), pattern_deadline_seconds=1.0
    ) as sandbox:
        ordinary: list[Any] = []

        async def hostile() -> None:
            results.append(await sandbox.run(program, profile=PROFILE, bindings=evil))

        async def benign() -> None:
            ordinary.append(
                await sandbox.run(
                    "return await echo(x=1)",
                    profile=PROFILE,
                    bindings=FunctionBindings({"echo": lambda x: x}),
                )
            )

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(hostile)
            tg.start_soon(benign)
    assert len(results) == 3
    for result in results:
        assert result.error is None, result.error
        kind, message = result.return_value
        assert kind == "pattern_timeout" and "1 s" in message
    assert ordinary[0].return_value == 1
