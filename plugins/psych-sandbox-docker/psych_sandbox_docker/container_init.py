"""A container's init as the host holds it: a pidfd through which the host kills the whole
container at its deadline itself, without the engine (whose kill request takes one to three
seconds on a loaded host), and the seal that ends its output streams once nothing of the
container is left to write.

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

The seal. The container's output reaches the host through two pipes the engine's shim (the
init's parent) reads and the engine relays; the engine closes the attached stream only after
it has processed the container's exit, tens to hundreds of milliseconds later. When the init
is taken, the host notes those pipes: the ones the init holds for writing and its parent for
reading only (under runc the init's stdout and stderr; under gVisor the Sentry's copies of
them); exactly two, or none is used. At the kill, it opens their write ends through the init
(checked to be the very pipes noted), and once the init is seen ended, with no process of the
container left to write, writes a random token, made only then, to each and closes them:
whatever the container wrote comes before it, and nothing after it, so each stream ends at
the token that arrives in it.
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
#: The container's output streams: stdout and stderr.
OUTPUTS = 2


class _NotTheInit(Exception):
    pass


class ContainerInit:
    """A pidfd on one container's init, verified, and its output pipes' identity."""

    def __init__(self, pid: int, pidfd: int, pipes: list[tuple[int, int, int]] | None) -> None:
        self.pid = pid
        self._pidfd = pidfd
        #: (descriptor, device, inode) of the container's output pipes in the init, noted
        #: when it was taken.
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
        else None. ``namespace_init``: it must be pid 1 of its own pid namespace (runc)."""
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return None
        try:
            if not _in_cgroup_of(pid, container_id):
                raise _NotTheInit
            if namespace_init and not _is_namespace_init(pid):
                raise _NotTheInit
            pipes = _output_pipes(pid)
            # Still alive, so everything read above through its pid was read of it.
            signal.pidfd_send_signal(pidfd, 0)
        except (OSError, ValueError, _NotTheInit):
            os.close(pidfd)
            return None
        return cls(pid, pidfd, pipes)

    @property
    def can_seal(self) -> bool:
        """Whether the container's two output pipes were found, so its streams can be sealed."""
        return self._pipes is not None

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

    def seal(self) -> list[bytes]:
        """Once the init has ended: a fresh token written to each output pipe opened at the
        kill, which is then closed; the tokens written (a stream that gets none ends when
        the engine closes it)."""
        with self._lock:
            writers, self._writers = self._writers, []
        tokens = []
        for fd in writers:
            token = SEAL_PREFIX + secrets.token_hex(16).encode("ascii")
            try:
                if os.write(fd, token) == len(token):
                    tokens.append(token)
            except OSError:
                pass  # the pipe is full (the shim is behind): no seal on it
            os.close(fd)
        return tokens

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


def _pipes(pid: int | str, access: int) -> dict[tuple[int, int], int]:
    """The pipes ``pid`` holds open with ``access`` (os.O_RDONLY or os.O_WRONLY): (device,
    inode) to the lowest descriptor."""
    found: dict[tuple[int, int], int] = {}
    for entry in os.listdir(f"/proc/{pid}/fd"):
        try:
            info = os.stat(f"/proc/{pid}/fd/{entry}")
            with open(f"/proc/{pid}/fdinfo/{entry}") as fdinfo:
                line = next(line for line in fdinfo if line.startswith("flags:"))
            flags = int(line.split()[1], 8)
        except (OSError, StopIteration, ValueError, IndexError):
            continue  # closed meanwhile
        if stat.S_ISFIFO(info.st_mode) and flags & os.O_ACCMODE == access:
            found.setdefault((info.st_dev, info.st_ino), int(entry))
    return found


def _output_pipes(pid: int) -> list[tuple[int, int, int]] | None:
    """The container's two output pipes as the init holds them (descriptor, device, inode):
    held by it for writing and by its parent, the engine's shim, for reading only. None
    unless there are exactly two."""
    with open(f"/proc/{pid}/status") as lines:
        parent = next((line.split()[1] for line in lines if line.startswith("PPid:")), "0")
    if parent == "0":
        return None
    written = _pipes(pid, os.O_WRONLY)
    read = _pipes(parent, os.O_RDONLY)
    both_ways = _pipes(parent, os.O_WRONLY)
    found = sorted(
        (fd, *pipe) for pipe, fd in written.items() if pipe in read and pipe not in both_ways
    )
    return found if len(found) == OUTPUTS else None


def _open_writers(pid: int, pipes: list[tuple[int, int, int]]) -> list[int]:
    """Write ends of the container's output pipes through the init, if they are still the
    pipes noted at its taking (a program that rewired the init's descriptors gets no seal);
    else none."""
    opened: list[int] = []
    try:
        for fd, *expected in pipes:
            opened.append(
                os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            )
            info = os.fstat(opened[-1])
            if [info.st_dev, info.st_ino] != expected:
                raise _NotTheInit
    except (OSError, _NotTheInit):
        for fd in opened:
            os.close(fd)
        return []
    return opened
