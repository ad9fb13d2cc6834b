"""The bootstrap's modules and their assembly (child/loader.py): each module is standard
library only and imports none of the others, since they run as one source in one namespace;
no top-level name is defined by two of them (the later would silently shadow the earlier);
every name one uses is defined by one of them or is a builtin (mypy does not check this
across them); each is short enough to hold at once; and the source the child runs is exactly
their assembly, which compiles and loads. Every check is run on a planted copy too, to show
that it can fail."""

from __future__ import annotations

import ast
import builtins
import shutil
import symtable
from collections import defaultdict
from pathlib import Path

import pytest

from psych_sandbox_core.child import loader
from psych_sandbox_core.child.loader import (
    MAX_PAYLOAD_CHARS,
    PARTS,
    assemble,
    bootstrap_module,
    bootstrap_source,
)

CHILD = Path(loader.__file__).parent
#: The child folder's modules that are the host's, not the bootstrap's.
HOST_MODULES = {"__init__", "loader"}
MAX_MODULE_LINES = 500
#: Names the interpreter defines in the namespace the bootstrap runs in (``-c`` gives no
#: ``__file__``, so it is not among them).
MODULE_NAMES = {"__name__", "__doc__", "__builtins__"}


def parts_of(folder: Path) -> list[tuple[str, str]]:
    return [(name, (folder / f"{name}.py").read_text(encoding="utf-8")) for name in PARTS]


def unlisted(folder: Path) -> list[str]:
    """Modules of the folder that are neither the host's nor assembled: the child never runs
    them."""
    return sorted(
        path.stem
        for path in folder.glob("*.py")
        if path.stem not in HOST_MODULES and path.stem not in PARTS
    )


def cross_imports(parts: list[tuple[str, str]]) -> list[str]:
    """Every import, anywhere in a module, of another module of the bootstrap or of the core."""
    found = []
    for name, text in parts:
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    found.append(f"{name}: a relative import (line {node.lineno})")
                    continue
                targets = [node.module or ""]
            else:
                continue
            for target in targets:
                top = target.split(".")[0]
                if top in PARTS or top == "psych_sandbox_core":
                    found.append(f"{name}: imports {target} (line {node.lineno})")
    return found


def top_level_bindings(text: str) -> dict[str, set[str]]:
    """Each name a module binds at its top level, with how: ``import X`` for a plain import
    of the module the name is, else ``binding``. Function and class bodies bind their own."""
    found: dict[str, set[str]] = defaultdict(set)
    pending: list[ast.AST] = list(ast.parse(text).body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[node.name].add("binding")
            continue
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp)):
            continue
        if isinstance(node, ast.GeneratorExp):
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                found[bound].add(f"import {bound}" if alias.asname is None else "binding")
            continue
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                found[alias.asname or alias.name].add("binding")
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            found[node.id].add("binding")
        elif isinstance(node, ast.ExceptHandler) and node.name:
            found[node.name].add("binding")
        pending.extend(ast.iter_child_nodes(node))
    return found


def clashes(parts: list[tuple[str, str]]) -> list[str]:
    """Top-level names bound by more than one module. The same plain import in several (each
    module imports the stdlib modules it uses) binds the same object, so it shadows nothing."""
    bound_by: dict[str, dict[str, set[str]]] = defaultdict(dict)
    for name, text in parts:
        for bound, kinds in top_level_bindings(text).items():
            bound_by[bound][name] = kinds
    return [
        f"{bound}: defined by {', '.join(modules)}"
        for bound, modules in sorted(bound_by.items())
        if len(modules) > 1 and any(kinds != {f"import {bound}"} for kinds in modules.values())
    ]


def global_names(text: str, filename: str) -> set[str]:
    """The global names a module uses or assigns: at its top level, names it uses without
    binding them; in its functions and classes, every name that is global there."""
    top = symtable.symtable(text, filename, "exec")
    names = {
        symbol.get_name()
        for symbol in top.get_symbols()
        if symbol.is_referenced() and not (symbol.is_assigned() or symbol.is_imported())
    }
    pending = list(top.get_children())
    while pending:
        table = pending.pop()
        names.update(
            symbol.get_name()
            for symbol in table.get_symbols()
            if symbol.is_global() and (symbol.is_referenced() or symbol.is_assigned())
        )
        pending.extend(table.get_children())
    return names


def undefined(parts: list[tuple[str, str]]) -> list[str]:
    """Global names a module uses that no module defines and that are not builtins."""
    defined = set(MODULE_NAMES) | set(dir(builtins))
    for _, text in parts:
        defined.update(top_level_bindings(text))
    return [
        f"{name}: uses {used}"
        for name, text in parts
        for used in sorted(global_names(text, f"{name}.py") - defined)
    ]


def too_long(parts: list[tuple[str, str]]) -> list[str]:
    return [
        f"{name}: {len(text.splitlines())} lines"
        for name, text in parts
        if len(text.splitlines()) > MAX_MODULE_LINES
    ]


def strings_after_the_docstring(source: str) -> list[int]:
    """Lines of top-level string statements after the source's docstring: a module's
    docstring that the assembly did not take out (it must open the module's text)."""
    body = ast.parse(source).body
    return [
        node.lineno
        for node in body[1:]
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    ]


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A copy of the child folder, to plant a fault in."""
    folder = tmp_path / "child"
    shutil.copytree(CHILD, folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def plant(folder: Path, part: str, text: str) -> None:
    path = folder / f"{part}.py"
    path.write_text(path.read_text(encoding="utf-8") + text, encoding="utf-8")


def test_the_child_runs_the_assembly_of_its_modules() -> None:
    source = bootstrap_source()
    assert source == assemble(parts_of(CHILD))
    assert ast.get_docstring(ast.parse(source)) == ast.get_docstring(
        ast.parse(parts_of(CHILD)[0][1])
    )
    assert strings_after_the_docstring(source) == []
    compile(source, "<bootstrap>", "exec", dont_inherit=True)
    module = bootstrap_module()  # its top level, run in order, without the entry point
    assert callable(module.main) and module.__name__ != "__main__"


def test_a_changed_module_changes_the_assembly(copy: Path) -> None:
    plant(copy, "entry", "\n# a change\n")
    assert assemble(parts_of(copy)) != bootstrap_source()


def test_a_docstring_left_in_the_assembly_is_found(copy: Path) -> None:
    path = copy / "probe.py"
    path.write_text("# a comment first\n" + path.read_text(encoding="utf-8"), encoding="utf-8")
    assert strings_after_the_docstring(assemble(parts_of(copy))) != []


def test_every_module_of_the_child_is_assembled(copy: Path) -> None:
    assert unlisted(CHILD) == []
    assert set(PARTS).isdisjoint(HOST_MODULES) and len(set(PARTS)) == len(PARTS)
    (copy / "stray.py").write_text('"""Never assembled."""\n')
    assert unlisted(copy) == ["stray"]


def test_no_module_imports_another_or_the_core() -> None:
    assert cross_imports(parts_of(CHILD)) == []


@pytest.mark.parametrize(
    "planted",
    [
        "from .channel import Channel\n",
        "from . import json_codec\n",
        "import psych_sandbox_core.errors\n",
        "from psych_sandbox_core.child import json_codec\n",
        "def late():\n    import channel\n",
    ],
)
def test_a_planted_import_is_found(copy: Path, planted: str) -> None:
    plant(copy, "entry", "\n\n" + planted)
    assert [problem for problem in cross_imports(parts_of(copy)) if problem.startswith("entry")]


def test_no_name_is_defined_by_two_modules() -> None:
    assert clashes(parts_of(CHILD)) == []


@pytest.mark.parametrize(
    ("planted", "clash"),
    [
        ("\n\ndef json_loads(text):\n    return text\n", "json_loads"),
        ("\n\nMAX_HOST_FRAME_BYTES = 1\n", "MAX_HOST_FRAME_BYTES"),
        ("\n\nos = None\n", "os"),
        ("\n\nimport json as Channel\n", "Channel"),
        ("\n\ntry:\n    pass\nexcept OSError as probe:\n    pass\n", "probe"),
    ],
)
def test_a_planted_clash_is_found(copy: Path, planted: str, clash: str) -> None:
    plant(copy, "entry", planted)
    assert [problem for problem in clashes(parts_of(copy)) if problem.startswith(f"{clash}:")]


def test_the_same_plain_import_in_two_modules_is_no_clash(copy: Path) -> None:
    plant(copy, "entry", "\n\nimport _thread\n")
    assert clashes(parts_of(copy)) == []


def test_every_name_used_is_defined_by_a_module() -> None:
    assert undefined(parts_of(CHILD)) == []


@pytest.mark.parametrize(
    "planted",
    [
        "\n\ndef f():\n    return json_load('1')\n",
        "\n\nclass C:\n    size = NO_SUCH_LIMIT\n",
        "\n\ndef g():\n    global _NEVER_DEFINED\n    _NEVER_DEFINED = 1\n",
        "\n\nprint(__file__)\n",
    ],
)
def test_a_planted_undefined_name_is_found(copy: Path, planted: str) -> None:
    plant(copy, "entry", planted)
    assert [problem for problem in undefined(parts_of(copy)) if problem.startswith("entry:")]


def test_every_module_is_short() -> None:
    assert too_long(parts_of(CHILD)) == []


def test_a_long_module_is_found(copy: Path) -> None:
    plant(copy, "output", "\n" * MAX_MODULE_LINES)
    assert [problem for problem in too_long(parts_of(copy)) if problem.startswith("output:")]


def fits_in_an_argument(source: str) -> bool:
    """Whether ``source`` can be passed as one command-line argument, as ``-c`` passes it."""
    return len(source.encode()) <= MAX_PAYLOAD_CHARS


def test_the_source_fits_in_one_argument(copy: Path) -> None:
    # A child's first start passes the source itself (loader.bootstrap_arguments).
    assert fits_in_an_argument(bootstrap_source())
    plant(copy, "entry", "#" * MAX_PAYLOAD_CHARS + "\n")
    assert not fits_in_an_argument(assemble(parts_of(copy)))


def test_an_assembly_that_cannot_compile_is_found(copy: Path) -> None:
    plant(copy, "idle", "\n\ndef broken(:\n")
    with pytest.raises(SyntaxError):
        compile(assemble(parts_of(copy)), "<bootstrap>", "exec", dont_inherit=True)
