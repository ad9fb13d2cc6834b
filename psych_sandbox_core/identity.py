"""Unprivileged identities leased one per execution, on hosts that run as root.

Two programs running at the same time under one uid can reach each other: read each other's
``/proc/<pid>/environ`` and ``/proc/<pid>/root``, write to each other's output, share one
process-count limit. So a root host gives every execution a uid (and gid) of its own, from a
range no account uses, and takes it back when the execution is over.

A lease is an exclusive ``flock`` on a per-uid file in a root-only directory: it holds across
every host process on the machine and is released by the kernel if the host dies, so a crash
never strands a uid. Leases go to the lowest free uid, which keeps the lock files few (as many
as the highest concurrency seen).
"""

from __future__ import annotations

import errno
import fcntl
import os
import pwd
import select
import signal
import stat
import tempfile
import time
from dataclasses import dataclass, field
from typing import Annotated

import anyio
from pydantic import Field

from .backend import BackendOptions, BackendUnavailable
from .errors import ConfigurationError

#: Default range: far above the uids distributions hand out (and above the 100000+ ranges
#: container tools use for subordinate ids), below 2**31 so no tool misreads it as negative.
DEFAULT_FIRST_UID = 1_800_000_000
DEFAULT_COUNT = 65_536

#: Where the lock files live: a root-only directory under /run, or the temp directory.
_LOCK_DIRECTORIES = ("/run/psych-sandbox/identities",)


class LeasedIdentityOptions(BackendOptions):
    """Settings of a backend that runs each execution as a uid of its own on root hosts."""

    #: The range uids are leased from: one no account uses (checked at load).
    identity_first_uid: Annotated[int, Field(ge=1000)] = DEFAULT_FIRST_UID
    identity_count: Annotated[int, Field(ge=1, le=1 << 24)] = DEFAULT_COUNT

    def identity_range(self) -> IdentityRange:
        return IdentityRange(self.identity_first_uid, self.identity_count)


class IdentityExhausted(Exception):
    """Every uid of the range is leased right now (more concurrent executions than uids)."""


@dataclass
class IdentityLease:
    uid: int
    gid: int
    _fd: int = field(repr=False)

    async def retire(self, *, sweep: bool = True) -> None:
        """Kill whatever still runs under the uid, then give it back; shielded from
        cancellation, since an execution's teardown must finish. A uid whose processes will
        not die stays leased (and marked unclean for the next holder) rather than be shared.

        ``sweep=False`` where a pid namespace held the whole tree: its end killed everything,
        and scanning every process on the host would only cost time.
        """
        if not sweep:
            self.release()
            return
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(kill_processes_of, self.uid)
            except OSError:
                return
            self.release()

    def release(self) -> None:
        """Give the uid back. Call only once nothing runs under it any more."""
        if self._fd >= 0:
            # An empty lock file tells the next holder the uid was handed back clean.
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing drops the flock
            self._fd = -1


@dataclass(frozen=True)
class IdentityRange:
    first: int = DEFAULT_FIRST_UID
    count: int = DEFAULT_COUNT

    def check(self) -> None:
        """Refuse a range that overlaps an account (configuration error, at load)."""
        if self.first < 1000 or self.count < 1 or self.first + self.count > 2**31 - 1:
            raise ConfigurationError(
                f"identity range {self.first}+{self.count} must lie within [1000, 2**31-1)"
            )
        for entry in pwd.getpwall():
            if self.first <= entry.pw_uid < self.first + self.count:
                raise ConfigurationError(
                    f"identity range {self.first}+{self.count} contains the uid of account "
                    f"{entry.pw_name!r} ({entry.pw_uid}); choose a range no account uses"
                )

    def lease_for_execution(self) -> IdentityLease:
        """A lease, or BackendUnavailable when every uid is in use: more executions at once
        than the range holds is the deployment's limit, not the program's."""
        try:
            return self.lease()
        except IdentityExhausted as exc:
            raise BackendUnavailable(str(exc)) from exc

    def lease(self) -> IdentityLease:
        directory = _lock_directory()
        for uid in range(self.first, self.first + self.count):
            path = os.path.join(directory, str(uid))
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    continue
                raise
            if os.fstat(fd).st_size:
                # The last holder died without handing the uid back (a crashed host): whatever
                # it left running under this uid goes before the uid is used again.
                kill_processes_of(uid)
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return IdentityLease(uid, uid, fd)
        raise IdentityExhausted(
            f"all {self.count} identities from {self.first} are in use by running executions"
        )


def kill_processes_of(uid: int, *, seconds: float = 5.0) -> None:
    """SIGKILL every live process any of whose uids is ``uid``, and wait until they are dead.

    Blocking: call it from a worker thread. Each victim is held by a pidfd, so its death is
    waited on, never polled for, and a recycled pid is never signalled.
    """
    deadline = time.monotonic() + seconds
    while True:
        victims = _processes_of(uid)
        if not victims:
            return
        if time.monotonic() > deadline:
            raise OSError(f"processes of uid {uid} survived SIGKILL for {seconds:g} s: {victims}")
        handles = []
        for pid in victims:
            try:
                handle = os.pidfd_open(pid)
            except OSError:
                continue  # already gone
            try:
                signal.pidfd_send_signal(handle, signal.SIGKILL)
            except ProcessLookupError:
                pass
            handles.append(handle)
        try:
            poller = select.poll()
            for handle in handles:
                poller.register(handle, select.POLLIN)
            pending = len(handles)
            while pending and time.monotonic() < deadline:
                ready = poller.poll(max(1, int((deadline - time.monotonic()) * 1000)))
                for handle, _ in ready:
                    poller.unregister(handle)
                    pending -= 1
        finally:
            for handle in handles:
                os.close(handle)


def _processes_of(uid: int) -> list[int]:
    victims = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            # The status file, not the directory's owner: a process that made itself
            # undumpable hands its /proc directory to root, but not its uids.
            with open(f"/proc/{entry}/status") as fh:
                status = fh.read()
        except OSError:
            continue
        if _runs_as(status, uid):
            victims.append(int(entry))
    return victims


def _runs_as(status: str, uid: int) -> bool:
    """Whether a /proc status text is a live process with ``uid`` among its uids. A zombie
    is already dead (it only waits for its parent to reap it) and cannot be killed again."""
    state = uids = ""
    for line in status.splitlines():
        if line.startswith("State:"):
            state = line.split()[1] if len(line.split()) > 1 else ""
        elif line.startswith("Uid:"):
            uids = line
            break
    return state not in ("Z", "X") and str(uid) in uids.split()[1:]


def _lock_directory() -> str:
    candidates = [*_LOCK_DIRECTORIES, os.path.join(tempfile.gettempdir(), "psych-sandbox-ids")]
    for directory in candidates:
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            info = os.lstat(directory)
        except OSError:
            continue
        # Only a root-owned, root-only directory is trusted: anyone able to create files in
        # it could hold a uid's lock and make two executions share that uid.
        if stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and not info.st_mode & 0o077:
            return directory
    raise ConfigurationError(
        "no root-only directory is available for identity leases (tried "
        + ", ".join(candidates)
        + ")"
    )
