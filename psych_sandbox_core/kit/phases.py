"""Where an execution's time goes: host-side timestamps at fixed points of an execution, taken
only while a caller records them (benchmarks/latency.py prints the breakdown).

Off by default at the cost of one context-variable read per point. Recording is scoped to the
caller's context, so it sees the points of the executions it started and of no other (tasks
and worker threads inherit the context they were started from).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["Marks", "mark", "recording"]

#: The points reached so far, in order: (point, time.perf_counter() when reached).
Marks = list[tuple[str, float]]

_marks: ContextVar[Marks | None] = ContextVar("psych_sandbox_phases", default=None)


def mark(point: str) -> None:
    """Note that ``point`` was reached now, if the current context is recording."""
    marks = _marks.get()
    if marks is not None:
        marks.append((point, time.perf_counter()))


@contextmanager
def recording() -> Iterator[Marks]:
    """Record the points reached in this context (and the tasks it starts) while inside."""
    marks: Marks = []
    token = _marks.set(marks)
    try:
        yield marks
    finally:
        _marks.reset(token)
