"""InitReport, the kit's teardown of a pid namespace whose init the bootstrap forks
(``pid-namespace=1``): it returns only once the kernel has let the init exit, that is once
nothing of the namespace is left, and says so; killing the bootstrap's process group does not
wait for that. Judged from the host's /proc, on the real bootstrap in a real pid namespace.

The namespace is held open deterministically: the host ptrace-attaches to the program's
process, so when it is killed its zombie waits for the host (its tracer) to reap it, and the
kernel keeps the dying init waiting for that zombie (zap_pid_ns_processes)."""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from psych_sandbox_testing.host import wait_until

from psych_sandbox_core.kit import (
    ExecutionLimits,
    InheritedSocketChannel,
    LaunchRequest,
    ProbeTargets,
    bootstrap_argv,
)
from psych_sandbox_core.kit.posix import (
    InitReport,
    ManagedProcess,
)
from psych_sandbox_core.kit.posix.pid_namespace import PidNamespace, _state_of, members
from psych_sandbox_core.kit.relay import (
    bootstrap_source,
)

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or shutil.which("unshare") is None,
        reason="pid namespaces by util-linux's unshare are Linux's",
    ),
]

PTRACE_SEIZE = 0x4206
WALL = 0x40000000  # waitpid's __WALL: a tracee that is not our child


def alive(pid: int) -> bool:
    return _state_of(pid) not in (None, "Z", "X")


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return [int(child) for child in fh.read().split()]


async def traced_program(namespace: PidNamespace) -> int:
    """The namespace's program process (the init's one child), the host its tracer: once
    killed, it stays a zombie until the host reaps it with ``os.waitpid(pid, WALL)``."""
    (program,) = await wait_until(lambda: children(namespace.init_pid))
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.ptrace(PTRACE_SEIZE, program, 0, 0) == 0, os.strerror(ctypes.get_errno())
    return program


@asynccontextmanager
async def bootstrap_in_a_pid_namespace(
    init: InitReport,
) -> AsyncIterator[tuple[ManagedProcess, PidNamespace]]:
    """The real bootstrap, run as the tutorial backend runs it: ``unshare --pid`` without
    ``--fork``, its children in the new namespace. Its program's process waits for the
    host's run frame, which never comes."""
    request = LaunchRequest(
        bootstrap_source=bootstrap_source(),
        targets=lambda: ProbeTargets(None, None, None, os.getpid()),
        limits=ExecutionLimits(),
    )
    channel = InheritedSocketChannel()
    namespaces = ["--pid"] if os.geteuid() == 0 else ["--pid", "--map-root-user"]
    argv = [
        "unshare",
        *namespaces,
        "--",
        *bootstrap_argv(sys.executable, request, channel.child_spec),
        *init.arguments,
    ]
    process = await ManagedProcess.spawn(
        argv, env={}, cwd="/", pass_fds=[*channel.inherited_fds, init.child_fd]
    )
    init.after_spawn()
    channel.after_spawn()
    try:
        namespace = await init.receive(30)
        assert namespace is not None, "no pidfd handed over"
        yield process, namespace
    finally:
        with anyio.CancelScope(shield=True):
            await init.aclose(process)
            await process.aclose()
            await channel.aclose()


async def test_teardown_returns_once_the_namespace_is_empty_and_not_before() -> None:
    init = InitReport()
    async with bootstrap_in_a_pid_namespace(init) as (process, namespace):
        program = await traced_program(namespace)
        reaped = False
        try:
            returned: list[bool | None] = []

            async def teardown() -> None:
                returned.append(await init.aclose(process))

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(teardown)
                # Killed: its zombie waits for its tracer, and the dying init for it.
                await wait_until(lambda: _state_of(program) == "Z")
                assert alive(namespace.init_pid)
                assert returned == [], "teardown returned with the namespace's init alive"
                os.waitpid(program, WALL)
                reaped = True
            assert returned == [True]
            assert not alive(namespace.init_pid)
            assert members(namespace.identity) == []
            assert not alive(process.pid)
        finally:
            if not reaped:
                os.waitpid(program, WALL)


async def test_a_namespace_that_does_not_empty_in_time_is_reported_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from psych_sandbox_core.kit.posix import pid_namespace

    monkeypatch.setattr(pid_namespace, "NAMESPACE_TEARDOWN_SECONDS", 0.2)
    init = InitReport()
    async with bootstrap_in_a_pid_namespace(init) as (process, namespace):
        program = await traced_program(namespace)
        try:
            assert await init.aclose(process) is False
            # Its own verdict is kept: a second teardown does not call it empty.
            assert alive(namespace.init_pid)
            assert await init.aclose(process) is False
        finally:
            os.waitpid(program, WALL)
        await wait_until(lambda: not alive(namespace.init_pid))


async def test_the_group_kill_alone_does_not_wait_for_the_init() -> None:
    """Why the kit has InitReport: the outer bootstrap, killed with its group, is reaped while
    the namespace's init is still alive (here, held by the traced zombie)."""
    init = InitReport()
    async with bootstrap_in_a_pid_namespace(init) as (process, namespace):
        program = await traced_program(namespace)
        try:
            await process.kill_and_reap()
            await wait_until(lambda: _state_of(program) == "Z")
            assert alive(namespace.init_pid)
        finally:
            os.waitpid(program, WALL)
