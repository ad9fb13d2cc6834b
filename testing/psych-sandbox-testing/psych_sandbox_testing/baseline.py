"""What a test's executions left on the host, found from outside whatever the backend did:
the host before the test, compared with the host after it (the conformance suite's check
after every test)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from psych_sandbox_core import ConfigurationError
from psych_sandbox_core.kit.posix.identity import IdentityExhausted, IdentityLease, IdentityRange

from .host import (
    HostProcess,
    cgroup_directories,
    cgroups_left,
    child_subreaper,
    descends_from,
    host_processes,
    kill_by_pidfd,
    reap_children,
    remove_cgroups,
)


@dataclass
class HostBaseline:
    """The host before a test, to find what the test's executions left behind.

    What counts as the execution's: a process that did not exist before (its pid and start
    time are new) and either descends from this process (made a child subreaper by
    :meth:`watching`, so a detached daemon still does) or runs under a uid of the backend's
    identity range that no live lease holds; and a cgroup directory, in any hierarchy, that
    did not exist before and is still there. A new cgroup that holds processes none of which
    is the execution's belongs to something else running on the host and is not counted.
    """

    processes: dict[int, HostProcess]
    cgroups: frozenset[str]
    #: The backend's identity range (its leased uids), where it has one.
    uids: range | None = None

    @classmethod
    def take(cls, uids: range | None = None) -> HostBaseline:
        return cls(host_processes(), cgroup_directories(), uids)

    @classmethod
    @contextmanager
    def watching(cls, uids: range | None = None) -> Iterator[HostBaseline]:
        """The baseline, with this process the reaper of its orphans until the block ends."""
        with child_subreaper():
            baseline = cls.take(uids)
            yield baseline
            # Orphans that died in the meantime were reparented here: reap them, so no
            # zombie of the test outlives it.
            me = os.getpid()
            reap_children(
                {
                    p.pid
                    for p in host_processes().values()
                    if p.ppid == me and not p.alive and p.pid not in baseline.processes
                }
            )

    def _new(self, process: HostProcess) -> bool:
        before = self.processes.get(process.pid)
        return before is None or before.started != process.started

    def survivors(self) -> tuple[list[HostProcess], list[IdentityLease]]:
        """Live processes the execution left, and leases held on the uids some of them run
        under (release them once those processes are dead)."""
        now = host_processes()
        me = os.getpid()
        left: dict[int, HostProcess] = {}
        for process in now.values():
            if process.alive and self._new(process) and descends_from(process, me, now):
                left[process.pid] = process
        leases: list[IdentityLease] = []
        if self.uids is not None:
            by_uid: dict[int, list[HostProcess]] = {}
            for process in now.values():
                uid = next((u for u in process.uids if u in self.uids), None)
                if uid is not None and process.alive and self._new(process):
                    by_uid.setdefault(uid, []).append(process)
            leased: list[list[HostProcess]] = []
            for uid, processes in by_uid.items():
                # A uid another execution holds is that execution's business; one nobody
                # holds has nothing to run. Leasing it also keeps it from being handed out
                # while its leftovers are killed.
                try:
                    lease = IdentityRange(uid, 1).lease()
                except (IdentityExhausted, ConfigurationError, OSError):
                    continue
                leases.append(lease)
                leased.append(processes)
            # Looked at again once leased: a process seen before the lease was taken may have
            # ended since, with its execution (another one, running beside this test) giving
            # the uid back just before the lease.
            again = host_processes() if leased else {}
            for processes in leased:
                for p in processes:
                    seen = again.get(p.pid)
                    if seen is not None and seen.alive and seen.started == p.started:
                        left[p.pid] = seen
        return sorted(left.values(), key=lambda p: p.pid), leases

    def check(self) -> str | None:
        """Kill (by pidfd) what the execution left and remove its empty cgroups; what was
        found, for a failure message, or None if nothing was."""
        survivors, leases = self.survivors()
        # Named while they still run: a dead process has no command line.
        named = [p.describe() for p in survivors]
        try:
            unkillable = kill_by_pidfd(survivors)
        finally:
            for lease in leases:
                lease.release()
        cgroups = cgroups_left(self.cgroups, spared={p.pid for p in survivors})
        remove_cgroups(cgroups)
        problems = []
        if survivors:
            problems.append(
                f"{len(survivors)} process(es) outlived the execution (killed now"
                + (f"; {len(unkillable)} would not die" if unkillable else "")
                + "): "
                + "; ".join(named)
            )
        if cgroups:
            problems.append(
                f"{len(cgroups)} cgroup(s) were left behind (removed now where empty): "
                + ", ".join(cgroups)
            )
        return "; ".join(problems) or None
