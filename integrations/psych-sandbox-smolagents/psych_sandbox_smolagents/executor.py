"""A smolagents executor that runs every code step of a ``CodeAgent`` in the sandbox
(``pip install psych-sandbox-smolagents``).

``CodeAgent(tools=..., model=..., executor=SandboxExecutor(sandbox))`` with a
:class:`SyncSandbox`: each step is one program in a fresh process. Inside it
the agent's tools are plain functions, called with keywords or positionally in the order of
their inputs, and ``final_answer(...)`` ends the step with the answer. Both are made by a
preamble (``Sandbox.run(preamble=...)``), so the step's tracebacks show its own lines.

A step that fails raises, as smolagents expects of an executor; the message is the result as
a model reads it (:meth:`ExecutionResult.for_model`), which the agent puts in front of the
model for its next step. Variables are not carried from one step to the next unless
``carry_variables=True``: then the names a step left holding JSON data (and the agent's
JSON-serialisable state) are given to the next step, since each step is still a fresh process.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import anyio
from psych_sandbox_core import BindingProvider, SyncSandbox, ToolCallError, ToolSpec
from psych_sandbox_core.integration_kit import DEFAULT_MAX_CHARS, given_variables
from smolagents.local_python_executor import CodeOutput, PythonExecutor
from smolagents.tools import Tool

#: Run ahead of each step, in its namespace. The bootstrap's tool aliases are async (a
#: program awaits them); smolagents' code calls tools as plain functions, so each is wrapped
#: in a function that makes the call at once (a program without an event loop makes its
#: calls synchronously, so the awaitable completes on its first step). final_answer hands
#: the answer to the host, then ends the program by an exception the program does not catch
#: with ``except Exception``, as smolagents' own executor does.
PREAMBLE = """\
class _PsychFinalAnswer(BaseException):
    pass


def _psych_sync(call):
    def sync(*args, **kwargs):
        pending = call(*args, **kwargs)
        try:
            pending.send(None)
        except StopIteration as done:
            return done.value
        pending.close()
        raise RuntimeError(call.__name__ + "() cannot be called inside a running event loop")

    sync.__name__ = sync.__qualname__ = call.__name__
    sync.__doc__ = call.__doc__
    return sync


for _psych_name in {names!r}:
    if _psych_name in globals():
        globals()[_psych_name] = _psych_sync(globals()[_psych_name])
_psych_answer = globals().pop("final_answer", None)


def final_answer(answer):
    if _psych_answer is None:
        raise NameError("final_answer is not offered to this agent")
    _psych_answer(answer)
    raise _PsychFinalAnswer()
"""

#: smolagents' input types and the JSON schema types they are.
_JSON_TYPES = {
    "string": "string",
    "boolean": "boolean",
    "integer": "integer",
    "number": "number",
    "array": "array",
    "object": "object",
    "null": "null",
}


class StepFailed(Exception):
    """A step's program failed; the message is the result as the model reads it."""


class SandboxExecutor(PythonExecutor):  # type: ignore[misc]
    """Runs each code step of a smolagents ``CodeAgent`` in ``sandbox`` (not closed here).

    ``profile`` and ``timeout`` are :meth:`SyncSandbox.run`'s; ``max_chars`` caps the model
    view of a failure; ``carry_variables`` gives each step the JSON data the previous steps
    left in their global names.
    """

    def __init__(
        self,
        sandbox: SyncSandbox,
        *,
        profile: str | None = None,
        timeout: float | None = None,
        carry_variables: bool = False,
        max_chars: int = DEFAULT_MAX_CHARS,
    ) -> None:
        self._sandbox = sandbox
        self._profile = profile
        self._timeout = timeout
        self.carry_variables = carry_variables
        self._max_chars = max_chars
        self._tools: dict[str, Tool] = {}
        #: What the next step is given when variables are carried.
        self.variables: dict[str, Any] = {}

    def send_tools(self, tools: dict[str, Any]) -> None:
        for name, tool in tools.items():
            if not isinstance(tool, Tool):
                raise ValueError(
                    f"{name!r} is not a smolagents Tool (managed agents are not supported)"
                )
        self._tools = dict(tools)

    def send_variables(self, variables: dict[str, Any]) -> None:
        if self.carry_variables:
            self.variables.update(self._carried(variables))

    def _carried(self, variables: dict[str, Any]) -> dict[str, Any]:
        """What of ``variables`` the next step can be given: JSON data under a name that
        hides none of the tools (which smolagents' own executor refuses to overwrite)."""
        return {
            name: value
            for name, value in variables.items()
            if name not in self._tools and _givable(name, value)
        }

    def __call__(self, code_action: str) -> CodeOutput:
        bindings = _ToolBindings(self._tools)
        names = sorted(name for name in self._tools if name.isidentifier())
        result = self._sandbox.run(
            code_action,
            profile=self._profile,
            timeout=self._timeout,
            bindings=bindings,
            preamble=PREAMBLE.format(names=names),
            # Filtered here: smolagents sends the variables before the tools.
            variables=self._carried(self.variables) if self.carry_variables else None,
            keep_variables=self.carry_variables,
        )
        logs = result.stdout + result.stderr
        if bindings.answered:
            return CodeOutput(output=bindings.answer, logs=logs, is_final_answer=True)
        if not result.ok:
            raise StepFailed(result.for_model(self._max_chars, reader=None))
        if self.carry_variables and result.variables is not None:
            self.variables = self._carried(result.variables)
        return CodeOutput(output=result.return_value, logs=logs, is_final_answer=False)

    def cleanup(self) -> None:
        """Nothing outlives a step; the sandbox is its owner's to close."""


class _ToolBindings(BindingProvider):
    """An agent's tools as bindings, for one step: each called in a worker thread;
    final_answer's answer kept for the executor."""

    def __init__(self, tools: dict[str, Tool]) -> None:
        self._tools = tools
        self.answered = False
        self.answer: Any = None

    async def list_tools(self) -> Sequence[ToolSpec]:
        return [
            ToolSpec(name, description=tool.description or "", input_schema=_schema(tool))
            for name, tool in self._tools.items()
        ]

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        tool = self._tools[name]
        try:
            value = await anyio.to_thread.run_sync(functools.partial(tool, **arguments))
        except Exception as exc:
            raise ToolCallError("tool_error", f"{type(exc).__name__}: {exc}") from None
        if name == "final_answer":
            self.answered, self.answer = True, value
            return None
        return value


def _schema(tool: Tool) -> dict[str, Any]:
    """The tool's inputs as a JSON schema, in their order (the order of positional calls)."""
    properties: dict[str, Any] = {}
    required = []
    for name, spec in tool.inputs.items():
        kind = _JSON_TYPES.get(spec.get("type"))
        properties[name] = {"description": spec.get("description", "")} | (
            {"type": kind} if kind is not None else {}
        )
        if not spec.get("nullable"):
            required.append(name)
    return {"type": "object", "properties": properties, "required": required}


def _givable(name: object, value: object) -> bool:
    """Whether the agent's state entry can be given to a program as a name."""
    try:
        given_variables({name: value})  # type: ignore[dict-item]
    except (TypeError, ValueError):
        return False
    return True
