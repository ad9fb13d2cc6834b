"""Host bindings through real child processes: names, aliases, kinds, threads, hostile frames,
withdrawn tools and cancellation."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core._bindings.bindings import (
    BindingProvider,
    FunctionBindings,
    ToolCallError,
    ToolSpec,
)
from psych_sandbox_core._bindings.runlog import SQLiteRunLog
from psych_sandbox_core.budgets import BindingBudgets
from psych_sandbox_core.errors import ErrorKind
from psych_sandbox_core.result import CallRecord

pytestmark = pytest.mark.anyio

PROFILE = "bind"
LIMITS = ExecutionLimits(cpu_seconds=10, wall_seconds=60.0, grace_seconds=0.5)


def deployment(budgets: BindingBudgets | None = None) -> DeploymentConfig:
    return DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(
                backend="subprocess", limits=LIMITS, budgets=budgets or BindingBudgets()
            )
        }
    )


async def run_with(
    source: str,
    functions: Mapping[str, Callable[..., Any]] | BindingProvider,
    *,
    budgets: BindingBudgets | None = None,
    suspending: Sequence[str] = (),
    **run: Any,
) -> Any:
    provider = (
        functions
        if isinstance(functions, BindingProvider)
        else FunctionBindings(functions, suspending=suspending)
    )
    async with Sandbox(deployment(budgets)) as sandbox:
        return await sandbox.run(source, profile=PROFILE, bindings=provider, **run)


async def test_every_name_is_reachable_and_aliases_are_never_mangled() -> None:
    tools = {
        "list-repos": lambda: "hyphen",
        "list_repos": lambda: "underscore",
        "2fa": lambda: "digit",
        "class": lambda: "keyword",
        "search": lambda query: f"found {query}",
    }
    result = await run_with(
        """
aliases = sorted(n for n in TOOLS if n in globals())
return {
    "hyphen": await call_tool("list-repos", {}),
    "underscore": await list_repos(),
    "via_call_tool": await call_tool("list_repos"),
    "digit": await call_tool("2fa", {}),
    "keyword": await call_tool("class", {}),
    "search": await search(query="x"),
    "tools": sorted(TOOLS),
    "aliases": aliases,
}
""",
        tools,
    )
    assert result.error is None, result.error
    value = result.return_value
    assert value["hyphen"] == "hyphen"
    assert value["underscore"] == value["via_call_tool"] == "underscore"
    assert value["digit"] == "digit" and value["keyword"] == "keyword"
    assert value["search"] == "found x"
    assert value["tools"] == sorted(tools)
    # Only usable identifiers get an alias; nothing answers for list-repos but call_tool.
    assert value["aliases"] == ["list_repos", "search"]


async def test_failures_carry_a_kind_the_program_can_branch_on() -> None:
    def unreachable() -> None:
        raise ToolCallError("unreachable", "server down")

    def broken() -> None:
        raise RuntimeError("boom")

    def odd_kind() -> None:
        raise ToolCallError("made_up_kind", "whatever")

    result = await run_with(
        """
out = {}
for name in ["unreachable", "broken", "odd_kind", "not_offered"]:
    try:
        await call_tool(name, {})
    except ToolError as exc:
        out[name] = [exc.kind, exc.message]
return out
""",
        {"unreachable": unreachable, "broken": broken, "odd_kind": odd_kind},
    )
    assert result.error is None, result.error
    value = result.return_value
    assert value["unreachable"] == ["unreachable", "server down"]
    assert value["broken"][0] == "tool_error" and "boom" in value["broken"][1]
    assert value["odd_kind"][0] == "tool_error"
    assert value["not_offered"][0] == "unknown_tool"
    assert [c.outcome for c in result.calls] == [
        "unreachable",
        "tool_error",
        "tool_error",
        "unknown_tool",
    ]


async def test_a_tool_that_may_suspend_is_not_offered_and_never_runs() -> None:
    ran: list[str] = []
    result = await run_with(
        """
try:
    await call_tool("approve_payment", {"amount": 5})
except ToolError as exc:
    return [exc.kind, exc.message, "approve_payment" in TOOLS, "approve_payment" in globals()]
""",
        {"approve_payment": lambda amount: ran.append("ran"), "other": lambda: 1},
        suspending=["approve_payment"],
    )
    assert result.error is None, result.error
    kind, message, listed, aliased = result.return_value
    assert kind == "approval_required" and "directly" in message
    assert not listed and not aliased
    assert ran == []


class Catalogue(BindingProvider):
    """A live catalogue: what is callable can change between executions."""

    def __init__(self) -> None:
        self.names = {"alpha", "beta"}
        self.asked = 0

    async def list_tools(self) -> Sequence[ToolSpec]:
        self.asked += 1
        return [ToolSpec(name) for name in sorted(self.names)]

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        if name not in self.names:
            raise AssertionError("the host called a withdrawn tool")
        return name


async def test_a_withdrawn_tool_is_not_callable_in_the_next_execution() -> None:
    catalogue = Catalogue()
    program = """
try:
    got = await call_tool("beta", {})
except ToolError as exc:
    got = exc.kind
return [sorted(TOOLS), got]
"""
    async with Sandbox(deployment()) as sandbox:
        first = await sandbox.run(program, profile=PROFILE, bindings=catalogue)
        catalogue.names.discard("beta")
        second = await sandbox.run(program, profile=PROFILE, bindings=catalogue)
    assert first.return_value == [["alpha", "beta"], "beta"]
    assert second.return_value == [["alpha"], "unknown_tool"]
    assert catalogue.asked == 2


async def test_calls_from_threads_keep_ids_consecutive() -> None:
    result = await run_with(
        """
import asyncio, threading
results = {}
def worker(n):
    results[n] = [asyncio.run(echo(value=n * 100 + i)) for i in range(15)]
threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
for t in threads: t.start()
for t in threads: t.join()
return results
""",
        {"echo": lambda value: value},
    )
    assert result.error is None, result.error
    assert result.return_value == {str(n): [n * 100 + i for i in range(15)] for n in range(6)}
    # The host answers only exact successors: 90 answered calls means 90 consecutive ids.
    assert len(result.calls) == 90 and all(c.outcome == "ok" for c in result.calls)


async def test_arguments_that_are_not_json_do_not_spend_an_id() -> None:
    result = await run_with(
        """
try:
    await echo(value={1, 2})
except TypeError as exc:
    first = str(exc)
return [first, await echo(value=3)]
""",
        {"echo": lambda value: value},
    )
    assert result.error is None, result.error
    assert "JSON" in result.return_value[0]
    assert result.return_value[1] == 3


async def test_a_value_is_a_value_whatever_its_field_names() -> None:
    collision = {"carries": "handle", "handle": {"id": "x"}, "id": "x", "__handle__": True}
    result = await run_with("return await lookalike()", {"lookalike": lambda: collision})
    assert result.error is None, result.error
    assert result.return_value == collision
    assert result.calls[0].carries == "value"


# ------------------------------------------------------------------ hostile frames

FORGE = """
import os, sys
fd = int(next(a for a in sys.argv if a.startswith("channel=fd:")).split(":")[1])
os.write(fd, {frame!r}.encode() + b"\\n")
import time
time.sleep(30)
"""


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        ('{"type":"call","id":7,"name":"echo","arguments":{}}', "not the successor"),
        ('{"type":"reply","id":0,"carries":"value","value_json":"1"}', "malformed frame"),
        ('{"type":"call","id":0,"name":"echo","arguments":{},"extra":1}', "malformed frame"),
        ('{"type":"call","id":-1,"name":"echo","arguments":{}}', "malformed frame"),
    ],
    ids=["forged-id", "reply-shaped", "extra-field", "negative-id"],
)
async def test_hostile_frames_on_the_call_path_end_the_execution(frame: str, expected: str) -> None:
    called: list[Any] = []
    result = await run_with(FORGE.format(frame=frame), {"echo": lambda **kw: called.append(kw)})
    assert result.error is not None
    assert result.error.kind is ErrorKind.PROTOCOL_ERROR
    assert expected in result.error.message
    assert called == []


async def test_a_forged_call_to_a_tool_not_offered_is_refused_by_name() -> None:
    called: list[Any] = []
    source = """
import os, sys, json
fd = int(next(a for a in sys.argv if a.startswith("channel=fd:")).split(":")[1])
os.write(fd, b'{"type":"call","id":0,"name":"secret","arguments":{}}\\n')
reply = b""
while not reply.endswith(b"\\n"):
    reply += os.read(fd, 65536)
return json.loads(reply)
"""
    result = await run_with(source, {"echo": lambda: called.append(1)})
    assert result.error is None, result.error
    assert result.return_value["carries"] == "error"
    assert result.return_value["error_kind"] == "unknown_tool"
    assert called == []


# ------------------------------------------------------------------ cancellation


class Blocking(BindingProvider):
    """A tool that blocks until cancelled, and says when it has started."""

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.finished = False

    async def list_tools(self) -> Sequence[ToolSpec]:
        return [ToolSpec("block")]

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        self.started.set()
        await anyio.Event().wait()
        self.finished = True


async def test_cancelled_before_start_runs_nothing() -> None:
    cancel = anyio.Event()
    cancel.set()
    log = SQLiteRunLog()
    provider = Blocking()
    async with Sandbox(deployment(), run_log=log) as sandbox:
        result = await sandbox.run(
            "await block()", profile=PROFILE, bindings=provider, cancel=cancel, run_id="r"
        )
    assert result.error is not None and result.error.kind is ErrorKind.CANCELLED
    assert "never ran" in result.error.message
    assert await log.entries("r") == []


async def test_cancelled_during_execution() -> None:
    cancel = anyio.Event()
    log = SQLiteRunLog()

    async def ready() -> None:
        # Async: it touches the event loop's own event (plain functions run in a thread).
        cancel.set()

    provider = FunctionBindings({"ready": ready})
    async with Sandbox(deployment(), run_log=log) as sandbox:
        result = await sandbox.run(
            "await ready()\nwhile True: pass",
            profile=PROFILE,
            bindings=provider,
            cancel=cancel,
            run_id="r",
        )
    assert result.error is not None and result.error.kind is ErrorKind.CANCELLED
    assert [e.outcome for e in await log.entries("r")] == ["ok"]
    assert await log.dangling("r") == []


async def test_cancelled_in_the_middle_of_a_binding_call() -> None:
    cancel = anyio.Event()
    log = SQLiteRunLog()
    provider = Blocking()
    async with Sandbox(deployment(), run_log=log) as sandbox, anyio.create_task_group() as tg:

        async def cancel_once_started() -> None:
            await provider.started.wait()
            cancel.set()

        tg.start_soon(cancel_once_started)
        result = await sandbox.run(
            "await block()", profile=PROFILE, bindings=provider, cancel=cancel, run_id="r"
        )
    assert result.error is not None and result.error.kind is ErrorKind.CANCELLED
    assert not provider.finished
    assert result.calls == [
        CallRecord(
            name="block", outcome="cancelled", carries="error", argument_bytes=2, result_bytes=0
        )
    ]
    entries = await log.entries("r")
    assert [e.outcome for e in entries] == ["cancelled"]
    assert await log.dangling("r") == []


async def test_outer_cancellation_also_leaves_no_dangling_call() -> None:
    log = SQLiteRunLog()
    provider = Blocking()
    async with Sandbox(deployment(), run_log=log) as sandbox, anyio.create_task_group() as tg:

        async def run() -> None:
            await sandbox.run("await block()", profile=PROFILE, bindings=provider, run_id="r")

        tg.start_soon(run)
        await provider.started.wait()
        tg.cancel_scope.cancel()
    assert [e.outcome for e in await log.entries("r")] == ["cancelled"]


# ------------------------------------------------------------------ the command line


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_cli_binds_the_functions_of_a_tools_file(tmp_path: Path) -> None:
    tools = tmp_path / "tools.py"
    tools.write_text(
        "import json\n"
        "from os.path import join\n"
        "def add(a, b):\n    return a + b\n"
        "async def shout(text):\n    return text.upper()\n"
        "def _private():\n    return 1\n"
    )
    program = tmp_path / "program.py"
    program.write_text("return [sorted(TOOLS), await add(a=1, b=2), await shout(text='hi')]\n")
    completed = await anyio.run_process(
        [
            sys.executable,
            "-m",
            "psych_sandbox_core.cli",
            "run",
            str(program),
            "--tools",
            str(tools),
            "--json",
            "--profile",
            "subprocess",
        ],
        check=False,
        stderr=subprocess.PIPE,
    )
    assert completed.returncode == 0, completed.stderr.decode()
    output = json.loads(completed.stdout)
    assert output["return_value"] == [["add", "read_tool_output", "shout"], 3, "HI"]
    assert [(c["name"], c["outcome"]) for c in output["calls"]] == [("add", "ok"), ("shout", "ok")]
    assert all("argument_bytes" in c and "result_bytes" in c for c in output["calls"])


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_cli_names_a_tools_file_that_cannot_load(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text("1\n")
    completed = await anyio.run_process(
        [
            sys.executable,
            "-m",
            "psych_sandbox_core.cli",
            "run",
            str(program),
            "--tools",
            str(tmp_path / "missing.py"),
            "--profile",
            "subprocess",
        ],
        check=False,
        stderr=subprocess.PIPE,
    )
    assert completed.returncode == 2
    assert "missing.py" in completed.stderr.decode()
