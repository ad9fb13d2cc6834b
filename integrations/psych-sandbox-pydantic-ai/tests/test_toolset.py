"""The Pydantic AI toolset, driven by a real Pydantic AI agent whose model is a script (no
network): a failed program reaches the model as a result it acts on, the corrected program
calls a binding, and the tool's description lists the tools callable at each step."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from psych_sandbox_core import BindingProvider, DeploymentConfig, ProfileConfig, Sandbox, ToolSpec
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from psych_sandbox_pydantic_ai import sandbox_toolset

#: The repository's documentation, whose guide to this integration is run below.
DOCS = Path(__file__).resolve().parents[3] / "docs"

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # Pydantic AI runs on asyncio only


CONFIG = DeploymentConfig(profiles={"agents": ProfileConfig(backend="subprocess")})


class Cities(BindingProvider):
    """One tool, ``population``, withdrawn once it has been called twice."""

    def __init__(self) -> None:
        self.calls = 0

    async def list_tools(self) -> Sequence[ToolSpec]:
        if self.calls >= 2:
            return []
        schema = {"type": "object", "properties": {"city": {"type": "string"}}}
        return [ToolSpec("population", description="People living there", input_schema=schema)]

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        self.calls += 1
        return {"Paris": 2_100_000, "Lyon": 520_000}[arguments["city"]]


def tool_returns(messages: list[ModelMessage]) -> list[Any]:
    return [
        json.loads(part.content)
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


async def test_a_scripted_agent_acts_on_a_failure_then_calls_a_binding() -> None:
    descriptions: list[str] = []

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        (tool,) = info.function_tools
        descriptions.append(tool.description or "")
        returns = tool_returns(messages)
        if not returns:
            return ModelResponse(parts=[ToolCallPart("run_python", {"code": "cities = 2\n1 / 0"})])
        if len(returns) == 1:
            # The model read the failure: its kind, where, and what to do.
            failure = returns[0]["error"]
            assert failure["kind"] == "exception"
            assert "ZeroDivisionError" in failure["message"] and "line 2" in failure["traceback"]
            program = (
                "total = 0\n"
                "for city in ['Paris', 'Lyon']:\n"
                "    total += await population(city=city)\n"
                "total // 1000"
            )
            return ModelResponse(parts=[ToolCallPart("run_python", {"code": program})])
        return ModelResponse(parts=[TextPart(f"thousands: {returns[-1]['return_value']}")])

    cities = Cities()
    async with Sandbox(CONFIG) as sandbox:
        toolset = sandbox_toolset(sandbox, bindings=cities, profile="agents")
        agent = Agent(FunctionModel(script), toolsets=[toolset])
        result = await agent.run("How many thousand people live in Paris and Lyon?")
    assert result.output == "thousands: 2620"
    assert cities.calls == 2
    # Live at every step: listed while callable, gone from the description once withdrawn.
    assert "- population(city: str = None): People living there" in descriptions[0]
    assert "population" not in descriptions[-1]
    assert returns_ok(result.all_messages()) == [False, True]


def returns_ok(messages: list[ModelMessage]) -> list[bool]:
    return [answer["ok"] for answer in tool_returns(messages)]


async def test_an_answer_is_capped() -> None:
    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not tool_returns(messages):
            return ModelResponse(parts=[ToolCallPart("run_python", {"code": "print('x' * 10**6)"})])
        return ModelResponse(parts=[TextPart("done")])

    async with Sandbox(CONFIG) as sandbox:
        agent = Agent(
            FunctionModel(script),
            toolsets=[sandbox_toolset(sandbox, profile="agents", max_chars=2000)],
        )
        result = await agent.run("print a lot")
    (answer,) = [
        part.content
        for message in result.all_messages()
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]
    assert len(answer) <= 2000 and json.loads(answer)["ok"] is True


async def test_the_guide_example_runs_and_returns_what_it_claims() -> None:
    import re

    text = (DOCS / "pydantic-ai.md").read_text()
    (example,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    claimed = re.search(r"it returns:\n\n```\n(.*?)\n```", text, flags=re.S)
    assert claimed is not None

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = tool_returns(messages)
        if not returns:
            return ModelResponse(parts=[ToolCallPart("run_python", {"code": "1 / 0"})])
        if len(returns) == 1:
            code = "(await population(city='Paris') + await population(city='Lyon')) // 1000"
            return ModelResponse(parts=[ToolCallPart("run_python", {"code": code})])
        failure = returns[0]["error"]["message"]
        return ModelResponse(
            parts=[TextPart(f"{returns[1]['return_value']} thousand, after fixing: {failure}")]
        )

    namespace: dict[str, Any] = {"__name__": "pydantic_ai_guide"}
    exec(compile(example, "pydantic-ai.md", "exec"), namespace)
    assert await namespace["main"](FunctionModel(script)) == claimed.group(1)
