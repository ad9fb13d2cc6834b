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


def _walk(tree: ast.AST) -> list[ast.AST]:
    """Every node, except the bodies of ``if TYPE_CHECKING:`` (imports for types only)."""
    found: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        found.append(node)
        children = list(ast.iter_child_nodes(node))
        if isinstance(node, ast.If) and _type_checking(node):
            children = list(node.orelse)
        stack.extend(children)
    return found


def core_imports(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, module) of every import of a core module in ``path``, the module ``module``
    (relative imports resolved against it), sorted by line. ``from package import name``
    counts as importing the submodule where ``name`` is one, else the package."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in _walk(ast.parse(path.read_text(), str(path))):
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
