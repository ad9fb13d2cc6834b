"""Host-side probes for containment tests: what a test sees from outside the boundary, not
what the program says about itself. Standard library and anyio only (no pytest)."""

from __future__ import annotations

import ctypes
import os
import struct
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import anyio

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

    from ..workspace import remove_tree

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
