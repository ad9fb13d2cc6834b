"""Temporary directories named for the host process that made them, and reaping those whose
host is gone.

A host killed outright (SIGKILL, the machine's out-of-memory killer) cannot remove what it
made: the workspace of the execution it was running and the directory of its canary stay in
the temporary directory. Its sandbox dies with it (parent-death signal, pid namespace), so what
is left is only files. Each such directory is named ``<prefix><pid>.<start>-<random>`` after its
host process (its pid and the kernel's start time for that pid, so a reused pid is not taken
for the owner), and the first directory a later host makes in the same temporary directory
first removes every one whose owner no longer runs. Removal never follows a link
(:func:`removal.remove_tree`): a name planted by someone else is removed as a name.
"""

from __future__ import annotations

import os
import tempfile
from functools import lru_cache

from .removal import remove_tree

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
    return _tag_of(os.getpid())


@lru_cache(maxsize=4)
def _tag_of(pid: int) -> str:
    # A process's start time never changes: read once per pid (a forked host has its own).
    return f"{pid}.{start_time(pid) or 0}"


def make_owned_directory(prefix: str) -> str:
    """A fresh private (0700) directory in the temporary directory, named for this host, made
    after the leftovers of dead hosts there (of the core's kinds and of ``prefix``) are gone."""
    reap_owned_once(tempfile.gettempdir(), tuple(sorted({*PREFIXES, prefix})))
    return tempfile.mkdtemp(prefix=f"{prefix}{owner_tag()}-")


@lru_cache(maxsize=8)
def reap_owned_once(directory: str, prefixes: tuple[str, ...] = PREFIXES) -> tuple[str, ...]:
    """:func:`reap_owned_directories` the first time this process makes a directory in
    ``directory``."""
    return tuple(reap_owned_directories(directory, prefixes))


def reap_owned_directories(
    directory: str, prefixes: tuple[str, ...] = PREFIXES, *, everything: bool = False
) -> list[str]:
    """Remove the directories in ``directory`` named ``<prefix><owner>-...`` for one of
    ``prefixes`` whose owner no longer runs (every one of them with ``everything``), and
    return their names. A directory whose owner cannot be read from its name is left alone."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    removed = []
    for name in names:
        prefix = next((p for p in prefixes if name.startswith(p)), None)
        owner = None if prefix is None else owner_of(name[len(prefix) :])
        if owner is None or (not everything and host_alive(*owner)):
            continue
        try:
            remove_tree(os.path.join(directory, name))
        except OSError:
            continue  # another host reaping the same leftover, or not ours to remove
        removed.append(name)
    return removed


def owner_of(name: str) -> tuple[int, str] | None:
    """The host process (pid, start time) a name beginning with :func:`owner_tag` and a ``-``
    was made by; None where the name does not begin so."""
    tag = name.split("-", 1)[0]
    pid, _, started = tag.partition(".")
    if not pid.isdigit() or not started.isdigit():
        return None
    return int(pid), started


def host_alive(pid: int, started: str) -> bool:
    """Whether the host process ``pid`` that started at ``started`` still runs (a reused pid
    has another start time)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    # Where the start time cannot be read (no /proc), a running pid is taken for the owner.
    now = start_time(pid)
    return now is None or started == "0" or now == started
