"""Resolving the child's interpreter: one absolute path, at load, that the child can run.

The child gets no PATH, so a bare name is resolved here, once; a name that cannot be resolved
is a configuration error at load, never a different interpreter at spawn time. When the
program runs as another, unprivileged uid, the interpreter must be reachable by any uid.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

from .errors import InterpreterNotFoundError

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


def reachable_by_others(path: str) -> bool:
    """Whether a uid that is neither the owner nor in the group can execute ``path``."""
    current = Path(path)
    try:
        if not current.stat().st_mode & stat.S_IXOTH:
            return False
        return all(parent.stat().st_mode & stat.S_IXOTH for parent in current.parents)
    except OSError:
        return False
