"""The spawner's thread: children are started off the event loop, from a thread that lives as
long as any child it started (a child's parent-death signal follows its parent thread)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading

import anyio
import pytest

from psych_sandbox_core.kit.posix import spawner
from psych_sandbox_core.kit.posix.process import ManagedProcess

pytestmark = pytest.mark.anyio

#: A child that asks for SIGKILL when its parent thread goes, then says so and waits.
DIES_WITH_ITS_PARENT_THREAD = (
    "import ctypes, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)\n"  # PR_SET_PDEATHSIG, SIGKILL
    "sys.stdout.write('ready'); sys.stdout.flush()\n"
    "sys.stdin.read()\n"
)


async def test_a_spawn_does_not_hold_the_event_loop() -> None:
    # The spawn waits for something only the loop, still running, can give it; a spawn made
    # on the loop's own thread would never get it.
    release = threading.Event()

    def make() -> subprocess.Popen[bytes]:
        assert release.wait(10), "the event loop was held while the child was started"
        return subprocess.Popen([sys.executable, "-I", "-c", "pass"])

    async def spawn() -> None:
        popen = await spawner.start(make)
        popen.wait()
        spawner.child_reaped(popen.pid)

    async with anyio.create_task_group() as tg:
        tg.start_soon(spawn)
        await anyio.sleep(0)  # the spawn is under way
        release.set()


async def test_the_thread_outlives_every_child_it_started(monkeypatch: pytest.MonkeyPatch) -> None:
    # With no work the thread would be gone after LINGER_SECONDS; a child it started asked to
    # be killed when its parent thread goes, so the thread must stay until it is reaped.
    monkeypatch.setattr(spawner, "LINGER_SECONDS", 0.01)
    process = await ManagedProcess.spawn(
        [sys.executable, "-I", "-c", DIES_WITH_ITS_PARENT_THREAD],
        env={},
        cwd="/",
        with_stdin=True,
    )
    try:
        assert await process.stdout.receive() == b"ready"
        thread = spawner._thread
        assert thread is not None
        # Many times its linger: a thread that left would have taken the child with it.
        thread.join(0.5)
        assert thread.is_alive()
        pidfd = os.pidfd_open(process.pid)
        try:
            assert not select.select([pidfd], [], [], 0)[0], "the child was killed"
        finally:
            os.close(pidfd)
    finally:
        await process.aclose()
    # Reaped: nothing keeps the thread any more.
    thread.join(10)
    assert not thread.is_alive()
    assert spawner._thread is None
