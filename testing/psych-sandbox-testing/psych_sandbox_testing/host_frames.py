"""The host's side of a child's frame channel, for a test that plays the host to a real
bootstrap over a connected channel: bounded frames read, host frames written."""

from __future__ import annotations

from psych_sandbox_core.kit.channel import FrameChannel

__all__ = ["FrameChannel"]
