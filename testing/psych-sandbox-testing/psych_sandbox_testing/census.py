"""What one host process has on the host, counted from outside it: for a soak's before and
after, and for what a host killed outright left for the next one to reap.

Everything is attributed by the names and marks the core gives what it makes for a host
process: its temporary directories carry the host's pid and start time
(temp_dirs.owner_tag), its per-execution cgroups the host's pid (cgroups.PREFIX), and a
uid lease file the pid of the host that holds it (identity.py). Processes are the host's
descendants, those in its cgroups and those under the uids its lease files name. A host
shared with other test runs at the same time keeps their things out of the count.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path

from psych_sandbox_core.kit.posix import cgroups, temp_dirs
from psych_sandbox_core.kit.posix.identity import _lock_directory

from .host import cgroup_directories, cgroup_pids, descends_from, host_processes

#: Mount points that are a container engine's own (a container's root file system, its
#: network namespace file): an engine's containers are counted as containers, and other runs
#: on the host start and stop theirs at any moment.
ENGINE_MOUNT_ROOTS = (
    "/var/lib/docker/",
    "/run/docker/",
    "/var/lib/containerd/",
    "/run/containerd/",
)


@dataclass(frozen=True)
class Census:
    """Counts for one host process (see the module docstring); -1 where not countable."""

    processes: int
    fds: int
    temp_dirs: int
    mounts: int
    cgroups: int
    #: Lease files naming the host, held or left behind by it.
    leases: int
    rss_bytes: int

    def as_dict(self) -> dict[str, int]:
        return {item.name: getattr(self, item.name) for item in fields(self)}

    def differences(
        self, later: Census, *, ignore: Iterable[str] = ("rss_bytes",)
    ) -> dict[str, tuple[int, int]]:
        """The counts (``ignore`` aside) that ``later`` does not have as this one does."""
        skip = set(ignore)
        return {
            name: (before, after)
            for name, before in self.as_dict().items()
            if name not in skip and (after := later.as_dict()[name]) != before
        }


def take(pid: int | None = None, *, extra_prefixes: tuple[str, ...] = ()) -> Census:
    """The census of host process ``pid`` (this one by default), alive or dead. Temporary
    directories named ``<prefix><pid>...`` for ``extra_prefixes`` count too (a plugin's)."""
    pid = os.getpid() if pid is None else pid
    leased = lease_files(pid)
    return Census(
        processes=len(processes_of(pid, leased)),
        fds=_count(f"/proc/{pid}/fd"),
        temp_dirs=len(temp_dirs_of(pid, extra_prefixes)),
        mounts=len(mounts(pid)),
        cgroups=len(cgroups_of(pid)),
        leases=len(leased),
        rss_bytes=rss_bytes(pid),
    )


def processes_of(pid: int, leased: dict[int, str] | None = None) -> list[int]:
    """Live processes that are the host's: its descendants, those in cgroups named for it,
    and those under a uid a lease file naming it holds."""
    table = host_processes()
    uids = set(lease_files(pid) if leased is None else leased)
    in_cgroups: set[int] = set()
    for directory in cgroups_of(pid):
        in_cgroups |= cgroup_pids(directory)
    return sorted(
        process.pid
        for process in table.values()
        if process.alive
        and process.pid != pid
        and (
            descends_from(process, pid, table)
            or process.pid in in_cgroups
            or (process.uids and process.uids[0] in uids)
        )
    )


def temp_dirs_of(pid: int, extra_prefixes: tuple[str, ...] = ()) -> list[str]:
    """Entries of the temporary directory named for host process ``pid``."""
    directory = tempfile.gettempdir()
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    prefixes = (*temp_dirs.PREFIXES, *extra_prefixes)
    return sorted(
        os.path.join(directory, name)
        for name in names
        for prefix in prefixes
        if name.startswith(prefix) and _named_for(name[len(prefix) :], pid)
    )


def _named_for(rest: str, pid: int) -> bool:
    # "<pid>.<start>-<random>" (temp_dirs.make_owned_directory, the core's and a plugin's).
    owner = temp_dirs.owner_of(rest)
    return owner is not None and owner[0] == pid


def cgroups_of(pid: int) -> list[str]:
    """Cgroup directories, in any hierarchy, named for host process ``pid`` (its owner tag,
    ``<pid>.<start>``): the core's ``psych-sandbox-<backend>-<tag>-<id>`` and a plugin's
    ``psych-sandbox/<tag>-...``."""
    found = []
    for path in cgroup_directories():
        name = os.path.basename(path)
        parent = os.path.basename(os.path.dirname(path))
        if name.startswith(cgroups.PREFIX):
            tokens = name[len(cgroups.PREFIX) :].rsplit("-", 2)
            owner = temp_dirs.owner_of(tokens[1]) if len(tokens) == 3 else None
        elif parent == cgroups.PREFIX.rstrip("-"):
            owner = temp_dirs.owner_of(name)
        else:
            continue
        if owner is not None and owner[0] == pid:
            found.append(path)
    return sorted(found)


def lease_files(pid: int) -> dict[int, str]:
    """The uid lease files that name host process ``pid`` (held by it, or left by it when it
    died), by uid."""
    directory = _lock_directory()
    found: dict[int, str] = {}
    mark = f"{pid}\n".encode()
    for entry in os.scandir(directory):
        if not entry.name.isdigit():
            continue
        try:
            with open(entry.path, "rb") as fh:
                if fh.read(32) == mark:
                    found[int(entry.name)] = entry.path
        except OSError:
            continue
    return found


def mounts(pid: int) -> list[str]:
    """Mount points in the mount namespace of ``pid`` (this process's when it is gone), an
    engine's own aside (see ENGINE_MOUNT_ROOTS)."""
    for source in (f"/proc/{pid}/mountinfo", "/proc/self/mountinfo"):
        try:
            text = Path(source).read_text()
            break
        except OSError:
            continue
    else:
        return []
    points = [line.split()[4] for line in text.splitlines() if len(line.split()) > 4]
    return [point for point in points if not point.startswith(ENGINE_MOUNT_ROOTS)]


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return -1


def _count(directory: str) -> int:
    try:
        return len(os.listdir(directory))
    except OSError:
        return -1
