"""The local spawn sequence, composed once: a backend that starts its child as one local process
tree (the subprocess backend, bwrap, the guide's tutorial) enters :func:`spawn` and fills in
only what is its own (the command line, the identity, the cgroup).

The sequence: a workspace, the control channel, the descriptors passed at spawn, the late
terms, an init report where the bootstrap unshares a pid namespace, the spawn itself; then the
terms delivered and the init received. Each step registers its undoing on one
:class:`~contextlib.AsyncExitStack` as it is taken, so leaving the context unwinds exactly what
was done, in reverse, on every exit path (a failed spawn, a cancelled run, a clean end), and
shielded: a cancelled execution still reaps its process, closes its descriptors, removes its
cgroup and its workspace.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio

from .backend import BackendUnavailable, LaunchRequest, ProbeTargets
from .channel import InheritedSocketChannel
from .late_terms import LateTerms
from .phases import mark
from .posix.cgroups import ExecutionCgroup
from .posix.pid_namespace import InitReport, PidNamespace
from .posix.process import ManagedProcess
from .posix.removal import remove_tree
from .posix.workspace import create_workspace
from .starting import PassedFds, bootstrap_argv

#: What removing a cgroup proved (an EmptyCgroup, or None): handed to a lease that accepts it.
CgroupProof = Callable[[Any], None]


class Spawn:
    """One local child's spawn, as :func:`spawn` yields it: the pieces made for it, the
    process once :meth:`start` ran, and the teardown registered for each."""

    def __init__(self, stack: AsyncExitStack) -> None:
        self._stack = stack
        #: The child's private directory on the host (None where the backend asked for none).
        self.workspace: str | None = None
        self.channel: InheritedSocketChannel
        #: Descriptors given to the child at spawn and closed by the host right after (the
        #: compiled bootstrap's memory file; a backend adds its own, such as a status pipe).
        self.passed_fds = PassedFds()
        self.late: LateTerms
        #: The pid namespace's init report, where the bootstrap unshares one.
        self.init: InitReport | None = None
        #: The pid namespace the init report handed over (see :meth:`receive_init`).
        self.namespace: PidNamespace | None = None
        self.process: ManagedProcess | None = None
        self.cgroup: ExecutionCgroup | None = None
        self._proof: CgroupProof | None = None
        #: The namespace's members, where the backend can list them (a cgroup the program
        #: cannot leave): teardown then checks the namespace empty among them.
        self.candidates: Callable[[], set[int] | None] | None = None

    def bootstrap_argv(self, interpreter: str, request: LaunchRequest, **options: Any) -> list[str]:
        """The child's command line (the kit's :func:`bootstrap_argv`) over this spawn's
        channel, passed descriptors and late terms, with the init report's arguments."""
        argv = bootstrap_argv(
            interpreter,
            request,
            self.channel.child_spec,
            passed_fds=self.passed_fds,
            late=self.late,
            **options,
        )
        return argv if self.init is None else [*argv, *self.init.arguments]

    def adopt_cgroup(
        self, cgroup: ExecutionCgroup | None, proven_empty: CgroupProof | None = None
    ) -> None:
        """Remove ``cgroup`` at teardown, once the tree is gone (stragglers in it are killed
        first); what its removal proved goes to ``proven_empty`` (a lease's, where the cgroup
        held the whole tree from before its first process ran as the leased uid). A cgroup
        adopted before :meth:`start` is joined by the spawn itself: its join files are closed
        once spawned."""
        self.cgroup, self._proof = cgroup, proven_empty

    async def start(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str],
        cwd: str,
        failure: str,
        preexec_fn: Callable[[], None] | None = None,
    ) -> ManagedProcess:
        """Spawn the child with every descriptor of this spawn passed, then close the host's
        copies of the child's ends. A spawn that fails is the backend's: BackendUnavailable,
        ``failure`` followed by the reason."""
        init_fd = [] if self.init is None else [self.init.child_fd]
        try:
            self.process = await ManagedProcess.spawn(
                argv,
                env=env,
                cwd=cwd,
                pass_fds=[
                    *self.channel.inherited_fds,
                    *self.passed_fds,
                    self.late.child_fd,
                    *init_fd,
                ],
                preexec_fn=preexec_fn,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise BackendUnavailable(f"{failure}: {exc}") from exc
        finally:
            self.late.after_spawn()
            if self.init is not None:
                self.init.after_spawn()
            if self.cgroup is not None:
                self.cgroup.close_join_fds()
            self.passed_fds.close()
        self.channel.after_spawn()
        return self.process

    def deliver(self, probe: ProbeTargets, joining: ExecutionCgroup | None = None) -> None:
        """Hand the spawned child its late terms: the probe's targets and, where given, the
        join files of ``joining``, a cgroup made while its interpreter started, which the
        bootstrap writes itself into first thing (adopted for removal)."""
        if joining is not None:
            self.adopt_cgroup(joining)
        try:
            self.late.deliver(probe, joining.join_fds if joining is not None else ())
        finally:
            if joining is not None:
                joining.close_join_fds()

    async def receive_init(self) -> PidNamespace | None:
        """The pid namespace the bootstrap hands over, before the handshake (so before any
        program exists); None where it could give no pidfd."""
        assert self.init is not None, "spawn(pid_namespace=True) asks for the init's report"
        self.namespace = await self.init.receive()
        mark("namespace reported")
        return self.namespace

    def callback(self, function: Callable[..., object], *args: Any) -> None:
        """Undo something of the backend's own at teardown, before the sequence's own steps
        (what is registered last is undone first)."""
        self._stack.callback(function, *args)

    def push_async_callback(self, function: Callable[..., Awaitable[object]], *args: Any) -> None:
        """The same, awaited (a ``finish`` that must run before the process is reaped)."""
        self._stack.push_async_callback(function, *args)

    async def _close_process(self) -> None:
        if self.init is not None:
            # The namespace by its init's pidfd, then the group; returns once the kernel let
            # the init exit (every member gone) or the bound passed.
            await self.init.aclose(self.process, self.candidates)
        if self.process is not None:
            await self.process.aclose()

    async def _remove_cgroup(self) -> None:
        if self.cgroup is not None:
            proof = await self.cgroup.remove()
            if self._proof is not None:
                self._proof(proof)


@asynccontextmanager
async def spawn(
    *,
    workspace: bool = True,
    owner: tuple[int, int] | None = None,
    pid_namespace: bool = False,
) -> AsyncIterator[Spawn]:
    """The local spawn sequence of one child (see the module's docstring).

    ``workspace``: make a private directory for the child (owned by ``owner`` where given),
    removed at teardown in a worker thread (a program can leave very many files).
    ``pid_namespace``: the bootstrap forks a new pid namespace's init and hands it over
    (:class:`InitReport`): teardown kills the namespace by it and waits until it is empty.
    """
    stack = AsyncExitStack()
    try:
        child = Spawn(stack)
        if workspace:
            child.workspace = create_workspace(owner)
            stack.push_async_callback(anyio.to_thread.run_sync, remove_tree, child.workspace)
        # Each piece's undoing is registered as soon as it exists.
        stack.push_async_callback(child._remove_cgroup)
        child.channel = InheritedSocketChannel()
        stack.push_async_callback(child.channel.aclose)
        stack.push_async_callback(child._close_process)
        if pid_namespace:
            child.init = InitReport()
        child.late = LateTerms()
        # Not delivered: the child exits unstarted.
        stack.callback(child.late.close)
        # Not spawned: still the host's.
        stack.callback(child.passed_fds.close)
        yield child
    finally:
        with anyio.CancelScope(shield=True):
            await stack.aclose()
