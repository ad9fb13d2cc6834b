"""An await that says when what it awaits first suspends.

A binding call served by the task that read it needs someone else to read the channel only
if its tool waits; most tools of a program awaiting its calls one by one answer without
ever suspending, and waking a standby for each of them costs the event loop a task's turn
per call. :func:`watching` awaits a coroutine exactly as ``await`` does (every value it
yields goes to the event loop, everything sent or thrown back goes to it, ``close`` closes
it), and calls ``on_suspend`` once, just before the coroutine's first suspension reaches the
event loop. It works on any event loop, since it forwards whatever the loop's traps are.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")


@types.coroutine
def watching(
    coroutine: Coroutine[Any, Any, T], on_suspend: Callable[[], None]
) -> Generator[Any, Any, T]:
    """Await ``coroutine``; ``on_suspend()`` runs once if it suspends, before it does."""
    try:
        yielded = coroutine.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    on_suspend()
    # What ``yield from`` does (PEP 380), for a coroutine already started.
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:
            coroutine.close()
            raise
        except BaseException as exc:
            try:
                yielded = coroutine.throw(exc)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
        else:
            try:
                yielded = coroutine.send(sent)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
