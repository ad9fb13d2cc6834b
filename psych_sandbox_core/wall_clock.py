"""The wall clock's deadline struck from a thread of its own.

The event loop's timer fires at the loop's next turn after the deadline, and a host serving
many executions at once turns late (tens of milliseconds under load); the kill would wait
behind whatever work is queued before it. So the first step of a timed-out child's
termination (:meth:`Launched.terminate_from_thread`: the signal that starts the grace window,
or the kill where there is none) is struck by one thread of this host's, sleeping until the
earliest armed deadline, independent of the loop. The driver's own timer still ends the
execution at its turn and performs the whole teardown (grace, kill, reap), exactly as
without this thread: the strike only makes the tree start dying on time.

The thread runs while a deadline is armed and exits once none is.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable

__all__ = ["Armed", "arm"]

_lock = threading.Condition()
#: (deadline in time.monotonic() seconds, sequence, the armed deadline)
_heap: list[tuple[float, int, Armed]] = []
_sequence = itertools.count()
_thread: threading.Thread | None = None


class Armed:
    """One deadline: ``strike`` is called from the wall clock's thread once it passes,
    unless disarmed first. Move it with :meth:`move`."""

    def __init__(self, strike: Callable[[], None]) -> None:
        self._strike = strike
        self._entry: tuple[float, int, Armed] | None = None

    def move(self, delay_seconds: float) -> None:
        """Strike ``delay_seconds`` from now (instead of when armed before)."""
        deadline = time.monotonic() + max(0.0, delay_seconds)
        with _lock:
            self._entry = (deadline, next(_sequence), self)
            heapq.heappush(_heap, self._entry)
            _start_locked()
            _lock.notify()

    def disarm(self) -> None:
        """Never strike. The thread drops the entry, and exits when none is left."""
        with _lock:
            self._entry = None
            _lock.notify()


def arm(delay_seconds: float, strike: Callable[[], None]) -> Armed:
    """Call ``strike`` (from another thread: it must be thread-safe, quick and never raise)
    ``delay_seconds`` from now, unless disarmed first."""
    armed = Armed(strike)
    armed.move(delay_seconds)
    return armed


def _start_locked() -> None:
    global _thread
    if _thread is None:
        _thread = threading.Thread(target=_run, name="psych-sandbox-wall-clock", daemon=True)
        _thread.start()


def _forget_after_fork() -> None:
    # A forked child has no such thread (nor the parent's deadlines), and the lock may have
    # been held by it at the fork.
    global _lock, _thread
    _lock = threading.Condition()
    _heap.clear()
    _thread = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _run() -> None:
    global _thread
    while True:
        with _lock:
            while True:
                # Entries a move or a disarm superseded go first.
                while _heap and _heap[0][2]._entry is not _heap[0]:
                    heapq.heappop(_heap)
                if not _heap:
                    _thread = None
                    return
                deadline, _, armed = _heap[0]
                wait = deadline - time.monotonic()
                if wait <= 0:
                    heapq.heappop(_heap)
                    armed._entry = None
                    break
                _lock.wait(wait)
        try:
            armed._strike()
        except Exception:
            pass  # a backend's bug: the driver's own timer still ends the execution
