"""Everything a leased uid left on the host, removed before the uid is leased again.

While a uid is leased it is one execution's alone, so whatever on the host belongs to that
uid belongs to that execution, and whatever of it outlives the execution would meet the next
holder of the uid (and anyone reading it meanwhile). Processes are the obvious part; the rest
is state that lives on without a process, kept by the kernel until someone removes it:

* SysV shared memory segments, message queues and semaphore sets in the host's IPC namespace,
  and POSIX message queues;
* files and directories in the host's world-writable directories (``/tmp``, ``/var/tmp``,
  ``/dev/shm``, ``/run/lock`` and the temp directory);
* the uid's user, user-session and persistent keyrings, which the kernel keeps per uid
  whether or not a process of it runs.

:func:`sweep` removes all of it, processes first (a live process would only make more).
A backend whose program had its own IPC namespace, ``/tmp`` and user namespace leaves none
of this on the host, and the sweep finds nothing, cheaply. Blocking: run it in a worker thread.

What a sweep costs is its passes over the host's tables (every process's status, every entry
of the shared directories), not the uid it looks for: :func:`sweep_together` sweeps the uids
of several executions ending at once in one pass of each, every uid exactly as :func:`sweep`
would (retirement.py hands it the uids retiring together). One uid's failure is that uid's
alone: the others are swept all the same. What lives in the host's IPC namespace is found and
removed by ipc_sweep.py.
"""

from __future__ import annotations

import ctypes
import os
import platform
import select
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import lru_cache

from .ipc_sweep import failed, remove_message_queues, remove_sysv_ipc
from .libc import c_library
from .removal import DIRECTORY_FLAGS, remove_entry

#: How long processes under the uid may take to die after SIGKILL before the sweep gives up
#: (the uid then stays leased rather than be shared).
KILL_SECONDS = 5.0
#: World-writable directories any local program can reach; the host's temp directory is added.
SHARED_DIRECTORIES = ("/tmp", "/var/tmp", "/dev/shm", "/run/shm", "/run/lock", "/var/lock")
#: How deep to look through world-writable directories someone else owns (such as
#: /tmp/.X11-unix): the uid can create entries there too. A directory the uid owns is
#: removed whole, however deep.
SHARED_DEPTH = 4


@dataclass(frozen=True)
class Swept:
    """One uid to sweep: its group, and whether its processes are looked for (False only
    where the caller holds kernel proof that none remain)."""

    uid: int
    gid: int
    processes: bool = True


def sweep(uid: int, gid: int, *, processes: bool = True) -> None:
    """Kill the uid's processes (unless the caller holds kernel proof there are none), then
    remove its SysV IPC objects, POSIX message queues, files in shared directories and keyring
    contents. OSError if something could not be removed: the uid must then not be reused."""
    failure = sweep_together([Swept(uid, gid, processes)]).get(uid)
    if failure is not None:
        raise failure


def sweep_together(identities: Collection[Swept]) -> dict[int, OSError]:
    """Sweep every uid of ``identities`` as :func:`sweep` does, in one pass over each of the
    host's tables; the uids that could not be swept, with why (each must then not be reused).
    Processes of every uid die before anything else of any of them is removed."""
    failures: dict[int, OSError] = {}
    uids = {one.uid for one in identities}
    groups = {one.gid: one.uid for one in identities}
    looked_for = {one.uid for one in identities if one.processes}
    stages: list[tuple[set[int], Callable[[], object]]] = [
        (looked_for, lambda: kill_processes_of(looked_for, failures)),
        (uids, lambda: remove_sysv_ipc(uids, groups, failures)),
        (uids, lambda: remove_message_queues(uids, failures)),
        (uids, lambda: remove_shared_files(uids, failures)),
        (uids, lambda: clear_keyrings_of(uids, failures)),
    ]
    for concerned, stage in stages:
        try:
            stage()
        except OSError as exc:
            # Not said whose it was: every uid the stage looked for stays unswept.
            for uid in concerned:
                failed(failures, uid, exc)
    return failures


# ---------------------------------------------------------------- processes


def kill_processes_of(
    uids: Collection[int], failures: dict[int, OSError], *, seconds: float = KILL_SECONDS
) -> None:
    """SIGKILL every live process any of whose uids is one of ``uids``, and wait until they
    are dead; a uid whose processes outlive ``seconds`` goes into ``failures``.

    Each victim is held by a pidfd, so its death is waited on, never polled for, and a
    recycled pid is never signalled.
    """
    deadline = time.monotonic() + seconds
    remaining = set(uids)
    while remaining:
        owners = processes_of(remaining)
        if not owners:
            return
        if time.monotonic() > deadline:
            for uid in set(owners.values()):
                survivors = sorted(pid for pid, owner in owners.items() if owner == uid)
                failed(
                    failures,
                    uid,
                    OSError(
                        f"processes of uid {uid} survived SIGKILL for {seconds:g} s: {survivors}"
                    ),
                )
            return
        handles = []
        for pid in owners:
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


def processes_of(uids: Collection[int]) -> dict[int, int]:
    """Live processes with one of ``uids`` among their uids, each to that uid: one pass over
    /proc."""
    victims = {}
    wanted = {str(uid).encode() for uid in uids}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        # The status file, not the directory's owner: a process that made itself undumpable
        # hands its /proc directory to root, but not its uids. Read raw: this runs once per
        # process on the host, at every execution's end.
        try:
            fd = os.open(f"/proc/{entry}/status", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            status = os.read(fd, 4096)
        except OSError:
            continue
        finally:
            os.close(fd)
        owner = _runs_as(status, wanted)
        if owner is not None:
            victims[int(entry)] = owner
    return victims


def _runs_as(status: bytes, uids: Collection[bytes]) -> int | None:
    """Which of ``uids`` (as text) a /proc status text of a live process has among its uids,
    if any. A zombie is already dead (it only waits for its parent to reap it) and cannot be
    killed again. Only the two lines are looked at (this runs for every process on the host
    at every sweep); the one line a process controls, its name, comes escaped by the
    kernel, so it cannot pass for either."""
    uid_line = _line(status, b"\nUid:")
    if uid_line is None:
        return None
    state = (_line(status, b"\nState:") or b"").split()
    if state and state[0] in (b"Z", b"X"):
        return None
    for uid in uid_line.split():
        if uid in uids:
            return int(uid)
    return None


def _line(text: bytes, key: bytes) -> bytes | None:
    """What follows ``key`` (a newline and a field name) up to the end of its line."""
    start = text.find(key)
    if start < 0:
        return None
    start += len(key)
    end = text.find(b"\n", start)
    return text[start:] if end < 0 else text[start:end]


# ---------------------------------------------------------------- shared directories


def shared_directories() -> list[str]:
    """The world-writable directories of this host the sweep looks through (real paths)."""
    found: dict[str, None] = {}
    for real in _resolved(tempfile.gettempdir()):
        try:
            info = os.stat(real)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_IWOTH:
            found[real] = None
    return list(found)


@lru_cache(maxsize=4)
def _resolved(temp_directory: str) -> tuple[str, ...]:
    """The real paths of SHARED_DIRECTORIES and ``temp_directory``, resolved once (the links
    between system directories do not change under a running host; whether each is there
    and world-writable is looked at every time)."""
    return tuple(os.path.realpath(path) for path in (*SHARED_DIRECTORIES, temp_directory))


def remove_shared_files(uids: Collection[int], failures: dict[int, OSError]) -> int:
    """Remove what ``uids`` own in the world-writable directories (directories whole); how
    many entries. Never follows a link: every step is relative to a directory descriptor,
    so a symlink the program planted is removed as a name and its target is left alone."""
    if not uids:
        return 0
    removed = 0
    for directory in shared_directories():
        try:
            fd = os.open(directory, DIRECTORY_FLAGS)
        except OSError:
            continue
        try:
            removed += _remove_owned(fd, uids, failures, depth=0)
        finally:
            os.close(fd)
    return removed


def _remove_owned(
    dir_fd: int, uids: Collection[int], failures: dict[int, OSError], *, depth: int
) -> int:
    removed = 0
    for name in os.listdir(dir_fd):
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if info.st_uid in uids:
            try:
                remove_entry(dir_fd, name)
            except OSError as exc:
                failed(failures, info.st_uid, exc)
                continue
            removed += 1
        elif stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_IWOTH and depth < SHARED_DEPTH:
            # Someone else's world-writable directory: the uid could have written in it.
            try:
                child = os.open(name, DIRECTORY_FLAGS, dir_fd=dir_fd)
            except OSError:
                continue  # swapped for something else, or gone
            try:
                removed += _remove_owned(child, uids, failures, depth=depth + 1)
            finally:
                os.close(child)
    return removed


# ---------------------------------------------------------------- keyrings

KEY_SPEC_THREAD_KEYRING = -1
KEY_SPEC_USER_KEYRING = -4
KEY_SPEC_USER_SESSION_KEYRING = -5
KEYCTL_GET_KEYRING_ID = 0
KEYCTL_CLEAR = 7
KEYCTL_INVALIDATE = 21
KEYCTL_GET_PERSISTENT = 22
PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4
#: System call numbers (keyctl, setresuid) where the keyring sweep is supported.
_SYSCALLS = {"x86_64": (250, 117), "aarch64": (219, 147)}


def clear_keyrings_of(uids: Collection[int], failures: dict[int, OSError]) -> None:
    """:func:`clear_keyrings` for each of ``uids`` that has keys (one read of the key table
    for them all)."""
    for uid in keyed(uids):
        try:
            clear_keyrings(uid)
        except OSError as exc:
            failed(failures, uid, exc)


def clear_keyrings(uid: int) -> bool:
    """Empty and invalidate the uid's user, user-session and persistent keyrings, which the
    kernel keeps for a uid after its processes are gone. True if it ran (the uid had keys).

    Only the uid itself can reach them, so a short-lived thread of this process takes the
    uid, on that thread alone (the raw system call, not libc's, which would change every
    thread), does the work and ends. Changing a thread's uid marks the whole process not
    dumpable; the flag is restored afterwards.
    """
    if not has_keys(uid):
        return False
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        return False
    keyctl, setresuid = numbers
    libc = c_library()
    failure: list[BaseException] = []

    def as_uid() -> None:
        try:
            if libc.syscall(setresuid, uid, uid, uid) != 0:
                raise OSError(ctypes.get_errno(), f"could not take uid {uid} to clear keyrings")
            rings = [
                libc.syscall(keyctl, KEYCTL_GET_KEYRING_ID, ctypes.c_long(spec), 0)
                for spec in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING)
            ]
            if os.path.exists("/proc/sys/kernel/keys/persistent_keyring_expiry"):
                # Made if missing (and then invalidated with the rest), linked only into this
                # thread's own keyring, which ends with the thread.
                rings.append(
                    libc.syscall(
                        keyctl,
                        KEYCTL_GET_PERSISTENT,
                        ctypes.c_long(-1),
                        ctypes.c_long(KEY_SPEC_THREAD_KEYRING),
                    )
                )
            for ring in rings:
                if ring > 0:
                    libc.syscall(keyctl, KEYCTL_CLEAR, ctypes.c_long(ring))
                    libc.syscall(keyctl, KEYCTL_INVALIDATE, ctypes.c_long(ring))
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    dumpable = libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)
    thread = threading.Thread(target=as_uid, name="psych-sandbox-keyring-sweep")
    thread.start()
    thread.join()
    if dumpable > 0:
        libc.prctl(PR_SET_DUMPABLE, dumpable, 0, 0, 0)
    if failure:
        raise failure[0]
    return True


def has_keys(uid: int) -> bool:
    """Whether the kernel charges any key to ``uid`` (/proc/key-users lists such uids)."""
    return bool(keyed([uid]))


def keyed(uids: Collection[int]) -> list[int]:
    """Those of ``uids`` the kernel charges any key to: one read of /proc/key-users."""
    if not uids:
        return []
    try:
        with open("/proc/key-users", "rb") as fh:
            listed = {line.lstrip().split(b":", 1)[0] for line in fh}
    except OSError:
        return []
    return [uid for uid in uids if str(uid).encode() in listed]
