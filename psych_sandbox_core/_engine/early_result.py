"""An execution's result handed back before its child is torn down.

A child's program ends with a result frame and a random end marker written to both of its
streams: once the result is accepted and both markers went by, output and result are
complete, and the result is handed back before the child's exit is reported and its teardown
done (see docs/architecture.md, early results), for a warm child and a cold one alike.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from ..kit.backend import Launched
from ..kit.capabilities import ProcessesNoted
from ..kit.watchers import waited
from .plan import ExecutionPlan

#: After a result was handed back early, how long the teardown waits for the child's own
#: exit before killing it (it exits right after its result frame).
EXIT_AFTER_EARLY_RESULT_SECONDS = 2.0


@dataclass(frozen=True)
class EarlyDelivery:
    """The end marker of an execution, and how its result is handed back early."""

    marker: str
    deliver: Callable[[], Awaitable[None]]


def end_marker(launched: Launched) -> str | None:
    """The end marker for an execution whose result may be handed back early, or None where
    the host must see the child end first (whether it is given to the program is decided
    once the child is graded: :func:`marker_for_program`)."""
    if not launched.early_result_ok:
        return None
    # Random per execution: output cannot end a stream early by chance (a program that finds
    # and prints it only cuts its own output short).
    return f"<psych-sandbox-end:{secrets.token_hex(16)}>"


def marker_for_program(launched: Launched, plan: ExecutionPlan, marker: str | None) -> str | None:
    """The end marker given to the program in its run frame, decided once the child is
    graded and before its program exists: where the host walks the workspace for files, only
    if the backend can tell, at the marker, that no process the program started is left to
    write there (it notes the child's processes now: every process of the bootstrap exists
    once it has reported, a cold child's too)."""
    if marker is None:
        return None
    if host_walks(launched, plan) and not (
        isinstance(launched, ProcessesNoted) and launched.before_program()
    ):
        return None
    return marker


def host_walks(launched: Launched, plan: ExecutionPlan) -> bool:
    """Whether the host collects the execution's files by walking its workspace."""
    return plan.output is not None and launched.workspace_path is not None


async def settled_or_exited(settled: list[anyio.Event], launched: Launched) -> None:
    """Return once both streams are settled (their marker went by, or they ended) or the
    child's exit is reported, whichever comes first."""
    if all(event.is_set() for event in settled):
        # The usual case (the markers go out before the result frame): no race to run.
        return
    async with anyio.create_task_group() as race:
        # The loser is cancelled, and must leave nothing behind it (watchers.py).
        async def markers() -> None:
            for event in settled:
                if not await waited(event.wait):
                    return
            race.cancel_scope.cancel()

        async def exited() -> None:
            if await waited(launched.wait_exited):
                race.cancel_scope.cancel()

        race.start_soon(markers)
        race.start_soon(exited)
