"""Budgets on a program's binding calls, owned by the deployment profile.

A program compresses model turns; it must not also compress the host's work. Every binding
call is counted and measured against these numbers, on the host, around the provider
callback (so every backend, remote included, gets them). A tenant policy may narrow a budget
with :meth:`BindingBudgets.narrowed`; nothing a request carries can raise it.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .protocol.limits import (
    JSON_STRING_ESCAPE_FACTOR,
    MAX_CHILD_FRAME_BYTES,
    MAX_HOST_FRAME_BYTES,
    RESULT_FRAME_OVERHEAD_BYTES,
)

KiB = 1024
MiB = 1024 * KiB

Positive = Annotated[int, Field(gt=0)]

#: Largest per-call result a reply frame can carry: the value travels as JSON text inside a
#: JSON string, so escaping may grow it by the escape factor.
MAX_RESULT_BYTES_PER_CALL = (
    MAX_HOST_FRAME_BYTES - RESULT_FRAME_OVERHEAD_BYTES
) // JSON_STRING_ESCAPE_FACTOR
#: Largest argument object a call frame can carry (arguments are not string-escaped).
MAX_ARGUMENT_BYTES_PER_CALL = MAX_CHILD_FRAME_BYTES - 64 * KiB


#: Most calls in flight a profile may allow: each holds a waiter in the child and, once the
#: host answers calls concurrently, a task there.
MAX_CALLS_IN_FLIGHT = 1024


class BindingBudgets(BaseModel):
    """Per-execution and per-run ceilings on binding calls.

    The defaults contain a consumer who never thinks about them: a few thousand calls per
    execution, results up to a few megabytes whole, and a total that bounds what one
    execution can make the host move.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    #: Calls one execution may make (read_tool_output included).
    calls_per_execution: Positive = 5000
    #: Calls all executions of one run may make together, counted in the run log.
    calls_per_run: Positive = 20000
    #: Largest JSON-encoded argument object of one call.
    argument_bytes_per_call: Annotated[int, Field(gt=0, le=MAX_ARGUMENT_BYTES_PER_CALL)] = MiB
    #: Largest JSON-encoded result handed over whole; larger ones are paged by handle when a
    #: blob store is configured, refused with binding_result_not_paged otherwise.
    result_bytes_per_call: Annotated[int, Field(gt=0, le=MAX_RESULT_BYTES_PER_CALL)] = 4 * MiB
    #: Arguments plus results of all calls of one execution, plus every byte stored for it:
    #: paged results (in full, when stored; windows read from them count again as results)
    #: and its attachments (streams, return value, artifacts).
    total_bytes_per_execution: Positive = 256 * MiB
    #: Calls one execution may have in flight at once (gathered, tasks, threads); the child
    #: holds a call beyond it until a reply frees a place.
    calls_in_flight: Annotated[int, Field(gt=0, le=MAX_CALLS_IN_FLIGHT)] = 16

    @model_validator(mode="after")
    def _coherent(self) -> BindingBudgets:
        if self.calls_per_execution > self.calls_per_run:
            raise ValueError(
                f"calls_per_execution={self.calls_per_execution} exceeds "
                f"calls_per_run={self.calls_per_run}; one execution could never use it"
            )
        return self

    def narrowed(self, other: BindingBudgets) -> BindingBudgets:
        """The stricter of this budget and ``other``, field by field (never wider than either)."""
        return BindingBudgets(
            calls_per_execution=min(self.calls_per_execution, other.calls_per_execution),
            calls_per_run=min(self.calls_per_run, other.calls_per_run),
            argument_bytes_per_call=min(
                self.argument_bytes_per_call, other.argument_bytes_per_call
            ),
            result_bytes_per_call=min(self.result_bytes_per_call, other.result_bytes_per_call),
            total_bytes_per_execution=min(
                self.total_bytes_per_execution, other.total_bytes_per_execution
            ),
            calls_in_flight=min(self.calls_in_flight, other.calls_in_flight),
        )


class ExecutionMeter:
    """What one execution has spent so far. Host-side only; never trusts the child's count."""

    def __init__(self, budgets: BindingBudgets) -> None:
        self.budgets = budgets
        self.calls = 0
        self.bytes = 0
        #: Calls answered budget_exhausted; a child that keeps going long after is spamming.
        self.refused_after_exhaustion = 0

    def admit_call(self) -> str | None:
        """Count one call against the execution; the reason it may not run, if any."""
        if self.calls >= self.budgets.calls_per_execution:
            self.refused_after_exhaustion += 1
            return (
                f"this program has spent its budget of {self.budgets.calls_per_execution} "
                "binding calls per execution"
            )
        self.calls += 1
        return None

    def admit_arguments(self, size: int) -> str | None:
        if size > self.budgets.argument_bytes_per_call:
            return (
                f"the arguments are {size} bytes as JSON, over the per-call budget of "
                f"{self.budgets.argument_bytes_per_call} bytes"
            )
        return self._spend(size, "arguments")

    def admit_result(self, size: int) -> str | None:
        return self._spend(size, "result")

    def admit_stored(self, size: int, what: str = "result") -> str | None:
        """Pay for bytes about to be stored for the program (a paged result, an attachment);
        the reason they may not be, if any. Nothing is stored without this."""
        return self._spend(size, what, stored=True)

    def _spend(self, size: int, what: str, *, stored: bool = False) -> str | None:
        if self.bytes + size > self.budgets.total_bytes_per_execution:
            return (
                f"the {what} ({size} bytes) would take this execution past its budget of "
                f"{self.budgets.total_bytes_per_execution} bytes moved through bindings or "
                "stored for it" + ("; it was not stored" if stored else "")
            )
        self.bytes += size
        return None
