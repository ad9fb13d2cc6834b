"""Who imports whom, read from the source with ``ast`` (nothing is imported): the evidence
for the layer rule (test_layers.py) and the backend kit rule (test_backend_kit.py)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = "psych_sandbox_core"
#: Read from the package by a few modules: a constant, not a dependency on the façade.
VERSION = "__version__"


def module_name(path: Path, root: Path = ROOT) -> str:
    """The dotted name of the module at ``path`` below ``root``."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def core_modules() -> dict[str, Path]:
    """Every module of the core package, by dotted name."""
    return {module_name(path): path for path in sorted((ROOT / CORE).rglob("*.py"))}


def _is_core_module(name: str) -> bool:
    base = ROOT / Path(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _type_checking(node: ast.stmt) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(tree: ast.AST, types: bool = False) -> list[ast.AST]:
    """Every node, except the bodies of ``if TYPE_CHECKING:`` (imports for types only) unless
    ``types``."""
    found: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        found.append(node)
        children = list(ast.iter_child_nodes(node))
        if not types and isinstance(node, ast.If) and _type_checking(node):
            children = list(node.orelse)
        stack.extend(children)
    return found


def core_imports(path: Path, module: str, types: bool = False) -> list[tuple[int, str]]:
    """(line, module) of every import of a core module in ``path``, the module ``module``
    (relative imports resolved against it), sorted by line. ``from package import name``
    counts as importing the submodule where ``name`` is one, else the package. Imports for
    types only count with ``types``."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in _walk(ast.parse(path.read_text(), str(path)), types):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            for alias in node.names:
                if base == CORE and alias.name == VERSION:
                    continue
                candidate = f"{base}.{alias.name}"
                targets.append(candidate if _is_core_module(candidate) else base)
        found.extend(
            (node.lineno, target)
            for target in dict.fromkeys(targets)
            if target.split(".")[0] == CORE and target != module
        )
    return sorted(found)


def import_graph(types: bool = False) -> dict[str, set[str]]:
    """Module to the core modules it imports (type-only imports aside, unless ``types``)."""
    modules = core_modules()
    return {
        module: {target for _, target in core_imports(path, module, types) if target in modules}
        for module, path in modules.items()
    }


def room_of(module: str) -> str:
    """The top-level module or folder of the package that ``module`` lives in."""
    return ".".join(module.split(".")[:2])


def rooms() -> dict[str, set[str]]:
    """The import graph between the package's top-level modules and folders (its rooms): the
    picture a structure tool draws of the tree. The package's own ``__init__`` re-exports
    lazily and is left out, as is the kit's lazy re-export of the subprocess backend."""
    graph: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        if module == CORE:
            continue
        room = room_of(module)
        graph.setdefault(room, set())
        for target in targets:
            if target == CORE or room_of(target) == room:
                continue
            if module == f"{CORE}.kit" and target == f"{CORE}.backends.subprocess":
                continue
            graph[room].add(room_of(target))
    return graph
