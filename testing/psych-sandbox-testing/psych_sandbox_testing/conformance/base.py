"""What every conformance test stands on: a backend's declarations (class attributes), the
hooks a backend may override, running a program on it, and the check after every test."""

from __future__ import annotations

from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.abc
import pytest
from psych_sandbox_core import (
    BindingProvider,
    DeploymentConfig,
    ExecutionLimits,
    ExecutionResult,
    OutputPolicy,
    ProfileConfig,
    Sandbox,
)
from psych_sandbox_core._policy.registry import BackendRegistry
from psych_sandbox_core.kit.posix.identity import LeasedIdentityOptions

from ..baseline import HostBaseline
from ..host import pids_with, private_tempdir, wait_for_pids


class ConformanceBase:
    """What the suite's tests stand on. A backend's test class (a subclass of
    :class:`~psych_sandbox_testing.conformance.BackendConformance`) sets the class attributes
    below; the hooks (:meth:`leftovers`, :meth:`registry`, :meth:`identity_uids`) may be
    overridden.

    After every test, whatever the backend did, the suite looks from the host for what the
    test's executions left (see :class:`~psych_sandbox_testing.baseline.HostBaseline`):
    processes that are new and descend from the test process (a detached daemon included)
    or run under a uid of the backend's identity range that no lease holds, and cgroup
    directories new in any hierarchy. It kills those processes by pidfd, removes the empty
    cgroups, and fails the test naming each one."""

    #: The backend id the profile names.
    backend: ClassVar[str]
    #: The backend's options for the profile.
    options: ClassVar[dict[str, Any]] = {}
    #: The level the backend reaches on a host where its tests run.
    level: ClassVar[str]
    #: Guarantees the backend must have graded ``enforced`` on such a host.
    enforced: ClassVar[frozenset[str]] = frozenset()
    #: Limits for every run: small, so a timeout is reached quickly.
    limits: ClassVar[dict[str, Any]] = {
        "cpu_seconds": 10,
        "wall_seconds": 60.0,
        "grace_seconds": 0.5,
    }
    #: Whether the program's processes are host processes (found in the host's /proc); under a
    #: user-space kernel (gVisor) they are not, and :meth:`leftovers` is the evidence instead.
    processes_visible: ClassVar[bool] = True
    #: Whether the workspace is a directory below the host's temporary directory.
    workspace_on_host: ClassVar[bool] = True
    #: The program's working directory, where the backend fixes it.
    workspace_path: ClassVar[str | None] = None
    #: Environment names the program may see besides what the interpreter sets itself; None
    #: where the boundary adds its own (an image's PATH, say) and only the secret is checked.
    environment: ClassVar[frozenset[str] | None] = None
    #: Further addresses a backend with the network enforced must not reach.
    unreachable: ClassVar[tuple[tuple[str, int], ...]] = ()

    #: The options that make every execution share one identity (the weaker setting for a
    #: host that cannot spare a uid range), where the backend has them, and that (uid, gid):
    #: a program on the host under it then reaches a running execution, the control for the
    #: leased case.
    shared_identity: ClassVar[tuple[dict[str, Any], tuple[int, int]] | None] = None
    #: Whether the options ``workspace_bytes``, ``tmp_bytes`` and ``shm_bytes`` cap the
    #: memory-backed workspace, /tmp and /dev/shm.
    capped_filesystems: ClassVar[bool] = False
    #: Whether the backend's options take an identity range (``identity_first_uid``), so the
    #: suite can give it a uid of the test's own. A backend whose identities are leased
    #: elsewhere (a remote service's) declares False.
    identity_options: ClassVar[bool] = True

    #: Whether the backend runs commands (its ``runs_commands``): the suite then runs them
    #: on it (command mode: argv, exit status, output caps, inputs, a timeout killing the
    #: whole tree, the shell form only when asked).
    runs_commands: ClassVar[bool] = False
    #: An interpreter the command tests run as their command; None: the one that runs the
    #: bootstrap where the child runs, asked of a program (it may be one the host started as
    #: root and the child's own uid cannot run again: then name one it can).
    command_python: ClassVar[str | None] = None
    #: Whether ``/bin/sh`` exists where the child runs (a minimal image may have none: the
    #: shell form then exits 127, as a shell says "not found").
    has_shell: ClassVar[bool] = True

    #: Whether an execution's result, a prepared child's and a fresh one's alike, is handed
    #: back before its child's teardown on this host (the launch sets ``early_result_ok``;
    #: see docs/architecture.md).
    early_result: ClassVar[bool] = False

    profile: ClassVar[str] = "conformance"
    #: A second profile some tests add: the subprocess backend without a pid namespace, a
    #: program on the host among the host's processes.
    PLAIN: ClassVar[str] = "plain-host-program"

    # ------------------------------------------------------------ hooks

    def config(
        self,
        *,
        options: dict[str, Any] | None = None,
        output: OutputPolicy | None = None,
        plain: dict[str, Any] | None = None,
        warm: int | None = None,
        **limits: Any,
    ) -> DeploymentConfig:
        """The deployment of one test: the backend's profile (its options updated by
        ``options``, ``warm`` children kept prepared: unset is the default pool), and with
        ``plain`` the plain subprocess profile with those options."""
        terms = ExecutionLimits(**{**self.limits, **limits})
        profiles = {
            self.profile: ProfileConfig(
                backend=self.backend,
                options={**self.options, **(options or {})},
                limits=terms,
                output=output or OutputPolicy(),
                warm=warm,
            )
        }
        if plain is not None:
            profiles[self.PLAIN] = ProfileConfig(
                backend="subprocess",
                options={"use_namespaces": False, **plain},
                limits=terms,
            )
        return DeploymentConfig(profiles=profiles)

    def leftovers(self) -> list[str]:
        """What the backend left behind after its sandbox closed (containers, say): empty."""
        return []

    #: Whether an execution holds something outside the host's process tree and temporary
    #: directory (a container), which :meth:`resources_of` finds.
    holds_resources: ClassVar[bool] = False

    def resources_of(self, host_pid: int) -> list[str]:
        """What the backend holds for executions the host process ``host_pid`` runs, outside
        that process's tree and temporary directory (its containers, say)."""
        return []

    def registry(self) -> BackendRegistry | None:
        """Where the sandbox finds the backend: None for the installed plugins."""
        return None

    def identity_uids(self) -> range | None:
        """The uids the backend runs executions as, where it leases them: a process left
        under one nobody holds is the execution's. By default, its options' identity
        range."""
        registry = self.registry() or BackendRegistry()
        options = registry.get(self.backend).cls.Options.model_validate(dict(self.options))
        if isinstance(options, LeasedIdentityOptions):
            identities = options.identity_range()
            return range(identities.first, identities.first + identities.count)
        return None

    async def run(
        self,
        source: str,
        *,
        bindings: BindingProvider | None = None,
        options: dict[str, Any] | None = None,
        preamble: str | None = None,
        variables: dict[str, Any] | None = None,
        keep_variables: bool = False,
        **limits: Any,
    ) -> ExecutionResult:
        """One program in a sandbox of its own, closed (and so torn down) on return."""
        config = self.config(options=options, **limits)
        async with Sandbox(config, registry=self.registry()) as sandbox:
            return await sandbox.run(
                source,
                profile=self.profile,
                bindings=bindings,
                preamble=preamble,
                variables=variables,
                keep_variables=keep_variables,
            )

    async def exec(
        self,
        command: str | list[str],
        *,
        shell: bool = False,
        inputs: dict[str, bytes] | None = None,
        **limits: Any,
    ) -> ExecutionResult:
        """One command in a sandbox of its own, closed (and so torn down) on return."""
        async with Sandbox(self.config(**limits), registry=self.registry()) as sandbox:
            return await sandbox.exec(command, shell=shell, profile=self.profile, inputs=inputs)

    async def child_python(self) -> str:
        """The interpreter that runs the bootstrap where the child runs (a command to run
        that surely exists there), asked of a program once per test class."""
        found = self.command_python or vars(type(self)).get("_child_python")
        if found is None:
            result = await self.run("import sys\nsys.executable")
            assert result.error is None, result.error
            found = str(result.return_value)
            type(self)._child_python = found  # type: ignore[attr-defined]
        return str(found)

    def sandbox(self, **kwargs: Any) -> Sandbox:
        """A sandbox of :meth:`config` (same arguments), for tests that run more than one
        program in it."""
        return Sandbox(self.config(**kwargs), registry=self.registry())

    # ------------------------------------------------------------ fixtures

    @pytest.fixture(params=["asyncio", "trio"])
    def anyio_backend(self, request: pytest.FixtureRequest) -> str:
        """Every test on both event loops anyio runs on: a backend's teardown and streams
        are loop-specific code, and an embedding application may use either."""
        return str(request.param)

    @pytest.fixture
    def private_tmp(self) -> Iterator[Path]:
        """The host's temporary directory, fresh and private to the test."""
        with private_tempdir("psych-conformance-") as root:
            yield Path(root)

    @pytest.fixture(autouse=True)
    def _execution_leaves_nothing(self) -> Iterator[None]:
        """Whatever the test and the backend did, nothing of its executions survives it: what
        did is killed or removed, and the test fails naming it."""
        with HostBaseline.watching(self.identity_uids()) as baseline:
            yield
            problem = baseline.check()
        if problem is not None:
            pytest.fail(f"the backend {self.backend!r} left this behind: {problem}")

    async def _watching(
        self, mark: str, execution: Awaitable[ExecutionResult]
    ) -> tuple[ExecutionResult, list[int]]:
        """Run ``execution`` while the host watches for processes carrying ``mark`` (where
        this backend's are visible from the host); its result, and the pids seen meanwhile."""
        seen: list[int] = []

        async def watch() -> None:
            if self.processes_visible:
                seen.extend(await wait_for_pids(mark))

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            result = await execution
            tg.cancel_scope.cancel()
        return result, seen

    def _nothing_left(self, mark: str) -> None:
        if self.processes_visible:
            assert pids_with(mark) == [], "a process of the program outlived its sandbox"
        assert self.leftovers() == []
