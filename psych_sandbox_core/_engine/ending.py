"""How an execution ends: what happened, classified, its output preserved, assembled."""

from __future__ import annotations

from dataclasses import dataclass

from .._bindings.call_server import CallServer
from .._output.artifacts import Collection
from .._output.capture import StreamCapture
from .._output.preservation import preserve, unavailable_failure
from ..result import ExecutionResult
from .outcome import Happened, assemble, failure_of, returned_json, withheld


@dataclass(frozen=True)
class Ending:
    """What happened, and what preserving the output needs beyond it."""

    happened: Happened
    stdout: StreamCapture
    stderr: StreamCapture
    collection: Collection | None = None
    calls: CallServer | None = None


async def conclude_ending(ending: Ending) -> ExecutionResult:
    """The result: classified, its output preserved (or withheld), assembled."""
    happened = ending.happened
    failure = failure_of(happened)
    kept = await preserve(
        happened.plan.output,
        stdout=ending.stdout,
        stderr=ending.stderr,
        value_json=returned_json(happened, failure),
        collection=ending.collection,
        withheld=withheld(failure),
        meter=None if ending.calls is None else ending.calls.meter,
    )
    if kept.unavailable is not None:
        failure = unavailable_failure(kept.unavailable, failure)
    return assemble(happened, failure, kept)
