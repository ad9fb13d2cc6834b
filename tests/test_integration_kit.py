"""The integrations (integrations/: MCP, Pydantic AI, smolagents) import only the core's
public API and its integration kit (their tests may add the test kit): checked over their
source, parsed and not imported, like the backend kit's rule. The core's extras of the same
names are aliases of those distributions, each of the core's current minor series."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import psych_sandbox_core
from psych_sandbox_core import integration_kit

from .import_rules import ROOT, core_imports

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

CORE = "psych_sandbox_core"
KIT = f"{CORE}.integration_kit"
#: The test kit, its own distribution: a test may import it, an integration's code may not.
TESTING = "psych_sandbox_testing"
#: Names of the core each distribution may import, by the module they are imported from.
PUBLIC = {CORE: set(psych_sandbox_core.__all__), KIT: set(integration_kit.__all__)}


def integration_projects() -> list[Path]:
    found = sorted(p.parent for p in ROOT.glob("integrations/*/pyproject.toml"))
    assert found
    return found


def project(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = tomllib.loads((directory / "pyproject.toml").read_text())["project"]
    return data


def sources(directory: Path) -> list[tuple[str, Path, bool]]:
    """(module, path, is a test) for every module of the distribution and of its tests."""
    found = []
    for path in sorted(directory.rglob("*.py")):
        relative = path.relative_to(directory)
        found.append((".".join(relative.with_suffix("").parts), path, relative.parts[0] == "tests"))
    return found


def breaches(path: Path, module: str, test: bool) -> list[str]:
    """What ``path`` imports of the core against the rule: a module other than the package
    and the integration kit (and the test kit, for a test), or a name neither exports."""
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    for line, name in core_imports(path, module):
        if name not in PUBLIC:
            found.append(f"{where}:{line} imports {name}")
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = (
            [alias.name for alias in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and not node.level
            else []
        )
        for name in names:
            if not test and (name == TESTING or name.startswith(TESTING + ".")):
                found.append(f"{where}:{node.lineno} imports {name}")
        if isinstance(node, ast.ImportFrom) and not node.level and node.module in PUBLIC:
            for alias in node.names:
                if alias.name not in PUBLIC[node.module]:
                    found.append(
                        f"{where}:{node.lineno} imports {alias.name} from "
                        f"{node.module}, which does not export it"
                    )
    return found


def test_integrations_import_only_the_public_api_and_the_integration_kit() -> None:
    found = [
        breach
        for directory in integration_projects()
        for module, path, test in sources(directory)
        for breach in breaches(path, module, test)
    ]
    assert found == [], "\n".join(found)


def test_the_rule_catches_a_breach(tmp_path: Path) -> None:
    # The check above cannot pass vacuously: each kind of breach is found, and what is
    # allowed is not.
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from psych_sandbox_core import Sandbox, _PUBLIC\n"
        "from psych_sandbox_core._api.provider_shapes import report_text\n"
        "from psych_sandbox_core.integration_kit import tool_line, describe_errors\n"
        "from psych_sandbox_testing.host import marker\n"
        "from psych_sandbox_core import kit\n"
    )
    assert [b.split(" ", 1)[1] for b in breaches(planted, "psych_sandbox_mcp.planted", False)] == [
        "imports psych_sandbox_core._api.provider_shapes",
        "imports psych_sandbox_core.kit",
        "imports _PUBLIC from psych_sandbox_core, which does not export it",
        f"imports describe_errors from {KIT}, which does not export it",
        f"imports {TESTING}.host",
        "imports kit from psych_sandbox_core, which does not export it",
    ]
    # A test may use the test kit too.
    assert [b.split(" ", 1)[1] for b in breaches(planted, "tests.planted", True)] == [
        "imports psych_sandbox_core._api.provider_shapes",
        "imports psych_sandbox_core.kit",
        "imports _PUBLIC from psych_sandbox_core, which does not export it",
        f"imports describe_errors from {KIT}, which does not export it",
        "imports kit from psych_sandbox_core, which does not export it",
    ]


def test_every_name_of_the_integration_kit_is_used_by_an_integration() -> None:
    # The kit holds what integrations need beyond the public API, and only that.
    used: set[str] = set()
    for directory in integration_projects():
        for _, path, _ in sources(directory):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.module == KIT:
                    used.update(alias.name for alias in node.names)
    assert set(integration_kit.__all__) - used == set()
    for name in integration_kit.__all__:
        assert getattr(integration_kit, name) is not None


def test_the_cores_extras_are_aliases_of_the_integrations_of_its_series() -> None:
    major, minor, *_ = psych_sandbox_core.__version__.split(".")
    series = f">={major}.{minor},<{major}.{int(minor) + 1}"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for directory in integration_projects():
        name = project(directory)["name"]
        assert name.startswith("psych-sandbox-")
        extra = name.removeprefix("psych-sandbox-")
        assert extras[extra] == [f"{name}{series}"], extra
        assert f"psych-sandbox-core{series}" in project(directory)["dependencies"]
