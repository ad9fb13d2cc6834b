"""``psych-sandbox mcp``: an MCP server whose ``run_python`` runs a program in the sandbox,
with every tool of the deployment's upstream MCP servers callable from it.

Three tools (see docs/mcp.md):

- ``run_python(code, timeout)``: one program, one fresh sandboxed process, under the profile
  the ``[mcp]`` section names (its limits, level and binding budgets). The answer is the
  result as a model reads it: return value, output previews, a typed failure with guidance.
- ``list_callable_tools()``: the tools a program may call right now, one line each.
- ``read_output(handle, offset, length)``: a window of output too long for the answer (a
  stream or return value past its preview), or the bytes of an image or other binary content
  an upstream tool returned, by the handle the answer named.

Nothing is kept across programs except what the handles name: results too large for a
program are paged from a blob store in a private temporary folder that lives as long as the
server, and removed with it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import sys
import tempfile
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import anyio
import mcp_types
from mcp.server.mcpserver import MCPServer
from psych_sandbox_core import (
    AttachmentDenied,
    BlobAddress,
    BlobStore,
    ConfigurationError,
    ExecutionResult,
    FilesystemBlobStore,
    Sandbox,
)
from psych_sandbox_core.integration_kit import (
    DEFAULT_WINDOW_BYTES,
    MAX_WINDOW_BYTES,
    ConfigSource,
    cut_text,
    tool_line,
)

from .bindings import BINARY_HANDLE_PREFIX, McpBindings, connect_upstreams

Transport = Literal["stdio", "streamable-http"]

#: Characters of a return value's JSON shown in an answer; past it, a handle to read it by.
RETURN_PREVIEW_CHARS = 16 * 1024
#: Characters of a failure's message and of its traceback in an answer (a head and a tail):
#: the streams' previews are 16 KiB each, and a failure should not outweigh them.
FAILURE_TEXT_CHARS = 16 * 1024
#: Runs whose output the server keeps readable by handle, and the bytes it keeps for them
#: on disk; past either, the oldest runs are forgotten.
REMEMBERED_RUNS = 1024
KEPT_BYTES = 1024 * 1024 * 1024

RUN_PYTHON_DESCRIPTION = """\
Run a Python program in an isolated sandbox (a fresh process each time; nothing survives it).
The value of a final bare expression (or a top-level `return`) is returned; print() output is
returned too, previewed when long. Top-level `await` works. Tools are callable from the program:
`await call_tool("name", {...})` for any tool, `await name(arg=...)` for a name that is a Python
identifier; `TOOLS` lists the names; a failed call raises `ToolError` with `.kind` and
`.message`. A result too large to hand over whole is a `ToolResultHandle`: read it with
`await read_tool_output(handle, offset=0, length=...)` or `pattern=...`. Call list_callable_tools
to see the tools and their arguments. Reduce results in the program and return only what is
needed."""


class RetainingStore(BlobStore):
    """The server's blob store: a private folder whose runs are forgotten oldest first once
    more than ``max_runs`` runs, or more than ``max_bytes`` bytes, are kept, so a server that
    runs for months does not fill its disk with output nobody will read again."""

    def __init__(self, root: str, *, max_runs: int, max_bytes: int) -> None:
        self._files = FilesystemBlobStore(root)
        self.max_runs = max_runs
        self.max_bytes = max_bytes
        self._runs: OrderedDict[tuple[str, str], list[tuple[BlobAddress, int]]] = OrderedDict()
        self._bytes = 0

    async def put(self, address: BlobAddress, data: bytes) -> None:
        await self._files.put(address, data)
        self._runs.setdefault((address.tenant, address.run_id), []).append((address, len(data)))
        self._bytes += len(data)

    async def read(self, address: BlobAddress, offset: int = 0, length: int | None = None) -> bytes:
        return await self._files.read(address, offset, length)

    async def size(self, address: BlobAddress) -> int:
        return await self._files.size(address)

    async def evict(self, keep: tuple[str, str]) -> list[tuple[str, str]]:
        """Remove the oldest runs (never ``keep``) until within bounds; the runs removed."""
        evicted = []
        while len(self._runs) > self.max_runs or self._bytes > self.max_bytes:
            run = next((r for r in self._runs if r != keep), None)
            if run is None:
                break
            for address, size in self._runs.pop(run):
                await self._files.delete(address)
                self._bytes -= size
            evicted.append(run)
        return evicted


@dataclass
class FrontDoor:
    """What the server's tools share: the sandbox, the upstream bindings and the handles."""

    sandbox: Sandbox
    bindings: McpBindings
    profile: str
    store: RetainingStore
    #: Output handles this server handed out, and the run each belongs to.
    handles: OrderedDict[str, str] = field(default_factory=OrderedDict)

    async def run_python(self, code: str, timeout: float | None) -> mcp_types.CallToolResult:
        if timeout is not None and not timeout > 0:
            return _error_result("timeout must be a positive number of seconds")
        result = await self.sandbox.run(
            code, profile=self.profile, timeout=timeout, bindings=self.bindings
        )
        view = self._view(result)
        await self._retain(result)
        return mcp_types.CallToolResult(
            content=[mcp_types.TextContent(type="text", text=_compact(view))],
            structured_content=view,
            is_error=not result.ok,
        )

    def _remember(self, handle: str | None, run_id: str | None) -> str | None:
        if handle is None or run_id is None:
            return None
        self.handles[handle] = run_id
        while len(self.handles) > REMEMBERED_RUNS * 3:  # three streams' worth per run
            self.handles.popitem(last=False)
        return handle

    async def _retain(self, result: ExecutionResult) -> None:
        """Forget the oldest runs' output once the store is past its bounds."""
        tenant, run_id = result.tenant or "default", result.run_id or ""
        evicted = await self.store.evict(keep=(tenant, run_id))
        if not evicted:
            return
        gone = {run for _, run in evicted}
        for old_tenant, old_run in evicted:
            self.sandbox.attachments.forget(old_tenant, old_run)
        for handle in [h for h, run in self.handles.items() if run in gone]:
            del self.handles[handle]

    def _view(self, result: ExecutionResult) -> dict[str, Any]:
        view: dict[str, Any] = {"ok": result.ok}
        if result.error is None:
            text = json.dumps(result.return_value, ensure_ascii=False)
            if len(text) <= RETURN_PREVIEW_CHARS:
                view["return_value"] = result.return_value
            else:
                handle = next(
                    (a.handle for a in result.attachments if a.kind == "return_value"), None
                )
                view["return_value_preview"] = text[:RETURN_PREVIEW_CHARS]
                view["return_value_truncated"] = {
                    "chars": len(text),
                    "handle": self._remember(handle, result.run_id),
                }
        else:
            error = result.error
            view["error"] = {
                "kind": error.kind.value,
                "message": cut_text(error.message, FAILURE_TEXT_CHARS),
                "guidance": error.guidance,
                **(
                    {"traceback": cut_text(error.traceback, FAILURE_TEXT_CHARS)}
                    if error.traceback
                    else {}
                ),
            }
        for name in ("stdout", "stderr"):
            text = getattr(result, name)
            info = getattr(result, f"{name}_info")
            if text:
                view[name] = text
            if info.omitted_bytes or info.dropped_bytes:
                view[f"{name}_truncated"] = {
                    "total_bytes": info.total_bytes,
                    "omitted_bytes": info.omitted_bytes,
                    "handle": self._remember(info.attachment, result.run_id),
                }
        if result.calls:
            view["tool_calls"] = len(result.calls)
            failed: dict[str, int] = {}
            for call in result.calls:
                if call.outcome != "ok":
                    failed[call.outcome] = failed.get(call.outcome, 0) + 1
            if failed:
                view["failed_tool_calls"] = failed
        view["level"] = result.level.value
        return view

    async def list_callable_tools(self) -> str:
        specs = await self.bindings.list_tools()
        lines = [tool_line(spec) for spec in specs if not spec.may_suspend]
        suspending = [spec.name for spec in specs if spec.may_suspend]
        if not lines:
            lines.append("(no tools are callable from a program right now)")
        if suspending:
            lines.append(
                "not callable from a program (they need approval or a person's answer; call "
                "them directly): " + ", ".join(suspending)
            )
        for name, problem in sorted(self.bindings.problems.items()):
            lines.append(f"unavailable: {name}: {problem}")
        return "\n".join(lines)

    async def read_output(self, handle: str, offset: int, length: int) -> mcp_types.CallToolResult:
        if handle.startswith(BINARY_HANDLE_PREFIX):
            kept = self.bindings.binary(handle)
            if kept is None:
                return _error_result("no binary content is kept under this handle (any more)")
            return mcp_types.CallToolResult(
                content=[_binary_block(handle, kept.mime_type, kept.data)]
            )
        run_id = self.handles.get(handle)
        if run_id is None:
            return _error_result("this server handed out no output handle like this one")
        if offset < 0 or not 0 < length <= MAX_WINDOW_BYTES:
            return _error_result(f"offset must be >= 0 and length from 1 to {MAX_WINDOW_BYTES}")
        try:
            window = await self.sandbox.read_attachment(
                handle, run_id=run_id, offset=offset, length=length
            )
        except AttachmentDenied:
            return _error_result("the output behind this handle is no longer kept")
        view = {
            "text": window.text,
            "offset": window.offset,
            "next_offset": window.offset + len(window.data),
            "kept_bytes": window.kept_bytes,
            "eof": window.eof,
            "complete": window.complete,
        }
        return mcp_types.CallToolResult(
            content=[mcp_types.TextContent(type="text", text=_compact(view))],
            structured_content=view,
        )


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _error_result(message: str) -> mcp_types.CallToolResult:
    return mcp_types.CallToolResult(
        content=[mcp_types.TextContent(type="text", text=message)], is_error=True
    )


def _binary_block(handle: str, mime_type: str, data: bytes) -> mcp_types.ContentBlock:
    encoded = base64.b64encode(data).decode("ascii")
    if mime_type.startswith("image/"):
        return mcp_types.ImageContent(type="image", data=encoded, mime_type=mime_type)
    if mime_type.startswith("audio/"):
        return mcp_types.AudioContent(type="audio", data=encoded, mime_type=mime_type)
    return mcp_types.EmbeddedResource(
        type="resource",
        resource=mcp_types.BlobResourceContents(
            uri=f"psych-sandbox:{handle}", mime_type=mime_type, blob=encoded
        ),
    )


def build_server(front: FrontDoor) -> MCPServer[Any]:
    """The MCP server application over ``front``."""
    server: MCPServer[Any] = MCPServer(
        "psych-sandbox",
        instructions=(
            "Run Python programs in an isolated sandbox with run_python; programs can call the "
            "tools list_callable_tools lists, and reduce their results before returning."
        ),
        log_level="WARNING",
    )

    async def run_python(code: str, timeout: float | None = None) -> mcp_types.CallToolResult:
        return await front.run_python(code, timeout)

    async def list_callable_tools() -> str:
        """The tools a program run by run_python may call right now, one per line, in the
        form a program calls them (an argument marked ? is optional)."""
        return await front.list_callable_tools()

    async def read_output(
        handle: str, offset: int = 0, length: int = DEFAULT_WINDOW_BYTES
    ) -> mcp_types.CallToolResult:
        """Read output that run_python's answer cut short (a *_truncated handle: a window of
        bytes from offset; next_offset continues), or the bytes of an image or other binary
        content a tool returned to the program (an "attachment" handle)."""
        return await front.read_output(handle, offset, length)

    server.add_tool(run_python, description=RUN_PYTHON_DESCRIPTION)
    server.add_tool(list_callable_tools)
    server.add_tool(read_output)
    return server


@contextlib.asynccontextmanager
async def front_door(config: ConfigSource) -> AsyncIterator[FrontDoor]:
    """The sandbox and upstream connections a server runs on, for as long as the block lasts."""
    with tempfile.TemporaryDirectory(prefix="psych-mcp-results-") as store:
        # Invalid configuration fails here, before any upstream is started.
        retaining = RetainingStore(store, max_runs=REMEMBERED_RUNS, max_bytes=KEPT_BYTES)
        sandbox = Sandbox(config, blob_store=retaining)
        settings = sandbox.config.mcp
        async with connect_upstreams(settings) as bindings, sandbox:
            for name, problem in bindings.problems.items():
                print(f"psych-sandbox mcp: upstream {name}: {problem}", file=sys.stderr)
            yield FrontDoor(sandbox, bindings, settings.profile, retaining)


#: Longest line read from a stdio client before it is refused (the SDK's HTTP request ceiling).
MAX_STDIO_LINE_BYTES = 64 * 1024 * 1024


class _StdinLines:
    """The lines a stdio client sends, read from fd 0 without a worker thread.

    The SDK reads stdin on a worker thread that nothing can interrupt, so a server asked to
    stop (a signal) would wait for the client's next message. This waits on the descriptor in
    the event loop instead, and stops when cancelled. Fd 0 itself is pointed at the null
    device meanwhile, so no child of the server reads what the client sends.
    """

    def __init__(self) -> None:
        self._fd = os.dup(0)
        os.set_blocking(self._fd, False)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        self._buffer = b""

    def close(self) -> None:
        os.dup2(self._fd, 0)
        os.close(self._fd)

    def __aiter__(self) -> _StdinLines:
        return self

    async def __anext__(self) -> str:
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line, self._buffer = self._buffer[: end + 1], self._buffer[end + 1 :]
                return line.decode("utf-8", "replace")
            if len(self._buffer) > MAX_STDIO_LINE_BYTES:
                raise StopAsyncIteration  # a client that never ends a line: hang up
            await anyio.wait_readable(self._fd)
            try:
                chunk = os.read(self._fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                raise StopAsyncIteration
            self._buffer += chunk


async def _serve_stdio(server: MCPServer[Any]) -> None:
    from mcp.server.stdio import stdio_server

    lines = _StdinLines()
    try:
        # The SDK iterates its stdin with ``async for`` and nothing else.
        async with stdio_server(stdin=cast("anyio.AsyncFile[str]", lines)) as (read, write):
            lowlevel = server._lowlevel_server
            await lowlevel.run(read, write, lowlevel.create_initialization_options())
    finally:
        lines.close()


async def serve(
    config: ConfigSource,
    transport: Transport,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    announce: Callable[[str], None] | None = None,
) -> None:
    """Serve until the client goes away (stdio) or a signal stops the server (HTTP)."""
    async with front_door(config) as front:
        server = build_server(front)
        if transport == "stdio":
            await _serve_stdio(server)
            return
        import uvicorn

        if not _loopback(host):
            # Anyone who can reach the port can run programs and call the upstreams' tools.
            print(
                f"psych-sandbox mcp: warning: listening on {host}, not a loopback address; "
                "this server has no authentication of its own: put it behind one",
                file=sys.stderr,
            )
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((host, port))
            listener.listen(128)
        except OSError as exc:
            listener.close()
            raise ConfigurationError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        with listener:
            bound = listener.getsockname()[1]
            shown = f"[{host}]" if family == socket.AF_INET6 else host
            if announce is not None:
                announce(f"http://{shown}:{bound}/mcp")
            app = server.streamable_http_app(host=host)
            web = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
            await web.serve(sockets=[listener])


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
