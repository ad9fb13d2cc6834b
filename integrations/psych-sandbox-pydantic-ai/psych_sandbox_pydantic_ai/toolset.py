"""A Pydantic AI toolset whose one tool runs a program in the sandbox
(``pip install psych-sandbox-pydantic-ai``).

``sandbox_toolset(sandbox, bindings=...)`` gives an agent ``run_python(code)``. Its description
lists the tools a program may call, asked of the bindings afresh at every step of the agent, so
the model sees what it can call now. Whatever the program does, the tool answers with the
result as a model reads it (``report_text``: output, return value, or a
typed failure with guidance), never an exception: a failed program is something the model
acts on in its next step, not a retry the framework counts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from psych_sandbox_core import BindingProvider, Sandbox
from psych_sandbox_core.integration_kit import DEFAULT_MAX_CHARS, report_text, tool_line
from pydantic_ai import RunContext, Tool
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import FunctionToolset

DESCRIPTION = """\
Run a Python program in an isolated sandbox (a fresh process each time; nothing survives it).
The value of a final bare expression is returned, print() output too. Top-level `await` works.
Reduce tool results in the program and return only what is needed. A failed program answers
with the error's kind, message, traceback and guidance: fix the program and run it again."""

TOOLS_HEADER = """
Tools the program may call (`await name(arg=...)`, or `await call_tool("name", {...})` for
any name; `TOOLS` lists them; a failed call raises ToolError with `.kind`):"""


def sandbox_toolset(
    sandbox: Sandbox,
    *,
    bindings: BindingProvider | None = None,
    profile: str | None = None,
    timeout: float | None = None,
    max_chars: int = DEFAULT_MAX_CHARS,
    name: str = "run_python",
) -> FunctionToolset[Any]:
    """A toolset with one tool, ``name``, running programs in ``sandbox`` under ``profile``
    with ``bindings``; each answer is at most ``max_chars`` characters."""

    async def run_python(code: str) -> str:
        result = await sandbox.run(code, profile=profile, timeout=timeout, bindings=bindings)
        return report_text(result, max_chars=max_chars)

    async def describe(ctx: RunContext[Any], definition: ToolDefinition) -> ToolDefinition:
        if bindings is None:
            return definition
        specs = [spec for spec in await bindings.list_tools() if not spec.may_suspend]
        if not specs:
            return definition
        lines = "\n".join(f"- {tool_line(spec)}" for spec in specs)
        return dataclasses.replace(
            definition, description=f"{DESCRIPTION}\n{TOOLS_HEADER}\n{lines}"
        )

    tool = Tool(run_python, name=name, description=DESCRIPTION, prepare=describe)
    return FunctionToolset([tool])
