"""A warm child's idle time: what an awaiting program would import, done while no program has
arrived, one step at a time."""

# Uses names the other modules define: they run as one namespace (loader.py).
# ruff: noqa: F821

import _socket

#: What a program that awaits needs imported (asyncio and what it imports, heaviest first in
#: the order asyncio reaches them), in steps of a few milliseconds each.
ASYNC_MODULES = (
    "enum",
    "functools",
    "collections",
    "re",
    "traceback",
    "inspect",
    "typing",
    "logging",
    "concurrent.futures",
    "socket",
    "selectors",
    "ssl",
    "subprocess",
    "asyncio",
)
#: Built (never run) by an idle child ahead of its program, see _prepare_while_idle.
WARM_UP_SOURCE = "warmed_up: int = 1\nprint(warmed_up)\nwarmed_up\n"
#: A host that has a program for this child sends it within a few milliseconds of the hello;
#: a child still waiting after this long is a warm one, prepared ahead of its program.
IDLE_AFTER_SECONDS = 0.05


def _prepare_while_idle(sock):
    """Import what an awaiting program needs while a warm child waits for its program: about
    30 ms of ``import asyncio`` that would otherwise be on the path the program waits on.

    Only once the child is idle (no program IDLE_AFTER_SECONDS after its hello: a cold child
    is answered at once and prepares nothing, so a program that does not await never pays),
    and one module at a time, stopping as soon as the program arrives, so a program that
    arrives mid-way waits for one step at most. A program sees these modules imported, as
    after any import of its own.
    """
    if _arrived(sock, IDLE_AFTER_SECONDS):
        return
    # The compiler's path walked once, on a text of ours that is built and never run: the
    # program's own build then skips what a first call costs (about 0.2 ms, measured).
    try:
        build_program(WARM_UP_SOURCE)
    except Exception:
        pass
    if _arrived(sock, 0.0):
        return
    for name in ASYNC_MODULES:
        try:
            __import__(name)
        except Exception:
            return  # an interpreter without it (no ssl): the program meets that itself
        if _arrived(sock, 0.0):
            return


def _arrived(sock, wait):
    """Whether the host has sent something (or closed the channel) within ``wait`` seconds."""
    sock.settimeout(wait)
    try:
        sock.recv(1, _socket.MSG_PEEK)
        return True  # a frame, or b"" at the end: either way, stop preparing
    except (BlockingIOError, TimeoutError):
        return False
    except OSError:
        return True
    finally:
        sock.settimeout(None)
