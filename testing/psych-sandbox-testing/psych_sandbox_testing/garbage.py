"""What executions leave to the garbage collector: objects only a collection pass can free.

An execution's objects must go as it ends, by reference counting: what is left in a reference
cycle waits for the collector, whose full passes over a host's heap stall its event loop by
tens of milliseconds (see watchers.py). Used by tests that run executions and then ask what
of psych-sandbox's own, or which exception, was left in a cycle.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


@asynccontextmanager
async def cyclic_garbage() -> AsyncIterator[list[str]]:
    """Inside: the collector runs nothing, and keeps what it finds; once left, the list holds
    the type of every object of psych-sandbox's own (or exception) that was left in a cycle
    by what ran inside."""
    found: list[str] = []
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    flags = gc.get_debug()
    gc.set_debug(flags | gc.DEBUG_SAVEALL)
    try:
        yield found
        gc.collect()
        for thing in gc.garbage:
            kind = type(thing)
            if kind.__module__.startswith("psych_sandbox") or isinstance(thing, BaseException):
                found.append(f"{kind.__module__}.{kind.__qualname__}")
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()
        if enabled:
            gc.enable()
