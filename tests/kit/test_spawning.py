"""The kit's spawn sequence unwinds what it made, in reverse, on every exit path: a spawn that
fails, a launch that fails after its child started, a cancelled one. Judged from the host:
the child's process gone (its pid no longer ours to reap), every descriptor closed, the
workspace removed."""

from __future__ import annotations

import os
import sys

import anyio
import pytest
from psych_sandbox_testing.host import open_fds

from psych_sandbox_core.kit import BackendUnavailable, spawn

pytestmark = pytest.mark.anyio

SLEEPS = [sys.executable, "-c", "import time; time.sleep(600)"]


def reaped(pid: int) -> bool:
    """Whether ``pid`` is no child of ours any more (killed and reaped, not a zombie)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


async def test_a_spawn_that_fails_is_the_backends_and_leaves_nothing() -> None:
    before = open_fds()
    workspace = None
    with pytest.raises(BackendUnavailable, match=r"^could not start nothing: "):
        async with spawn(pid_namespace=True) as child:
            workspace = child.workspace
            assert workspace is not None and os.path.isdir(workspace)
            await child.start(
                ["/nonexistent/launcher"], env={}, cwd=workspace, failure="could not start nothing"
            )
    assert workspace is not None and not os.path.exists(workspace)
    assert open_fds() == before


async def test_a_launch_that_fails_after_the_spawn_unwinds_in_reverse() -> None:
    before = open_fds()
    undone: list[str] = []
    with pytest.raises(RuntimeError, match="the handshake failed"):
        async with spawn() as child:
            assert child.workspace is not None
            # The backend's own steps are undone before the sequence's: the process is still
            # there to be looked at when the first of them runs.
            child.callback(lambda: undone.append("first registered"))

            async def finish() -> None:
                assert child.process is not None and not reaped(child.process.pid)
                undone.append("last registered")

            child.push_async_callback(finish)
            process = await child.start(SLEEPS, env={}, cwd=child.workspace, failure="no")
            raise RuntimeError("the handshake failed")
    assert undone == ["last registered", "first registered"]
    assert reaped(process.pid)
    assert not os.path.exists(child.workspace)
    assert open_fds() == before


async def test_a_cancelled_launch_still_tears_down_whole() -> None:
    before = open_fds()
    with anyio.CancelScope() as scope:
        async with spawn() as child:
            assert child.workspace is not None
            process = await child.start(SLEEPS, env={}, cwd=child.workspace, failure="no")
            scope.cancel()
            # The teardown is shielded: the cancellation does not cut it short.
            await anyio.sleep_forever()
    assert scope.cancelled_caught
    assert reaped(process.pid)
    assert not os.path.exists(child.workspace)
    assert open_fds() == before
