"""Where a launch's time goes: the points of an execution the core marks, recorded with the
moment each was reached."""

from __future__ import annotations

from psych_sandbox_core.kit.phases import Marks, recording

__all__ = ["Marks", "recording"]
