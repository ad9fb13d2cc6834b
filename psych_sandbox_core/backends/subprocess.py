"""The subprocess backend: the embedded default, reaching the process level.

A fresh interpreter per execution in its own session, with rlimits the child applies to
itself, an environment built from an allow-list and a private working directory. On Linux it
also unshares a pid namespace (so teardown reaches a descendant that called setsid) and a
network namespace where the kernel allows, and drops to an unprivileged uid when the host
runs as root. It has no filesystem boundary: that guarantee is graded unavailable.

Usage is read from a cgroup of the execution's own where the host can make one (root, with a
writable hierarchy; see cgroups.py): the bootstrap moves itself in first, while still root and
before anything forks. wait4's rusage is not used: a program that sets SIGCHLD to SIG_IGN has
its children reaped by the kernel with their usage discarded, so it would report low. Without
a cgroup, usage is not measured.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import lru_cache
from typing import Annotated, ClassVar

import anyio
from pydantic import Field

from .. import cgroups, hookspecs
from ..backend import Backend, BackendOptions, BackendUnavailable, Launched, LaunchRequest
from ..channel import InheritedSocketChannel
from ..errors import ConfigurationError
from ..grading import Level, Mechanisms
from ..host import child_environment
from ..identity import (
    IdentityLease,
    LeasedIdentityOptions,
)
from ..interpreter import (
    SYSTEM_CANDIDATES,
    InterpreterOptions,
    resolve_environment,
    resolve_interpreter,
)
from ..process import ExitStatus, ManagedProcess
from ..workspace import create_workspace, remove_tree

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
    #: Unshare pid and network namespaces where the kernel allows.
    use_namespaces: bool = True


class SubprocessBackend(Backend):
    id: ClassVar[str] = "subprocess"
    Options: ClassVar[type[BackendOptions]] = SubprocessOptions
    claims: ClassVar[Level] = Level.PROCESS

    def __init__(self, options: BackendOptions) -> None:
        super().__init__(options)
        assert isinstance(options, SubprocessOptions)
        self.settings = options
        self.is_root = hasattr(os, "geteuid") and os.geteuid() == 0
        # The bootstrap drops the identity itself (Linux); elsewhere none is claimed.
        linux = sys.platform.startswith("linux")
        self.drops_identity = self.is_root and linux
        self.fixed_identity: tuple[int, int] | None = None
        if (options.drop_to_uid is None) != (options.drop_to_gid is None):
            raise ConfigurationError("drop_to_uid and drop_to_gid go together")
        if options.drop_to_uid is not None and options.drop_to_gid is not None:
            self.fixed_identity = (options.drop_to_uid, options.drop_to_gid)
        self.identities = options.identity_range()
        if self.drops_identity and self.fixed_identity is None:
            self.identities.check()
        # Resolved once, at load: a name that cannot be resolved fails configuration now.
        runner = "the unprivileged uid the program runs as"
        if options.environment is not None:
            self.interpreter = resolve_environment(
                options.environment, reachable_by_any_uid=self.drops_identity, runner=runner,
                bound_read_only=False,
            ).executable
        else:
            self.interpreter = resolve_interpreter(
                options.interpreter,
                reachable_by_any_uid=self.drops_identity,
                # The host's own interpreter first (same version), then the system's.
                candidates=[os.path.realpath(sys.executable), *SYSTEM_CANDIDATES],
                runner=runner,
            )
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

    async def execution_cgroup(self) -> cgroups.ExecutionCgroup | None:
        """A fresh cgroup ready to be joined, measuring usage only; None where there can be
        none (then usage is not measured)."""
        if not self.drops_identity:
            # Only a root host makes cgroups, and only a program that is not root cannot
            # leave its own.
            return None
        host = cgroups.detect()
        if isinstance(host, str):
            return None
        try:
            cgroup = host.create(self.id)
        except OSError:
            return None
        try:
            cgroup.open_for_joining()
        except OSError:
            await cgroup.remove()
            return None
        return cgroup

    def mechanisms(self) -> Mechanisms:
        return Mechanisms(
            network_namespace=bool(self.namespaces & CLONE_NEWNET),
            process_tree_boundary=bool(self.namespaces & CLONE_NEWPID),
            process_group=True,
            unprivileged_identity=self.drops_identity,
        )

    @asynccontextmanager
    async def launch(self, request: LaunchRequest) -> AsyncIterator[Launched]:
        lease: IdentityLease | None = None
        identity: tuple[int, int] | None = self.fixed_identity
        if self.drops_identity and identity is None:
            lease = await self.identities.lease_for_execution()
            identity = (lease.uid, lease.gid)
        try:
            workspace = create_workspace(identity)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        channel = InheritedSocketChannel()
        process: ManagedProcess | None = None
        cgroup: cgroups.ExecutionCgroup | None = None
        try:
            cgroup = await self.execution_cgroup()
            join_fds = cgroup.join_fds if cgroup is not None else []
            argv = [
                self.interpreter,
                "-I",
                "-u",
                *request.bootstrap_command(self.interpreter),
                f"channel={channel.child_spec}",
                "probe=" + json.dumps(request.probe.as_json_object()),
            ]
            if self.contain:
                uid, gid = identity if identity is not None else ("", "")
                argv.append(f"contain={self.namespaces}:{uid}:{gid}:{os.getpid()}")
            if self.namespaces & CLONE_NEWPID:
                argv.append("pid-namespace=1")
            if join_fds:
                # The bootstrap writes itself into the cgroup first thing, as root.
                argv.append("cgroup=" + ",".join(str(fd) for fd in join_fds))
            try:
                process = await ManagedProcess.spawn(
                    argv,
                    env={**child_environment(workspace), **request.environment},
                    cwd=workspace,
                    pass_fds=(*channel.inherited_fds, *join_fds),
                    # No pre-exec step: the bootstrap contains itself first (see its
                    # _contain), so the host spawns with vfork.
                )
            except (OSError, subprocess.SubprocessError) as exc:
                raise BackendUnavailable(
                    f"the subprocess backend could not start {self.interpreter}: {exc}"
                ) from exc
            finally:
                if cgroup is not None:
                    cgroup.close_join_fds()
            channel.after_spawn()
            launched = _Launched(
                process,
                channel,
                self.mechanisms(),
                pid_namespace=bool(self.namespaces & CLONE_NEWPID),
                cgroup=cgroup,
            )
            launched.workspace_path = workspace
            yield launched
        finally:
            # Shielded: a cancelled run must still reap, close and remove its workspace.
            with anyio.CancelScope(shield=True):
                if process is not None:
                    await process.aclose()
                await channel.aclose()
                if cgroup is not None:
                    # Stragglers in it (a daemon that left the group) are killed first.
                    await cgroup.remove()
                # In a worker thread: a program can leave hundreds of thousands of files, and
                # the event loop serves every other execution's clock meanwhile.
                if lease is not None:
                    # Whatever still runs as this execution's uid, and whatever it left on
                    # the host without a process, goes before the uid is reused. Always: a
                    # pid namespace is no proof that nothing runs under the uid elsewhere.
                    await lease.retire()
                await anyio.to_thread.run_sync(remove_tree, workspace)


#: How long teardown waits for a killed pid namespace to empty (its init exits last).
NAMESPACE_TEARDOWN_SECONDS = 5.0


class _Launched(Launched):
    def __init__(
        self,
        process: ManagedProcess,
        channel: InheritedSocketChannel,
        mechanisms: Mechanisms,
        *,
        pid_namespace: bool,
        cgroup: cgroups.ExecutionCgroup | None = None,
    ) -> None:
        self.process = process
        self.cgroup = cgroup
        self.channel = channel
        self.mechanisms = mechanisms
        self.stdout = process.stdout
        self.stderr = process.stderr
        self._pid_namespace = pid_namespace

    def usage_so_far(self) -> tuple[float | None, int | None] | None:
        return None if self.cgroup is None else self.cgroup.usage()

    async def wait_exited(self) -> None:
        await self.process.wait_exited()

    async def terminate(self, grace_seconds: float) -> None:
        await self.process.terminate(grace_seconds)

    async def finish(self) -> ExitStatus:
        # Killing the group ends the outer process at once, while the namespace's init is
        # still taking everything in the namespace down with it. Hold init by a pidfd first
        # and wait for it, so teardown ends only when the namespace is empty.
        init = _hold_first_child(self.process.pid) if self._pid_namespace else None
        try:
            status = await self.process.kill_and_reap()
            if init is not None:
                with anyio.move_on_after(NAMESPACE_TEARDOWN_SECONDS):
                    await anyio.wait_readable(init)
        finally:
            if init is not None:
                os.close(init)
        # wait4's rusage stops at what was reaped: a program that ignores SIGCHLD hides its
        # children's usage from it. Only the cgroup counts everything; without one, usage is
        # not measured rather than reported low.
        cpu: float | None = None
        peak: int | None = None
        if self.cgroup is not None:
            with anyio.CancelScope(shield=True):
                # Usage is final only once nothing is left to run in the cgroup.
                empty = await self.cgroup.drain()
            if empty:
                cpu, peak = self.cgroup.usage()
        return replace(status, cpu_seconds=cpu, peak_memory_bytes=peak)


def _hold_first_child(pid: int) -> int | None:
    """A pidfd for the first child of ``pid`` (the bootstrap's namespace init), or None."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            children = fh.read().split()
    except OSError:
        return None
    if not children:
        return None
    try:
        return os.pidfd_open(int(children[0]))
    except (OSError, AttributeError):
        return None


# ---------------------------------------------------------------- interpreter resolution


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


@lru_cache(maxsize=4)
def namespace_flags(interpreter: str, is_root: bool) -> int:
    """The namespace flags a real trial spawn accepted here (0 if none)."""
    wanted = CLONE_NEWPID | CLONE_NEWNET
    if not is_root:
        wanted |= CLONE_NEWUSER
    libc = _load_libc()
    if libc is None:
        return 0

    def trial() -> None:
        if libc.unshare(wanted) != 0:
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
        return 0
    return wanted


@hookspecs.hookimpl
def psych_sandbox_register_backends(registry: hookspecs.BackendRegistrar) -> None:
    registry.add(SubprocessBackend)
