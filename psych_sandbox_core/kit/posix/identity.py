"""Unprivileged identities leased one per execution, on hosts that run as root.

Two programs running at the same time under one uid can reach each other: read each other's
``/proc/<pid>/environ`` and ``/proc/<pid>/root``, write to each other's output, share one
process-count limit. So a root host gives every execution a uid (and gid) of its own, from a
range no account uses, and takes it back when the execution is over.

A lease is an exclusive ``flock`` on a per-uid file in a root-only directory: it holds across
every host process on the machine and is released by the kernel if the host dies, so a crash
never strands a uid. A lock file with content is a uid its last holder never handed back
(the host died): whatever it left is swept before the uid is used again. A uid handed back
clean has its file removed, so the files are as many as the uids leased right now.

A host's first lease also sweeps and hands back every uid whose file has content and no
holder (:func:`reap_abandoned`): what a killed host left under its uids goes when the next
host starts leasing, not only when the range comes round to them.

Uids are not reused eagerly: a cursor file per range, under its own ``flock``, walks the
range in order (skipping uids leased right now), so a uid comes back only after the whole
range has been leased, least recently used first. Whatever escaped every other measure under
one uid does not meet the next execution, which gets another.

Before a uid goes back, :func:`psych_sandbox_core.kit.posix.sweep.sweep` kills whatever still
runs under it and removes the state it could leave without a process (SysV IPC, message
queues, files in shared directories, keyrings). Only kernel proof that no process can remain
(:class:`EmptyCgroup`) skips the scan for processes; the rest of the sweep always runs. The
uids of executions ending at the same time are swept together, in one pass over the host's
tables, each as thoroughly as alone (retirement.py). A backend holds a lease through
leased.py (:func:`~.leased.leased_identity`, :class:`~.leased.LeasedIdentityBackend`).
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Annotated, final

import anyio
from pydantic import Field

from ...errors import ConfigurationError
from ..backend import BackendOptions, BackendUnavailable
from .retirement import returns, sweeps
from .sweep import sweep

if sys.platform != "win32":  # POSIX identities; the module must still import on Windows
    import fcntl
    import pwd

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

    def leasable_range(self, *, leases: bool) -> IdentityRange:
        """The range, checked against the host's accounts where uids will be leased from it
        (a range holding an account is a configuration error, at load)."""
        identities = self.identity_range()
        if leases:
            identities.check()
        return identities

    def fixed_identity(self, uid_setting: str, gid_setting: str) -> tuple[int, int] | None:
        """The one identity every execution shares, where the deployment set the pair of
        settings named (the weaker choice), else None; half a pair is a configuration
        error."""
        uid, gid = getattr(self, uid_setting), getattr(self, gid_setting)
        if (uid is None) != (gid is None):
            raise ConfigurationError(f"{uid_setting} and {gid_setting} go together")
        return None if uid is None or gid is None else (int(uid), int(gid))


def host_is_root() -> bool:
    """Whether the host runs as root: only then are identities leased (the lease directory is
    root's, and only root starts a child as another uid)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


class IdentityExhausted(Exception):
    """Every uid of the range is leased right now (more concurrent executions than uids)."""


#: Only this module makes :class:`EmptyCgroup` proofs.
_MINT = object()


@final
class EmptyCgroup:
    """Kernel proof that no process of an execution remains: the cgroup that held its whole
    tree (joined before the tree's first process ran as the leased uid, and impossible to
    leave without write access to cgroupfs) was removed, and the kernel removes only an
    empty cgroup. Made by :func:`remove_execution_cgroup` alone, never by hand."""

    __slots__ = ("directories",)

    def __init__(self, directories: tuple[str, ...], *, mint: object = None) -> None:
        if mint is not _MINT:
            raise TypeError("an EmptyCgroup is made by remove_execution_cgroup() only")
        self.directories = directories

    def __repr__(self) -> str:
        return f"EmptyCgroup({self.directories!r})"


def remove_execution_cgroup(directories: Iterable[str | os.PathLike[str]]) -> EmptyCgroup | None:
    """rmdir every directory of an execution's cgroup (one per hierarchy); the proof that it
    was empty when each one was removed by this call, else None (one is busy or was gone)."""
    removed: list[str] = []
    failed = False
    for directory in directories:
        try:
            os.rmdir(directory)
        except OSError:
            failed = True  # still populated (EBUSY), or not ours to claim (already gone)
            continue
        removed.append(os.fspath(directory))
    if failed or not removed:
        return None
    return EmptyCgroup(tuple(removed), mint=_MINT)


@dataclass
class IdentityLease:
    uid: int
    gid: int
    _fd: int = field(repr=False)
    _path: str = field(repr=False, default="")

    async def retire(self, empty: EmptyCgroup | None = None) -> None:
        """Sweep the uid, then give it back; shielded from cancellation, since an execution's
        teardown must finish. A uid whose processes will not die, or whose state cannot be
        removed, stays leased (and marked unclean for the next holder) rather than be shared.

        ``empty``, kernel proof that no process of the execution remains, spares the scan
        for processes; everything else is swept regardless. Off the event loop (the
        release's file operations too).
        """
        with anyio.CancelScope(shield=True):
            try:
                await sweeps.retire(self, processes=empty is None)
            except OSError:
                return

    def release(self) -> None:
        """Give the uid back. Call only once nothing of the execution is left under it."""
        if self._fd >= 0:
            # Emptied first: should the removal fail, an empty file still reads as clean.
            os.ftruncate(self._fd, 0)
            # Removed while still locked: a leaser that opened it before cannot mistake the
            # old file for the uid's (it checks the path still names what it locked).
            if self._path:
                try:
                    os.unlink(self._path)
                except FileNotFoundError:
                    pass
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

    async def lease_for_execution(self) -> IdentityLease:
        """A lease, or BackendUnavailable when every uid is in use: more executions at once
        than the range holds is the deployment's limit, not the program's. In a worker
        thread: the cursor's lock may be held by another host sweeping a crashed one's uid.

        A uid of this process's own that is being retired is not in use by a running
        execution (its result may already have been handed back): with every uid taken and
        one of them on its way back, this waits for it rather than fail."""
        while True:
            returned = returns.count(self)
            try:
                # Without a thread when nothing is to wait for (a few file operations,
                # cheaper than the hand-over): a cursor another host holds, or a uid to
                # sweep first, goes to a worker thread.
                quick = self.lease_now()
                if quick is not None:
                    return quick
                return await anyio.to_thread.run_sync(self.lease)
            except IdentityExhausted as exc:
                if not returns.retiring(self):
                    raise BackendUnavailable(str(exc)) from exc
                if returns.count(self) == returned:
                    await returns.wait(self)

    def lease(self) -> IdentityLease:
        """The next free uid after the one this range handed out last (blocking)."""
        return self._choose(wait=True)

    def lease_now(self) -> IdentityLease | None:
        """:meth:`lease`, or None instead of anything that can take long: the cursor held
        by another host, a uid whose last holder died to sweep first, this process's first
        lease (which reaps what dead hosts left)."""
        try:
            return self._choose(wait=False)
        except _WouldWait:
            return None

    def _choose(self, *, wait: bool) -> IdentityLease:
        directory = _lock_directory()
        if not wait and reap_abandoned_once.cache_info().currsize == 0:
            raise _WouldWait
        reap_abandoned_once(directory)
        cursor = os.open(
            _cursor_path(directory, self),
            os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
        )
        try:
            # Held while choosing: two hosts leasing from the range at once walk it in turn.
            try:
                fcntl.flock(cursor, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _WouldWait from None
            start = _read_cursor(cursor, self.count)
            for step in range(self.count):
                offset = (start + step) % self.count
                lease = _try_lease(directory, self.first + offset, sweep_first=wait)
                if lease is not None:
                    _write_cursor(cursor, (offset + 1) % self.count)
                    return lease
        finally:
            os.close(cursor)  # closing drops the flock
        raise IdentityExhausted(
            f"all {self.count} identities from {self.first} are in use by running executions"
        )

    def forget(self) -> None:
        """Remove the range's cursor (a range no longer configured); the next lease from it
        starts at its first uid."""
        try:
            os.unlink(_cursor_path(_lock_directory(), self))
        except FileNotFoundError:
            pass


@lru_cache(maxsize=4)
def reap_abandoned_once(directory: str) -> tuple[int, ...]:
    """:func:`reap_abandoned` the first time this process leases from ``directory``."""
    return tuple(reap_abandoned(directory))


def reap_abandoned(directory: str) -> list[int]:
    """Sweep and hand back every uid in ``directory`` whose last holder died holding it (its
    file has content and nobody holds its lock), and return them. Without this a uid a host
    killed outright held keeps whatever that execution left without a process (files in the
    shared directories, IPC objects, keys) until its range comes round to it again."""
    reaped = []
    try:
        entries = [entry for entry in os.scandir(directory) if entry.name.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            if not entry.stat(follow_symlinks=False).st_size:
                continue  # handed back clean, or being leased right now
        except OSError:
            continue
        lease = _try_lease(directory, int(entry.name))
        if lease is not None:
            lease.release()
            reaped.append(lease.uid)
    return reaped


def _cursor_path(directory: str, identities: IdentityRange) -> str:
    return os.path.join(directory, f"cursor-{identities.first}-{identities.count}")


#: How often a leaser retries a uid whose lock file was removed under it by its last holder.
_REOPEN_ATTEMPTS = 3


class _WouldWait(Exception):
    """Leasing now would wait (IdentityRange.lease_now gives way to a worker thread)."""


def _try_lease(directory: str, uid: int, *, sweep_first: bool = True) -> IdentityLease | None:
    """The uid's lease if nobody holds it (swept first if its last holder died; without
    ``sweep_first``, _WouldWait instead), else None."""
    path = os.path.join(directory, str(uid))
    for _ in range(_REOPEN_ATTEMPTS):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            raise
        if _still_named(fd, path):
            break
        # The holder removed the file between our open and our lock (a clean hand-back):
        # that inode is nobody's lock any more; open the path again.
        os.close(fd)
    else:
        return None
    if os.fstat(fd).st_size:
        # The last holder died without handing the uid back (a crashed host): whatever it
        # left under this uid goes before the uid is used again.
        if not sweep_first:
            os.close(fd)
            raise _WouldWait
        try:
            sweep(uid, uid)
        except OSError:
            os.close(fd)  # left marked: the next leaser tries again
            return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return IdentityLease(uid, uid, fd, path)


def _still_named(fd: int, path: str) -> bool:
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _read_cursor(fd: int, count: int) -> int:
    try:
        return int(os.pread(fd, 32, 0) or b"0") % count
    except ValueError:
        return 0  # unreadable: start over from the range's first uid


def _write_cursor(fd: int, offset: int) -> None:
    data = f"{offset}\n".encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))


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
