"""The wire protocol's ceilings a test runs an execution up against."""

from __future__ import annotations

from psych_sandbox_core.protocol.limits import MAX_INPUT_BYTES

__all__ = ["MAX_INPUT_BYTES"]
