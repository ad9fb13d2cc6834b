"""A container's init as the host holds it: a pidfd through which the host kills the whole
container at its deadline itself, without the engine (whose kill request takes one to three
seconds on a loaded host), and, under runc, the seal that ends its output streams once
nothing of the container is left to write.

The pid to take comes from the engine's inspection, and is only a hint: the process is
taken only if, between opening a pidfd on it and seeing it still alive through that pidfd,
the kernel says it is in the container's own cgroup (which no process joins without root on
the host) and, under runc, that it is pid 1 of a pid namespace of its own. A pid reused in
between is never the one held, and nothing the program can send or write is consulted.

Under runc the init is the engine's tiny init, pid 1 of the container's pid namespace: the
kernel answers its SIGKILL by killing every other process of the namespace, and reports the
init's exit (the pidfd turns readable) only once all of them are reaped. Under gVisor the
engine's pid is the sandbox itself (runsc-sandbox, the Sentry, in the host's pid namespace):
every process of the program is a task of that Sentry, and its host helpers get their
parent-death SIGKILL as it exits, so its exit ends everything that could act for the program;
the engine's own exit report rests on the same exit.

The seal (runc only). The container's output reaches the host through pipes the engine's
shim reads and the engine relays; the engine closes the attached stream only after it has
processed the container's exit, tens to hundreds of milliseconds later. At the kill, the
host opens the write ends of those pipes through the init (checked to be the very pipes the
init had when it was taken), and once the init is seen ended, with no process of the
container left, writes a random token, made only then, to each and closes them: whatever the
container wrote comes before it, and nothing can come after it, so the stream ends there.
"""

from __future__ import annotations

import os
import secrets
import signal
import stat
import threading
from contextlib import suppress

import anyio

#: The seal's bytes: a NUL and a token, shorter than PIPE_BUF, so a write of it is atomic.
SEAL_PREFIX = b"\0psych-sandbox-docker-seal:"
#: The container's output streams, as the init's file descriptors.
OUTPUT_FDS = (1, 2)


class _NotTheInit(Exception):
    pass


class ContainerInit:
    """A pidfd on one container's init, verified, and (runc) its output pipes' identity."""

    def __init__(self, pid: int, pidfd: int, pipes: tuple[tuple[int, int], ...] | None) -> None:
        self.pid = pid
        self._pidfd = pidfd
        #: (device, inode) of the init's stdout and stderr pipes when it was taken.
        self._pipes = pipes
        #: Write ends of those pipes, opened at the kill, closed at the seal.
        self._writers: list[int] = []
        #: Guards the descriptors: the kill is struck from the wall clock's thread.
        self._lock = threading.Lock()
        #: Whether the host killed it (and the container with it).
        self.killed = False

    @classmethod
    def take(cls, pid: int, container_id: str, *, namespace_init: bool) -> ContainerInit | None:
        """The process ``pid`` if it is the container's init (see the module's docstring),
        else None. ``namespace_init``: it must be pid 1 of its own pid namespace (runc), and
        its stdout and stderr pipes are noted for the seal."""
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return None
        try:
            if not _in_cgroup_of(pid, container_id):
                raise _NotTheInit
            pipes = None
            if namespace_init:
                if not _is_namespace_init(pid):
                    raise _NotTheInit
                pipes = _pipes_of(pid)
            # Still alive, so everything read above through its pid was read of it.
            signal.pidfd_send_signal(pidfd, 0)
        except (OSError, ValueError, _NotTheInit):
            os.close(pidfd)
            return None
        return cls(pid, pidfd, pipes)

    def kill(self) -> None:
        """SIGKILL the init (the kernel then kills the rest of the container). Thread-safe,
        quick, never raises; does nothing once closed."""
        with self._lock:
            if self._pidfd < 0 or self.killed:
                return
            self.killed = True
            if self._pipes is not None:
                self._writers = _open_writers(self.pid, self._pipes)
                try:
                    # Alive after the opening: the pipes opened are the init's own.
                    signal.pidfd_send_signal(self._pidfd, 0)
                except OSError:
                    self._close_writers()
            with suppress(OSError):  # already gone
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    async def wait_ended(self, seconds: float) -> bool:
        """Whether the init exited within ``seconds`` (the container's whole tree with it)."""
        if self._pidfd < 0:
            return False
        with anyio.move_on_after(seconds):
            await anyio.wait_readable(self._pidfd)
            return True
        return False

    def seal(self) -> tuple[bytes | None, ...]:
        """Once the init has ended: a fresh token written to each output pipe opened at the
        kill, which is then closed; per output stream, the token, or None where none was
        written (the stream then ends when the engine closes it)."""
        with self._lock:
            writers, self._writers = self._writers, []
        tokens: list[bytes | None] = []
        for fd in writers:
            token = SEAL_PREFIX + secrets.token_hex(16).encode("ascii")
            try:
                written = os.write(fd, token)
            except OSError:
                written = 0  # the pipe is full (the shim is behind): no seal on it
            tokens.append(token if written == len(token) else None)
            os.close(fd)
        return tuple(tokens) or (None,) * len(OUTPUT_FDS)

    def _close_writers(self) -> None:
        for fd in self._writers:
            os.close(fd)
        self._writers = []

    def close(self) -> None:
        with self._lock:
            self._close_writers()
            if self._pidfd >= 0:
                os.close(self._pidfd)
                self._pidfd = -1


def _in_cgroup_of(pid: int, container_id: str) -> bool:
    """Whether the kernel lists ``pid`` in the container's cgroup (its id is the last part of
    the cgroup's path: ``.../<id>`` with the cgroupfs driver, ``docker-<id>.scope`` with
    systemd's)."""
    with open(f"/proc/{pid}/cgroup") as lines:
        for line in lines:
            path = line.rstrip("\n").split(":", 2)[-1]
            if container_id in path.rsplit("/", 1)[-1]:
                return True
    return False


def _is_namespace_init(pid: int) -> bool:
    """Whether ``pid`` is pid 1 of a pid namespace below the host's."""
    with open(f"/proc/{pid}/status") as lines:
        for line in lines:
            if line.startswith("NSpid:"):
                ids = line.split()[1:]
                return len(ids) >= 2 and ids[-1] == "1"
    return False


def _pipes_of(pid: int) -> tuple[tuple[int, int], ...] | None:
    """The (device, inode) of the init's stdout and stderr when both are pipes."""
    found = []
    for fd in OUTPUT_FDS:
        info = os.stat(f"/proc/{pid}/fd/{fd}")
        if not stat.S_ISFIFO(info.st_mode):
            return None
        found.append((info.st_dev, info.st_ino))
    return tuple(found)


def _open_writers(pid: int, pipes: tuple[tuple[int, int], ...]) -> list[int]:
    """Write ends of the init's output pipes, if they are still the pipes noted at its
    taking (a program that rewired the init's descriptors gets no seal); else none."""
    opened: list[int] = []
    try:
        for fd, expected in zip(OUTPUT_FDS, pipes, strict=True):
            opened.append(
                os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            )
            info = os.fstat(opened[-1])
            if (info.st_dev, info.st_ino) != expected:
                raise _NotTheInit
    except (OSError, _NotTheInit):
        for fd in opened:
            os.close(fd)
        return []
    return opened
