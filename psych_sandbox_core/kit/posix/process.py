"""Spawning, waiting for and tearing down one child process tree (POSIX).

Used by every backend that runs a local process (subprocess, bwrap) and by the pattern
search. The child is started from the spawner's thread (spawner.py), off the event loop,
and gets its own session and process group, stdin closed (or, on request, a
socket the host writes to), stdout and stderr on socket pairs that the host drains, and is
waited for with a pidfd where the kernel has one (cancellable, no thread). Teardown is
SIGTERM to the group, a grace window, SIGKILL to the group, and always a reap.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

import anyio

from ..exit_status import ExitStatus
from ..phases import mark
from . import spawner
from .socket_stream import SocketByteStream


class ManagedProcess:
    """One spawned child whose whole process group the host owns."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        stdout: SocketByteStream,
        stderr: SocketByteStream,
        stdin: SocketByteStream | None = None,
    ):
        self._popen = popen
        self.pid = popen.pid
        self.stdout = stdout
        self.stderr = stderr
        #: The host's end of the child's stdin, when spawn was asked for one.
        self.stdin = stdin
        self._exited = False
        self._status: ExitStatus | None = None
        # Held while a signal is sent and while the child is reaped: a signal from another
        # thread (the wall clock's, see wall_clock.py) must never reach a reused pid.
        self._reaping = threading.Lock()
        self._asked_to_end = False

    @classmethod
    async def spawn(
        cls,
        argv: Sequence[str],
        *,
        env: dict[str, str],
        cwd: str,
        pass_fds: Sequence[int] = (),
        preexec_fn: Callable[[], None] | None = None,
        with_stdin: bool = False,
    ) -> ManagedProcess:
        out_host, out_child = socket.socketpair()
        err_host, err_child = socket.socketpair()
        in_host, in_child = socket.socketpair() if with_stdin else (None, None)

        def start() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL if in_child is None else in_child.fileno(),
                stdout=out_child.fileno(),
                stderr=err_child.fileno(),
                env=env,
                cwd=cwd,
                pass_fds=tuple(pass_fds),
                close_fds=True,
                start_new_session=True,
                preexec_fn=preexec_fn,
            )

        try:
            popen = await spawner.start(start)
        except BaseException:
            for sock in (out_host, out_child, err_host, err_child, in_host, in_child):
                if sock is not None:
                    sock.close()
            raise
        finally:
            out_child.close()
            err_child.close()
            if in_child is not None:
                in_child.close()
        mark("spawned")
        # The child never writes to these directions; shutting them makes intent explicit.
        out_host.shutdown(socket.SHUT_WR)
        err_host.shutdown(socket.SHUT_WR)
        if in_host is not None:
            in_host.shutdown(socket.SHUT_RD)
        # Waited on with anyio.wait_readable (see socket_stream): anyio's own socket stream
        # can complete a cancelled future when a read is cancelled as the socket turns
        # readable, as a drain's is at teardown.
        stdout = SocketByteStream(out_host)
        stderr = SocketByteStream(err_host)
        stdin = SocketByteStream(in_host) if in_host is not None else None
        return cls(popen, stdout, stderr, stdin)

    async def wait_exited(self) -> None:
        """Return once the direct child has exited, without reaping it (its pid stays ours)."""
        if self._exited:
            return
        if hasattr(os, "pidfd_open"):
            try:
                pidfd = os.pidfd_open(self.pid)
            except OSError:
                pidfd = -1
            if pidfd >= 0:
                try:
                    while not self._peek_exited():
                        await anyio.wait_readable(pidfd)
                finally:
                    os.close(pidfd)
                self._exited = True
                return
        # Without pidfds: a worker thread blocks in waitid; abandoned on cancel, it returns
        # when teardown kills the child.
        await anyio.to_thread.run_sync(self._block_until_exited, abandon_on_cancel=True)
        self._exited = True

    def _peek_exited(self) -> bool:
        info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        return info is not None

    def _block_until_exited(self) -> None:
        os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)

    def signal_group(self, signum: int) -> None:
        """Signal the group; safe from any thread. The direct child is unreaped until
        reap(), so its pid is also still the group id and cannot have been recycled."""
        with self._reaping:
            if self._status is not None:
                return
            try:
                os.killpg(self.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def ask_to_end(self) -> None:
        """SIGTERM the group, once: the wall clock's thread strikes it at the deadline and the
        loop's terminate follows, and a program that handles SIGTERM must see one request to
        end, not a second one arriving inside its handler. Safe from any thread."""
        with self._reaping:
            if self._asked_to_end:
                return
            self._asked_to_end = True
        self.signal_group(signal.SIGTERM)

    async def terminate(self, grace_seconds: float) -> None:
        """SIGTERM the group, wait out the grace window, then SIGKILL the group."""
        self.ask_to_end()
        with anyio.move_on_after(grace_seconds):
            await self.wait_exited()
        self.signal_group(signal.SIGKILL)

    async def kill_and_reap(self) -> ExitStatus:
        """SIGKILL whatever is left of the group, then reap the direct child. Idempotent."""
        if self._status is not None:
            return self._status
        self.signal_group(signal.SIGKILL)
        with anyio.CancelScope(shield=True):
            await self.wait_exited()
        with self._reaping:
            # Exited already (waited for above): this returns at once.
            try:
                _, status, rusage = os.wait4(self.pid, 0)
            finally:
                spawner.child_reaped(self.pid)
            self._popen.returncode = os.waitstatus_to_exitcode(status)  # keep Popen off it
            # ru_maxrss is KiB on Linux, bytes on macOS.
            scale = 1 if sys.platform == "darwin" else 1024
            self._status = ExitStatus.of_wait_status(
                status, rusage.ru_utime + rusage.ru_stime, rusage.ru_maxrss * scale
            )
        return self._status

    async def aclose(self) -> None:
        await self.kill_and_reap()
        await self.stdout.aclose()
        await self.stderr.aclose()
        if self.stdin is not None:
            await self.stdin.aclose()
