"""The wall clock's deadline struck from a thread of its own.

The event loop's timer fires at the loop's next turn after the deadline, and a host serving
many executions at once turns late (tens of milliseconds under load); the kill would wait
behind whatever work is queued before it. So the first step of a timed-out child's
termination (:meth:`Launched.terminate_from_thread`: the signal that starts the grace window,
or the kill where there is none) is struck by one thread of this host's, sleeping until the
earliest armed deadline, independent of the loop. The driver's own timer still ends the
execution at its turn and performs the whole teardown (grace, kill, reap), exactly as
without this thread: the strike only makes the tree start dying on time.

The thread is woken only for a deadline earlier than the one it sleeps until: an execution
that ends (disarm) or whose program clock starts later (move) leaves it asleep, to find nothing
due when it wakes. Once none is left it waits :data:`LINGER_SECONDS` for another, then exits:
starting a thread costs the loop a wait for it to be scheduled, which a host running one
execution after another would otherwise pay on each one's path. Each wake-up costs the loop
thread a hand-over of the interpreter lock, which on a busy machine can wait milliseconds for
the woken thread to be scheduled.
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
#: The deadline the thread sleeps until (infinity: none, or not asleep).
_sleeping_until = float("inf")
#: Deadlines armed and not yet struck or disarmed (the heap also holds superseded entries,
#: dropped when they come first, or all at once when they outnumber these).
_live = 0


class Armed:
    """One deadline: ``strike`` is called from the wall clock's thread once it passes,
    unless disarmed first. Move it with :meth:`move`."""

    def __init__(self, strike: Callable[[], None]) -> None:
        self._strike = strike
        self._entry: tuple[float, int, Armed] | None = None
        #: Whether the thread has taken this deadline to strike it.
        self._struck = False

    def move(self, delay_seconds: float) -> bool:
        """Strike ``delay_seconds`` from now (instead of when armed before); False, moving
        nothing, if it has struck already (the caller is then past its deadline)."""
        global _live
        deadline = time.monotonic() + max(0.0, delay_seconds)
        with _lock:
            if self._struck:
                return False
            if self._entry is None:
                _live += 1
            self._entry = (deadline, next(_sequence), self)
            heapq.heappush(_heap, self._entry)
            if len(_heap) > _COMPACT_ABOVE and len(_heap) > 4 * _live:
                _compact_locked()
            if not _start_locked() and deadline < _sleeping_until:
                _lock.notify()
        return True

    def disarm(self) -> None:
        """Never strike. The thread drops the entry when it comes first."""
        global _live
        with _lock:
            if self._entry is not None:
                _live -= 1
            self._entry = None


def arm(delay_seconds: float, strike: Callable[[], None]) -> Armed:
    """Call ``strike`` (from another thread: it must be thread-safe, quick and never raise)
    ``delay_seconds`` from now, unless disarmed first."""
    armed = Armed(strike)
    armed.move(delay_seconds)
    return armed


#: Superseded entries are dropped all at once past this many entries (and four per live one).
_COMPACT_ABOVE = 256
#: How long the thread waits for a new deadline once none is left before it exits.
LINGER_SECONDS = 2.0


def _compact_locked() -> None:
    _heap[:] = [entry for entry in _heap if entry[2]._entry is entry]
    heapq.heapify(_heap)


def _start_locked() -> bool:
    """Start the thread if it is not running; True if it was started (it then looks at the
    heap itself, no need to wake it)."""
    global _thread
    if _thread is None:
        _thread = threading.Thread(target=_run, name="psych-sandbox-wall-clock", daemon=True)
        _thread.start()
        return True
    return False


def _forget_after_fork() -> None:
    # A forked child has no such thread (nor the parent's deadlines), and the lock may have
    # been held by it at the fork.
    global _lock, _thread, _sleeping_until, _live
    _lock = threading.Condition()
    _heap.clear()
    _thread = None
    _sleeping_until = float("inf")
    _live = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _run() -> None:
    global _thread, _sleeping_until, _live
    while True:
        with _lock:
            while True:
                # Entries a move or a disarm superseded go first.
                while _heap and _heap[0][2]._entry is not _heap[0]:
                    heapq.heappop(_heap)
                if not _heap:
                    # None left: wait a while for the next one (an arm wakes it), then exit.
                    _lock.wait(LINGER_SECONDS)
                    if _heap:
                        continue
                    _thread = None
                    return
                deadline, _, armed = _heap[0]
                wait = deadline - time.monotonic()
                if wait <= 0:
                    heapq.heappop(_heap)
                    armed._entry = None
                    armed._struck = True
                    _live -= 1
                    break
                _sleeping_until = deadline
                _lock.wait(wait)
                _sleeping_until = float("inf")
        try:
            armed._strike()
        except Exception:
            pass  # a backend's bug: the driver's own timer still ends the execution
