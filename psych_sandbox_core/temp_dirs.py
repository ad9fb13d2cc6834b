"""Temporary directories named for the host process that made them, and reaping those whose
host is gone.

A host killed outright (SIGKILL, the machine's out-of-memory killer) cannot remove what it
made: the workspace of the execution it was running and the directory of its canary stay in
the temporary directory. Its sandbox dies with it (parent-death signal, pid namespace), so what
is left is only files. Each such directory is named ``<prefix><pid>.<start>-<random>`` after its
host process (its pid and the kernel's start time for that pid, so a reused pid is not taken
for the owner), and the first directory a later host makes in the same temporary directory
first removes every one whose owner no longer runs. Removal never follows a link
(:func:`workspace.remove_tree`): a name planted by someone else is removed as a name.
"""

from __future__ import annotations

import os
import tempfile
from functools import lru_cache

#: The kinds of directory a host makes per execution in the temporary directory.
WORKSPACE_PREFIX = "psych-ws-"
CANARY_PREFIX = "psych-canary-"
PREFIXES = (WORKSPACE_PREFIX, CANARY_PREFIX)


def start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), None where it has no such
    process or no /proc to ask."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[19].decode() if len(fields) > 19 else None


def owner_tag() -> str:
    """This host process, as it appears in the names of the directories it makes."""
    pid = os.getpid()
    return f"{pid}.{start_time(pid) or 0}"


def make_directory(prefix: str) -> str:
    """A fresh private (0700) directory in the temporary directory, named for this host, made
    after the leftovers of dead hosts there are gone."""
    reap_once(tempfile.gettempdir())
    return tempfile.mkdtemp(prefix=f"{prefix}{owner_tag()}-")


@lru_cache(maxsize=8)
def reap_once(directory: str) -> tuple[str, ...]:
    """:func:`reap` the first time a directory is made in ``directory`` by this process."""
    return tuple(reap(directory))


def reap(directory: str) -> list[str]:
    """Remove the directories in ``directory`` made by host processes that no longer run, and
    return their names. A directory whose owner cannot be read from its name is left alone."""
    # Imported here: workspace.py makes its directories through this module.
    from .workspace import remove_tree

    try:
        names = os.listdir(directory)
    except OSError:
        return []
    removed = []
    for name in names:
        owner = _owner(name)
        if owner is None or _alive(*owner):
            continue
        try:
            remove_tree(os.path.join(directory, name))
        except OSError:
            continue  # another host reaping the same leftover, or not ours to remove
        removed.append(name)
    return removed


def _owner(name: str) -> tuple[int, str] | None:
    prefix = next((p for p in PREFIXES if name.startswith(p)), None)
    if prefix is None:
        return None
    tag = name[len(prefix) :].split("-", 1)[0]
    pid, _, started = tag.partition(".")
    if not pid.isdigit() or not started.isdigit():
        return None
    return int(pid), started


def _alive(pid: int, started: str) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    # Where the start time cannot be read (no /proc), a running pid is taken for the owner.
    now = start_time(pid)
    return now is None or started == "0" or now == started
