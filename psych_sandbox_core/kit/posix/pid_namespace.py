"""A pid namespace the host tears down itself, whatever the program did to its processes.

The bootstrap that unshared the namespace hands the host, before any program exists, a pidfd
on the namespace's init and the namespace itself, open (see bootstrap ``_hand_over_init``).
Teardown is then the host's own act: SIGKILL to the init through that pidfd (the kernel kills
everything else in the namespace, and the init exits only once all of it is reaped), the pidfd
becoming readable, and a scan of /proc that no process is left in the namespace. Nothing here
asks the program, or any process it could reach, to cooperate.

The init also reports on the same socket how the program's process ended (bootstrap
``_reap_as_init``) and then exits: a host that has asked the program to end learns that it did
from the init, one process of ours away, not from the outer process behind it.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from ..backend import BackendUnavailable
from .process import ManagedProcess

#: How long the bootstrap may take to start and report its namespace's init (the handshake's
#: own bound: it is the first thing the bootstrap does).
INIT_REPORT_SECONDS = 30.0
#: How long teardown waits for a killed pid namespace to empty (its init exits last).
NAMESPACE_TEARDOWN_SECONDS = 5.0
#: Up to this many candidate processes are looked at on the event loop (see wait_empty).
_LISTED_INLINE = 8
#: The report is the init's pid in decimal (the descriptors travel beside it); the init's own,
#: this tag, then the program's wait status in decimal and the CPU seconds of what the init
#: reaped (a copy of child/pid_init.py's EXIT_REPORT).
MAX_REPORT_BYTES = 64
EXIT_REPORT = b"exit "


@dataclass(frozen=True)
class ProgramEnd:
    """How the program's process ended, as the namespace's init reported it."""

    #: Its wait status, as waitpid gave it to the init.
    status: int
    #: CPU seconds of it and of whatever else the init reaped (wait4's lower bound: a program
    #: can hide children from it).
    reaped_cpu_seconds: float


@dataclass
class PidNamespace:
    """One execution's pid namespace, held open, and a pidfd on its init."""

    init_pid: int
    #: The namespace's identity, as stat() of /proc/<pid>/ns/pid gives it: (device, inode).
    #: Unique while the namespace is held open (a freed namespace's inode is reused).
    identity: tuple[int, int]
    _namespace: int = field(repr=False)
    _handle: int = field(repr=False)
    #: The report socket, on which the init reports the program's end (the caller's to close).
    _report: socket.socket = field(repr=False)
    #: How the program's process ended, as its init reported it, once read.
    _program_end: ProgramEnd | None = field(default=None, repr=False)
    #: Whether teardown saw the namespace empty (None until it looked).
    emptied: bool | None = None

    @classmethod
    async def receive(cls, report: socket.socket, seconds: float) -> PidNamespace | None:
        """The namespace the bootstrap reports on ``report``, or None if it reported none
        (it exited first, or its interpreter has no pidfds). Raises TimeoutError when the
        bootstrap says nothing within ``seconds``."""
        ended: ProgramEnd | None = None
        with anyio.fail_after(seconds):
            while True:
                await anyio.wait_readable(report)
                try:
                    message, fds, _, _ = socket.recv_fds(
                        report, MAX_REPORT_BYTES, 2, socket.MSG_DONTWAIT
                    )
                except BlockingIOError:
                    continue
                except OSError:
                    return None
                # The init's report of a program's process that ended at once can come first.
                status = None if fds else _exit_report(message)
                if status is None:
                    break
                ended = status
        try:
            pid = int(message.decode("ascii"))
            if len(fds) != 2:
                raise ValueError("a namespace and a pidfd were expected")
            info = os.fstat(fds[0])
        except (ValueError, OSError):
            for fd in fds:
                os.close(fd)
            return None
        return cls(pid, (info.st_dev, info.st_ino), fds[0], fds[1], report, ended)

    async def wait_exited(self) -> None:
        """Return once the init has exited, which ends the namespace (the kernel kills every
        other member and waits until each is reaped before the init can exit), without
        killing it."""
        if self._handle >= 0:
            await anyio.wait_readable(self._handle)

    def program_end(self) -> ProgramEnd | None:
        """How the program's process ended, as its init reported it (it reports before it
        exits), or None if it has not (yet), or was killed first."""
        while self._program_end is None:
            try:
                message = self._report.recv(MAX_REPORT_BYTES, socket.MSG_DONTWAIT)
            except OSError:
                return None  # nothing (yet), or the socket is closed
            if not message:
                return None  # every sender is gone
            self._program_end = _exit_report(message)
        return self._program_end

    def kill(self) -> None:
        """SIGKILL the init by its pidfd: the kernel then kills every process in the namespace
        (from the parent namespace the signal cannot be ignored, handled or blocked)."""
        if self._handle < 0:
            return
        try:
            signal.pidfd_send_signal(self._handle, signal.SIGKILL)
        except ProcessLookupError:
            pass  # already exited: the namespace went with it

    async def wait_empty(
        self,
        seconds: float | None = None,
        candidates: Callable[[], set[int] | None] | None = None,
    ) -> bool:
        """Kill the namespace and wait until nothing is left in it; True once verified empty.
        Idempotent. False if the init outlived ``seconds`` (NAMESPACE_TEARDOWN_SECONDS where
        not given) or a member is still listed: the
        caller must then not treat the execution's identity as free (the uid sweep of
        identity.py kills what runs under it, and keeps a uid whose processes will not die).

        ``candidates``: where every member but the init must be among the processes it
        returns (those of the execution's cgroup, where the program cannot leave it: it runs
        as an unprivileged uid, and moving a process between cgroups takes root), only those
        are looked at instead of every process of the host; None from it (unreadable) falls
        back to the whole scan."""
        if self.emptied is not None:
            return self.emptied
        self.kill()
        exited = False
        with anyio.move_on_after(NAMESPACE_TEARDOWN_SECONDS if seconds is None else seconds):
            # The init exits last: the kernel has it wait until every other member is reaped.
            await anyio.wait_readable(self._handle)
            exited = True
        if not exited:
            self.emptied = False
            return False
        listed = None if candidates is None else candidates()
        if listed is not None and len(listed) <= _LISTED_INLINE:
            # A few stat calls: cheaper than the hop to a worker thread.
            self.emptied = not self._left(listed)
        else:
            self.emptied = not await anyio.to_thread.run_sync(self._left, listed)
        return self.emptied

    def _left(self, listed: set[int] | None = None) -> list[int]:
        """The namespace's members among ``listed`` (None: every process of the host's),
        but for its init listed as dead: exited, and being released by the kernel as its own
        last step (its parent keeps no zombies, see bootstrap ``_pid_namespace_init``), which
        a host woken by its exit can still see. A zombie init is listed: it waits for someone
        to reap it."""
        found = (
            members(self.identity)
            if listed is None
            else [
                pid
                for pid in sorted(listed | {self.init_pid})
                if namespace_of(pid) == self.identity
            ]
        )
        return [
            pid for pid in found if not (pid == self.init_pid and _state_of(pid) in ("X", None))
        ]

    def close(self) -> None:
        for fd in (self._handle, self._namespace):
            if fd >= 0:
                os.close(fd)
        self._handle = self._namespace = -1


class InitReport:
    """The socket on which a bootstrap run with ``pid-namespace=1`` (its children in a new pid
    namespace) hands the host its namespace's init, and the teardown that uses it.

    Without it the host knows only the outer bootstrap: a SIGKILL to the group may end that
    process before the init, which then dies on its own time, after the host has called the
    execution over. With it the host kills the namespace by the init's pidfd and waits for
    the init's exit, which the kernel holds back until every member of the namespace is gone.

    Make one before the spawn; add :attr:`arguments` to the command line and :attr:`child_fd`
    to the descriptors passed; call :meth:`after_spawn` once spawned; ``await receive()``
    before the handshake; ``await aclose(process)`` in the shielded teardown."""

    def __init__(self) -> None:
        self._host, self._child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        #: The namespace, once received (None where the bootstrap could give no pidfd).
        self.namespace: PidNamespace | None = None

    @property
    def child_fd(self) -> int:
        """The child's end: pass it to the spawn."""
        return self._child.fileno()

    @property
    def arguments(self) -> list[str]:
        """The bootstrap's arguments that ask for the init and its report."""
        return ["pid-namespace=1", f"init-report={self.child_fd}"]

    def after_spawn(self) -> None:
        """Close the host's copy of the child's end (the child has its own)."""
        self._child.close()

    async def receive(self, seconds: float = INIT_REPORT_SECONDS) -> PidNamespace | None:
        """The namespace the bootstrap reports, before any program of its exists; None where
        it could give no pidfd (the host can then neither kill nor check the namespace, and
        must not claim it does). A bootstrap silent for ``seconds`` is the backend's failure."""
        try:
            self.namespace = await PidNamespace.receive(self._host, seconds)
        except TimeoutError:
            raise BackendUnavailable(
                f"the bootstrap did not report its pid namespace within {seconds:g} s"
            ) from None
        return self.namespace

    async def aclose(
        self,
        process: ManagedProcess | None,
        candidates: Callable[[], set[int] | None] | None = None,
    ) -> bool | None:
        """Teardown: kill the namespace and the process group (:func:`kill_tree`), reap
        ``process`` (its streams are still the caller's to close), wait until the namespace
        is seen empty, and close the report. True once verified empty, False if not (see
        :meth:`PidNamespace.wait_empty`, with ``candidates``), None where no namespace was
        reported. Idempotent: a ``finish`` may call it, and teardown again."""
        if process is not None:
            await kill_tree(process, self.namespace)
            await process.kill_and_reap()
        emptied = None
        if self.namespace is not None:
            emptied = await self.namespace.wait_empty(candidates=candidates)
            self.namespace.close()
        self._host.close()
        self._child.close()
        return emptied


async def kill_tree(process: ManagedProcess, namespace: PidNamespace | None) -> None:
    """Kill everything of an execution whose outer bootstrap is ``process``. The namespace
    first, by the init's pidfd: whatever the program did to its process group and sessions,
    everything in the namespace dies with its init; the outer process exits once the init is
    gone (it ignores the group's SIGTERM), so no init is orphaned, left for the system to reap.
    Then SIGKILL to the group, for whatever is left."""
    if namespace is not None:
        namespace.kill()
        with anyio.move_on_after(NAMESPACE_TEARDOWN_SECONDS):
            await process.wait_exited()
    process.signal_group(signal.SIGKILL)


def _exit_report(message: bytes) -> ProgramEnd | None:
    """What an init's report says, or None if ``message`` is not one."""
    if not message.startswith(EXIT_REPORT):
        return None
    try:
        status, spent = message[len(EXIT_REPORT) :].decode("ascii").split()
        end = ProgramEnd(int(status), float(spent))
        os.waitstatus_to_exitcode(end.status)  # (a status a process can end with)
    except ValueError:
        return None
    if not 0.0 <= end.reaped_cpu_seconds < 1e9:  # NaN and infinities fail this too
        return None
    return end


def _state_of(pid: int) -> str | None:
    """The state letter /proc gives ``pid`` (R, S, Z, X...), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0].decode("ascii")
    except (OSError, IndexError, UnicodeDecodeError):
        return None


def namespace_of(pid: int | str) -> tuple[int, int] | None:
    """The pid namespace ``pid`` belongs to, or None where the host may not look."""
    try:
        info = os.stat(f"/proc/{pid}/ns/pid")
    except OSError:
        return None
    return info.st_dev, info.st_ino


def members(identity: tuple[int, int]) -> list[int]:
    """Processes (zombies included) whose pid namespace is ``identity``, seen from the host's
    /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and namespace_of(entry) == identity:
            found.append(int(entry))
    return found
