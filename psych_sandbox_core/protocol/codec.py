"""Encoding host frames and decoding (distrusting) child frames. No I/O."""

from __future__ import annotations

from pydantic import TypeAdapter, ValidationError

from ..errors import ProtocolViolation
from .frames import ChildFrame, HostFrame
from .limits import MAX_CHILD_FRAME_BYTES

_CHILD_FRAMES: TypeAdapter[ChildFrame] = TypeAdapter(ChildFrame)
_HOST_FRAMES: TypeAdapter[HostFrame] = TypeAdapter(HostFrame)


def encode_host_frame(frame: HostFrame) -> bytes:
    """One host frame as a newline-terminated JSON line."""
    return _HOST_FRAMES.dump_json(frame) + b"\n"


def decode_child_frame(line: bytes) -> ChildFrame:
    """Rebuild one child frame from its line, or raise ProtocolViolation saying what was wrong.

    The caller has already bounded ``line`` while reading; this checks again so the codec is
    safe on its own.
    """
    if len(line) > MAX_CHILD_FRAME_BYTES:
        raise ProtocolViolation(
            f"child frame of {len(line)} bytes exceeds the {MAX_CHILD_FRAME_BYTES}-byte ceiling"
        )
    try:
        return _CHILD_FRAMES.validate_json(line, strict=True)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in err['loc']) or '<frame>'}: {err['msg']}"
            for err in exc.errors(include_url=False, include_input=False)[:5]
        )
        raise ProtocolViolation(f"malformed frame from child: {problems}") from None


def decode_host_frame(line: bytes) -> HostFrame:
    """Parse a host frame (used by tests and by peers that speak the host's side)."""
    return _HOST_FRAMES.validate_json(line, strict=True)
