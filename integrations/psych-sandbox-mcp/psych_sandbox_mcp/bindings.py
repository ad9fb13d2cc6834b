"""Bindings over upstream MCP servers: every tool they offer when an execution starts is a
tool the program may call (``pip install psych-sandbox-mcp``).

:class:`McpBindings` is a :class:`BindingProvider` over one or more connected
``mcp.Client`` sessions (stdio or streamable HTTP); :func:`connect_upstreams` opens them from a
deployment's ``[mcp]`` section. The tool list is asked of every upstream at the start of each
execution, never cached, so a tool an upstream withdrew is gone in the next run.

What a program gets back from a call (see docs/mcp.md): the structured content when the tool
gave one; else, for a single text block, its JSON parsed (or the text itself when it is not
JSON); else a list of blocks, each a dict with a ``type``. Images, audio and binary resources
are never inlined: the program gets a descriptor (type, MIME type, size, SHA-256 and an
``attachment`` handle) and the bytes stay with the host, readable by the embedder through
:meth:`McpBindings.binary`.

Failures reach the program as ToolError kinds: a result flagged ``is_error`` is
``tool_error``; an upstream that is gone, cannot be reached or did not answer in time is
``unreachable``; a tool that needs a person's approval (the upstream's ``approval`` list), a
long-running task (``taskSupport: required``) or an answer from a person or a model
(an ``InputRequiredResult``) is ``approval_required`` and is never offered in the first place
where the listing says so, since a program cannot suspend.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import math
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
import mcp_types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from psych_sandbox_core import BindingProvider, CallErrorKind, ToolCallError, ToolSpec
from psych_sandbox_core.integration_kit import (
    MAX_TOOL_NAME_CHARS,
    MAX_TOOLS,
    HttpUpstream,
    McpSettings,
    StdioUpstream,
)

#: Bytes of binary content (images, audio, blobs) kept for the embedder across calls; the
#: oldest go first past it. A program sees only descriptors, so this bounds host memory only.
DEFAULT_BINARY_BYTES = 64 * 1024 * 1024
#: Characters of an upstream's error text handed to the program.
MAX_ERROR_CHARS = 4000
#: Pages of a tool listing read from one upstream: a listing that never ends cannot hang
#: the start of an execution.
MAX_LISTING_PAGES = 100
#: Characters of a tool's description kept (a listing is read by a model).
MAX_DESCRIPTION_CHARS = 2000

#: Handles of kept binary content start with this.
BINARY_HANDLE_PREFIX = "mcp-bin:"


@dataclass(frozen=True)
class KeptBinary:
    mime_type: str
    data: bytes


class BinaryKeeper:
    """Binary content of tool results, under random handles, bounded in total bytes."""

    def __init__(self, max_bytes: int = DEFAULT_BINARY_BYTES) -> None:
        self.max_bytes = max_bytes
        self._kept: OrderedDict[str, KeptBinary] = OrderedDict()
        self._bytes = 0

    def put(self, mime_type: str, data: bytes) -> str | None:
        """Keep ``data``; its handle, or None when it alone is larger than the bound."""
        if len(data) > self.max_bytes:
            return None
        while self._kept and self._bytes + len(data) > self.max_bytes:
            _, oldest = self._kept.popitem(last=False)
            self._bytes -= len(oldest.data)
        handle = BINARY_HANDLE_PREFIX + secrets.token_urlsafe(18)
        self._kept[handle] = KeptBinary(mime_type, data)
        self._bytes += len(data)
        return handle

    def get(self, handle: str) -> KeptBinary | None:
        return self._kept.get(handle)


@dataclass(frozen=True)
class _Route:
    upstream: str
    tool: str


@dataclass(frozen=True)
class UpstreamOptions:
    """How one connected upstream is treated (from its ``[mcp.upstreams.NAME]`` section)."""

    approval: Collection[str] = ()
    timeout_seconds: float = 60.0


class McpBindings(BindingProvider):
    """The tools of connected MCP clients, as bindings.

    ``clients`` maps an upstream's name to an entered ``mcp.Client``. A tool name offered by
    one upstream keeps its own name; a name two upstreams offer is offered as
    ``upstream/name`` for each, so neither answers for the other.
    """

    def __init__(
        self,
        clients: Mapping[str, Client],
        *,
        options: Mapping[str, UpstreamOptions] | None = None,
        binaries: BinaryKeeper | None = None,
        unavailable: Mapping[str, str] | None = None,
    ) -> None:
        self._clients = dict(clients)
        #: Upstreams that could not be connected at all, and why (said in every listing).
        self._unavailable = dict(unavailable or {})
        self._options = dict(options or {})
        self.binaries = binaries or BinaryKeeper()
        self._routes: dict[str, _Route] = {}
        #: Why an upstream (or one of its tools) is not offered, as of the last listing.
        self.problems: dict[str, str] = dict(self._unavailable)

    def _option(self, upstream: str) -> UpstreamOptions:
        return self._options.get(upstream, UpstreamOptions())

    async def list_tools(self) -> Sequence[ToolSpec]:
        listings: dict[str, list[mcp_types.Tool]] = {}
        problems: dict[str, str] = dict(self._unavailable)

        async def listing(name: str, client: Client) -> None:
            try:
                with anyio.fail_after(self._option(name).timeout_seconds):
                    listings[name] = await _all_tools(client)
            except Exception as exc:
                problems[name] = f"unreachable: {_describe(exc)}"

        async with anyio.create_task_group() as group:
            for name, client in self._clients.items():
                group.start_soon(listing, name, client)
        offered_by: dict[str, list[str]] = {}
        for upstream in self._clients:
            for tool in listings.get(upstream, []):
                offered_by.setdefault(tool.name, []).append(upstream)
        routes: dict[str, _Route] = {}
        specs: list[ToolSpec] = []
        for upstream in self._clients:
            option = self._option(upstream)
            for tool in listings.get(upstream, []):
                shared = len(offered_by[tool.name]) > 1
                name = f"{upstream}/{tool.name}" if shared else tool.name
                if not 0 < len(name) <= MAX_TOOL_NAME_CHARS:
                    problems[f"{upstream}/{tool.name[:64]}"] = "its name is too long to offer"
                    continue
                if name in routes:
                    problems[f"{upstream}/{tool.name}"] = "the upstream lists the name twice"
                    continue
                if len(specs) >= MAX_TOOLS:
                    problems[f"{upstream}/{tool.name}"] = (
                        f"more than {MAX_TOOLS} tools are offered; this one is not"
                    )
                    continue
                routes[name] = _Route(upstream, tool.name)
                specs.append(
                    ToolSpec(
                        name,
                        may_suspend=tool.name in option.approval or _needs_task(tool),
                        description=(tool.description or "")[:MAX_DESCRIPTION_CHARS],
                        input_schema=dict(tool.input_schema),
                    )
                )
        self._routes = routes
        self.problems = problems
        return specs

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        route = self._routes.get(name)
        if route is None:
            raise ToolCallError(
                CallErrorKind.UNKNOWN_TOOL.value, f"no upstream offers a tool named {name!r}"
            )
        option = self._option(route.upstream)
        if route.tool in option.approval:
            raise ToolCallError(
                CallErrorKind.APPROVAL_REQUIRED.value,
                f"{name!r} needs a person's approval, so a program cannot call it; nothing "
                "was run. Call it directly as a tool instead",
            )
        client = self._clients[route.upstream]
        try:
            with anyio.fail_after(option.timeout_seconds):
                result = await client.session.call_tool(
                    route.tool, arguments, allow_input_required=True
                )
        except TimeoutError:
            raise ToolCallError(
                CallErrorKind.UNREACHABLE.value,
                f"the MCP server {route.upstream!r} did not answer {name!r} within "
                f"{option.timeout_seconds:g} s",
            ) from None
        except MCPError as exc:
            raise _mcp_error(route, name, exc) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            raise _gone(route, name, exc) from None
        except (OSError, httpx2.TransportError) as exc:
            raise _gone(route, name, exc) from None
        if isinstance(result, mcp_types.InputRequiredResult):
            raise ToolCallError(
                CallErrorKind.APPROVAL_REQUIRED.value,
                f"{name!r} asked for input from a person or a model before it could finish, "
                "which a program cannot give; nothing was completed. Call it directly as a "
                "tool instead",
            )
        return convert_result(result, self.binaries)

    def binary(self, handle: str) -> KeptBinary | None:
        """The bytes behind an ``attachment`` handle a call's descriptor named."""
        return self.binaries.get(handle)


async def _all_tools(client: Client) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(MAX_LISTING_PAGES):
        page = await client.list_tools(cursor=cursor, cache_mode="refresh")
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _needs_task(tool: mcp_types.Tool) -> bool:
    """Whether the tool runs only as a long-running task, which outlives any one call."""
    execution = tool.execution
    return execution is not None and execution.task_support == "required"


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text[:MAX_ERROR_CHARS]


def _gone(route: _Route, name: str, exc: BaseException) -> ToolCallError:
    return ToolCallError(
        CallErrorKind.UNREACHABLE.value,
        f"the MCP server {route.upstream!r} cannot be reached ({_describe(exc)}); {name!r} was "
        "not run",
    )


def _mcp_error(route: _Route, name: str, exc: MCPError) -> ToolCallError:
    if exc.code == mcp_types.CONNECTION_CLOSED:
        return _gone(route, name, exc)
    if exc.code == mcp_types.REQUEST_TIMEOUT:
        return ToolCallError(
            CallErrorKind.UNREACHABLE.value,
            f"the MCP server {route.upstream!r} did not answer {name!r} in time",
        )
    if exc.code == mcp_types.MISSING_REQUIRED_CLIENT_CAPABILITY:
        # The tool asks a person (elicitation) or a model (sampling) for something: this
        # client offers neither, since a program cannot stop and wait for an answer.
        return ToolCallError(
            CallErrorKind.APPROVAL_REQUIRED.value,
            f"{name!r} needs an answer from a person or a model before it can finish, which a "
            f"program cannot give ({_describe(exc)}); nothing was completed. Call it directly "
            "as a tool instead",
        )
    if exc.code == mcp_types.INVALID_PARAMS:
        return ToolCallError(CallErrorKind.INVALID_ARGUMENTS.value, f"{name}: {_describe(exc)}")
    return ToolCallError(CallErrorKind.TOOL_ERROR.value, f"{name}: {_describe(exc)}")


# ---------------------------------------------------------------------- result conversion


def convert_result(result: mcp_types.CallToolResult, binaries: BinaryKeeper) -> Any:
    """What a program gets for an MCP tool result (see the module's docstring)."""
    if result.is_error:
        texts = [block.text for block in result.content if isinstance(block, mcp_types.TextContent)]
        message = "\n".join(texts) or "the tool reported an error and said nothing more"
        raise ToolCallError(CallErrorKind.TOOL_ERROR.value, message[:MAX_ERROR_CHARS])
    if result.structured_content is not None:
        return result.structured_content
    blocks = result.content
    if not blocks:
        return None
    if len(blocks) == 1 and isinstance(blocks[0], mcp_types.TextContent):
        return _text_value(blocks[0].text)
    return [_block(block, binaries) for block in blocks]


def _text_value(text: str) -> Any:
    """The text's JSON value when it is JSON, else the text itself."""
    stripped = text.strip()
    if (
        stripped[:1] in ("{", "[", '"')
        or stripped in ("true", "false", "null")
        or _numeric(stripped)
    ):
        try:
            return json.loads(stripped, parse_constant=_not_json, parse_float=_finite)
        except (ValueError, RecursionError):
            pass
    return text


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    """A JSON number as a float, refusing one too large for a float (1e999): that text is
    kept as text rather than becoming a value the program could not be sent."""
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} is out of range")
    return value


def _numeric(text: str) -> bool:
    return bool(text) and (text[0].isdigit() or (text[0] == "-" and text[1:2].isdigit()))


def _block(block: Any, binaries: BinaryKeeper) -> dict[str, Any]:
    if isinstance(block, mcp_types.TextContent):
        entry: dict[str, Any] = {"type": "text", "text": block.text}
        value = _text_value(block.text)
        if value is not block.text:
            entry["data"] = value
        return entry
    if isinstance(block, (mcp_types.ImageContent, mcp_types.AudioContent)):
        return _binary(block.type, block.mime_type, block.data, binaries)
    if isinstance(block, mcp_types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, mcp_types.TextResourceContents):
            return {
                "type": "resource",
                "uri": resource.uri,
                "mime_type": resource.mime_type,
                "text": resource.text,
            }
        entry = _binary(
            "resource", resource.mime_type or "application/octet-stream", resource.blob, binaries
        )
        return {**entry, "uri": resource.uri}
    if isinstance(block, mcp_types.ResourceLink):
        return {
            "type": "resource_link",
            "uri": block.uri,
            "name": block.name,
            "mime_type": block.mime_type,
            "description": block.description,
        }
    return {"type": str(getattr(block, "type", "unknown"))}


def _binary(kind: str, mime_type: str, encoded: str, binaries: BinaryKeeper) -> dict[str, Any]:
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ToolCallError(
            CallErrorKind.TOOL_ERROR.value,
            f"the tool returned {kind} content that is not valid base64",
        ) from None
    handle = binaries.put(mime_type, data)
    return {
        "type": kind,
        "mime_type": mime_type,
        "size_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        # None when it alone is over what the host keeps: described, not kept.
        "attachment": handle,
    }


# ---------------------------------------------------------------------- connecting


@contextlib.asynccontextmanager
async def connect_upstreams(
    settings: McpSettings, *, binaries: BinaryKeeper | None = None
) -> AsyncIterator[McpBindings]:
    """Connect to every upstream the ``[mcp]`` section names, for as long as the block lasts.

    An upstream that cannot be started or reached is left out (its tools are not offered)
    and said in ``problems``, so the others keep working.
    """
    clients: dict[str, Client] = {}
    options: dict[str, UpstreamOptions] = {}
    failed: dict[str, str] = {}
    async with contextlib.AsyncExitStack() as stack:
        for name, upstream in settings.upstreams.items():
            options[name] = UpstreamOptions(
                approval=frozenset(upstream.approval), timeout_seconds=upstream.timeout_seconds
            )
            try:
                # Not under a cancel scope of its own: the client's task group outlives this
                # statement. The handshake is bounded by the client's read timeout instead.
                client = await _client(upstream, stack)
                clients[name] = await stack.enter_async_context(client)
            except Exception as exc:
                failed[name] = f"could not connect: {_describe(exc)}"
        yield McpBindings(clients, options=options, binaries=binaries, unavailable=failed)


async def _client(
    upstream: StdioUpstream | HttpUpstream, stack: contextlib.AsyncExitStack
) -> Client:
    # No response cache: the tool list must be the upstream's own at each execution's start.
    if isinstance(upstream, StdioUpstream):
        parameters = StdioServerParameters(
            command=upstream.command,
            args=list(upstream.args),
            env=dict(upstream.env) or None,
            cwd=upstream.cwd,
        )
        return Client(parameters, cache=None, read_timeout_seconds=upstream.timeout_seconds)
    http = await stack.enter_async_context(create_mcp_http_client(headers=dict(upstream.headers)))
    return Client(
        streamable_http_client(upstream.url, http_client=http),
        cache=None,
        read_timeout_seconds=upstream.timeout_seconds,
    )
