"""Work the host does on a program's behalf, limited by and charged to the program's budget.

A read_tool_output pattern search runs in a process of the host, not in the sandbox, so none
of the sandbox's own limits or measurements see it; a program could otherwise spend host CPU
without limit by asking for searches. Each search is therefore given only the CPU left of the
execution's budget (its ``cpu_seconds`` limit, less what the host already spent for it and
what the sandbox's processes have used so far, where the backend can read that live) and the
profile's memory limit. What it cost, as the kernel accounted it when the host reaped it, is
added up here and reported as ``usage.host_cpu_seconds``; when, after a binding call, the
host's share and the program's own CPU together have reached the limit, the execution ends as
a CPU timeout (host.py). Between calls only the program's own rlimit holds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


def _unknown() -> float | None:
    return None


@dataclass
class HostWork:
    """One execution's account of host-side work. Unbound (no limit) until the host binds it
    to the execution it serves."""

    #: The execution's CPU budget in seconds; None: not bound to an execution.
    cpu_limit_seconds: float | None = None
    #: Address space each helper process gets: the profile's memory limit (None: the helper's
    #: own default).
    memory_bytes: int | None = None
    #: The sandbox's own CPU seconds so far, read live from the backend; None when it cannot.
    program_cpu: Callable[[], float | None] = field(default=_unknown)
    #: CPU seconds the kernel accounted to helper processes so far.
    cpu_seconds: float = 0.0
    #: Set when a helper was stopped for having used all that was left of the budget.
    spent: bool = False

    def bind(
        self,
        cpu_limit_seconds: float,
        memory_bytes: int | None,
        program_cpu: Callable[[], float | None],
    ) -> None:
        self.cpu_limit_seconds = cpu_limit_seconds
        self.memory_bytes = memory_bytes
        self.program_cpu = program_cpu

    def charge(self, seconds: float) -> None:
        self.cpu_seconds += max(seconds, 0.0)

    def remaining_cpu(self) -> float | None:
        """CPU seconds left of the execution's budget; None when unbound."""
        if self.cpu_limit_seconds is None:
            return None
        return self.cpu_limit_seconds - self.cpu_seconds - (self.program_cpu() or 0.0)

    def exhausted(self) -> bool:
        """Whether host work has helped spend the whole budget (never before any was done)."""
        if self.spent:
            return True
        if self.cpu_seconds <= 0:
            return False
        remaining = self.remaining_cpu()
        return remaining is not None and remaining <= 0

    def spent_message(self) -> str:
        limit = self.cpu_limit_seconds or 0.0
        return (
            f"This execution's CPU budget of {limit:g} s is spent ({self.cpu_seconds:.2f} s "
            "of it by the host searching tool results on the program's behalf)"
        )
