"""Host-side evidence for one execution: a canary file outside any workspace and loopback
listeners on both address families, counting every connection they see. What the child's
probe reaches here is judged by the host, never taken from the child's own report."""

from __future__ import annotations

import os
import select
import shutil
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import anyio

from .backend import ProbeTargets
from .phases import mark
from .posix.temp_dirs import CANARY_PREFIX, make_owned_directory


class ProbeHarness:
    """Host-side evidence for one execution: a canary outside any workspace and loopback
    listeners on both address families that count every connection they see.

    Nothing waits on the listeners: the kernel completes a loopback connection whether or
    not anyone accepts it, and keeps it in the listener's queue, so the count is taken from
    the queues whenever it is read (exact as of that moment, a reset connection included).
    No task, cancel scope or wake-up of the host's per listener, and a program that
    connects in a loop costs the host nothing until the count is read."""

    def __init__(self) -> None:
        self._counted = 0
        #: The uid the child runs as on this host, once told (attribute_to); None: every
        #: connection counts.
        self._owner: int | None = None
        #: Connections from sockets of another uid: not this execution's, not counted.
        self.foreign = 0
        self._listeners: list[socket.socket] = []
        self._directory: str | None = None
        self._targets: ProbeTargets | None = None
        self._open = False

    @property
    def connections(self) -> int:
        """Every connection the listeners have been reached by so far."""
        if not self._listeners:
            return self._counted
        # One look at them all first: usually none was reached, and a failed accept on each
        # costs a system call and an exception. (poll: a busy host's descriptors can be
        # numbered past what select takes.)
        looking = select.poll()
        for listener in self._listeners:
            looking.register(listener, select.POLLIN)
        reached = {fd for fd, _ in looking.poll(0)}
        for listener in self._listeners:
            if listener.fileno() not in reached:
                continue
            while True:
                try:
                    connection, _ = listener.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except ConnectionAbortedError:
                    self._counted += 1  # reached, then aborted before it was taken
                    continue
                except OSError:
                    break  # out of descriptors: the rest stay queued for the next reading
                try:
                    if self._owner is not None and _socket_uid(connection) not in (
                        None,
                        self._owner,
                    ):
                        self.foreign += 1
                        continue
                    self._counted += 1
                finally:
                    connection.close()
        return self._counted

    def attribute_to(self, uid: int) -> None:
        """Count only connections from sockets of ``uid``, the uid the child runs as on this
        host (one no other execution has): a socket's owner is its creator's, which a
        program cannot change without privilege. One whose owner cannot be read any more
        (its process closed it, or reset it) still counts: the child's own evidence is never
        dropped, so only a connection held open by another uid is told apart."""
        self._owner = uid

    def made(self) -> ProbeTargets:
        """The targets, made the first time they are asked for while the harness is active
        (a backend that hands them to its child after spawning it asks only then: see
        late_terms.py), the same ones after."""
        if self._targets is None:
            if not self._open:
                raise RuntimeError("probe targets are made only while the harness is active")
            self._targets = self._make()
        return self._targets

    def _make(self) -> ProbeTargets:
        directory = self._directory = make_owned_directory(CANARY_PREFIX)
        os.chmod(directory, 0o755)
        canary = os.path.join(directory, "canary")
        # World-readable on purpose: only a real filesystem boundary can hide it.
        fd = os.open(canary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.fchmod(fd, 0o644)  # whatever the umask
            os.write(fd, CANARY_TEXT)
        finally:
            os.close(fd)
        ports: dict[str, int | None] = {"4": None, "6": None}
        for family, host in (("4", "127.0.0.1"), ("6", "::1")):
            try:
                listener, ports[family] = _loopback_listener(family, host)
            except OSError:
                continue  # no such address family on this host: nothing to reach
            self._listeners.append(listener)
        mark("probe targets")
        return ProbeTargets(
            canary_path=canary, port4=ports["4"], port6=ports["6"], host_pid=os.getpid()
        )

    @asynccontextmanager
    async def active(self) -> AsyncIterator[ProbeHarness]:
        """The harness for one execution; what it made is removed on leaving."""
        self._open = True
        try:
            yield self
        finally:
            self._open = False
            for listener in self._listeners:
                listener.close()
            directory, self._directory = self._directory, None
            if directory is not None:
                # Shielded: on cancellation the canary is still removed, in a worker thread:
                # on a busy disk a directory's removal took milliseconds (26 ms at worst,
                # measured), and the event loop serves every other execution meanwhile.
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(
                        partial(shutil.rmtree, directory, ignore_errors=True)
                    )


#: What the canary holds: a program that can read it has reached the host's files.
CANARY_TEXT = b"psych-sandbox canary: reading this proves filesystem exposure\n"


def _loopback_listener(family: str, host: str) -> tuple[socket.socket, int]:
    """A listening socket on ``host`` (a literal loopback address), any free port, and that
    port; non-blocking, so its queue is read without waiting."""
    sock = socket.socket(socket.AF_INET if family == "4" else socket.AF_INET6, socket.SOCK_STREAM)
    try:
        if family == "6":
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, 0))
        sock.listen()
        sock.setblocking(False)
        port: int = sock.getsockname()[1]
    except BaseException:
        sock.close()
        raise
    return sock, port


def _socket_uid(connection: socket.socket) -> int | None:
    """The uid owning the peer's end of an accepted loopback connection, from the kernel's
    socket table (this network namespace's), or None when it cannot be told."""
    try:
        peer_port = connection.getpeername()[1]
        own_port = connection.getsockname()[1]
    except OSError:
        return None
    table = "/proc/net/tcp6" if connection.family == socket.AF_INET6 else "/proc/net/tcp"
    try:
        with open(table, encoding="ascii", errors="replace") as fh:
            next(fh, None)  # the header
            for line in fh:
                fields = line.split()
                if len(fields) < 10:
                    continue
                local, remote = fields[1], fields[2]
                if (
                    int(local.rsplit(":", 1)[1], 16) == peer_port
                    and int(remote.rsplit(":", 1)[1], 16) == own_port
                ):
                    # A socket its process has closed (time-wait remnants too) is listed as
                    # root's, without an inode: its owner is not known any more.
                    return None if fields[9] == "0" else int(fields[7])
    except (OSError, ValueError, IndexError):
        return None
    return None
