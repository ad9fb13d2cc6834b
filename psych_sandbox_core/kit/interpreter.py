"""Resolving the child's interpreter: one absolute path, at load, that the child can run.

The child gets no PATH, so a bare name is resolved here, once; a name that cannot be resolved
is a configuration error at load, never a different interpreter at spawn time. When the
program runs as another, unprivileged uid, the interpreter must be reachable by any uid.

A deployment that offers programs libraries (numpy, pandas, ...) names an *environment*: a
virtual environment or a self-contained Python prefix it built, with the packages installed.
The child runs that environment's own ``bin/python3``, still in isolated mode: ``-I`` ignores
PYTHONPATH and the user's site-packages, but a virtual environment is found from the
``pyvenv.cfg`` beside its executable, so its site-packages (and only them) are on the path.
Nothing is ever installed implicitly, and nothing is added to the path by the bootstrap.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, model_validator

from ..errors import ConfigurationError, InterpreterNotFoundError
from .backend import BackendOptions

_MINOR = f"python{sys.version_info.major}.{sys.version_info.minor}"
#: System interpreters, most specific first.
SYSTEM_CANDIDATES = (
    f"/usr/bin/{_MINOR}",
    "/usr/bin/python3",
    f"/usr/local/bin/{_MINOR}",
    "/usr/local/bin/python3",
)


def resolve_interpreter(
    configured: str | None,
    *,
    reachable_by_any_uid: bool,
    candidates: Sequence[str],
    runner: str,
) -> str:
    """``configured`` resolved and checked, or the first of ``candidates`` that works.

    ``runner`` names who runs it, for the error message.
    """
    if configured is not None:
        found = configured if os.path.isabs(configured) else shutil.which(configured)
        if found is None or not os.access(found, os.X_OK):
            raise InterpreterNotFoundError(
                f"interpreter {configured!r} cannot be resolved to an executable file"
            )
        venv = virtual_environment_of(found)
        if venv is not None:
            # Resolving the link would silently run the base interpreter without the
            # environment's packages; the environment option keeps it whole.
            raise InterpreterNotFoundError(
                f"interpreter {configured!r} belongs to the virtual environment {venv}; set "
                f"environment = {venv!r} instead, so its packages are what the program gets"
            )
        path = os.path.realpath(found)
        if reachable_by_any_uid and not reachable_by_others(path):
            raise InterpreterNotFoundError(
                f"interpreter {path} is not reachable by {runner} (a parent directory or the "
                "file is not world-executable)"
            )
        return path
    for candidate in candidates:
        if not os.path.isfile(candidate) or not os.access(candidate, os.X_OK):
            continue
        real = os.path.realpath(candidate)
        if not reachable_by_any_uid or reachable_by_others(real):
            return real
    raise InterpreterNotFoundError(
        f"no Python interpreter that {runner} can run was found; set 'interpreter' in the "
        "profile to a world-executable python3 (3.10 or newer), e.g. /usr/bin/python3"
    )


@lru_cache(maxsize=8)
def interpreter_prefixes(interpreter: str) -> tuple[str, ...]:
    """Where ``interpreter`` reads its standard library and packages from: its prefixes
    (``sys.prefix``, ``base_prefix``, ``base_exec_prefix``) as real paths, asked of the
    interpreter itself, for a backend that shows its child only part of the host's files."""
    try:
        completed = subprocess.run(
            [
                interpreter,
                "-I",
                "-S",
                "-c",
                "import sys; print(sys.prefix, sys.base_prefix, sys.base_exec_prefix, sep='\\n')",
            ],
            env={},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise InterpreterNotFoundError(
            f"interpreter {interpreter} did not run to report its prefix: {exc}"
        ) from exc
    lines = completed.stdout.decode("utf-8", "replace").splitlines()
    return tuple(dict.fromkeys(os.path.realpath(line.strip()) for line in lines if line.strip()))


def reachable_by_others(path: str) -> bool:
    """Whether a uid that is neither the owner nor in the group can execute ``path``."""
    current = Path(path)
    try:
        if not current.stat().st_mode & stat.S_IXOTH:
            return False
        return all(parent.stat().st_mode & stat.S_IXOTH for parent in current.parents)
    except OSError:
        return False


# ---------------------------------------------------------------- environments

#: The executable an environment is run through, first found wins.
ENVIRONMENT_EXECUTABLES = ("bin/python3", "bin/python")
#: How many unreadable entries a configuration error quotes.
QUOTED_ENTRIES = 5


def virtual_environment_of(executable: str) -> str | None:
    """The virtual environment ``executable`` starts (its directory holding the
    ``pyvenv.cfg`` Python looks for beside the executable or one level up), or None."""
    directory = os.path.dirname(os.path.abspath(executable))
    for candidate in (directory, os.path.dirname(directory)):
        if os.path.isfile(os.path.join(candidate, "pyvenv.cfg")):
            return os.path.realpath(candidate)
    return None


def environment_executable(root: str) -> str | None:
    """The python executable of the environment at ``root``, or None. The path stays inside
    the environment (not resolved through the venv's link to its base interpreter): Python
    finds the environment from the path it was started by."""
    for name in ENVIRONMENT_EXECUTABLES:
        candidate = os.path.join(root, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def check_environment_path(value: str) -> str:
    """Validate the ``environment`` option at load: an absolute directory holding a Python
    environment. Returns its real path."""
    if not os.path.isabs(value):
        raise ValueError(f"{value!r} is not an absolute path")
    root = os.path.realpath(value)
    if not os.path.isdir(root):
        raise ValueError(f"{value!r} does not exist or is not a directory")
    if environment_executable(root) is None:
        raise ValueError(
            f"{value!r} holds no Python environment: no executable "
            f"{' or '.join(ENVIRONMENT_EXECUTABLES)} in it (make one with "
            "`python3 -m venv DIR` and install packages into it with DIR/bin/python -m pip)"
        )
    return root


#: A configured environment directory, checked when the configuration is loaded.
EnvironmentPath = Annotated[str, AfterValidator(check_environment_path)]


class InterpreterOptions(BackendOptions):
    """The child's interpreter, as backends that run one from the host configure it (a
    base of their options model)."""

    #: Interpreter for the child: a path or a name on PATH; None lets the backend pick one.
    interpreter: str | None = None
    #: A Python environment the deployment built (a virtual environment or a self-contained
    #: prefix): the child runs its bin/python3, so the program can import what is installed
    #: there. Bound or used read-only, as-is; nothing is installed implicitly.
    environment: EnvironmentPath | None = None

    @model_validator(mode="after")
    def _one_interpreter(self) -> InterpreterOptions:
        if self.interpreter is not None and self.environment is not None:
            raise ValueError(
                "set either 'interpreter' or 'environment' (whose own python runs), not both"
            )
        return self

    def child_interpreter(
        self,
        *,
        reachable_by_any_uid: bool,
        runner: str,
        candidates: Sequence[str],
        bound_read_only: bool,
    ) -> ChildInterpreter:
        """What the child runs, resolved once, at load: the configured environment's own
        executable (see :func:`resolve_environment`), else the configured interpreter or
        the first of ``candidates`` that works (see :func:`resolve_interpreter`)."""
        if self.environment is not None:
            environment = resolve_environment(
                self.environment,
                reachable_by_any_uid=reachable_by_any_uid,
                runner=runner,
                bound_read_only=bound_read_only,
            )
            return ChildInterpreter(environment.executable, environment.base, environment.root)
        path = resolve_interpreter(
            self.interpreter,
            reachable_by_any_uid=reachable_by_any_uid,
            candidates=candidates,
            runner=runner,
        )
        return ChildInterpreter(path, path)


@dataclass(frozen=True)
class ChildInterpreter:
    """The interpreter a child runs, resolved."""

    #: What the child executes (an environment's bin/python3, or the interpreter itself).
    executable: str
    #: The interpreter binary that leads to (the executable itself, outside an environment).
    base: str
    #: The configured environment's directory, or None.
    environment: str | None = None


@dataclass(frozen=True)
class Environment:
    """A configured environment, resolved: where it is and the executable to run."""

    root: str
    executable: str
    #: The interpreter binary the executable leads to (a venv's base interpreter).
    base: str


def resolve_environment(
    root: str, *, reachable_by_any_uid: bool, runner: str, bound_read_only: bool
) -> Environment:
    """The environment at ``root`` (already validated), checked for ``runner``.

    When the program runs as another, unprivileged uid, the whole environment must be
    readable by any uid: a package it cannot read would fail at import, mid-program, as if
    the program were at fault. Unless the backend binds it read-only, nothing in it may be
    writable by any uid either: one program could plant code every later one imports.
    Checked here, at load, naming what is at fault.
    """
    executable = environment_executable(root)
    if executable is None:
        raise ConfigurationError(f"environment: {root!r} holds no Python environment")
    base = os.path.realpath(executable)
    if reachable_by_any_uid:
        if not reachable_by_others(base):
            raise ConfigurationError(
                f"environment: its interpreter {base} (which {executable} leads to) is not "
                f"reachable by {runner}; build the environment from a world-executable "
                "interpreter, e.g. /usr/bin/python3 -m venv"
            )
        unreadable, writable = modes_for_others(root)
        read_remedy = "directories need o+rx and files o+r: chmod -R o+rX"
        write_remedy = "no entry may be o+w, nor a directory above without the sticky bit"
        for found, problem, remedy in (
            (unreadable, "not readable by", read_remedy),
            ([] if bound_read_only else writable, "writable by", write_remedy),
        ):
            if found:
                shown = ", ".join(found[:QUOTED_ENTRIES])
                more = len(found) - QUOTED_ENTRIES
                raise ConfigurationError(
                    f"environment: {root} is {problem} {runner}: {shown}"
                    + (f" and {more} more" if more > 0 else "")
                    + f" ({remedy})"
                )
    return Environment(root=root, executable=executable, base=base)


def modes_for_others(root: str) -> tuple[list[str], list[str]]:
    """What a uid that is neither owner nor group member cannot read, and what it can
    change, of ``root``, everything under it and the directories above it: (unreadable,
    writable). Unreadable: a directory without o+rx, a file without o+r, a directory above
    without o+x. Writable: any entry with o+w, a directory above with o+w and no sticky bit
    (the environment could be swapped). Links are not followed (a link out of the
    environment is the deployment's own business)."""
    unreadable: list[str] = []
    writable: list[str] = []
    for parent in Path(root).parents:
        try:
            mode = parent.stat().st_mode
        except OSError:
            unreadable.append(str(parent))
            continue
        if not mode & stat.S_IXOTH:
            unreadable.append(str(parent))
        if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
            writable.append(str(parent))
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            mode = os.lstat(directory).st_mode
        except OSError:
            unreadable.append(directory)
            continue
        if mode & stat.S_IWOTH:
            writable.append(directory)
        if mode & (stat.S_IROTH | stat.S_IXOTH) != stat.S_IROTH | stat.S_IXOTH:
            unreadable.append(directory)
            continue
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        entry_mode = entry.stat(follow_symlinks=False).st_mode
                        if not entry_mode & stat.S_IROTH:
                            unreadable.append(entry.path)
                        if entry_mode & stat.S_IWOTH:
                            writable.append(entry.path)
        except OSError:
            unreadable.append(directory)
    return unreadable, writable
