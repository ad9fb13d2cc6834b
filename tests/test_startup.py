"""What a command imports before it does anything: ``psych-sandbox --help`` and a usage error
import no model, plugin manager or backend, and importing the package imports none of its
submodules. Judged structurally, from the modules a fresh interpreter actually imported
(``-X importtime`` lists each one), never by timing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import psych_sandbox_core

#: Modules that only a command running a program (or reporting on backends) needs.
HEAVY = ("pydantic", "pydantic_core", "pluggy", "importlib_metadata", "anyio")
#: The core's modules that define backends, models or the machinery that loads them.
CORE_MACHINERY = (
    "psych_sandbox_core.sandbox",
    "psych_sandbox_core.registry",
    "psych_sandbox_core.backend",
    "psych_sandbox_core.backends",
    "psych_sandbox_core.host",
    "psych_sandbox_core.hookspecs",
    "psych_sandbox_core.profiles",
    "psych_sandbox_core.protocol",
)


def imported_by(*argv: str) -> set[str]:
    """Every module a fresh interpreter imported while running ``argv``."""
    completed = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in completed.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "psych_sandbox_core" in modules, completed.stderr[-2000:]
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
    modules = imported_by("-c", "import psych_sandbox_core.sandbox")
    assert {"pydantic", "pluggy", "psych_sandbox_core.registry"} <= modules


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
    from psych_sandbox_core.grading import level_of as defined_level_of
    from psych_sandbox_core.profiles import DeploymentConfig as defined_config
    from psych_sandbox_core.sandbox import Sandbox as defined_sandbox

    assert (Sandbox, DeploymentConfig, level_of) == (
        defined_sandbox,
        defined_config,
        defined_level_of,
    )
