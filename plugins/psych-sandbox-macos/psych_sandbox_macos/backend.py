"""The macos backend: the process level on macOS, with a seatbelt profile per execution.

Each execution runs ``sandbox-exec`` with a profile generated for it (seatbelt.py): writes
confined to its own workspace (also its temporary directory), reads allowed except in named
subtrees, every network operation denied. The bootstrap caps CPU, file size and process
count with rlimits on itself; the tree runs in its own session and process group, torn down
as on Linux (SIGTERM to the group, a grace window, SIGKILL to the group, always a reap).

What it cannot do, and says so in the grades (docs: the plugin's README):

- The filesystem guarantee is unverified, never enforced, whatever the canary finds: the
  profile denies named subtrees, and everything it does not name is readable.
- Memory is capped by nothing: macOS accepts an address-space rlimit and does not enforce it.
  The memory grade is unavailable, so the level is process and a profile that requires the
  isolated level is refused at configuration (the backend claims process).
- The program runs as the worker's own account (identity unavailable) and can signal the
  worker (supervisor reachable): process tree and wall clock are unverified.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from psych_sandbox_core.kit import (
    Backend,
    BackendRegistrar,
    BackendUnavailable,
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
)
from psych_sandbox_core.kit.posix import (
    ManagedProcess,
    create_workspace,
    interpreter_prefixes,
    remove_tree,
)

from .seatbelt import SeatbeltPolicy, generate

#: Where macOS keeps sandbox-exec; not looked up on PATH, which the worker's caller controls.
SANDBOX_EXEC = "/usr/bin/sandbox-exec"
#: The platform this backend serves, as sys.platform names it.
PLATFORM = "darwin"


def requires_macos() -> str | None:
    """Why this host cannot run the backend at all, or None on macOS."""
    if sys.platform != PLATFORM:
        return f"requires macOS (seatbelt); this host is {sys.platform}"
    return None


class MacosOptions(InterpreterOptions):
    # interpreter: a path or a name on PATH (None: this process's own interpreter); or
    # environment: a virtual environment or prefix whose own python runs.
    #: The sandbox-exec executable.
    sandbox_exec: str = SANDBOX_EXEC


class MacosBackend(
    Backend[MacosOptions],
    id="macos",
    # Never isolated: memory cannot be capped and the filesystem profile is a deny-list.
    claims=Level.PROCESS,
):
    def __init__(self, options: MacosOptions) -> None:
        super().__init__(options)
        self.interpreter: str | None = None
        self.read_roots: tuple[str, ...] = ()
        if requires_macos() is not None:
            # Installed on another platform: nothing to resolve; unavailable_reason says why.
            return
        interpreter = options.child_interpreter(
            reachable_by_any_uid=False,
            runner="the program",
            candidates=[os.path.realpath(sys.executable)],
            bound_read_only=True,
        )
        self.interpreter = interpreter.executable
        environment = [] if interpreter.environment is None else [interpreter.environment]
        # Where the interpreter reads its library from stays readable even under a denied
        # subtree (a home, say).
        base = interpreter.base
        roots = [*environment, *interpreter_prefixes(base), os.path.dirname(base)]
        self.read_roots = tuple(dict.fromkeys(os.path.realpath(root) for root in roots))

    def unavailable_reason(self) -> str | None:
        reason = requires_macos()
        if reason is not None:
            return reason
        if not os.access(self.options.sandbox_exec, os.X_OK):
            return f"{self.options.sandbox_exec} is missing; it ships with macOS"
        return None

    @staticmethod
    def mechanisms() -> Mechanisms:
        return Mechanisms(
            filesystem_confinement=True,
            # Seatbelt's (deny network*): a kernel policy the program cannot lift.
            network_namespace=True,
            process_group=True,
            # The worker's own account: it can signal the worker that holds its clock.
            supervisor_reachable=True,
            # RLIMIT_AS is accepted and not enforced on macOS.
            address_space_rlimit=False,
        )

    def policy(self, workspace: str) -> SeatbeltPolicy:
        real = os.path.realpath(workspace)
        return SeatbeltPolicy(workspace=real, temp=real, read_roots=self.read_roots)

    @asynccontextmanager
    async def launch(self, request: LaunchRequest) -> AsyncIterator[Launched]:
        reason = self.unavailable_reason()
        if reason is not None or self.interpreter is None:
            raise BackendUnavailable(reason or "no interpreter")
        workspace = create_workspace()
        channel = InheritedSocketChannel()
        process: ManagedProcess | None = None
        try:
            profile = generate(self.policy(workspace))
            argv = [
                self.options.sandbox_exec,
                *profile.sandbox_exec_arguments(),
                self.interpreter,
                "-I",
                "-u",
                *request.bootstrap_command(self.interpreter),
                f"channel={channel.child_spec}",
                "probe=" + json.dumps(request.probe.as_json_object()),
            ]
            try:
                process = await ManagedProcess.spawn(
                    argv,
                    env={**child_environment(workspace), **request.environment},
                    cwd=workspace,
                    pass_fds=channel.inherited_fds,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                raise BackendUnavailable(f"sandbox-exec could not start: {exc}") from exc
            channel.after_spawn()
            launched = _Launched(process, channel, self.mechanisms())
            launched.workspace_path = workspace
            yield launched
        finally:
            # Shielded: a cancelled run must still reap, close and remove its workspace.
            with anyio.CancelScope(shield=True):
                if process is not None:
                    process.signal_group(signal.SIGKILL)
                    await process.aclose()
                await channel.aclose()
                await anyio.to_thread.run_sync(remove_tree, workspace)


class _Launched(ProcessLaunched[InheritedSocketChannel]):
    async def terminate(self, grace_seconds: float) -> None:
        await self.process.terminate(grace_seconds)

    async def finish(self) -> ExitStatus:
        return await self.process.kill_and_reap()


@hookimpl
def psych_sandbox_register_backends(registry: BackendRegistrar) -> None:
    registry.add(MacosBackend)
