"""The cyclic garbage collector kept out of the command's start-up and exit.

Start-up builds tens of thousands of objects that live as long as the process (modules,
classes, pydantic's validators, which make a full collection cost tens of milliseconds),
walked again by every collection: :func:`pause` stops the collector while the command
imports, and :func:`resume` then freezes what the imports built out of later collections.
"""

from __future__ import annotations

#: Whether pause() paused the collector, which is resumed once the command's imports are done.
_paused = False


def pause() -> None:
    import gc

    global _paused
    gc.disable()
    _paused = True


def resume() -> None:
    """Freeze what the start-up built out of every later collection and resume the
    collector, if :func:`pause` paused it."""
    global _paused
    if _paused:
        import gc

        gc.freeze()
        gc.enable()
        _paused = False
