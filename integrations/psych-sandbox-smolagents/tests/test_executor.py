"""The smolagents executor, driven by a real smolagents CodeAgent whose model is a script (no
network): steps run in the sandbox, tools are called synchronously and positionally, a
variable is carried only when asked for, final_answer ends the run with the answer, and a
failing step reaches the model as the result's model view (the guide's example is the
carrying case)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from psych_sandbox_core import DeploymentConfig, ProfileConfig, SyncSandbox
from smolagents import CodeAgent, Tool
from smolagents.models import ChatMessage, MessageRole, Model

from psych_sandbox_smolagents import SandboxExecutor

#: The repository's documentation, whose guide to this integration is run below.
DOCS = Path(__file__).resolve().parents[3] / "docs"

CONFIG = DeploymentConfig(profiles={"agents": ProfileConfig(backend="subprocess")})


class ScriptedModel(Model):  # type: ignore[misc]
    """Answers each step with the next program of a script, and records what it was shown."""

    def __init__(self, steps: list[str]) -> None:
        super().__init__(model_id="scripted")
        self.steps = list(steps)
        self.seen: list[str] = []

    def generate(self, messages: list[Any], **kwargs: Any) -> ChatMessage:
        self.seen.append(_text(messages[-1]))
        code = self.steps.pop(0)
        return ChatMessage(
            role=MessageRole.ASSISTANT, content=f"Thought: go\n<code>\n{code}\n</code>"
        )


def _text(message: Any) -> str:
    content = message.content if hasattr(message, "content") else message["content"]
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


class Population(Tool):  # type: ignore[misc]
    name = "population"
    description = "People living in a city, in a year"
    inputs = {  # noqa: RUF012 - smolagents reads the class attribute
        "city": {"type": "string", "description": "the city"},
        "year": {"type": "integer", "description": "the year"},
    }
    output_type = "integer"

    def forward(self, city: str, year: int) -> int:
        return {"Paris": 2_100_000, "Lyon": 520_000}[city] + (year - 2020)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SyncSandbox]:
    with SyncSandbox(CONFIG) as sandbox:
        yield sandbox


def agent_with(
    sandbox: SyncSandbox, steps: list[str], carry: bool
) -> tuple[CodeAgent, ScriptedModel]:
    model = ScriptedModel(steps)
    executor = SandboxExecutor(sandbox, profile="agents", carry_variables=carry)
    agent = CodeAgent(tools=[Population()], model=model, executor=executor, max_steps=4)
    return agent, model


def test_without_carry_over_a_step_does_not_see_the_last_ones_names_and_a_failure_is_the_model_view(
    sandbox: SyncSandbox,
) -> None:
    steps = [
        "paris = population('Paris', 2020)",
        # Line 2 of the program, whatever the preamble ahead of it.
        "x = 1\ny = paris + 1",
        "final_answer('gave up')",
    ]
    agent, model = agent_with(sandbox, steps, carry=False)
    assert agent.run("Try") == "gave up"
    failure = model.seen[2]
    # The result's model view: kind, message, the program's own traceback, guidance.
    assert "failed: exception: NameError: name 'paris' is not defined" in failure
    assert "guidance:" in failure
    assert re.search(r'File "<program>", line 2', failure), failure
    assert "<preamble>" not in failure


def test_the_guide_example_runs_and_returns_what_it_claims() -> None:
    text = (DOCS / "smolagents.md").read_text()
    (example,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    claimed = re.search(r"it returns:\n\n```\n(.*?)\n```", text, flags=re.S)
    assert claimed is not None
    steps = [
        "total = population('Paris') + population('Lyon')\nprint(total)",
        "final_answer(total // 1000)",
    ]
    namespace: dict[str, Any] = {"__name__": "smolagents_guide"}
    exec(compile(example, "smolagents.md", "exec"), namespace)
    main: Callable[[Model], Any] = namespace["main"]
    model = ScriptedModel(steps)
    # Two steps: tools called positionally, `total` carried to the second (carry_variables),
    # and final_answer's answer is what the run returns.
    assert str(main(model)) == claimed.group(1)
    # The first step's output reached the model as its observation.
    assert "2620000" in model.seen[1]
