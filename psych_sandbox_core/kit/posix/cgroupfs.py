"""The cgroup hierarchies mounted on this host, and removing cgroup directories safely.

A Linux host mounts cgroup v1 controllers (a hierarchy each, or several co-mounted), the v2
unified hierarchy, or both: a hybrid host has v1 controllers under /sys/fs/cgroup/<controller>
beside cgroup2 at /sys/fs/cgroup/unified. A container runtime creates a container's cgroup in
every hierarchy it finds, so whatever creates or cleans up cgroups must consider all of them,
not only the controllers it uses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: Where the kernel lists this process's mounts.
MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy."""

    #: The hierarchy's path that is mounted here (not "/" inside a cgroup namespace).
    root: str
    #: Where it is mounted.
    point: Path
    #: "cgroup" (v1) or "cgroup2" (the unified hierarchy).
    fstype: str
    #: The superblock's options: for v1, the controllers (and any name=...) it holds.
    options: frozenset[str]

    @property
    def version(self) -> int:
        return 2 if self.fstype == "cgroup2" else 1


def hierarchies() -> list[Hierarchy]:
    """Every cgroup hierarchy mounted here, each once (at its first mount: the same hierarchy
    bind-mounted elsewhere is the same set of cgroups). Empty where none is, or off Linux."""
    found: list[Hierarchy] = []
    seen: set[str] = set()
    try:
        with open(MOUNTINFO) as fh:
            lines = fh.readlines()
    except OSError:
        return []
    for line in lines:
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) < 5 or len(rest) < 3 or rest[0] not in ("cgroup", "cgroup2"):
            continue
        # Field 3 is the superblock's device: one per hierarchy, shared by its bind mounts.
        if fields[2] in seen:
            continue
        seen.add(fields[2])
        found.append(
            Hierarchy(
                root=_unescape(fields[3]),
                point=Path(_unescape(fields[4])),
                fstype=rest[0],
                options=frozenset(rest[2].split(",")),
            )
        )
    return found


def _unescape(text: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, char)
    return text


def remove_tree(path: Path) -> bool:
    """rmdir ``path`` and every cgroup below it, deepest first; True if nothing is left.

    Only empty cgroups can be removed (the kernel refuses one with a process or a child in
    it), so this never takes a cgroup from anything still running; symbolic links are not
    followed (cgroupfs has none, but the path may not be on cgroupfs)."""
    try:
        walked = list(os.walk(path, topdown=False, followlinks=False))
    except OSError:
        walked = []
    for top, dirs, _ in walked:
        for name in dirs:
            try:
                os.rmdir(os.path.join(top, name))
            except OSError:
                pass
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True
