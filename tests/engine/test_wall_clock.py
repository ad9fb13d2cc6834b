"""The wall clock: the deadline is struck from a thread of the host's own, whatever its event
loop is doing, and a timed-out result comes back once the host saw every process of the
execution end, before the rest of its teardown."""

from __future__ import annotations

import os
import random
import select
import threading

import anyio
import pytest
from psych_sandbox_testing.leftovers import own_uid
from psych_sandbox_testing.programs import DAEMON

from psych_sandbox_core import ErrorKind, Sandbox
from psych_sandbox_core._engine import wall_clock
from psych_sandbox_core.kit.phases import recording

from ..conftest import PROFILE, config, marker, pids_with, wait_for_pids

pytestmark = pytest.mark.anyio

#: How long a test blocks its own event loop at most, waiting for the strike: far past the
#: wall clock, so only a missing strike reaches it.
BLOCKED_SECONDS = 20


@pytest.mark.parametrize("warm", [0, 1], ids=["cold", "warm"])
async def test_a_timeout_comes_back_with_every_process_dead_before_its_teardown(
    warm: int,
) -> None:
    mark = marker()
    # A daemon that left the program's session and ignores SIGTERM, and the program asleep.
    program = DAEMON.format(mark=mark) + "while True:\n    time.sleep(1)\n"
    with recording() as reached:
        async with Sandbox(config(warm=warm, wall_seconds=1.0, grace_seconds=0.2)) as sandbox:
            if warm:
                await sandbox.warmed(PROFILE)
            async with anyio.create_task_group() as tg:
                seen: list[int] = []

                async def watch() -> None:
                    seen.extend(await wait_for_pids(mark))

                tg.start_soon(watch)
                result = await sandbox.run(program, profile=PROFILE)
                tg.cancel_scope.cancel()
            # Judged from the host the moment the result is back, the Sandbox still open.
            left = pids_with(mark)
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT, result.error
    assert seen, "the daemon was never seen running"
    assert left == []
    points = [point for point, _ in reached]
    # Handed back once the tree was reaped and seen ended, the launch's teardown after it.
    assert points.index("reaped") < points.index("result handed back"), points
    assert points.index("result handed back") < points.index("identity retired"), points


@pytest.mark.skipif(os.geteuid() != 0, reason="uid leases are made only by a root host")
async def test_a_timed_out_execution_hands_its_uid_on_to_the_next() -> None:
    # A one-uid range: the next execution, started as soon as the timeout comes back (its
    # teardown still running), waits for the uid rather than find the range exhausted.
    with own_uid(1_960_000_000 + random.randrange(1_000_000)) as options:
        limits = {"wall_seconds": 1.0, "grace_seconds": 0.2}
        async with Sandbox(config(options=options, warm=0, **limits)) as sandbox:
            timed_out = await sandbox.run("while True:\n    pass\n", profile=PROFILE)
            following = await sandbox.run("2", profile=PROFILE)
    assert timed_out.error is not None and timed_out.error.kind is ErrorKind.TIMEOUT
    assert following.error is None and following.return_value == 2, following.error


# The thread does not depend on the loop: once, on asyncio.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_deadline_strikes_while_the_event_loop_is_blocked() -> None:
    mark = marker()
    # A process of the program's, in its process group, that SIGTERM ends.
    program = (
        "import subprocess, sys\n"
        f"subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)', {mark!r}])\n"
    )
    limits = {"wall_seconds": 1.0, "grace_seconds": 0.2}
    async with Sandbox(config(warm=0, **limits)) as sandbox, anyio.create_task_group() as tg:
        tg.start_soon(lambda: sandbox.run(program, profile=PROFILE))
        [pid] = await wait_for_pids(mark)
        pidfd = os.pidfd_open(pid)
        try:
            # The event loop is held here, past the deadline: no timer of its own can fire,
            # so only the wall clock's thread can end the process.
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            events = poller.poll(BLOCKED_SECONDS * 1000)
        finally:
            os.close(pidfd)
    assert events, "the process outlived its deadline while the event loop was blocked"


def test_an_earlier_deadline_wakes_the_thread_and_a_later_or_disarmed_one_never_strikes() -> None:
    # The thread is woken only for a deadline earlier than the one it sleeps until; one moved
    # later or disarmed leaves it asleep, and must then never strike early or at all.
    struck: dict[str, threading.Event] = {name: threading.Event() for name in "abcd"}
    far = wall_clock.arm(60.0, struck["a"].set)  # the thread sleeps until this one
    moved = wall_clock.arm(0.5, struck["b"].set)  # earlier: wakes it
    moved.move(60.0)  # later again: no wake-up
    dropped = wall_clock.arm(0.5, struck["c"].set)
    dropped.disarm()
    near = wall_clock.arm(1.0, struck["d"].set)  # after when the others were due
    try:
        assert struck["d"].wait(10)
        assert not (struck["a"].is_set() or struck["b"].is_set() or struck["c"].is_set())
    finally:
        for armed in (far, moved, near):
            armed.disarm()


def test_superseded_deadlines_do_not_pile_up() -> None:
    # Moves and disarms that never wake the thread leave entries behind: dropped all at once
    # once they outnumber the live deadlines.
    keep = wall_clock.arm(60.0, lambda: None)
    try:
        for _ in range(2000):
            wall_clock.arm(30.0, lambda: None).disarm()
        assert len(wall_clock._heap) <= 4 * wall_clock._COMPACT_ABOVE
    finally:
        keep.disarm()


def test_the_thread_serves_one_deadline_after_another_then_exits_once_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Deadlines armed one after another are served by the same thread (no thread start on
    # each execution's path); once none is left it waits LINGER_SECONDS, then exits.
    monkeypatch.setattr(wall_clock, "LINGER_SECONDS", 0.05)
    first = wall_clock.arm(0.2, lambda: None)
    thread = wall_clock._thread
    assert thread is not None
    first.disarm()
    second = wall_clock.arm(0.2, lambda: None)
    assert wall_clock._thread is thread
    second.disarm()
    thread.join(10)
    assert not thread.is_alive()
    assert wall_clock._thread is None


def test_a_deadline_struck_already_is_not_moved() -> None:
    # A caller that moves its deadline (the driver, as it gives the program) learns that the
    # thread struck it first, and the deadline stays struck (the driver then keeps its own).
    struck = threading.Event()
    armed = wall_clock.arm(0.0, struck.set)
    try:
        assert struck.wait(10)
        assert armed.move(60.0) is False
        assert all(entry[2] is not armed for entry in wall_clock._heap)  # not re-armed
    finally:
        armed.disarm()
