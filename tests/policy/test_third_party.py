"""A third party's backend, shipped as its own distribution: installed for real into this
environment, found through its entry point, run, and listed by doctor."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from psych_sandbox_testing.conformance import BackendConformance
from psych_sandbox_testing.host import execution_cgroups_here

from psych_sandbox_core import Sandbox
from psych_sandbox_core._policy.profiles import DeploymentConfig
from psych_sandbox_core._policy.registry import BackendRegistry
from psych_sandbox_core.cli.doctor import diagnose

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "psych-sandbox-example-backend"
DISTRIBUTION = "psych-sandbox-example-backend"


def _pip(*args: str) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr


@pytest.fixture(scope="session")
def example_installed() -> Iterator[None]:
    # No build isolation: the build backend is a test dependency, so this works offline.
    _pip("install", "--no-deps", "--no-build-isolation", str(EXAMPLE))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        # Left installed, it would be one more backend every other test's default sees.
        _pip("uninstall", "-y", DISTRIBUTION)
        importlib.invalidate_caches()


@pytest.mark.anyio
async def test_the_example_backend_is_found_through_its_entry_point_and_runs(
    example_installed: None,
) -> None:
    registry = BackendRegistry()
    assert "example" in registry.ids()
    registered = registry.get("example")
    assert registered.distribution == DISTRIBUTION
    assert registered.version == "0.2.0"
    async with Sandbox(registry=registry) as box:
        result = await box.run("print('from a plugin')\nreturn 6 * 7", profile="example")
    assert result.error is None, result.error
    assert result.return_value == 42
    assert result.stdout == "from a plugin\n"
    assert result.backend.id == "example"
    assert result.backend.distribution == DISTRIBUTION


@pytest.mark.anyio
async def test_doctor_lists_the_example_backend(example_installed: None) -> None:
    report = await diagnose(DeploymentConfig(), BackendRegistry())
    rows = {row["id"]: row for row in report["backends"]}
    assert rows["example"]["works"] is True
    assert rows["example"]["distribution"] == DISTRIBUTION
    assert rows["example"]["level"] == "process"
    assert rows["example"]["grades"]["filesystem"] == "unavailable"
    assert any(p["name"] == "example" and p["backend"] == "example" for p in report["profiles"])


def test_the_cli_doctor_shows_the_example_backend(example_installed: None) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "psych_sandbox_core.cli", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    assert "example" in {row["id"] for row in report["backends"]}


@pytest.mark.usefixtures("example_installed")
class TestExampleConformance(BackendConformance):
    """The third party's backend passes the shared suite, run as its own tests would run it."""

    backend = "example"
    level = "process"
    environment = frozenset({"TMPDIR"})
    # The subprocess backend's launch, early results included (where executions get a
    # cgroup of their own).
    early_result = execution_cgroups_here()

    # Its limits are the subprocess mechanism's own, timed out in test_conformance.py already.
    test_cpu_loop_is_a_timeout = None  # type: ignore[assignment]
    test_wall_clock_timeout_and_nothing_left = None  # type: ignore[assignment]
    # It inherits the subprocess backend's commands too, run in test_conformance.py already.
    runs_commands = True
    test_a_command_runs_where_a_program_runs = None  # type: ignore[assignment]
    test_a_command_past_its_wall_clock_is_killed_with_its_whole_tree = None  # type: ignore[assignment]
    test_a_string_is_run_by_a_shell_only_when_asked = None  # type: ignore[assignment]


def test_installing_a_backend_does_not_make_it_default_on_a_tie(
    example_installed: None, tmp_path: Path
) -> None:
    """No isolated backend works (a PATH without bwrap or a container engine): the example
    backend and subprocess both reach process, and "example" sorts first by id, yet default
    stays psych-sandbox's own, unless the deployment prefers the other."""
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty)}
    program = tmp_path / "program.py"
    program.write_text("6 * 7\n")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "psych_sandbox_core.cli", *args],
            capture_output=True,
            text=True,
            timeout=110,
            env=env,
            check=False,
        )

    completed = cli("run", "--json", str(program))
    assert completed.returncode == 0, completed
    assert json.loads(completed.stdout)["backend"]["id"] == "subprocess"
    doctor = json.loads(cli("doctor", "--json").stdout)
    default = next(row for row in doctor["profiles"] if row["name"] == "default")
    assert default["backend"] == "subprocess"
    assert "psych-sandbox's own backends come before third-party ones" in default["selected"]
    order = default["selected"].split("then preference: ", 1)[1].split(")", 1)[0].split(", ")
    assert order.index("subprocess") < order.index("example")

    config = tmp_path / "deploy.toml"
    config.write_text('backend_preference = ["example"]\n')
    preferred = cli("run", "--json", "--config", str(config), str(program))
    assert preferred.returncode == 0, preferred
    assert json.loads(preferred.stdout)["backend"]["id"] == "example"
    doctor = json.loads(cli("doctor", "--json", "--config", str(config)).stdout)
    default = next(row for row in doctor["profiles"] if row["name"] == "default")
    assert default["backend"] == "example" and "listed in backend_preference" in default["selected"]
