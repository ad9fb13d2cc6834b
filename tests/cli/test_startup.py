"""What a command imports before it does anything: ``psych-sandbox --help`` and a usage error
import no model, plugin manager or backend, and importing the package imports none of its
submodules. Judged structurally, from the modules a fresh interpreter actually imported
(``-X importtime`` lists each one, and ``sys.modules`` holds them at exit), never by timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import psych_sandbox_core
from psych_sandbox_core.child.loader import PARTS

#: Modules that only a command running a program (or reporting on backends) needs.
HEAVY = ("pydantic", "pydantic_core", "pluggy", "importlib_metadata", "anyio")
#: The core's modules that define backends, models or the machinery that loads them.
CORE_MACHINERY = (
    "psych_sandbox_core._api.sandbox",
    "psych_sandbox_core._policy.registry",
    "psych_sandbox_core.kit.backend",
    "psych_sandbox_core.backends",
    "psych_sandbox_core._engine.host",
    "psych_sandbox_core.kit.hookspecs",
    "psych_sandbox_core._policy.profiles",
    "psych_sandbox_core.protocol",
)


#: What ``run`` of a plain program never needs: the commands' and integrations' modules,
#: the exporter (only with --artifacts), the durable run log's database (only with a run id),
#: the TOML reader (only with a configuration file), the metadata backport (doctor and
#: --version), and the MCP and HTTP stacks.
RUN_NEVER = (
    "mcp",
    "httpx",
    "sqlite3",
    "tomllib",
    "tomli",
    "importlib_metadata",
    "smolagents",
    "pydantic_ai",
    "psych_sandbox_core._output.artifact_export",
    "psych_sandbox_core.cli.doctor",
    "psych_sandbox_core._policy.versions",
    "psych_sandbox_core.cli.libraries",
    "psych_sandbox_mcp",
    "psych_sandbox_core.service_kit",
    "psych_sandbox_core.integration_kit",
    "psych_sandbox_core._api.provider_shapes",
    "psych_sandbox_pydantic_ai",
    "psych_sandbox_smolagents",
    "psych_sandbox_core._api.sync_sandbox",
    *(f"psych_sandbox_core.child.{part}" for part in PARTS),  # read as text, never imported
)


#: Prints every module in ``sys.modules`` as the interpreter exits. ``-X importtime`` alone
#: misses a module imported through importlib.import_module (as plugins are loaded).
_EXIT_PROBE = (
    "import atexit, json, sys\n"
    "atexit.register(lambda: print('\\n' + {mark!r} + json.dumps(sorted(sys.modules)),"
    " file=sys.stderr))\n"
)
_MARK = "psych-startup-modules: "


def imported_by(
    *argv: str, env: dict[str, str] | None = None, expect: int | None = None
) -> set[str]:
    """Every module a fresh interpreter imported while running ``argv`` (``-c CODE`` or
    ``-m MODULE ARGS...``), which exited with ``expect`` when given."""
    probe = _EXIT_PROBE.format(mark=_MARK)
    if argv[0] == "-c":
        code = probe + argv[1]
    else:
        assert argv[0] == "-m"
        code = (
            probe + f"import runpy\nsys.argv = {[argv[1], *argv[2:]]!r}\n"
            f"runpy.run_module({argv[1]!r}, run_name='__main__', alter_sys=True)\n"
        )
    completed = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in completed.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    at_exit = [line for line in completed.stderr.splitlines() if line.startswith(_MARK)]
    assert len(at_exit) == 1, completed.stderr[-2000:]
    modules |= set(json.loads(at_exit[0][len(_MARK) :]))
    assert "psych_sandbox_core" in modules, completed.stderr[-2000:]
    if expect is not None:
        assert completed.returncode == expect, completed.stderr[-2000:]
    return modules


def offending(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(
        name for name in modules if any(name == p or name.startswith(p + ".") for p in prefixes)
    )


def plugin_packages(modules: set[str]) -> list[str]:
    """Any installed backend plugin's package (psych_sandbox_bwrap, psych_sandbox_docker...)."""
    return sorted(
        name
        for name in modules
        if name.startswith("psych_sandbox_") and not name.startswith("psych_sandbox_core")
    )


def test_the_probe_sees_what_a_command_imports() -> None:
    # Control: the same probe does see the heavy modules where they are imported.
    modules = imported_by("-c", "import psych_sandbox_core._api.sandbox")
    assert {"pydantic", "pluggy", "psych_sandbox_core._policy.registry"} <= modules


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["run", "--help"],
        ["doctor", "--help"],
        ["no-such-command"],
        ["run", "--timeout", "-1", "-"],
    ],
    ids=["help", "run-help", "doctor-help", "usage-error", "bad-timeout"],
)
def test_help_and_usage_errors_import_no_model_plugin_or_backend(argv: list[str]) -> None:
    modules = imported_by("-m", "psych_sandbox_core", *argv)
    assert "psych_sandbox_core.cli" in modules
    assert offending(modules, HEAVY) == []
    assert offending(modules, CORE_MACHINERY) == []
    assert plugin_packages(modules) == []


def test_run_imports_only_what_running_a_program_needs(tmp_path: Path) -> None:
    program = tmp_path / "print1.py"
    program.write_text("print(1)\n")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    env.pop("PSYCH_SANDBOX_CONFIG", None)
    modules = imported_by(
        "-m",
        "psych_sandbox_core",
        "run",
        "--profile",
        "subprocess",
        str(program),
        env=env,
        expect=0,
    )
    assert {"psych_sandbox_core._engine.host", "psych_sandbox_core.backends.subprocess"} <= modules
    assert offending(modules, RUN_NEVER) == []
    # Only the backend the profile names: no other plugin is loaded, or even imported.
    assert plugin_packages(modules) == []


def test_importing_the_package_imports_no_submodule() -> None:
    modules = imported_by("-c", "import psych_sandbox_core")
    assert offending(modules, HEAVY) == []
    core = sorted(m for m in modules if m.startswith("psych_sandbox_core."))
    assert core == []
    assert plugin_packages(modules) == []


def test_every_public_name_resolves_from_its_module() -> None:
    # Lazily, in a fresh interpreter: each name is the object its module defines.
    program = (
        "import json, importlib, psych_sandbox_core as p\n"
        "print(json.dumps({n: getattr(p, n).__module__ if n != '__version__' else None"
        " for n in p.__all__}))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    modules = json.loads(completed.stdout)
    assert set(modules) == set(psych_sandbox_core.__all__)
    for name, module in modules.items():
        if module is not None:
            assert module.startswith("psych_sandbox_core."), (name, module)
    assert set(dir(psych_sandbox_core)) >= set(psych_sandbox_core.__all__)
    with pytest.raises(AttributeError, match="no_such_name"):
        psych_sandbox_core.no_such_name  # noqa: B018


def test_public_names_are_the_defining_modules_objects() -> None:
    from psych_sandbox_core import DeploymentConfig, Sandbox, level_of
    from psych_sandbox_core._api.sandbox import Sandbox as defined_sandbox
    from psych_sandbox_core._policy.profiles import DeploymentConfig as defined_config
    from psych_sandbox_core.grading import level_of as defined_level_of

    assert (Sandbox, DeploymentConfig, level_of) == (
        defined_sandbox,
        defined_config,
        defined_level_of,
    )


def test_the_command_runs_a_program_with_the_collector_on_and_its_start_up_frozen(
    tmp_path: Path,
) -> None:
    # Read in the command's own process, by a tool the program calls while it runs: the
    # collector paused for the start-up is running again, with the start-up frozen out.
    tools = tmp_path / "tools.py"
    tools.write_text(
        "import gc\ndef collector():\n    return [gc.isenabled(), gc.get_freeze_count() > 0]\n"
    )
    program = tmp_path / "program.py"
    program.write_text("return await collector()\n")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    env.pop("PSYCH_SANDBOX_CONFIG", None)
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "psych_sandbox_core",
            "run",
            str(program),
            "--tools",
            str(tools),
            "--json",
            "--profile",
            "subprocess",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert json.loads(completed.stdout)["return_value"] == [True, True]
