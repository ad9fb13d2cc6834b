"""Running part of a test as an unprivileged host user (the test itself runs as root): a
system account, the system interpreter, and a copy of this environment's packages any uid can
read. Standard library only (no pytest)."""

from __future__ import annotations

import atexit
import importlib
import json
import pwd
import shutil
import subprocess
import sys
import sysconfig
from functools import cache
from pathlib import Path

from psych_sandbox_core.kit.posix.temp_dirs import make_owned_directory

#: The system interpreter an unprivileged user can run (the test environment's may live
#: under a home directory it cannot enter).
SYSTEM_PYTHON = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
#: Test-only tools nothing run as the user imports: left out of the staged copy.
#: The staged copies' directories in the temporary directory.
STAGING_PREFIX = "psych-as-user-"
_NOT_NEEDED = ("mypy", "mypyc", "hypothesis", "ruff", "_pytest", "pytest", "trio", "pip")


def unprivileged_user(name: str) -> tuple[int, int]:
    """The uid and gid of system account ``name``, created (no home, no shell) if missing."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
        )
        entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid


@cache
def staged_environment(
    editable: tuple[str, ...], leave_out: tuple[str, ...] = (), files: tuple[str, ...] = ()
) -> Path:
    """A directory any uid can read: ``site/`` holds this environment's packages (add it with
    ``site.addsitedir``), the packages named in ``editable`` copied beside their metadata
    (editable installs point into the checkout), and ``files`` at the top. Distributions whose
    names start with an entry of ``leave_out`` are left out. Made once per process, removed
    at exit.

    The checkout (and the environment inside it) may live below a directory other users
    cannot enter, such as /root; a test must not depend on where it was cloned.
    """
    # Named for this process, so a later one reaps it should this one be killed before its
    # exit handlers run (a test run's worker ended by a timeout, for example).
    root = Path(make_owned_directory(STAGING_PREFIX))
    _staged.append(root)
    atexit.register(shutil.rmtree, root, True)
    site = root / "site"
    packages = Path(sysconfig.get_paths()["purelib"])
    # An editable install not named in ``editable`` is left out too: its code stays in the
    # checkout, and its metadata alone would register an entry point nothing can load.
    left_out_editable = {
        info.name
        for info in packages.glob("*.dist-info")
        if _is_editable(info) and info.name.split("-")[0] not in editable
    }

    def ignore(directory: str, names: list[str]) -> set[str]:
        if Path(directory) != packages:
            return {n for n in names if n == "__pycache__"}
        return {
            n
            for n in names
            if n.endswith(".pth")
            or n.split("-")[0].split(".")[0] in _NOT_NEEDED
            or n.startswith(leave_out)
            or n in left_out_editable
        }

    shutil.copytree(packages, site, ignore=ignore)
    for name in editable:
        source = Path(importlib.import_module(name).__file__ or "").parent
        # Installed from a wheel (an environment of one distribution's own), it is copied
        # with the rest already.
        if source.parent != packages:
            shutil.copytree(
                source, site / source.name, ignore=shutil.ignore_patterns("__pycache__")
            )
    for file in files:
        shutil.copy(file, root / Path(file).name)
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


#: The staged copies this process made and has not removed.
_staged: list[Path] = []


def remove_staged() -> None:
    """Remove every staged copy this process made. A test session calls it as it ends: its
    exit handlers are not run where the process ends without them (a pytest-xdist worker)."""
    staged_environment.cache_clear()
    while _staged:
        shutil.rmtree(_staged.pop(), ignore_errors=True)


def _is_editable(info: Path) -> bool:
    """Whether the distribution whose metadata is ``info`` was installed in editable mode."""
    try:
        direct = json.loads((info / "direct_url.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(direct, dict) and bool((direct.get("dir_info") or {}).get("editable"))
