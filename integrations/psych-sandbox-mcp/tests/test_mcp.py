"""MCP in both directions, with real servers and real clients: the reference "everything"
server from npm and a Python server (the SDK's MCPServer) as upstreams, programs calling their
tools through real child processes, and ``psych-sandbox mcp`` driven by the SDK's client over
stdio and streamable HTTP. What an upstream ran and which processes are left are judged from
the host (a file the upstream writes, /proc), never from what a program prints."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import mcp_types
import pytest
from mcp import Client, StdioServerParameters
from psych_sandbox_core import BindingProvider, DeploymentConfig, Sandbox, ToolSpec
from psych_sandbox_core.integration_kit import parse_config
from psych_sandbox_testing.host import marker, pids_with, wait_for_pids, wait_until

from psych_sandbox_mcp import McpBindings, connect_upstreams

#: Each test starts real servers (Node.js, Python interpreters importing the SDK, the
#: sandbox's children); on a loaded two-core machine that is slow, never stuck.
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

#: Seconds to wait for processes to appear or go (polled: they are not this process's own).
PROCESS_DEADLINE = 120.0

#: The repository: its documentation (the guide run below) and the reference server that
#: scripts/setup --test installs into its virtual environment.
ROOT = Path(__file__).resolve().parents[3]
UPSTREAM = Path(__file__).resolve().parent / "upstream_server.py"
PIXEL_SHA256 = "6b7fa434f92a8b80aab02d9bf1a12e49ffcae424e4013a1c4f68b67e3d2bbcd0"


@pytest.fixture
def anyio_backend() -> str:
    # The SDK's stdio transport and its HTTP server run on asyncio; the core's own tests
    # cover trio.
    return "asyncio"


def everything_command() -> str:
    """The reference server from npm, as scripts/setup --test installs it."""
    explicit = os.environ.get("PSYCH_SANDBOX_MCP_EVERYTHING")
    path = (
        Path(explicit) if explicit else ROOT / ".venv/node/node_modules/.bin/mcp-server-everything"
    )
    if not path.exists():
        pytest.fail(
            f"the reference MCP server is not installed at {path}: run scripts/setup --test "
            "(npm install --prefix .venv/node @modelcontextprotocol/server-everything)"
        )
    return str(path)


def deployment_toml(
    mark: str,
    ran_file: Path,
    *,
    budgets: str = "",
    http_url: str | None = None,
) -> str:
    """A deployment with a subprocess profile and both upstreams (the Python one over stdio,
    or over streamable HTTP at ``http_url``); each upstream process carries ``mark``."""
    python = (
        f"""
[mcp.upstreams.py]
transport = "streamable-http"
url = "{http_url}"
approval = ["delete-everything"]
"""
        if http_url
        else f"""
[mcp.upstreams.py]
transport = "stdio"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(UPSTREAM))}, "stdio", "{mark}"]
env = {{ UPSTREAM_RAN_FILE = {json.dumps(str(ran_file))} }}
approval = ["delete-everything"]
"""
    )
    return f"""
[profiles.mcp-test]
backend = "subprocess"

[profiles.mcp-test.limits]
cpu_seconds = 20
wall_seconds = 60.0

[profiles.mcp-test.budgets]
{budgets}

[mcp]
profile = "mcp-test"

[mcp.upstreams.everything]
transport = "stdio"
command = {json.dumps(everything_command())}
args = ["stdio", "{mark}"]
{python}"""


@pytest.fixture
def mark() -> str:
    return marker("psych-mcp")


@pytest.fixture
def ran_file(tmp_path: Path) -> Path:
    return tmp_path / "delete-everything-ran"


def config_of(text: str) -> DeploymentConfig:
    return parse_config(text)


@pytest.fixture
async def upstreams(mark: str, ran_file: Path) -> AsyncIterator[tuple[McpBindings, Sandbox]]:
    config = config_of(deployment_toml(mark, ran_file, budgets="result_bytes_per_call = 65536"))
    async with connect_upstreams(config.mcp) as bindings, Sandbox(config) as sandbox:
        yield bindings, sandbox
    await wait_for_pids(mark, present=False, deadline=PROCESS_DEADLINE)


async def run(pair: tuple[McpBindings, Sandbox], source: str) -> Any:
    bindings, sandbox = pair
    return await sandbox.run(source, profile="mcp-test", bindings=bindings)


# ------------------------------------------------------------------ the bindings provider


async def test_every_upstream_tool_is_a_binding_with_its_description_and_schema(
    upstreams: tuple[McpBindings, Sandbox],
) -> None:
    bindings, _ = upstreams
    specs = {spec.name: spec for spec in await bindings.list_tools()}
    # The reference server's names are not identifiers; the Python server's partly are.
    assert {"echo", "get-sum", "get-tiny-image", "get-structured-content"} <= set(specs)
    assert {"list-orders", "stats", "big", "fail", "pixel", "delete-everything"} <= set(specs)
    get_sum = specs["get-sum"]
    assert get_sum.description == "Returns the sum of two numbers"
    assert get_sum.input_schema is not None
    assert set(get_sum.input_schema["properties"]) == {"a", "b"}
    assert specs["stats"].input_schema is not None
    assert "values" in specs["stats"].input_schema["properties"]
    # Never offered to a program: a long-running task, and a tool the deployment marks as
    # needing approval.
    assert specs["simulate-research-query"].may_suspend
    assert specs["delete-everything"].may_suspend
    assert not specs["get-sum"].may_suspend
    assert bindings.problems == {}


async def test_a_program_calls_upstream_tools_in_a_loop_and_reduces_their_results(
    upstreams: tuple[McpBindings, Sandbox],
) -> None:
    result = await run(
        upstreams,
        """
total = 0
for a in range(10):
    text = await call_tool("get-sum", {"a": a, "b": 100})
    total += int(text.rstrip(".").split()[-1])
orders = []
page = 0
while batch := await call_tool("list-orders", {"page": page}):
    orders.extend(batch)
    page += 1
summary = await stats(values=[o["amount"] for o in orders])
{"sum": total, "orders": len(orders), "stats": summary, "echo": await echo(message="hi"),
 "names": ["get-sum" in TOOLS, "delete-everything" in TOOLS, "simulate-research-query" in TOOLS]}
""",
    )
    assert result.error is None, result.error
    assert result.return_value == {
        "sum": sum(range(10)) + 1000,
        "orders": 30,
        "stats": {"sum": float(sum(range(30))), "mean": sum(range(30)) / 30},
        "echo": "Echo: hi",
        "names": [True, False, False],
    }
    assert len(result.calls) == 10 + 4 + 2
    assert {call.outcome for call in result.calls} == {"ok"}


async def test_results_are_converted_faithfully_and_binary_content_is_kept_not_inlined(
    upstreams: tuple[McpBindings, Sandbox],
) -> None:
    bindings, _ = upstreams
    result = await run(
        upstreams,
        """
{
    "structured": await call_tool("get-structured-content", {"location": "Chicago"}),
    "json_text": await call_tool("list-orders", {"page": 2}),
    "text": await echo(message="not json"),
    "image": await pixel(),
    "logo": await call_tool("get-tiny-image", {}),
    "blob": await call_tool("get-resource-reference", {"resourceType": "Blob", "resourceId": 2}),
}
""",
    )
    assert result.error is None, result.error
    value = result.return_value
    assert set(value["structured"]) == {"temperature", "conditions", "humidity"}
    assert value["json_text"][0] == {"id": 20, "amount": 20}
    assert value["text"] == "Echo: not json"
    (image,) = value["image"]
    assert image["type"] == "image" and image["mime_type"] == "image/png"
    assert image["sha256"] == PIXEL_SHA256 and image["size_bytes"] == 70
    kept = bindings.binary(image["attachment"])
    assert kept is not None and hashlib.sha256(kept.data).hexdigest() == PIXEL_SHA256
    # Mixed content: each block with its type, text kept, the image described.
    kinds = [block["type"] for block in value["logo"]]
    assert kinds == ["text", "image", "text"]
    logo = bindings.binary(value["logo"][1]["attachment"])
    assert logo is not None and logo.data.startswith(b"\x89PNG")
    blob = next(block for block in value["blob"] if block["type"] == "resource")
    assert blob["uri"].startswith("demo://") and bindings.binary(blob["attachment"]) is not None
    # No base64 crossed into the program.
    assert "iVBOR" not in json.dumps(value)


async def test_upstream_failures_reach_the_program_as_tool_error_kinds(
    upstreams: tuple[McpBindings, Sandbox], ran_file: Path
) -> None:
    result = await run(
        upstreams,
        """
kinds = {}
for name, args in [("fail", {"reason": "disk on fire"}), ("delete-everything", {}),
                   ("simulate-research-query", {"topic": "x"}), ("get-sum", {"a": "x"}),
                   ("confirm-with-person", {})]:
    try:
        await call_tool(name, args)
        kinds[name] = "ok"
    except ToolError as exc:
        kinds[name] = [exc.kind, exc.message]
kinds
""",
    )
    assert result.error is None, result.error
    kinds = result.return_value
    assert kinds["fail"][0] == "tool_error" and "disk on fire" in kinds["fail"][1]
    assert kinds["delete-everything"][0] == "approval_required"
    assert kinds["simulate-research-query"][0] == "approval_required"
    assert kinds["get-sum"][0] == "tool_error"
    # An elicitation: the upstream asks for a person's answer, which a program cannot give.
    assert kinds["confirm-with-person"][0] == "approval_required"
    # Refused before it ran: the upstream never saw the call.
    assert not ran_file.exists()


async def test_a_tool_the_upstream_withdrew_is_gone_in_the_next_execution(
    upstreams: tuple[McpBindings, Sandbox],
) -> None:
    first = await run(upstreams, '[("big" in TOOLS), await withdraw(tool="big")]')
    assert first.return_value == [True, "withdrew big"]
    second = await run(upstreams, '"big" in TOOLS')
    assert second.return_value is False


def python_upstream_pids(mark: str) -> list[int]:
    """The Python upstream's processes carrying ``mark`` (not the reference server's)."""
    found = []
    for pid in pids_with(mark):
        try:
            if str(UPSTREAM) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                found.append(pid)
        except OSError:
            pass
    return found


async def kill_python_upstream(mark: str) -> None:
    (pid,) = python_upstream_pids(mark)
    os.kill(pid, signal.SIGKILL)
    await wait_until(lambda: pid not in pids_with(mark), PROCESS_DEADLINE)


class _KilledAfterListing(BindingProvider):
    """The upstreams' tools as listed, then the Python upstream killed before any call."""

    def __init__(self, inner: McpBindings, mark: str) -> None:
        self.inner = inner
        self.mark = mark

    async def list_tools(self) -> Sequence[ToolSpec]:
        specs = await self.inner.list_tools()
        await kill_python_upstream(self.mark)
        return specs

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        return await self.inner.call(name, arguments)


async def test_a_killed_upstream_is_reported_as_data_and_the_others_keep_working(
    mark: str, ran_file: Path
) -> None:
    config = config_of(deployment_toml(mark, ran_file))
    async with connect_upstreams(config.mcp) as bindings, Sandbox(config) as sandbox:
        await wait_until(lambda: python_upstream_pids(mark), PROCESS_DEADLINE)
        result = await sandbox.run(
            """
try:
    await stats(values=[1])
    outcome = "ok"
except ToolError as exc:
    outcome = exc.kind
[outcome, await echo(message="still here")]
""",
            profile="mcp-test",
            bindings=_KilledAfterListing(bindings, mark),
        )
        assert result.error is None, result.error
        assert result.return_value == ["unreachable", "Echo: still here"]
        # The next execution is not offered its tools, and the listing says why.
        after = await sandbox.run(
            '["stats" in TOOLS, "echo" in TOOLS]', profile="mcp-test", bindings=bindings
        )
        assert after.return_value == [False, True]
        assert bindings.problems["py"].startswith("unreachable")
    await wait_for_pids(mark, present=False, deadline=PROCESS_DEADLINE)


@pytest.fixture
def http_upstream(mark: str) -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, str(UPSTREAM), "http", mark], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()


async def test_an_upstream_over_streamable_http(
    http_upstream: str, mark: str, ran_file: Path
) -> None:
    config = config_of(deployment_toml(mark, ran_file, http_url=http_upstream))
    async with connect_upstreams(config.mcp) as bindings, Sandbox(config) as sandbox:
        result = await sandbox.run(
            "await stats(values=[2, 4])", profile="mcp-test", bindings=bindings
        )
        assert result.error is None, result.error
        assert result.return_value == {"sum": 6.0, "mean": 3.0}
        refused = await sandbox.run(
            """
try:
    await call_tool("delete-everything", {})
    kind = "ok"
except ToolError as exc:
    kind = exc.kind
kind
""",
            profile="mcp-test",
            bindings=bindings,
        )
        assert refused.return_value == "approval_required"


# ------------------------------------------------------------------ psych-sandbox mcp


def server_parameters(config: Path, tmp: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=str(Path(sys.executable).with_name("psych-sandbox")),
        args=["mcp", "--config", str(config)],
        env={"TMPDIR": str(tmp)},
    )


def text_of(result: mcp_types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, mcp_types.TextContent)
    return block.text


def test_a_configuration_the_server_cannot_run_is_said_as_the_command_says_every_other(
    tmp_path: Path,
) -> None:
    # Through the core's command and its hand-over: exit status 2 and one line naming the
    # key, not a traceback out of the server's task group.
    config = tmp_path / "deployment.toml"
    config.write_text("[mcp]\nprofile = 'nope'\n")
    completed = subprocess.run(
        [str(Path(sys.executable).with_name("psych-sandbox")), "mcp", "--config", str(config)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 2, completed.stderr
    assert completed.stderr.startswith(
        "psych-sandbox: configuration error: mcp.profile: no profile named 'nope'"
    ), completed.stderr
    assert "Traceback" not in completed.stderr


async def test_the_mcp_server_end_to_end_over_stdio(
    tmp_path: Path, mark: str, ran_file: Path
) -> None:
    config = tmp_path / "deployment.toml"
    config.write_text(
        deployment_toml(
            mark, ran_file, budgets="calls_per_execution = 40\nresult_bytes_per_call = 65536"
        )
    )
    server_tmp = tmp_path / "server-tmp"
    server_tmp.mkdir()
    async with Client(server_parameters(config, server_tmp)) as client:
        listed = {tool.name for tool in (await client.list_tools()).tools}
        assert listed == {"run_python", "list_callable_tools", "read_output"}

        listing = text_of(await client.call_tool("list_callable_tools", {}))
        assert "call_tool('get-sum', {a: float, b: float}): Returns the sum" in listing
        assert "stats(values: list[float]): Sum and mean" in listing
        assert "delete-everything" in listing.splitlines()[-1]  # listed as not callable

        # A loop over upstream tools, reduced in the program.
        loop = await client.call_tool(
            "run_python",
            {
                "code": "sum([int((await call_tool('get-sum', {'a': i, 'b': i})).rstrip('.')"
                ".split()[-1]) for i in range(20)])"
            },
        )
        assert not loop.is_error, text_of(loop)
        assert loop.structured_content is not None
        assert loop.structured_content["return_value"] == 2 * sum(range(20))
        assert loop.structured_content["tool_calls"] == 20

        # A large tool result, paged inside the program; a large output, paged by handle.
        paged = await client.call_tool(
            "run_python",
            {
                "code": """
handle = await big(size=200000)
tail = await read_tool_output(handle, offset=199990, length=100)
found = await read_tool_output(handle, pattern="!")
print("y" * 50000 + "END")
[type(handle).__name__, tail["text"], found["matches"][0]["offset"]]
"""
            },
        )
        view = paged.structured_content
        assert view is not None and not paged.is_error, text_of(paged)
        # The JSON text of the result is the string in quotes, so "!" is at index 200000.
        assert view["return_value"] == ["ToolResultHandle", "x" * 10 + '!"', 200000]
        truncated = view["stdout_truncated"]
        assert truncated["total_bytes"] == 50004
        window = await client.call_tool(
            "read_output", {"handle": truncated["handle"], "offset": 49990, "length": 100}
        )
        assert window.structured_content is not None
        assert window.structured_content["text"] == "yyyyyyyyyyEND\n"
        assert window.structured_content["eof"] is True

        # Budgets: the profile allows 40 calls per execution.
        budget = await client.call_tool(
            "run_python",
            {
                "code": """
kinds = []
for i in range(50):
    try:
        await echo(message=str(i))
        kinds.append("ok")
    except ToolError as exc:
        kinds.append(exc.kind)
[kinds.count("ok"), kinds.count("budget_exhausted")]
"""
            },
        )
        assert budget.structured_content is not None
        assert budget.structured_content["return_value"] == [40, 10]
        assert budget.structured_content["failed_tool_calls"] == {"budget_exhausted": 10}

        # An image an upstream returned: described to the program, its bytes by handle.
        image = await client.call_tool("run_python", {"code": "(await pixel())[0]"})
        assert image.structured_content is not None
        descriptor = image.structured_content["return_value"]
        read = await client.call_tool("read_output", {"handle": descriptor["attachment"]})
        (block,) = read.content
        assert isinstance(block, mcp_types.ImageContent) and block.mime_type == "image/png"
        import base64

        assert hashlib.sha256(base64.b64decode(block.data)).hexdigest() == PIXEL_SHA256

        # A failing program is an answer, not a protocol error.
        failed = await client.call_tool("run_python", {"code": "1 / 0"})
        assert failed.is_error and failed.structured_content is not None
        assert failed.structured_content["error"]["kind"] == "exception"
        denied = await client.call_tool("read_output", {"handle": "att:0:forged"})
        assert denied.is_error

        # A killed upstream: reported as data in the next answer and listing.
        await kill_python_upstream(mark)
        gone = await client.call_tool(
            "run_python", {"code": '["stats" in TOOLS, await echo(message="ok")]'}
        )
        assert gone.structured_content is not None
        assert gone.structured_content["return_value"] == [False, "Echo: ok"]
        listing = text_of(await client.call_tool("list_callable_tools", {}))
        assert "unavailable: py: unreachable" in listing
    # The server is gone with its client: no upstream process, no temporary folder left.
    await wait_for_pids(mark, present=False, deadline=PROCESS_DEADLINE)
    assert list(server_tmp.iterdir()) == []
    assert not ran_file.exists()


async def test_the_mcp_server_over_streamable_http(
    tmp_path: Path, mark: str, ran_file: Path
) -> None:
    config = tmp_path / "deployment.toml"
    config.write_text(deployment_toml(mark, ran_file))
    server_tmp = tmp_path / "server-tmp"
    server_tmp.mkdir()
    process = await anyio.open_process(
        [
            str(Path(sys.executable).with_name("psych-sandbox")),
            "mcp",
            "--config",
            str(config),
            "--transport",
            "streamable-http",
            "--port",
            "0",
        ],
        env={**os.environ, "TMPDIR": str(server_tmp)},
    )
    try:
        assert process.stderr is not None
        announced = b""
        with anyio.fail_after(PROCESS_DEADLINE):
            while b"serving at " not in announced:
                announced += await process.stderr.receive()
        url = announced.split(b"serving at ", 1)[1].split(b"\n", 1)[0].decode()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")
        async with Client(url) as client:
            answer = await client.call_tool(
                "run_python",
                {
                    "code": "[await stats(values=[1, 2, 3]), "
                    "await call_tool('get-sum', {'a': 1, 'b': 2})]"
                },
            )
            assert answer.structured_content is not None, text_of(answer)
            assert answer.structured_content["return_value"] == [
                {"sum": 6.0, "mean": 2.0},
                "The sum of 1 and 2 is 3.",
            ]
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(PROCESS_DEADLINE):
            status = await process.wait()
        assert status == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.aclose()
    await wait_for_pids(mark, present=False, deadline=PROCESS_DEADLINE)
    assert list(server_tmp.iterdir()) == []


async def test_the_mcp_guide_example_runs_and_prints_what_it_claims(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import re

    text = (ROOT / "docs" / "mcp.md").read_text()
    (toml,) = re.findall(r"```toml\n(.*?)```", text, flags=re.S)
    (example,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    claimed = re.search(r"What it prints:\n\n```\n(.*?)```", text, flags=re.S)
    assert claimed is not None
    config = tmp_path / "deployment.toml"
    config.write_text(toml)
    # As the guide says: psych-sandbox and the reference server on PATH.
    path = [str(Path(sys.executable).parent), str(Path(everything_command()).parent)]
    monkeypatch.setenv("PATH", os.pathsep.join([*path, os.environ.get("PATH", "")]))
    namespace: dict[str, Any] = {"__name__": "mcp_guide"}
    exec(compile(example, "mcp.md", "exec"), namespace)
    lines = await namespace["main"](str(config))
    assert lines == claimed.group(1).strip().splitlines()


async def test_the_server_keeps_output_of_its_latest_runs_only(tmp_path: Path) -> None:
    from psych_sandbox_mcp.server import FrontDoor, RetainingStore

    store_root = tmp_path / "store"
    store = RetainingStore(str(store_root), max_runs=2, max_bytes=10**9)
    config = config_of('[profiles.mcp-test]\nbackend = "subprocess"')
    async with Sandbox(config, blob_store=store) as sandbox:
        front = FrontDoor(sandbox, McpBindings({}), "mcp-test", store)
        handles = []
        sizes: list[int] = []
        for n in range(4):
            answer = await front.run_python(f"print({str(n)!r} * 100000)", None)
            assert answer.structured_content is not None
            handles.append(answer.structured_content["stdout_truncated"]["handle"])
            sizes.append(sum(p.stat().st_size for p in store_root.rglob("*") if p.is_file()))
        # Judged on disk: each run keeps as much, and at most two runs' worth is ever there.
        assert sizes[1] > sizes[0] > 0
        assert max(sizes) < 3 * sizes[0]
        for old in handles[:2]:
            denied = await front.read_output(old, 0, 10)
            assert denied.is_error
        latest = await front.read_output(handles[-1], 0, 10)
        assert latest.structured_content is not None
        assert latest.structured_content["text"] == "3333333333"


def test_the_listing_names_a_tool_as_the_program_calls_it() -> None:
    from psych_sandbox_core.integration_kit import tool_line

    schema = {
        "type": "object",
        "properties": {"q": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["q"],
    }
    assert tool_line(ToolSpec("search", description="Find\n things", input_schema=schema)) == (
        "search(q: str, n: int = None): Find"
    )
    # No alias for a keyword, a builtin or a name that is not an identifier.
    for name in ("class", "print", "list-repos", 'a"b'):
        line = tool_line(ToolSpec(name, input_schema=schema))
        assert line == f"call_tool({name!r}, {{q: str, n: int = None}})"


async def test_a_name_two_upstreams_offer_is_qualified_for_each(mark: str) -> None:
    upstream = f"""
transport = "stdio"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(UPSTREAM))}, "stdio", "{mark}"]
"""
    config = config_of(
        f'[profiles.mcp-test]\nbackend = "subprocess"\n'
        f"[mcp.upstreams.a]{upstream}[mcp.upstreams.b]{upstream}"
    )
    async with connect_upstreams(config.mcp) as bindings, Sandbox(config) as sandbox:
        result = await sandbox.run(
            """
[sorted(t for t in TOOLS if t.endswith("stats")),
 await call_tool("a/stats", {"values": [1]}), await call_tool("b/withdraw", {"tool": "big"})]
""",
            profile="mcp-test",
            bindings=bindings,
        )
        assert result.error is None, result.error
        assert result.return_value == [
            ["a/stats", "b/stats"],
            {"sum": 1.0, "mean": 1.0},
            "withdrew big",
        ]
        # Withdrawn from b only: a's keeps the plain name now that no one else offers it.
        after = await sandbox.run(
            '[t for t in TOOLS if t.endswith("big")]', profile="mcp-test", bindings=bindings
        )
        assert after.return_value == ["big"]
    await wait_for_pids(mark, present=False, deadline=PROCESS_DEADLINE)


async def test_a_signal_to_the_server_tears_down_a_running_program_and_the_upstreams(
    tmp_path: Path, mark: str, ran_file: Path
) -> None:
    config = tmp_path / f"{mark}.toml"  # the server's command line carries the mark too
    config.write_text(deployment_toml(mark, ran_file))
    server_tmp = tmp_path / "server-tmp"
    server_tmp.mkdir()
    sleeper = marker("psych-mcp-sleeper")
    program = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {sleeper!r}],"
        " start_new_session=True)\n"
        "import time\ntime.sleep(600)"
    )
    outcome: list[BaseException] = []
    async with anyio.create_task_group() as group:

        async def drive() -> None:
            try:
                async with Client(server_parameters(config, server_tmp)) as client:
                    await client.call_tool("run_python", {"code": program})
            except BaseException as exc:  # the server went away mid-call
                outcome.append(exc)
                if isinstance(exc, anyio.get_cancelled_exc_class()):
                    raise

        group.start_soon(drive)
        await wait_for_pids(sleeper, deadline=PROCESS_DEADLINE)
        (server,) = [
            pid
            for pid in pids_with(str(config))
            if "mcp" in Path(f"/proc/{pid}/cmdline").read_text()
        ]
        os.kill(server, signal.SIGTERM)
    assert outcome, "the call should have failed when the server went away"
    # Judged from the host: the program's detached descendant, the upstreams and the server's
    # temporary folder are gone.
    await wait_for_pids(sleeper, present=False, deadline=PROCESS_DEADLINE)
    await wait_for_pids(mark, present=False, deadline=PROCESS_DEADLINE)
    assert list(server_tmp.iterdir()) == []


def test_result_conversion_edges() -> None:
    import base64

    from psych_sandbox_core import ToolCallError

    from psych_sandbox_mcp.bindings import BinaryKeeper, convert_result

    def text(*texts: str, **fields: Any) -> mcp_types.CallToolResult:
        blocks: list[mcp_types.ContentBlock] = [mcp_types.TextContent(text=t) for t in texts]
        return mcp_types.CallToolResult(content=blocks, **fields)

    keeper = BinaryKeeper(max_bytes=100)
    # Structured content wins over the text that mirrors it.
    assert convert_result(text('{"a": 1}', structured_content={"a": 2}), keeper) == {"a": 2}
    assert convert_result(text("[1, 2]"), keeper) == [1, 2]
    # Text that is not JSON, or JSON no program could be sent (NaN, 1e999), stays text.
    for kept in ("Echo: hi", "NaN", "[1e999]", "123abc"):
        assert convert_result(text(kept), keeper) == kept
    assert convert_result(mcp_types.CallToolResult(content=[]), keeper) is None
    assert convert_result(text("a", '{"b": 1}'), keeper) == [
        {"type": "text", "text": "a"},
        {"type": "text", "text": '{"b": 1}', "data": {"b": 1}},
    ]
    with pytest.raises(ToolCallError) as failed:
        convert_result(text("quota exceeded", is_error=True), keeper)
    assert failed.value.kind == "tool_error" and failed.value.message == "quota exceeded"

    def image(data: bytes) -> mcp_types.CallToolResult:
        encoded = base64.b64encode(data).decode()
        return mcp_types.CallToolResult(
            content=[mcp_types.ImageContent(data=encoded, mime_type="image/png")]
        )

    (small,) = convert_result(image(b"x" * 60), keeper)
    (other,) = convert_result(image(b"y" * 60), keeper)
    # Bounded: the older image is forgotten to keep the newer; one over the bound alone is
    # described but not kept.
    assert keeper.get(small["attachment"]) is None
    assert keeper.get(other["attachment"]) is not None
    (huge,) = convert_result(image(b"z" * 101), keeper)
    assert huge["attachment"] is None and huge["size_bytes"] == 101
    broken = mcp_types.CallToolResult(
        content=[mcp_types.ImageContent(data="not base64!", mime_type="image/png")]
    )
    with pytest.raises(ToolCallError, match="not valid base64"):
        convert_result(broken, keeper)


async def test_an_answer_is_bounded_whatever_the_program_does(tmp_path: Path) -> None:
    from psych_sandbox_mcp.server import (
        FAILURE_TEXT_CHARS,
        RETURN_PREVIEW_CHARS,
        FrontDoor,
        RetainingStore,
    )

    store = RetainingStore(str(tmp_path / "store"), max_runs=8, max_bytes=10**9)
    config = config_of('[profiles.mcp-test]\nbackend = "subprocess"')
    async with Sandbox(config, blob_store=store) as sandbox:
        front = FrontDoor(sandbox, McpBindings({}), "mcp-test", store)
        failed = await front.run_python("raise ValueError('x' * 10**6)", None)
        assert failed.is_error and failed.structured_content is not None
        error = failed.structured_content["error"]
        assert error["kind"] == "exception"
        assert len(error["message"]) <= FAILURE_TEXT_CHARS
        assert len(error["traceback"]) <= FAILURE_TEXT_CHARS
        big = await front.run_python("'y' * 50000", None)  # under the 64 KiB return limit
        view = big.structured_content
        assert view is not None and "return_value" not in view
        assert len(view["return_value_preview"]) == RETURN_PREVIEW_CHARS
        truncated = view["return_value_truncated"]
        assert truncated["chars"] == 50002
        window = await front.read_output(truncated["handle"], 50002 - 7, 100)
        assert window.structured_content is not None
        assert window.structured_content["text"] == 'yyyyyy"'
        assert len(text_of(big)) < 3 * RETURN_PREVIEW_CHARS
