"""Children are started from one thread of the host's, never from the event loop's.

Starting a process holds its caller until the child has replaced itself with the new program
(vfork), and on a busy machine that waits for the child to be scheduled: 0.4 to 8 ms was
measured with other work running, during which the event loop served nothing else (every
other execution's frames, output and clocks). So the spawn runs in a thread.

Not in a worker thread of a pool: a child asks the kernel to kill it when its parent goes
(PR_SET_PDEATHSIG, see the bootstrap's _contain and the bwrap backend's pre-exec step), and
Linux means the parent *thread*, so a pooled thread that retires would kill the children it
started. This thread lives as long as any child it started is unreaped
(:func:`child_reaped`), and waits :data:`LINGER_SECONDS` for more work before it exits.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections import deque
from collections.abc import Callable

import anyio

__all__ = ["child_reaped", "start"]

#: How long the thread waits for another spawn once it has nothing to do and no child of its
#: own is left, before it exits.
LINGER_SECONDS = 2.0

_lock = threading.Condition()
_jobs: deque[_Job] = deque()
_thread: threading.Thread | None = None
#: The pids of the children this thread started that have not been reaped yet.
_unreaped: set[int] = set()


class _Job:
    __slots__ = ("error", "make", "popen", "wake")

    def __init__(self, make: Callable[[], subprocess.Popen[bytes]], wake: int) -> None:
        self.make = make
        self.wake = wake
        self.popen: subprocess.Popen[bytes] | None = None
        self.error: BaseException | None = None


async def start(make: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """Call ``make`` (which starts one child with :class:`subprocess.Popen`) in the spawning
    thread and return its Popen, or raise what it raised. Not cancellable: once asked for,
    the child may exist, and the caller must hold it. The caller reports its reaping with
    :func:`child_reaped`."""
    global _thread
    readable, writable = os.pipe()
    job = _Job(make, writable)
    try:
        with _lock:
            _jobs.append(job)
            if _thread is None:
                _thread = threading.Thread(target=_run, name="psych-sandbox-spawner", daemon=True)
                _thread.start()
            else:
                _lock.notify()
        with anyio.CancelScope(shield=True):
            await anyio.wait_readable(readable)
    finally:
        os.close(readable)
    if job.error is not None:
        raise job.error
    assert job.popen is not None
    return job.popen


def child_reaped(pid: int) -> None:
    """The child ``pid`` is reaped (or gone): the thread no longer needs to live for it.
    Idempotent, and nothing for a pid it did not start."""
    with _lock:
        _unreaped.discard(pid)  # not woken for it: the thread looks again as its wait ends


def _run() -> None:
    global _thread
    while True:
        with _lock:
            while not _jobs:
                if not _lock.wait(LINGER_SECONDS) and not _jobs and not _unreaped:
                    _thread = None
                    return
            job = _jobs.popleft()
        try:
            job.popen = job.make()
        except BaseException as exc:  # handed to the caller, whatever it is
            job.error = exc
        else:
            with _lock:
                _unreaped.add(job.popen.pid)
        finally:
            try:
                os.write(job.wake, b"\0")
            finally:
                os.close(job.wake)


def _forget_after_fork() -> None:
    # A forked child has no such thread, and the lock may have been held by it at the fork.
    global _lock, _thread
    _lock = threading.Condition()
    _jobs.clear()
    _thread = None
    _unreaped.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
