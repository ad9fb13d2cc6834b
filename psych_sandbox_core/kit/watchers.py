"""Tasks that only wait for something, ended by their task group's cancellation when it no
longer matters, without leaving their state to the garbage collector.

anyio (4.x, on asyncio) keeps the exception of a task that ended by cancellation in a reference
cycle with its own bookkeeping frame. The cycle holds the task's frames and everything they
reference (for a watcher of an execution: its launch and every object of it) until the
collector's next pass over the generation they reached, and those passes stall the event loop
by tens of milliseconds on a busy host, which every execution's timing then carries. A waiting
task that returns when it is cancelled leaves nothing: its objects go as it ends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio


async def waited(wait: Callable[[], Awaitable[object]]) -> bool:
    """Await ``wait()``: True once it returned, False if the task was cancelled first (the
    cancellation is the task group's, and ends the task; a task whose cancellation is its
    caller's never calls this)."""
    try:
        await wait()
    except anyio.get_cancelled_exc_class():
        return False
    return True
