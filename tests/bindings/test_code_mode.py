"""Code mode with real tool catalogues: described tools, the catalogue lookups, positional
aliases, a missing await, provider failures as data, the model's view of a result and
read_output, all through real child processes."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

import psych_sandbox_core
from psych_sandbox_core import (
    BindingProvider,
    DeploymentConfig,
    ExecutionLimits,
    FilesystemBlobStore,
    FunctionBindings,
    OutputPolicy,
    ProfileConfig,
    Sandbox,
    ToolSpec,
    describe_tools,
    spec_from_function,
)
from psych_sandbox_core._bindings import catalogue
from psych_sandbox_core._bindings.call_server import CallServer
from psych_sandbox_core._output.attachments import AttachmentLedger
from psych_sandbox_core.child.loader import bootstrap_module
from psych_sandbox_core.errors import ErrorKind
from psych_sandbox_core.grading import Level
from psych_sandbox_core.protocol import limits as protocol_limits

#: The child's functions and constants, from the source the child runs.
bootstrap = bootstrap_module()

pytestmark = pytest.mark.anyio

PROFILE = "code"
LIMITS = ExecutionLimits(cpu_seconds=10, wall_seconds=60.0, grace_seconds=0.5)
DOCS = Path(__file__).resolve().parents[2] / "docs"


def deployment(**output: Any) -> DeploymentConfig:
    return DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(
                backend="subprocess", limits=LIMITS, output=OutputPolicy(**output)
            )
        }
    )


def search(query: str, limit: int = 10, *, exact: bool = False) -> list[str]:
    """Search the catalogue for items matching a query.

    Returns at most ``limit`` names."""
    return [f"{query}-{i}" for i in range(limit)] + (["exact"] if exact else [])


async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


TOOLS = {"search": search, "add": add, "list-repos": lambda owner: [owner]}


async def run(source: str, provider: BindingProvider | None = None, **kwargs: Any) -> Any:
    async with Sandbox(deployment()) as sandbox:
        return await sandbox.run(
            source, profile=PROFILE, bindings=provider or FunctionBindings(TOOLS), **kwargs
        )


# ---------------------------------------------------------------- described tools


def test_a_python_tool_is_described_by_its_signature_and_docstring() -> None:
    spec = spec_from_function(search)
    assert spec.name == "search"
    assert spec.description.startswith("Search the catalogue")
    schema = spec.input_schema
    assert schema is not None
    assert list(schema["properties"]) == ["query", "limit", "exact"]
    assert schema["properties"]["limit"] == {"type": "integer", "default": 10}
    assert schema["required"] == ["query"]


async def test_tools_exposes_name_alias_description_and_schema() -> None:
    result = await run(
        """
return [
    {"name": t.name, "alias": t.alias, "description": t.description,
     "required": (t.schema or {}).get("required"), "is_str": isinstance(t, str)}
    for t in TOOLS
]
"""
    )
    assert result.error is None, result.error
    by_name = {entry["name"]: entry for entry in result.return_value}
    assert set(by_name) == set(TOOLS)
    assert by_name["search"]["alias"] == "search"
    assert by_name["search"]["description"].startswith("Search the catalogue")
    assert by_name["search"]["required"] == ["query"]
    assert by_name["list-repos"]["alias"] is None  # not an identifier: call_tool only
    assert all(entry["is_str"] for entry in by_name.values())


async def test_aliases_take_positional_arguments_in_schema_order() -> None:
    result = await run(
        """
out = [await add(1, 2), await add(1, b=5), await search("q", 2), await search("q", 1, exact=True)]
errors = []
for attempt in (lambda: add(1, 2, 3), lambda: add(1, a=2)):
    try:
        await attempt()
    except TypeError as exc:
        errors.append(str(exc))
return out, errors
"""
    )
    assert result.error is None, result.error
    out, errors = result.return_value
    assert out == [3, 6, ["q-0", "q-1"], ["q-0", "exact"]]
    assert "at most 2 positional arguments (a, b)" in errors[0]
    assert "multiple values for argument 'a'" in errors[1]
    # Only the calls that were made reached the host.
    assert [c.name for c in result.calls] == ["add", "add", "search", "search"]


async def test_the_catalogue_lookups_are_callable_bounded_and_counted() -> None:
    result = await run(
        """
listed = await list_tools()
found = await list_tools(query="integers")
info = await get_tool_info("list-repos")
kinds = []
for bad in (lambda: get_tool_info("nope"), lambda: list_tools(limit=100000)):
    try:
        await bad()
    except ToolError as exc:
        kinds.append(exc.kind)
return listed, found, info, kinds, "list_tools" in TOOLS
"""
    )
    assert result.error is None, result.error
    listed, found, info, kinds, lookups_listed = result.return_value
    assert [t["name"] for t in listed["tools"]] == list(TOOLS)
    assert listed["total"] == 3 and listed["next_offset"] is None
    assert [t["name"] for t in found["tools"]] == ["add"]
    assert info["name"] == "list-repos" and info["alias"] is None
    assert list(info["input_schema"]["properties"]) == ["owner"]
    assert kinds == ["unknown_tool", "invalid_arguments"]
    assert not lookups_listed  # helpers, like call_tool, not tools
    # Lookups are binding calls: counted against the budget like any other.
    assert [c.name for c in result.calls][:3] == ["list_tools", "list_tools", "get_tool_info"]


class Described(BindingProvider):
    def __init__(self, specs: Sequence[ToolSpec]) -> None:
        self.specs = specs

    async def list_tools(self) -> Sequence[ToolSpec]:
        return self.specs

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        return {"name": name, "arguments": arguments}


async def test_a_schema_too_large_for_the_run_frame_is_learnt_through_get_tool_info() -> None:
    properties = {f"p{i:04}": {"type": "string", "description": "x" * 40} for i in range(600)}
    huge = {"type": "object", "properties": properties}
    provider = Described([ToolSpec("big", description="A big tool.", input_schema=huge)])
    result = await run(
        "info = await get_tool_info('big')\n"
        "TOOLS[0].schema is None, TOOLS[0].description, len(info['input_schema']['properties'])",
        provider,
    )
    assert result.error is None, result.error
    assert result.return_value == [True, "A big tool.", 600]


def test_the_run_frames_catalogue_is_bounded_however_many_tools() -> None:
    long = "d" * 5000
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(300)}}
    specs = [
        ToolSpec(f"tool{i}", description=long, input_schema=schema)
        for i in range(protocol_limits.MAX_TOOLS - 2)
    ]
    entries = catalogue.Catalogue(specs).entries()
    assert [e.name for e in entries] == [s.name for s in specs]
    carried = sum(len(e.description) + len(e.input_schema_json or "") for e in entries)
    assert carried <= protocol_limits.MAX_CATALOGUE_CHARS
    assert all(
        len(e.description) <= protocol_limits.MAX_CATALOGUE_DESCRIPTION_CHARS for e in entries
    )
    assert entries[0].input_schema_json is not None and entries[-1].input_schema_json is None


def test_the_bootstrap_keeps_the_alias_rule_in_step() -> None:
    assert bootstrap.NAMESPACE_NAMES == catalogue.NAMESPACE_NAMES
    assert tuple(bootstrap.LOOKUPS) == tuple(catalogue.LOOKUPS)
    names = [
        "search",
        "list-repos",
        "class",
        "print",
        "TOOLS",
        "list_tools",
        "2fa",
        "read_output",
        "get_tool_info",
        "x1",
        "_private",
        "café",
    ]
    assert [bootstrap.alias_for(n) for n in names] == [catalogue.alias_for(n) for n in names]


def test_describe_tools_stays_compact_for_hundreds_of_tools() -> None:
    specs = [
        spec_from_function(search, name=f"search_{i}") if i % 3 else ToolSpec(f"tool-{i}")
        for i in range(300)
    ]
    text = describe_tools(specs)
    assert len(text) <= catalogue.DEFAULT_DESCRIBE_CHARS
    # How to call, the await rule, the lookups and every ToolError kind are said once.
    assert "await" in text and "asyncio.gather" in text and "call_tool(" in text
    assert "list_tools" in text and "get_tool_info" in text
    for kind in ("approval_required", "tool_error", "budget_exhausted", "unknown_tool"):
        assert kind in text
    assert "search_1(query: str, limit: int = 10, exact: bool = False)" in text
    assert "call_tool('tool-0', {...})" in text
    # Every tool is shown, named, or counted with how to list it.
    small = describe_tools(specs, max_chars=4000)
    assert len(small) <= 4000
    shown = len(re.findall(r"search_\d+|tool-\d+", small))
    counted = re.search(r"and (\d+) more", small)
    assert shown + (int(counted.group(1)) if counted else 0) == 300


# ---------------------------------------------------------------- the await rule


@pytest.mark.parametrize(
    ("program", "line"),
    [
        ("x = 1\nhits = search('q')\nlen(hits)", 2),  # used as a value
        ("search('q')\nreturn 1", 1),  # dropped: the tool never ran
        ("y = 2\nsearch('q')", 2),  # returned
        ("print(add(1, 2))", 1),
    ],
)
async def test_a_missing_await_fails_saying_so_at_the_programs_own_line(
    program: str, line: int
) -> None:
    result = await run(program)
    error = result.error
    assert error is not None and error.kind is ErrorKind.EXCEPTION
    assert error.exception_type == "NotAwaitedError"
    assert f"line {line}: " in error.message and "without await" in error.message
    assert "await" in error.guidance and "never ran" in error.guidance
    assert "bootstrap" not in (error.traceback or "") and "<string>" not in (error.traceback or "")
    assert result.calls == []  # nothing was called
    assert "never awaited" not in result.stderr  # no RuntimeWarning pointing elsewhere


async def test_tool_calls_work_with_gather_tasks_wait_for_and_task_groups() -> None:
    result = await run(
        """
import asyncio
gathered = await asyncio.gather(*[add(i, 1) for i in range(5)])
task = asyncio.create_task(add(2, 2))
waited = await asyncio.wait_for(add(3, 3), 30)
async def group():
    async with asyncio.TaskGroup() as tg:
        first = tg.create_task(add(1, 1))
    return first.result()
return gathered, await task, waited, await group()
"""
    )
    assert result.error is None, result.error
    assert result.return_value == [[1, 2, 3, 4, 5], 4, 6, 2]


# ---------------------------------------------------------------- failures are data


class Failing(BindingProvider):
    def __init__(self, how: str) -> None:
        self.how = how
        self.called = False

    async def list_tools(self) -> Sequence[ToolSpec]:
        if self.how == "raise":
            raise ConnectionError("the MCP server is gone")
        if self.how == "hang":
            await anyio.sleep_forever()
        if self.how == "duplicate":
            return [ToolSpec("same"), ToolSpec("same")]
        return [42]  # type: ignore[list-item]

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        self.called = True


@pytest.mark.parametrize("how", ["raise", "hang", "duplicate", "junk"])
async def test_a_provider_failing_to_list_its_tools_is_a_result_not_an_exception(
    how: str,
) -> None:
    provider = Failing(how)
    config = DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(
                backend="subprocess",
                limits=ExecutionLimits(cpu_seconds=5, wall_seconds=1.0, grace_seconds=0.5),
            )
        }
    )
    async with Sandbox(config) as sandbox:
        result = await sandbox.run("print('ran')", profile=PROFILE, bindings=provider)
    assert result.error is not None and result.error.kind is ErrorKind.PROVIDER_ERROR
    assert "binding provider failed" in result.error.message
    assert "tool" in result.error.guidance
    assert result.stdout == ""  # the program never ran
    assert not provider.called


def test_python_configuration_takes_the_plain_strings_toml_takes() -> None:
    config = DeploymentConfig(
        required_level="isolated",  # type: ignore[arg-type]
        profiles={"p": ProfileConfig(backend="subprocess", required_level="process")},  # type: ignore[arg-type]
    )
    assert config.required_level is Level.ISOLATED
    assert config.profiles["p"].required_level is Level.PROCESS
    policy = psych_sandbox_core.TenantPolicy(minimum_level="isolated")  # type: ignore[arg-type]
    assert policy.minimum_level is Level.ISOLATED
    with pytest.raises(ValueError, match="isolated"):
        ProfileConfig(required_level="sealed")  # type: ignore[arg-type]


def test_everything_the_docs_tell_an_embedder_to_import_is_exported() -> None:
    names = set()
    for page in [*DOCS.glob("*.md"), DOCS.parent / "README.md"]:
        text = page.read_text()
        for match in re.finditer(r"from psych_sandbox_core import (\(([^)]*)\)|.*)", text):
            listed = match.group(2) if match.group(2) is not None else match.group(1)
            names.update(n.strip() for n in listed.split(",") if n.strip())
    names |= {
        "FilesystemBlobStore",
        "BindingBudgets",
        "TenantPolicy",
        "ExecutionRequest",
        "OutputPolicy",
        "SQLiteRunLog",
        "describe_tools",
        "ToolSpec",
    }
    for name in sorted(names):
        assert name in psych_sandbox_core.__all__, name
        assert getattr(psych_sandbox_core, name) is not None


# ---------------------------------------------------------------- the model's view


async def test_for_model_is_bounded_and_keeps_what_the_model_needs() -> None:
    async with Sandbox(deployment(preview_bytes=2048)) as sandbox:
        result = await sandbox.run(
            "for i in range(5000): print('row', i)\n"
            "def deep(n):\n    return deep(n - 1) if n else {}['missing']\n"
            "deep(3)",
            profile=PROFILE,
        )
    full = len(result.model_dump_json())
    view = result.for_model(max_chars=1500)
    assert len(view) <= 1500 < full
    assert view.startswith("failed: exception: KeyError: 'missing'")
    assert "row 0" in view and "row 4999" in view  # head and tail of what was printed
    assert 'File "<program>", line 3, in deep' in view
    assert "bootstrap" not in view
    assert result.error is not None and result.error.guidance[:40] in view
    assert "stdout cut" in view
    for size in (1, 40, 300, 100_000):
        assert len(result.for_model(max_chars=size)) <= size
    ok = (await run("print('hello')\n{'answer': 42}")).for_model()
    assert ok == 'ok\nstdout:\nhello\nreturned:\n{"answer": 42}'


async def test_read_output_pages_an_earlier_executions_output_in_its_run_only(
    tmp_path: Path,
) -> None:
    store = FilesystemBlobStore(tmp_path / "blobs")
    async with Sandbox(
        deployment(preview_bytes=256, read_output=True), blob_store=store
    ) as sandbox:
        first = await sandbox.run(
            "for i in range(3000): print('row', i)", profile=PROFILE, run_id="run-a", tenant="t1"
        )
        handle = first.stdout_info.attachment
        assert handle is not None and first.stdout_info.omitted_bytes > 0
        view = first.for_model(800)
        assert f"await read_output({handle!r}, offset=0)" in view
        reader = (
            f"w = await read_output({handle!r}, offset=0, length=20)\n"
            f"m = await read_output({handle!r}, pattern='row 2999')\n"
            "w['text'], w['total_chars'], [x['text'] for x in m['matches']]"
        )
        same = await sandbox.run(reader, profile=PROFILE, run_id="run-a", tenant="t1")
        other_run = await sandbox.run(reader, profile=PROFILE, run_id="run-b", tenant="t1")
        other_tenant = await sandbox.run(reader, profile=PROFILE, run_id="run-a", tenant="t2")
    assert same.error is None, same.error
    text, total, matches = same.return_value
    assert text == "row 0\nrow 1\nrow 2\nro"
    assert total == len("".join(f"row {i}\n" for i in range(3000)))
    assert matches == ["row 2999"]
    for denied in (other_run, other_tenant):
        assert denied.error is not None
        assert "handle_denied" in denied.error.message


async def test_read_output_is_offered_only_where_the_deployment_enables_it() -> None:
    result = await run("'read_output' in TOOLS, 'read_output' in globals()")
    assert result.return_value == [False, False]


def test_read_output_and_lookups_shadow_provider_tools_of_the_same_name() -> None:
    server = CallServer(
        Described([]),
        [ToolSpec("list_tools"), ToolSpec("read_output"), ToolSpec("mine")],
        outputs=AttachmentLedger(None),
    )
    assert [e.name for e in server.catalogue()] == ["mine", "read_output"]
    assert server.offered == ["mine", "read_output", "list_tools", "get_tool_info"]


# ---------------------------------------------------------------- calls in flight


def in_flight_deployment(calls_in_flight: int) -> DeploymentConfig:
    return DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(
                backend="subprocess",
                limits=LIMITS,
                budgets=psych_sandbox_core.BindingBudgets(calls_in_flight=calls_in_flight),
            )
        }
    )


async def test_calls_beyond_the_limit_in_flight_wait_their_turn_in_order() -> None:
    async with Sandbox(in_flight_deployment(2)) as sandbox:
        result = await sandbox.run(
            "import asyncio\nawait asyncio.gather(*[add(i, 100) for i in range(12)])",
            profile=PROFILE,
            bindings=FunctionBindings(TOOLS),
        )
    assert result.error is None, result.error
    assert result.return_value == [i + 100 for i in range(12)]
    # The host accepts only exact successors: twelve accepted calls are ids 0..11.
    assert [c.outcome for c in result.calls] == ["ok"] * 12


async def test_a_call_cancelled_while_it_waits_for_a_place_is_never_sent() -> None:
    async with Sandbox(in_flight_deployment(1)) as sandbox:
        result = await sandbox.run(
            """
import asyncio
first = asyncio.create_task(add(1, 2))
second = asyncio.create_task(search("never"))
await asyncio.sleep(0)  # both start: the first takes the one place, the second waits
second.cancel()
third = await add(3, 4)
return await first, second.cancelled(), third
""",
            profile=PROFILE,
            bindings=FunctionBindings(TOOLS),
        )
    assert result.error is None, result.error
    assert result.return_value == [3, True, 7]
    assert [c.name for c in result.calls] == ["add", "add"]


async def test_a_call_that_times_out_in_the_program_no_longer_blocks_it() -> None:
    # The program stops waiting at its own deadline: its event loop is not held by the call
    # (which its cancel frame cancels on the host; see test_concurrent_calls.py).
    async def slow() -> str:
        await anyio.sleep(2)
        return "late"

    result = await run(
        """
import asyncio
try:
    return await asyncio.wait_for(slow(), 0.05)
except TimeoutError:
    return "timed out"
""",
        FunctionBindings({"slow": slow}),
    )
    assert result.error is None, result.error
    assert result.return_value == "timed out"
