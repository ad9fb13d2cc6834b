"""Host bindings: tools the program may call, supplied by the embedding runtime.

The core imports no tool registry. The embedder implements :class:`BindingProvider`; it is
asked at the start of every execution for the tools callable right now, and every call the
program makes is answered through it.
"""

from __future__ import annotations

import inspect
import json
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ProtocolViolation
from .protocol import CallFrame, ReplyFrame


@dataclass(frozen=True)
class ToolSpec:
    name: str
    #: Whether calling it may suspend the run (approval-gated, elicitation, a question to a
    #: person). Such tools are never offered to a program.
    may_suspend: bool = False


class ToolCallError(Exception):
    """Raised by a provider to fail a call with a kind the program can branch on."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class BindingProvider(ABC):
    """What an embedding runtime implements to let programs call its tools."""

    @abstractmethod
    async def list_tools(self) -> Sequence[ToolSpec]:
        """The tools callable right now; asked once at the start of each execution."""

    @abstractmethod
    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """Run one tool call; return JSON data or raise ToolCallError."""


class FunctionBindings(BindingProvider):
    """Plain Python functions (sync or async) as tools, for local use and tests."""

    def __init__(self, functions: Mapping[str, Callable[..., Any]]) -> None:
        self._functions = dict(functions)

    async def list_tools(self) -> Sequence[ToolSpec]:
        return [ToolSpec(name) for name in self._functions]

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        function = self._functions[name]
        value = function(**arguments)
        if inspect.isawaitable(value):
            value = await value
        return value


class CallServer:
    """Answers one execution's call frames: strict id order, offered names only."""

    def __init__(self, provider: BindingProvider | None, offered: Sequence[str]) -> None:
        self._provider = provider
        self._offered = frozenset(offered)
        self.expected_id = 0
        self.record: list[dict[str, Any]] = []

    async def answer(self, frame: CallFrame) -> ReplyFrame:
        if frame.id != self.expected_id:
            raise ProtocolViolation(
                f"call id {frame.id} is not the successor of the last call "
                f"(expected {self.expected_id})"
            )
        self.expected_id += 1
        reply = await self._dispatch(frame)
        self.record.append(
            {
                "name": frame.name,
                "outcome": reply.error_kind or "ok",
                "result_bytes": len(reply.value_json or ""),
            }
        )
        return reply

    async def _dispatch(self, frame: CallFrame) -> ReplyFrame:
        if self._provider is None or frame.name not in self._offered:
            return _error(frame.id, "unknown_tool", f"no tool named {frame.name!r} is offered")
        try:
            value = await self._provider.call(frame.name, dict(frame.arguments))
        except ToolCallError as exc:
            return _error(frame.id, exc.kind, exc.message)
        except Exception as exc:
            return _error(frame.id, "tool_error", f"{type(exc).__name__}: {exc}")
        try:
            value_json = json.dumps(value, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            return _error(frame.id, "tool_error", f"the tool returned non-JSON data: {exc}")
        return ReplyFrame(id=frame.id, carries="value", value_json=value_json)


def _error(call_id: int, kind: str, message: str) -> ReplyFrame:
    return ReplyFrame(id=call_id, carries="error", error_kind=kind, message=message)


AsyncTool = Callable[..., Awaitable[Any]]
