"""The subprocess backend: the embedded default, reaching the process level.

A fresh interpreter per execution in its own session, with rlimits the child applies to
itself, an environment built from an allow-list and a private working directory. On Linux it
also unshares pid, network, IPC and UTS namespaces where the kernel allows, and on a root host
runs the program's process (only that one) as an unprivileged uid. The processes the backend
runs for an execution (the outer bootstrap, the namespace's init) stay out of the program's
reach: another identity on a root host, undumpable and unnameable from inside the namespace
everywhere. Teardown kills the namespace by a pidfd on its init held since before the program
existed, and checks it empty. It has no filesystem boundary: that guarantee is graded
unavailable.

Usage is read from a cgroup of the execution's own where the host can make one (root, with a
writable hierarchy; see cgroups.py): the bootstrap moves itself in first, while still root and
before anything forks. wait4's rusage is not used: a program that sets SIGCHLD to SIG_IGN has
its children reaped by the kernel with their usage discarded, so it would report low. Without
a cgroup, usage is not measured.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import lru_cache
from typing import Annotated

import anyio
from pydantic import Field

from ..kit import (
    BackendRegistrar,
    ExitStatus,
    InheritedSocketChannel,
    InterpreterOptions,
    Launched,
    LaunchRequest,
    Level,
    Mechanisms,
    ProcessLaunched,
    child_environment,
    hookimpl,
    spawn,
)
from ..kit.posix import (
    SYSTEM_CANDIDATES,
    ExecutionCgroup,
    ExecutionIdentity,
    LeasedIdentityBackend,
    LeasedIdentityOptions,
    ManagedProcess,
    execution_cgroup,
)

# The one mechanism of this backend's own: a pid namespace whose init it holds by a pidfd.
from ..kit.posix.pid_namespace import PidNamespace, ProgramEnd, kill_tree

CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000


class SubprocessOptions(LeasedIdentityOptions, InterpreterOptions):
    # interpreter (None picks one the child's identity can run: the host's own when
    # reachable, else a system python3) or environment, whose own python runs as-is.
    #: When the host runs as root, the program runs as an unprivileged uid/gid of its own,
    #: leased per execution from the identity range (identity_first_uid, identity_count; see
    #: identity.py), so concurrent programs cannot reach each other. Setting drop_to_uid and
    #: drop_to_gid instead makes every execution share that one identity: weaker, and only for
    #: hosts that cannot spare a range.
    drop_to_uid: Annotated[int, Field(ge=1)] | None = None
    drop_to_gid: Annotated[int, Field(ge=1)] | None = None
    #: Unshare pid, network, IPC and UTS namespaces where the kernel allows.
    use_namespaces: bool = True


class SubprocessBackend(
    LeasedIdentityBackend[SubprocessOptions],
    id="subprocess",
    claims=Level.PROCESS,
    # Commands run in the same child as programs (command mode).
    runs_commands=True,
    shared_identity=("drop_to_uid", "drop_to_gid"),
):
    # The bootstrap drops to the execution's identity itself (drops_identity: a root host).

    def __init__(self, options: SubprocessOptions) -> None:
        super().__init__(options)
        # Resolved once, at load: a name that cannot be resolved fails configuration now.
        self.interpreter = options.child_interpreter(
            reachable_by_any_uid=self.drops_identity,
            runner="the unprivileged uid the program runs as",
            # The host's own interpreter first (same version), then the system's.
            candidates=[os.path.realpath(sys.executable), *SYSTEM_CANDIDATES],
            bound_read_only=False,
        ).executable
        self.namespaces = (
            namespace_flags(self.interpreter, self.is_root)
            if options.use_namespaces and sys.platform.startswith("linux")
            else 0
        )
        self.contain = sys.platform.startswith("linux") and (
            bool(self.namespaces) or self.drops_identity
        )

    def unavailable_reason(self) -> str | None:
        if os.name != "posix":
            return "the subprocess backend needs a POSIX host"
        return None

    async def execution_cgroup(self) -> ExecutionCgroup | None:
        """A fresh cgroup ready to be joined, measuring usage only; None where there can be
        none (then usage is not measured)."""
        if not self.drops_identity:
            # Only a root host makes cgroups, and only a program that is not root cannot
            # leave its own.
            return None
        return await execution_cgroup(self.id)

    def mechanisms(self) -> Mechanisms:
        pid_namespace = bool(self.namespaces & CLONE_NEWPID)
        return Mechanisms(
            network_namespace=bool(self.namespaces & CLONE_NEWNET),
            ipc_namespace=bool(self.namespaces & CLONE_NEWIPC),
            process_tree_boundary=pid_namespace,
            process_group=True,
            unprivileged_identity=self.drops_identity,
            # The program's process shares the host's uid where it drops none; outside a pid
            # namespace it can then name its parent, the host itself, and signal or trace it.
            # (Inside one it cannot name its ancestors, and they are undumpable: _contain.)
            supervisor_reachable=not self.drops_identity and not pid_namespace,
        )

    @asynccontextmanager
    async def launch_as(
        self, request: LaunchRequest, leased: ExecutionIdentity
    ) -> AsyncIterator[Launched]:
        # The lease is swept always: a pid namespace is no proof that nothing runs under the
        # uid elsewhere.
        identity = leased.ids
        # The bootstrap reports its namespace's init (a pidfd, by SCM_RIGHTS) where it makes
        # one; the probe's targets and the cgroup are made once the child is spawned, while
        # its interpreter starts, and handed to it then (late_terms.py).
        async with spawn(
            owner=identity, pid_namespace=bool(self.namespaces & CLONE_NEWPID)
        ) as child:
            workspace = child.workspace
            assert workspace is not None
            argv = child.bootstrap_argv(self.interpreter, request)
            if self.contain:
                uid, gid = identity if identity is not None else ("", "")
                argv.append(f"contain={self.namespaces}:{uid}:{gid}:{os.getpid()}")
            process = await child.start(
                argv,
                env={**child_environment(workspace), **request.environment},
                cwd=workspace,
                failure=f"the subprocess backend could not start {self.interpreter}",
                # No pre-exec step: the bootstrap contains itself first (see its _contain),
                # so the host spawns with vfork.
            )
            # The bootstrap writes itself into the cgroup first thing, as root, before
            # anything of the execution's forks. Its removal at teardown (stragglers killed
            # first) is no proof for the lease: with no filesystem boundary a program can
            # have a process started under its uid outside the cgroup (through a host
            # service it reaches), which only the sweep's scan finds.
            cgroup = await self.execution_cgroup()
            child.deliver(request.probe, joining=cgroup)
            namespace: PidNamespace | None = None
            if child.init is not None:
                # Before the handshake, so before any program can exist: what the host holds
                # was handed over by the bootstrap alone.
                namespace = await child.receive_init()
            mechanisms = self.mechanisms()
            if leased.exclusive:
                # A leased uid is this execution's alone; a fixed drop_to_uid is every one's.
                mechanisms = mechanisms.model_copy(update={"exclusive_identity": True})
            if child.init is not None and namespace is None:
                # Not handed over (no pidfds there): the namespace still dies with the outer
                # process, but the host cannot kill or check it itself.
                mechanisms = mechanisms.model_copy(update={"process_tree_boundary": False})
            # Where the program runs as an unprivileged uid it cannot leave its cgroup, so the
            # namespace's members are among the cgroup's processes (pid_namespace.wait_empty).
            candidates = cgroup.processes if cgroup is not None and identity is not None else None
            child.candidates = candidates
            launched = _Launched(
                process, child.channel, mechanisms, namespace, cgroup=cgroup, candidates=candidates
            )
            launched.workspace_path = workspace
            yield launched


class _Launched(ProcessLaunched[InheritedSocketChannel]):
    def __init__(
        self,
        process: ManagedProcess,
        channel: InheritedSocketChannel,
        mechanisms: Mechanisms,
        namespace: PidNamespace | None,
        *,
        cgroup: ExecutionCgroup | None = None,
        candidates: Callable[[], set[int] | None] | None = None,
    ) -> None:
        super().__init__(process, channel, mechanisms, cgroup)
        self._namespace = namespace
        self._candidates = candidates
        #: How the program's process ended, as its init reported it, once terminate saw
        #: the init exit after it: then finish need not wait for the outer process.
        self._reported: ProgramEnd | None = None
        # A warm result may be handed back before teardown: the pipes carry exactly what the
        # child wrote, the cgroup measures usage so far and tells whether anything the
        # program started is left (only then are its workspace's files collected early).
        self.early_result_ok = cgroup is not None

    async def terminate(self, grace_seconds: float) -> None:
        self.process.ask_to_end()
        namespace = self._namespace
        with anyio.move_on_after(grace_seconds):
            if namespace is None:
                await self.process.wait_exited()
            else:
                # The init exits once it has reaped the program's process and reported how
                # it ended, and the namespace with it; the outer process only mirrors that
                # ending, later (a wake-up of one more process at the execution's low CPU
                # weight, which a loaded host would otherwise wait for).
                await namespace.wait_exited()
                self._reported = namespace.program_end()
        if self._reported is None:
            # The grace window is over (or the init went without a report): kill it all.
            await kill_tree(self.process, namespace)

    async def finish(self) -> ExitStatus:
        reaped: ExitStatus | None = None
        if self._reported is None:
            # (Otherwise the program ended within its grace window, and the outer process is
            # reaped by the launch's teardown, once it has exited on its own: the init it
            # waits for is then never orphaned.)
            await kill_tree(self.process, self._namespace)
            reaped = await self.process.kill_and_reap()
        ended: bool | None = None
        end: ProgramEnd | None = None
        if self._namespace is not None:
            ended = await self._namespace.wait_empty(candidates=self._candidates)
            end = self._namespace.program_end()
        # The program's own ending where its init reported it (the outer process mirrors its
        # status, but wait4 on it no longer counts the CPU of what the init reaped).
        status = reaped
        if end is not None:
            status = ExitStatus.of_wait_status(end.status, end.reaped_cpu_seconds)
        assert status is not None  # (no report, so reaped above)
        # wait4's rusage stops at what was reaped: a program that ignores SIGCHLD hides its
        # children's usage from it. Only the cgroup counts everything; without one, usage is
        # not measured rather than reported low.
        cpu, peak = None, None
        if self.cgroup is not None and reaped is None and ended:
            # Everything of the program's is gone (its namespace seen empty), so its usage is
            # final, though the outer process may still be in the cgroup, exiting on its own:
            # ours, and none of the program's work is in it.
            cpu, peak = self.cgroup.usage()
        elif self.cgroup is not None:
            cpu, peak = await self.cgroup.final_usage()
        return replace(status, cpu_seconds=cpu, peak_memory_bytes=peak, tree_ended=ended)


# ---------------------------------------------------------------- namespaces and identity

_libc: ctypes.CDLL | None = None


def _load_libc() -> ctypes.CDLL | None:
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            return None
    return _libc


#: Namespace sets to try, strongest first: pid and network are what the backend needs; IPC
#: (SysV objects and POSIX message queues die with it) and UTS (a hostname of its own) are
#: taken wherever the kernel allows them too.
_NAMESPACE_CHOICES = (
    CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS,
    CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC,
    CLONE_NEWPID | CLONE_NEWNET,
)


@lru_cache(maxsize=4)
def namespace_flags(interpreter: str, is_root: bool) -> int:
    """The strongest namespace flags a real trial spawn accepted here (0 if none)."""
    libc = _load_libc()
    if libc is None:
        return 0
    for flags in _NAMESPACE_CHOICES:
        wanted = flags if is_root else flags | CLONE_NEWUSER
        if _unshare_trial(libc, interpreter, wanted):
            return wanted
    return 0


def _unshare_trial(libc: ctypes.CDLL, interpreter: str, flags: int) -> bool:
    def trial() -> None:
        if libc.unshare(flags) != 0:
            raise OSError(ctypes.get_errno(), "unshare failed")

    try:
        subprocess.run(
            [interpreter, "-I", "-S", "-c", "pass"],
            preexec_fn=trial,
            check=True,
            env={},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return True


@hookimpl
def psych_sandbox_register_backends(registry: BackendRegistrar) -> None:
    registry.add(SubprocessBackend)
