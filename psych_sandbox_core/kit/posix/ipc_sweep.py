"""What a leased uid left in the host's IPC namespace, removed by the sweep (sweep.py): SysV
shared memory segments, message queues and semaphore sets, and POSIX message queues (listed
through an mqueue filesystem mounted by one thread in a mount namespace of its own).
"""

from __future__ import annotations

import ctypes
import errno
import os
import queue
import threading
from collections.abc import Collection
from dataclasses import dataclass, field

from .libc import c_library
from .removal import DIRECTORY_FLAGS


def failed(failures: dict[int, OSError], uid: int, exc: OSError) -> None:
    """Record why ``uid`` could not be swept (its first reason is kept)."""
    failures.setdefault(uid, exc)


# ---------------------------------------------------------------- SysV IPC

IPC_RMID = 0


def remove_sysv_ipc(
    uids: Collection[int], groups: dict[int, int], failures: dict[int, OSError]
) -> int:
    """Remove every SysV object of the host's IPC namespace that one of ``uids`` owns or
    created (the creator cannot be changed, the owner can be given away), or one of the
    ``groups`` (gid to its uid) does. Returns how many were removed. Objects in an IPC
    namespace of the program's own died with it."""
    if not uids:
        return 0
    libc = c_library()
    removed = 0
    for kind in ("shm", "msg", "sem"):
        for ident, uid in _sysv_objects(kind, uids, groups):
            if kind == "shm":
                status = libc.shmctl(ident, IPC_RMID, None)
            elif kind == "msg":
                status = libc.msgctl(ident, IPC_RMID, None)
            else:
                status = libc.semctl(ident, 0, IPC_RMID)
            if status != 0:
                code = ctypes.get_errno()
                if code in (errno.EINVAL, errno.EIDRM):
                    continue  # already gone
                failed(
                    failures,
                    uid,
                    OSError(code, f"could not remove SysV {kind} {ident} of uid {uid}"),
                )
                continue
            removed += 1
    return removed


def _sysv_objects(
    kind: str, uids: Collection[int], groups: dict[int, int]
) -> list[tuple[int, int]]:
    """The objects of ``kind`` one of ``uids`` or ``groups`` owns or created, each with the
    uid it is swept for."""
    try:
        with open(f"/proc/sysvipc/{kind}") as fh:
            header, *rows = fh.read().splitlines()
    except (OSError, ValueError):
        return []
    columns = {name: index for index, name in enumerate(header.split())}
    found = []
    for row in rows:
        fields = row.split()
        try:
            owners = (int(fields[columns["uid"]]), int(fields[columns["cuid"]]))
            owning_groups = (int(fields[columns["gid"]]), int(fields[columns["cgid"]]))
            ident = int(fields[1])  # shmid, msqid or semid
        except (KeyError, IndexError, ValueError):
            continue
        swept_for = [uid for uid in owners if uid in uids]
        swept_for += [groups[gid] for gid in owning_groups if gid in groups]
        if swept_for:
            found.append((ident, swept_for[0]))
    return found


# ---------------------------------------------------------------- POSIX message queues

CLONE_FS = 0x200
CLONE_NEWNS = 0x20000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
#: Where the queue filesystem is mounted, inside a mount namespace private to one thread.
_QUEUE_MOUNT_POINT = b"/dev"
#: How long the thread that sweeps queues waits for another sweep before it exits.
QUEUE_SWEEPER_LINGER_SECONDS = 5.0


def remove_message_queues(uids: Collection[int], failures: dict[int, OSError]) -> int:
    """Unlink the POSIX message queues of ``uids`` in the host's IPC namespace; how many.

    Queues are only listed through an mqueue filesystem, which hosts often do not mount. One
    thread mounts one in a mount namespace of its own (made private first, so nothing
    propagates to the host's) and sweeps for every caller; the mount ends with the thread,
    which exits once no sweep came for QUEUE_SWEEPER_LINGER_SECONDS. 0 where mounting is not
    allowed (no CAP_SYS_ADMIN): such a host is documented as not sweeping queues.
    """
    if not uids:
        return 0
    return _queue_sweeper.sweep(uids, failures)


@dataclass
class _QueueSweep:
    uids: Collection[int]
    failures: dict[int, OSError]
    outcome: int | BaseException = 0
    done: threading.Event = field(default_factory=threading.Event)


class _QueueSweeper:
    """The thread behind :func:`remove_message_queues`, started by the first sweep after it
    exited. Mounting for every sweep instead (a thread, a copy of the host's mount table and
    its teardown) cost more than everything else a sweep does together. The thread, not a
    descriptor of its mount handed out, does the listing: nothing of it stays in the host's
    descriptor table between sweeps."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sweeps: queue.SimpleQueue[_QueueSweep] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def sweep(self, uids: Collection[int], failures: dict[int, OSError]) -> int:
        request = _QueueSweep(uids, failures)
        with self._lock:
            if self._thread is None:
                thread = threading.Thread(
                    target=self._run, name="psych-sandbox-mqueue-sweep", daemon=True
                )
                try:
                    thread.start()
                except RuntimeError as exc:  # no thread to be had: the uid is not swept
                    raise OSError(f"no thread to sweep message queues with: {exc}") from None
                self._thread = thread
            self._sweeps.put(request)
        request.done.wait()
        if isinstance(request.outcome, BaseException):
            raise request.outcome
        return request.outcome

    def _run(self) -> None:
        mounted: bool | BaseException
        try:
            libc = c_library()
            mounted = (
                libc.unshare(CLONE_NEWNS | CLONE_FS) == 0
                and libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) == 0
                and libc.mount(b"mqueue", _QUEUE_MOUNT_POINT, b"mqueue", 0, None) == 0
            )
        except BaseException as exc:  # handed to each caller
            mounted = exc
        while True:
            try:
                request = self._sweeps.get(timeout=QUEUE_SWEEPER_LINGER_SECONDS)
            except queue.Empty:
                with self._lock:
                    # A sweep put after the wait timed out is still served: the lock orders
                    # its arrival before this check or after the thread is gone.
                    if self._sweeps.empty():
                        self._thread = None
                        return
                continue
            try:
                if mounted is True:
                    fd = os.open(_QUEUE_MOUNT_POINT, DIRECTORY_FLAGS)
                    try:
                        request.outcome = _remove_owned_queues(fd, request.uids, request.failures)
                    finally:
                        os.close(fd)
                else:
                    request.outcome = 0 if mounted is False else mounted
            except BaseException as exc:  # handed to the caller's thread
                request.outcome = exc
            finally:
                request.done.set()


_queue_sweeper = _QueueSweeper()


def _forget_queue_sweeper() -> None:
    # A forked child has no such thread, and the lock may have been held at the fork.
    global _queue_sweeper
    _queue_sweeper = _QueueSweeper()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_queue_sweeper)


def _remove_owned_queues(fd: int, uids: Collection[int], failures: dict[int, OSError]) -> int:
    removed = 0
    for name in os.listdir(fd):
        try:
            owner = os.stat(name, dir_fd=fd, follow_symlinks=False).st_uid
        except FileNotFoundError:
            continue
        if owner not in uids:
            continue
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            continue
        except OSError as exc:
            failed(failures, owner, exc)
            continue
        removed += 1
    return removed
