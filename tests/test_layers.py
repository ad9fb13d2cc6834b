"""The layer rule of docs/architecture.md, checked over every import in the package: the
table there names folders (and the few top-level modules), read as written, so the document
and the rule cannot drift apart. The shape the tree gives the import graph is checked too: no
import circle, no module over the size a reader holds at once, and few rooms on few floors."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from .import_rules import CORE, ROOT, core_imports, core_modules, import_graph, rooms

ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: The public façade: what the selection layer and doctor never import.
FAÇADE = f"{CORE}._api"
#: What a backend shipped in the core may import: the kit.
BACKEND_MAY_IMPORT = f"{CORE}.kit"
#: The longest module a reader is asked to hold at once; the child's modules are assembled
#: into one source, which is not a module of the tree.
MAX_MODULE_LINES = 500
#: The graph between the package's top-level entries (its rooms) and its floors.
MAX_ROOMS = 30
MAX_FLOORS = 13


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
    """A top-level module or folder (``name/``) to its layer, from the document's table."""
    found: dict[str, int] = {}
    for row in table_rows(section("Layers").split("On top of the order")[0]):
        for name in re.findall(r"`([^`]+)`", row[1]):
            full = CORE if name == CORE else f"{CORE}.{name.rstrip('/').replace('/', '.')}"
            found[full] = int(row[0])
    return found


def exceptions() -> set[tuple[str, str]]:
    rows = table_rows(section("Layers").split("Known exceptions")[1])
    return {
        (f"{CORE}.{a.strip('`').replace('/', '.')}", f"{CORE}.{b.strip('`').replace('/', '.')}")
        for a, b, _ in rows
    }


def layer_of(module: str, table: dict[str, int]) -> int | None:
    """The layer of the top-level module or folder ``module`` lives in."""
    if module == CORE:
        return table.get(CORE)
    top = ".".join(module.split(".")[:2])
    return table.get(top)


def within(module: str, folder: str) -> bool:
    return module == folder or module.startswith(folder + ".")


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
        child = within(module, f"{CORE}.child") and module != f"{CORE}.child.loader"
        if (
            other > own
            or child
            or (
                within(module, f"{CORE}.protocol")
                and not (within(target, f"{CORE}.protocol") or target == f"{CORE}.errors")
            )
            or (within(module, f"{CORE}.backends") and not within(target, BACKEND_MAY_IMPORT))
            or (
                (within(module, f"{CORE}._policy") or module == f"{CORE}.cli.doctor")
                and within(target, FAÇADE)
            )
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
        ("grading", "from ._api.sandbox import Sandbox\n", f"{CORE}._api.sandbox"),
        ("protocol.frames", "from ..budgets import x\n", f"{CORE}.budgets"),
        ("backends.subprocess", "from .._engine.host import x\n", f"{CORE}._engine.host"),
        ("_policy.selection", "def f():\n    from .._api import sandbox\n", f"{CORE}._api.sandbox"),
        ("child.channel", "from ..errors import SandboxError\n", f"{CORE}.errors"),
        ("kit.backend", "from .._engine import host\n", f"{CORE}._engine.host"),
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


#: The test kit, a distribution of its own that depends on the core (and on pytest).
TEST_KIT = "psych_sandbox_testing"


def imports_of_the_test_kit(path: Path) -> list[int]:
    """The lines of ``path`` that import the test kit."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if (
            isinstance(node, ast.Import)
            and any(a.name.split(".")[0] == TEST_KIT for a in node.names)
        )
        or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == TEST_KIT)
    ]


def test_the_core_never_imports_the_test_kit(tmp_path: Path) -> None:
    # pytest is not a dependency of the core; the test kit depends on the core, not back.
    found = [
        f"{name}:{line}"
        for name, path in core_modules().items()
        for line in imports_of_the_test_kit(path)
    ]
    assert found == []
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from psych_sandbox_testing.host import marker\n")
    assert imports_of_the_test_kit(planted) == [2]


def test_type_only_imports_are_not_dependencies(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from .sandbox import Sandbox\n"
        "from . import __version__\n"
    )
    assert core_imports(planted, f"{CORE}.grading") == []
    # ... except where a circle is looked for.
    assert core_imports(planted, f"{CORE}.grading", types=True) == [(3, f"{CORE}.sandbox")]


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle() -> None:
    # Imports for types only count here: a circle through one is still two modules that
    # cannot be read apart (and a structure tool draws it).
    graph = import_graph(types=True)
    # The kit's documented lazy re-export of the subprocess backend, for subclassing.
    graph[f"{CORE}.kit"].discard(f"{CORE}.backends.subprocess")
    assert circles(graph) == []


def test_the_circle_finder_finds_one() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_is_longer_than_a_reader_holds() -> None:
    long = {
        name: lines
        for name, path in core_modules().items()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"split these modules (over {MAX_MODULE_LINES} lines): {long}"


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each room's floor: one above the highest room it imports (0 for none)."""
    floor: dict[str, int] = {}

    def place(room: str, seen: tuple[str, ...]) -> int:
        if room not in floor:
            assert room not in seen, f"rooms import each other: {[*seen, room]}"
            below = [place(other, (*seen, room)) for other in graph[room]]
            floor[room] = 1 + max(below, default=-1)
        return floor[room]

    for room in graph:
        place(room, ())
    return floor


def test_the_rooms_and_floors_are_few() -> None:
    graph = rooms()
    levels = floors(graph)
    assert len(graph) <= MAX_ROOMS, sorted(graph)
    assert max(levels.values()) + 1 <= MAX_FLOORS, levels


def test_the_tree_is_drawn_in_the_architecture() -> None:
    # docs/architecture.md opens with the tree: one line per folder of the package.
    tree = ARCHITECTURE.read_text().split("```")[1]
    folders = sorted(
        str(path.parent.relative_to(ROOT / CORE))
        for path in (ROOT / CORE).rglob("__init__.py")
        if path.parent != ROOT / CORE
    )
    missing = [folder for folder in folders if f"{folder.rpartition('/')[2]}/" not in tree]
    assert missing == [], f"draw these folders in docs/architecture.md's tree: {missing}"
