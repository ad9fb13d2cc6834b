"""The narrowed terms of one execution, and its program, as the host driver receives them."""

from __future__ import annotations

from dataclasses import dataclass

import anyio

from .._bindings.call_server import CallServer
from .._output.preservation import OutputContext
from .._output.streaming import OutputRelay
from ..grading import Level
from ..result import BackendIdentity, ExecutionFailure
from ..terms import ExecutionLimits
from .program import Program


@dataclass(frozen=True)
class ExecutionPlan:
    """The narrowed terms of one execution (see terms.py and profiles.py)."""

    #: What the caller gave the child to run, carried unchanged to its run frame.
    program: Program
    limits: ExecutionLimits
    profile: str
    backend_identity: BackendIdentity
    #: The level the backend claimed at selection; a weaker report withholds the output.
    claimed_level: Level
    #: The lowest level this execution may run at.
    required_level: Level = Level.NONE
    #: Whether the program was granted network access.
    network_allowed: bool = False
    #: This execution's bindings: the tools offered, the provider that answers them, their
    #: budgets, run log and paging. None offers no tools.
    calls: CallServer | None = None
    #: Set from outside to cancel: the result then says cancelled (see docs/bindings.md).
    cancel: anyio.Event | None = None
    #: A refusal decided before launch (narrowing): the child is answered with abort.
    refusal: ExecutionFailure | None = None
    #: Previews, attachments and artifacts (see attachments.py); None gives previews only.
    output: OutputContext | None = None
    #: Hands the program's output to a callback while it runs (streaming.py); None: nobody.
    relay: OutputRelay | None = None
