"""Host-side probes for containment tests: what a test sees from outside the boundary, not
what the program says about itself. Standard library and anyio only (no pytest)."""

from __future__ import annotations

import ctypes
import os
import select
import signal
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import anyio
from psych_sandbox_core.kit.posix import cgroupfs, cgroups

T = TypeVar("T")


def marker(prefix: str = "psych-marker") -> str:
    """A string unique to one test, to find its processes in /proc."""
    return f"{prefix}-{uuid.uuid4().hex}"


def pids_with(mark: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains ``mark``, seen from the host."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if mark.encode() in cmdline and state not in (b"Z", b"X"):
            found.append(int(entry))
    return found


async def wait_for_pids(mark: str, *, present: bool = True, deadline: float = 20.0) -> list[int]:
    """Poll /proc until processes carrying ``mark`` appear (or are all gone). There is no
    event to wait on for a process the host did not spawn itself, so this polls with a
    deadline."""
    with anyio.fail_after(deadline):
        while True:
            pids = pids_with(mark)
            if bool(pids) == present:
                return pids
            await anyio.sleep(0.02)


def uids_of(pid: int) -> list[int]:
    """Real, effective, saved and filesystem uids of ``pid``, read from the host."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("Uid:"):
                return [int(value) for value in line.split()[1:]]
    raise AssertionError(f"no Uid line for {pid}")


def status_of(pid: int) -> dict[str, str]:
    """The fields of ``/proc/<pid>/status`` (State, PPid, TracerPid, Uid, ...), as the host's
    /proc shows them (pids in the host's namespace)."""
    with open(f"/proc/{pid}/status") as fh:
        return {
            name: value.strip() for name, _, value in (line.partition(":") for line in fh) if value
        }


def pids_running_as(uid: int) -> list[int]:
    """Live (non-zombie) processes any of whose uids is ``uid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = status_of(int(entry))
        except OSError:
            continue
        if status["State"][:1] not in ("Z", "X") and str(uid) in status["Uid"].split():
            found.append(int(entry))
    return found


def environ_of(pid: int) -> dict[str, str]:
    """The environment ``pid`` was started with, read by the host from the kernel."""
    with open(f"/proc/{pid}/environ", "rb") as fh:
        raw = fh.read().split(b"\0")
    return {
        name.decode(errors="replace"): value.decode(errors="replace")
        for name, _, value in (item.partition(b"=") for item in raw if item)
    }


def open_fds() -> set[str]:
    """What each of this process's descriptors points at, by number."""
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            out.add(f"{name}->{os.readlink(f'/proc/self/fd/{name}')}")
        except OSError:
            continue  # the descriptor listdir itself used
    return out


# ---------------------------------------------------------------- opens seen from the host

_IN_ACCESS = 0x1
_IN_OPEN = 0x20
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000


@contextmanager
def opens_of(*paths: str) -> Iterator[list[str]]:
    """Record, from the host, every open or read of ``paths`` (inotify watches the inode,
    whatever mount or namespace the opener reached it through). The list fills when the
    block ends; a test should open one path itself as a control that the watch works."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    seen: list[str] = []
    try:
        watches = {}
        for path in paths:
            wd = libc.inotify_add_watch(fd, os.fsencode(path), _IN_OPEN | _IN_ACCESS)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
            watches[wd] = path
        yield seen
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                break
            offset = 0
            while offset < len(data):
                wd, _mask, _cookie, length = struct.unpack_from("iIII", data, offset)
                offset += 16 + length
                if wd in watches:
                    seen.append(watches[wd])
    finally:
        os.close(fd)


async def wait_until(predicate: Callable[[], T], deadline: float = 30.0) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that: for conditions
    with no event to wait on (a process or container the host did not start itself)."""
    with anyio.fail_after(deadline):
        while True:
            value = predicate()
            if value:
                return value
            await anyio.sleep(0.02)


@contextmanager
def private_tempdir(prefix: str = "psych-test-tmp-") -> Iterator[str]:
    """Make the host's temporary directory a fresh one for the duration, so what an execution
    leaves behind shows there and nowhere else; removed (without following links) after."""
    import tempfile

    from psych_sandbox_core.kit.posix.removal import remove_tree

    root = tempfile.mkdtemp(prefix=prefix)
    # The program may run as another uid; it must reach its workspace below here.
    os.chmod(root, 0o755)
    previous = tempfile.tempdir
    tempfile.tempdir = root
    try:
        yield root
    finally:
        tempfile.tempdir = previous
        remove_tree(root)


# ---------------------------------------------------------------- what a test's executions left

#: How long a new cgroup directory may take to disappear before it counts as left behind:
#: only for cgroups other things on the host are making and removing at the same moment
#: (what an execution made must be gone once its teardown returned).
CGROUP_SETTLE_SECONDS = 5.0
#: How long killed survivors may take to die before they are reported as unkillable.
KILL_SECONDS = 10.0

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


@dataclass(frozen=True)
class HostProcess:
    """One process as the host's /proc shows it."""

    pid: int
    #: Start time in clock ticks since boot: with the pid, names one process even after the
    #: pid is reused.
    started: int
    ppid: int
    state: str
    #: Real, effective, saved and filesystem uids.
    uids: tuple[int, ...]

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")

    def cmdline(self) -> str:
        try:
            with open(f"/proc/{self.pid}/cmdline", "rb") as fh:
                raw = fh.read()
        except OSError:
            return "?"
        return raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")

    def describe(self) -> str:
        return f"pid {self.pid}, uid {self.uids[0] if self.uids else '?'}: {self.cmdline()!r}"


def host_processes() -> dict[int, HostProcess]:
    """Every process in the host's /proc, by pid."""
    found: dict[int, HostProcess] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{entry}/status") as fh:
                uid_line = next((line for line in fh if line.startswith("Uid:")), "Uid:")
        except (OSError, IndexError):
            continue
        try:
            found[int(entry)] = HostProcess(
                pid=int(entry),
                started=int(fields[19]),
                ppid=int(fields[1]),
                state=fields[0].decode(),
                uids=tuple(int(v) for v in uid_line.split()[1:]),
            )
        except (IndexError, ValueError):
            continue
    return found


@contextmanager
def child_subreaper() -> Iterator[None]:
    """Make this process the reaper of its orphaned descendants for the duration: a daemon
    that double-forks and calls setsid() stays below it (its parent pid says so), instead of
    becoming init's. Where the kernel has no such setting, nothing changes."""
    libc = ctypes.CDLL(None, use_errno=True)
    previous = ctypes.c_int(0)
    if libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(previous), 0, 0, 0) != 0:
        yield
        return
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        yield
    finally:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, previous.value, 0, 0, 0)


def kill_by_pidfd(victims: list[HostProcess], seconds: float = KILL_SECONDS) -> list[HostProcess]:
    """SIGKILL each victim through a pidfd, wait for its death, and reap it where it is this
    process's child; returns those still alive after ``seconds``. A pid reused since the
    victim was seen is left alone: the pidfd is checked against the start time."""
    handles: dict[int, HostProcess] = {}
    try:
        for victim in victims:
            try:
                handle = os.pidfd_open(victim.pid)
            except OSError:
                continue  # already gone
            current = host_processes().get(victim.pid)
            if current is None or current.started != victim.started:
                os.close(handle)
                continue
            try:
                signal.pidfd_send_signal(handle, signal.SIGKILL)
            except ProcessLookupError:
                pass
            handles[handle] = victim
        poller = select.poll()
        for handle in handles:
            poller.register(handle, select.POLLIN)
        pending = set(handles)
        deadline = time.monotonic() + seconds
        while pending and time.monotonic() < deadline:
            for handle, _ in poller.poll(max(1, int((deadline - time.monotonic()) * 1000))):
                poller.unregister(handle)
                pending.discard(handle)
        reap_children({handles[h].pid for h in handles if h not in pending})
        return [handles[h] for h in pending]
    finally:
        for handle in handles:
            os.close(handle)


def reap_children(pids: set[int]) -> None:
    """Reap those of ``pids`` that are this process's exited children (no one else will)."""
    for pid in pids:
        with suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def execution_cgroups_here() -> bool:
    """Whether executions get a cgroup of their own on this host (root, with a hierarchy it
    can write): what a bwrap or subprocess warm result needs to come back before teardown."""
    return os.geteuid() == 0 and isinstance(cgroups.detect(), cgroups.CgroupHost)


def cgroup_directories() -> frozenset[str]:
    """Every cgroup directory in every mounted hierarchy (v1 controllers and v2 alike)."""
    found: set[str] = set()
    for hierarchy in cgroupfs.hierarchies():
        for top, dirs, _ in os.walk(hierarchy.point, followlinks=False):
            found.update(os.path.join(top, name) for name in dirs)
    return frozenset(found)


def cgroup_pids(directory: str) -> set[int]:
    """Processes in the cgroup ``directory`` or any cgroup below it."""
    pids: set[int] = set()
    for top, _, _ in os.walk(directory, followlinks=False):
        try:
            with open(os.path.join(top, "cgroup.procs")) as fh:
                pids.update(int(line) for line in fh.read().split() if line.isdigit())
        except OSError:
            continue
    return pids


#: What a container engine makes at the top of a hierarchy for its containers the first time
#: it starts one, and keeps: the engine's, not an execution's (what is made under it is).
ENGINE_PARENTS = ("docker",)


def cgroups_left(
    before: frozenset[str],
    *,
    spared: set[int] | frozenset[int] = frozenset(),
    settle_seconds: float = CGROUP_SETTLE_SECONDS,
) -> list[str]:
    """Cgroup directories, in any hierarchy, that are not in ``before`` and are still there
    once those that others on the host make and remove at the same moment have had
    ``settle_seconds`` to go (polled: cgroupfs has no event for a directory's removal).

    Not counted: a container engine's own parent (:data:`ENGINE_PARENTS`), one that holds a
    process other than those ``spared`` (someone else's running cgroup), and one named for
    another host process (see :func:`names_another_host`), with the parents only such a one
    keeps."""
    deadline = time.monotonic() + settle_seconds
    me = os.getpid()
    engines = {
        os.path.join(hierarchy.point, name)
        for hierarchy in cgroupfs.hierarchies()
        for name in ENGINE_PARENTS
    }
    while True:
        new = cgroup_directories() - before - engines
        foreign = [path for path in new if names_another_host(path, me)]
        left = sorted(
            path
            for path in new
            if not names_another_host(path, me)
            and not any(other.startswith(path + "/") for other in foreign)
            and not (cgroup_pids(path) - spared)
        )
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def names_another_host(path: str, me: int) -> bool:
    """Whether a component of ``path`` is named for a process other than ``me``: it has
    dash-separated decimal tokens and ``me`` is not one of them. This project's backends name
    every per-execution cgroup with the pid of the host process that made it (its owner tag,
    ``<pid>.<start>``, as in ``<pid>.<start>-<id>``), so on a host shared
    with another test run, what that run leaves is not blamed on this one."""
    for component in Path(path).parts:
        # An owner tag is ``<pid>.<start time>`` (temp_dirs.owner_tag): both numbers count.
        tokens = component.replace(".", "-").split("-")
        numbers = {token for token in tokens if token.isdigit()}
        if numbers and str(me) not in numbers:
            return True
    return False


def remove_cgroups(paths: list[str]) -> None:
    """Remove those of ``paths`` that are empty cgroups (deepest first)."""
    for path in sorted(paths, key=len, reverse=True):
        cgroupfs.remove_tree(Path(path))


@contextmanager
def no_cgroup_left() -> Iterator[None]:
    """Fail if the block leaves a new cgroup directory in any hierarchy (v1 controllers and
    v2); what it left is removed where empty, so one leak fails one test only."""
    before = cgroup_directories()
    yield
    left = cgroups_left(before)
    remove_cgroups(left)
    assert left == [], f"cgroups left behind: {left}"


def descends_from(process: HostProcess, ancestor: int, table: dict[int, HostProcess]) -> bool:
    """Whether ``process`` descends from the process ``ancestor`` in ``table``."""
    seen: set[int] = set()
    current: HostProcess | None = process
    while current is not None and current.pid not in seen:
        if current.ppid == ancestor:
            return True
        seen.add(current.pid)
        current = table.get(current.ppid)
    return False
