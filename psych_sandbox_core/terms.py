"""The limits of one execution, and the request an agent's spec carries.

Every field is validated strictly when it is built; an impossible combination (an output cap
no frame could carry) fails here, at configuration, never at the first affected run.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .protocol.limits import max_return_value_bytes

KiB = 1024
MiB = 1024 * KiB

Positive = Annotated[int, Field(gt=0)]
PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class ExecutionLimits(BaseModel):
    """Per-execution ceilings. Defaults are chosen so that the common case never sees them."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    #: CPU budget; the soft limit's signal is a timeout, the hard limit one second above
    #: is the backstop for a program that traps it.
    cpu_seconds: Positive = 30
    #: Wall-clock budget from spawn to exit, enforced from the host.
    wall_seconds: PositiveSeconds = 120.0
    #: Address-space cap (None leaves the inherited one).
    memory_bytes: Positive | None = 512 * MiB
    #: Largest file the program can write.
    file_size_bytes: Positive | None = 64 * MiB
    #: Most processes the program's identity may own at once.
    processes: Positive | None = 64
    #: What the host holds of each stream at all; the reader keeps draining past it.
    stdout_bytes: Positive = 64 * KiB
    stderr_bytes: Positive = 64 * KiB
    #: Largest JSON-encoded return value.
    return_value_bytes: Positive = 64 * KiB
    #: Between SIGTERM and SIGKILL at teardown.
    grace_seconds: Annotated[float, Field(ge=0, le=60, allow_inf_nan=False)] = 3.0

    @model_validator(mode="after")
    def _fits_in_a_frame(self) -> ExecutionLimits:
        ceiling = max_return_value_bytes()
        if self.return_value_bytes > ceiling:
            raise ValueError(
                f"return_value_bytes={self.return_value_bytes} cannot be carried by one "
                f"protocol frame; the largest possible is {ceiling}"
            )
        return self
