"""How a launched child ended, as the host saw it: the one record every backend's ``finish``
returns and the engine classifies."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from ..errors import ErrorKind


@dataclass(frozen=True)
class ExitStatus:
    #: Exit code, or None when a signal ended the process.
    code: int | None
    #: The signal that ended the process, if one did.
    signal: int | None
    #: CPU seconds of the whole tree, from a mechanism the program cannot influence; None
    #: when nothing measured it. (kill_and_reap leaves it None; a backend fills in its
    #: cgroup's figure.)
    cpu_seconds: float | None
    #: Largest resident set of the tree, in bytes, measured the same way; None when not.
    peak_memory_bytes: int | None
    #: A backend's own reading of how the child ended, when its runtime knows more than the
    #: exit code (a container runtime's OOM kill): the failure kind and its message. The core
    #: uses it when the program left no result.
    failure_hint: tuple[ErrorKind, str] | None = None
    #: CPU seconds wait4 reported for the process and what it reaped: a lower bound (a
    #: program can hide children from it), used only to tell a CPU-limit kill, never reported.
    reaped_cpu_seconds: float | None = None
    #: Largest resident set of the direct child or a descendant it reaped (``wait4``): a
    #: lower bound the program can shrink, for the host's own helpers, never usage.
    reaped_peak_memory_bytes: int | None = None
    #: Whether the host saw that nothing of the tree is left (its pid namespace killed and
    #: found empty). False: it could not see that in time, so the process-tree guarantee is
    #: not enforced for this execution; None: the backend has no such check.
    tree_ended: bool | None = None

    def describe(self) -> str:
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            return f"killed by {name}"
        return f"exited with status {self.code}"

    @classmethod
    def of_wait_status(
        cls,
        status: int,
        reaped_cpu_seconds: float,
        reaped_peak_memory_bytes: int | None = None,
    ) -> ExitStatus:
        """How a process ended, from the wait status its parent reaped, with what wait4
        reported of it. Not usage: a program that ignores SIGCHLD has its children reaped by
        the kernel and their rusage dropped, so wait4 would report low and call it measured.
        A backend reports usage from a mechanism the program cannot influence (a cgroup)."""
        code = os.waitstatus_to_exitcode(status)
        return cls(
            code=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            cpu_seconds=None,
            peak_memory_bytes=None,
            reaped_cpu_seconds=reaped_cpu_seconds,
            reaped_peak_memory_bytes=reaped_peak_memory_bytes,
        )
