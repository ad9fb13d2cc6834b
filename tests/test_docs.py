"""The embedding guide's example is real code: run it and check what it claims."""

from __future__ import annotations

import re
from pathlib import Path

import anyio

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_embedding_guide_example_runs_and_matches_its_claimed_output() -> None:
    text = (DOCS / "embedding.md").read_text()
    (example,) = _python_blocks(text)
    namespace: dict[str, object] = {"__name__": "embedding_example"}
    exec(compile(example, "embedding.md", "exec"), namespace)
    transcript = anyio.run(namespace["agent_loop"])  # type: ignore[arg-type]
    claimed = re.search(r"What the loop sees:\n\n```\n(.*?)```", text, flags=re.S)
    assert claimed is not None
    assert transcript == claimed.group(1).strip().splitlines()


def test_readme_configuration_example_loads(tmp_path: Path) -> None:
    from psych_sandbox_core._policy.config import resolve_config
    from psych_sandbox_core.grading import Level

    readme = (DOCS.parent / "README.md").read_text()
    refusing, example = re.findall(r"```toml\n(.*?)```", readme, flags=re.S)
    path = tmp_path / "deployment.toml"
    path.write_text(example)
    config = resolve_config(path)
    profile = config.profiles["agents"]
    assert profile.warm == 2 and profile.limits.cpu_seconds == 10
    # The first screen's one setting: every run below isolated refused.
    path.write_text(refusing)
    assert resolve_config(path).required_level is Level.ISOLATED


def test_libraries_guide_examples_name_real_options(tmp_path: Path) -> None:
    # Each configuration example loads, and names options its backend really has.
    from psych_sandbox_core._policy.config import resolve_config
    from psych_sandbox_core._policy.registry import BackendRegistry

    text = (DOCS / "libraries.md").read_text()
    examples = re.findall(r"```toml\n(.*?)```", text, flags=re.S)
    assert len(examples) == 2
    registry = BackendRegistry()
    for number, example in enumerate(examples):
        path = tmp_path / f"example-{number}.toml"
        path.write_text(example)
        for profile in resolve_config(path).profiles.values():
            assert profile.backend is not None
            if profile.backend not in registry.ids():
                continue  # a plugin not installed here
            fields = registry.get(profile.backend).cls.Options.model_fields
            assert set(profile.options) <= set(fields), profile.options


def _run_guide(name: str) -> None:
    """Run a guide's one example and check it prints what the guide says it prints."""
    text = (DOCS / name).read_text()
    (example,) = _python_blocks(text)
    namespace: dict[str, object] = {"__name__": name}
    exec(compile(example, name, "exec"), namespace)
    transcript = namespace["main"]()  # type: ignore[operator]
    claimed = re.search(r"What it prints:\n\n```\n(.*?)```", text, flags=re.S)
    assert claimed is not None
    assert transcript == claimed.group(1).strip().splitlines()


def test_sync_guide_example_runs_and_prints_what_it_claims() -> None:
    _run_guide("sync.md")


def test_provider_shapes_guide_example_runs_and_prints_what_it_claims() -> None:
    _run_guide("provider-shapes.md")


def test_command_mode_guide_example_runs_and_prints_what_it_claims() -> None:
    _run_guide("command-mode.md")


def test_bindings_guide_example_runs_and_prints_what_it_claims() -> None:
    _run_guide("bindings.md")


def test_streaming_guide_example_runs_and_prints_what_it_claims() -> None:
    _run_guide("streaming.md")


def test_preamble_guide_example_runs_and_prints_what_it_claims() -> None:
    _run_guide("preamble.md")
