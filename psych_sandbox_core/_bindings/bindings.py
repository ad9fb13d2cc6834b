"""Host bindings: tools the program may call, supplied by the embedding runtime.

The core imports no tool registry. The embedder implements :class:`BindingProvider`; it is
asked at the start of every execution for the tools callable right now, and every call the
program makes is answered through it by the execution's call server (call_server.py). A
provider fails a call with a :class:`ToolCallError` of one of the closed set of kinds a
program branches on (:class:`CallErrorKind`). :class:`FunctionBindings` offers plain Python
functions as tools; the tools are described to the program by catalogue.py.
"""

from __future__ import annotations

import enum
import functools
import importlib.util
import inspect
import os
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from ..errors import ConfigurationError
from .catalogue import ToolSpec, spec_from_function

__all__ = [
    "BindingProvider",
    "CallErrorKind",
    "FunctionBindings",
    "ToolCallError",
    "ToolSpec",
    "load_function_tools",
]


class CallErrorKind(str, enum.Enum):
    """Why a binding call failed: a closed set a program can branch on (ToolError.kind)."""

    #: The tool may suspend the run (approval, elicitation, a question): call it directly.
    APPROVAL_REQUIRED = "approval_required"
    #: Policy refused the call.
    REFUSED = "refused"
    #: The tool's server could not be reached.
    UNREACHABLE = "unreachable"
    #: The tool ran and failed.
    TOOL_ERROR = "tool_error"
    #: A call, byte or run budget is spent.
    BUDGET_EXHAUSTED = "budget_exhausted"
    #: No tool of that name is offered to this execution.
    UNKNOWN_TOOL = "unknown_tool"
    #: The result is over the per-call ceiling and nothing could store it for paging.
    BINDING_RESULT_NOT_PAGED = "binding_result_not_paged"
    #: The execution was cancelled while the call was in flight.
    CANCELLED = "cancelled"
    #: The arguments are not what the tool accepts (read_tool_output's own checks).
    INVALID_ARGUMENTS = "invalid_arguments"
    #: A read_tool_output handle this program's own calls did not produce.
    HANDLE_DENIED = "handle_denied"
    #: A read_tool_output pattern search ran past its deadline and was killed.
    PATTERN_TIMEOUT = "pattern_timeout"


class ToolCallError(Exception):
    """Raised by a provider to fail a call with a kind the program can branch on.

    ``kind`` should be a :class:`CallErrorKind` value; anything else reaches the program as
    tool_error, so the set a program branches on stays closed.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class BindingProvider(ABC):
    """What an embedding runtime implements to let programs call its tools."""

    @abstractmethod
    async def list_tools(self) -> Sequence[ToolSpec]:
        """The tools callable right now; asked once at the start of each execution. A
        provider that fails here fails the execution as data (provider_error), never the
        caller of ``run``."""

    @abstractmethod
    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """Run one tool call; return JSON data or raise ToolCallError."""


class FunctionBindings(BindingProvider):
    """Plain Python functions (sync or async) as tools. Each is described by its docstring
    and a JSON schema of its parameters (see catalogue.spec_from_function)."""

    def __init__(
        self,
        functions: Mapping[str, Callable[..., Any]],
        *,
        suspending: Sequence[str] = (),
    ) -> None:
        self._functions = dict(functions)
        self._suspending = frozenset(suspending)
        # Computed once: inspecting a signature per call costs more than the call itself.
        self._signatures: dict[str, inspect.Signature | None] = {}
        #: Tools that take a call without arguments (no binding to check then).
        self._bare: set[str] = set()
        self._coroutines = {
            name
            for name, function in self._functions.items()
            if inspect.iscoroutinefunction(function)
        }
        for name, function in self._functions.items():
            try:
                self._signatures[name] = signature = inspect.signature(function)
            except (TypeError, ValueError):
                self._signatures[name] = None
                continue
            try:
                signature.bind()
            except TypeError:
                continue
            self._bare.add(name)
        # Described when first listed, then kept: a schema costs about a millisecond.
        self._specs: list[ToolSpec] | None = None

    async def list_tools(self) -> Sequence[ToolSpec]:
        if self._specs is None:
            self._specs = [
                spec_from_function(function, name=name, may_suspend=name in self._suspending)
                for name, function in self._functions.items()
            ]
        return self._specs

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        function = self._functions[name]
        signature = self._signatures.get(name)
        if signature is not None and (arguments or name not in self._bare):
            try:
                signature.bind(**arguments)
            except TypeError as exc:
                raise ToolCallError("invalid_arguments", f"{name}: {exc}") from None
        if name in self._coroutines:
            return await function(**arguments)
        # A plain function may block (I/O, a slow computation): it runs in a worker thread,
        # so the event loop keeps every execution's wall clock and channel served.
        value = await anyio.to_thread.run_sync(functools.partial(function, **arguments))
        if inspect.isawaitable(value):
            value = await value
        return value


def load_function_tools(path: str | os.PathLike[str]) -> FunctionBindings:
    """The plain functions a Python file defines (sync or async), as tools named after them.

    For trying programs locally: the file is the user's own and runs on the host. Names
    starting with an underscore, and functions the file merely imports, are not tools.
    """
    location = Path(path)
    if not location.is_file():
        raise ConfigurationError(f"tools file {str(location)!r} does not exist")
    name = f"psych_sandbox_tools_{secrets.token_urlsafe(18)}"
    spec = importlib.util.spec_from_file_location(name, location)
    if spec is None or spec.loader is None:
        raise ConfigurationError(f"tools file {str(location)!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ConfigurationError(
            f"tools file {str(location)!r} failed to load: {type(exc).__name__}: {exc}"
        ) from exc
    functions = {
        name: value
        for name, value in vars(module).items()
        if inspect.isfunction(value)
        and not name.startswith("_")
        and value.__module__ == module.__name__
    }
    if not functions:
        raise ConfigurationError(f"tools file {str(location)!r} defines no functions")
    return FunctionBindings(functions)
