"""The layer rule of docs/architecture.md, checked over every import in the package: the
table there is read as written, so the document and the rule cannot drift apart."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .import_rules import CORE, ROOT, core_imports, core_modules

ARCHITECTURE = ROOT / "docs" / "architecture.md"
FAÇADE = {CORE, f"{CORE}.sandbox", f"{CORE}.sync_sandbox"}
#: What a backend shipped in the core may import: the kit, and the mechanism that is its own.
BACKEND_MAY_IMPORT = {f"{CORE}.backend_kit", f"{CORE}.pid_namespace"}


def section(title: str) -> str:
    text = ARCHITECTURE.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def table_rows(text: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith("| ---")
    ][1:]


def layers() -> dict[str, int]:
    """Module (or ``package/``) to its layer, from the document's table."""
    found: dict[str, int] = {}
    for row in table_rows(section("Layers").split("On top of the order")[0]):
        for name in re.findall(r"`([^`]+)`", row[2]):
            full = CORE if name == CORE else f"{CORE}.{name.rstrip('/').replace('/', '.')}"
            found[full + ("/" if name.endswith("/") else "")] = int(row[0])
    return found


def exceptions() -> set[tuple[str, str]]:
    rows = table_rows(section("Layers").split("Known exceptions")[1])
    return {
        (f"{CORE}.{a.strip('`').replace('/', '.')}", f"{CORE}.{b.strip('`').replace('/', '.')}")
        for a, b, _ in rows
    }


def layer_of(module: str, table: dict[str, int]) -> int | None:
    if module in table:
        return table[module]
    for name, layer in table.items():
        if name.endswith("/") and module.startswith(name[:-1]):
            return layer
    return None


def edges() -> list[tuple[str, int, str]]:
    return [
        (module, line, target)
        for module, path in core_modules().items()
        for line, target in core_imports(path, module)
    ]


def test_every_module_has_a_layer() -> None:
    table = layers()
    unplaced = [module for module in core_modules() if layer_of(module, table) is None]
    assert unplaced == [], f"add these to the layer table of docs/architecture.md: {unplaced}"


def breaches() -> set[tuple[str, str]]:
    """Every import against the rule, as (importer, imported)."""
    table = layers()
    found: set[tuple[str, str]] = set()
    for module, _, target in edges():
        own, other = layer_of(module, table), layer_of(target, table)
        assert own is not None and other is not None, (module, target)
        testing = target.startswith(f"{CORE}.testing")
        if (
            other > own
            or (testing and not module.startswith(f"{CORE}.testing"))
            or (module == f"{CORE}.bootstrap")
            or (
                module.startswith(f"{CORE}.protocol")
                and not (target.startswith(f"{CORE}.protocol") or target == f"{CORE}.errors")
            )
            or (module.startswith(f"{CORE}.backends.") and target not in BACKEND_MAY_IMPORT)
            or ((own == 4 or module == f"{CORE}.doctor") and target in FAÇADE)
        ):
            found.add((module, target))
    return found


def test_imports_follow_the_layers() -> None:
    found = breaches() - exceptions()
    assert found == set(), "\n".join(f"{a} imports {b}" for a, b in sorted(found))


def test_every_known_exception_still_occurs() -> None:
    # Once the change that removes one has landed, its row goes: the list only shrinks.
    stale = exceptions() - breaches()
    assert stale == set(), f"remove from docs/architecture.md's exceptions: {sorted(stale)}"


@pytest.mark.parametrize(
    ("module", "source", "breach"),
    [
        ("grading", "from .sandbox import Sandbox\n", f"{CORE}.sandbox"),
        ("protocol.frames", "from ..budgets import x\n", f"{CORE}.budgets"),
        ("backends.subprocess", "from ..host import child_environment\n", f"{CORE}.host"),
        ("selection", "def f():\n    from .sandbox import Sandbox\n", f"{CORE}.sandbox"),
        ("result", "from .testing.host import marker\n", f"{CORE}.testing.host"),
    ],
)
def test_the_rule_catches_a_breach(
    module: str, source: str, breach: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rule cannot pass vacuously: a planted import against it is found.
    name = f"{CORE}.{module}"
    planted = tmp_path / "planted.py"
    planted.write_text(source)
    modules = {**core_modules(), name: planted}
    monkeypatch.setattr(f"{__name__}.core_modules", lambda: modules)
    assert (name, breach) in breaches()


def test_type_only_imports_are_not_dependencies(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from .sandbox import Sandbox\n"
        "from . import __version__\n"
    )
    assert core_imports(planted, f"{CORE}.grading") == []
