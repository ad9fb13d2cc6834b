"""A pid namespace the host tears down itself, whatever the program did to its processes.

The bootstrap that unshared the namespace hands the host, before any program exists, a pidfd
on the namespace's init and the namespace itself, open (see bootstrap ``_hand_over_init``).
Teardown is then the host's own act: SIGKILL to the init through that pidfd (the kernel kills
everything else in the namespace, and the init exits only once all of it is reaped), the pidfd
becoming readable, and a scan of /proc that no process is left in the namespace. Nothing here
asks the program, or any process it could reach, to cooperate.
"""

from __future__ import annotations

import os
import signal
import socket
from dataclasses import dataclass, field

import anyio

#: The report is the init's pid in decimal (the descriptors travel beside it).
MAX_REPORT_BYTES = 32


@dataclass
class PidNamespace:
    """One execution's pid namespace, held open, and a pidfd on its init."""

    init_pid: int
    #: The namespace's identity, as stat() of /proc/<pid>/ns/pid gives it: (device, inode).
    #: Unique while the namespace is held open (a freed namespace's inode is reused).
    identity: tuple[int, int]
    _namespace: int = field(repr=False)
    _handle: int = field(repr=False)
    #: Whether teardown saw the namespace empty (None until it looked).
    emptied: bool | None = None

    @classmethod
    async def receive(cls, report: socket.socket, seconds: float) -> PidNamespace | None:
        """The namespace the bootstrap reports on ``report``, or None if it reported none
        (it exited first, or its interpreter has no pidfds). Raises TimeoutError when the
        bootstrap says nothing within ``seconds``."""
        with anyio.fail_after(seconds):
            await anyio.wait_readable(report)
        try:
            message, fds, _, _ = socket.recv_fds(report, MAX_REPORT_BYTES, 2, socket.MSG_DONTWAIT)
        except OSError:
            return None
        try:
            pid = int(message.decode("ascii"))
            if len(fds) != 2:
                raise ValueError("a namespace and a pidfd were expected")
            info = os.fstat(fds[0])
        except (ValueError, OSError):
            for fd in fds:
                os.close(fd)
            return None
        return cls(pid, (info.st_dev, info.st_ino), fds[0], fds[1])

    def kill(self) -> None:
        """SIGKILL the init by its pidfd: the kernel then kills every process in the namespace
        (from the parent namespace the signal cannot be ignored, handled or blocked)."""
        if self._handle < 0:
            return
        try:
            signal.pidfd_send_signal(self._handle, signal.SIGKILL)
        except ProcessLookupError:
            pass  # already exited: the namespace went with it

    async def wait_empty(self, seconds: float) -> bool:
        """Kill the namespace and wait until nothing is left in it; True once verified empty.
        Idempotent. False if the init outlived ``seconds`` or a member is still listed: the
        caller must then not treat the execution's identity as free (the uid sweep of
        identity.py kills what runs under it, and keeps a uid whose processes will not die)."""
        if self.emptied is not None:
            return self.emptied
        self.kill()
        exited = False
        with anyio.move_on_after(seconds):
            # The init exits last: the kernel has it wait until every other member is reaped.
            await anyio.wait_readable(self._handle)
            exited = True
        self.emptied = exited and not await anyio.to_thread.run_sync(members, self.identity)
        return self.emptied

    def close(self) -> None:
        for fd in (self._handle, self._namespace):
            if fd >= 0:
                os.close(fd)
        self._handle = self._namespace = -1


def namespace_of(pid: int | str) -> tuple[int, int] | None:
    """The pid namespace ``pid`` belongs to, or None where the host may not look."""
    try:
        info = os.stat(f"/proc/{pid}/ns/pid")
    except OSError:
        return None
    return info.st_dev, info.st_ino


def members(identity: tuple[int, int]) -> list[int]:
    """Processes (zombies included) whose pid namespace is ``identity``, seen from the host's
    /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and namespace_of(entry) == identity:
            found.append(int(entry))
    return found
