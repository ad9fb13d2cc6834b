"""Encoding host frames and decoding (distrusting) child frames. No I/O."""

from __future__ import annotations

import base64
import binascii
import gc
import math
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic_core import from_json

from ..errors import ProtocolViolation
from .frames import ChildFrame, HostFrame
from .framing import CHANNEL_CEILINGS, FrameCeilings, check_length, frame_kind
from .limits import (
    MAX_CHILD_FRAME_BYTES,
    MAX_FRAME_DEPTH,
    MAX_FRAME_ELEMENTS,
    MAX_JSON_DEPTH,
    MAX_JSON_ELEMENTS,
)
from .shape import ShapeLimits, check_shape

# No string cache: nothing a child sends is worth keeping (as from_json's cache_strings).
_CHILD_FRAMES: TypeAdapter[ChildFrame] = TypeAdapter(
    ChildFrame, config=ConfigDict(cache_strings=False)
)
_HOST_FRAMES: TypeAdapter[HostFrame] = TypeAdapter(HostFrame)

#: What a whole frame, and a value it carries as JSON text, may nest and hold.
FRAME_SHAPE = ShapeLimits(
    MAX_FRAME_DEPTH, MAX_FRAME_ELEMENTS, "MAX_FRAME_DEPTH", "MAX_FRAME_ELEMENTS"
)
VALUE_SHAPE = ShapeLimits(MAX_JSON_DEPTH, MAX_JSON_ELEMENTS, "MAX_JSON_DEPTH", "MAX_JSON_ELEMENTS")


def encode_host_frame(frame: HostFrame) -> bytes:
    """One host frame as a newline-terminated JSON line."""
    # The frame's own serializer: the union's would first find which member the frame is,
    # the same bytes at several times the cost (a reply per binding call goes through here).
    return frame.__pydantic_serializer__.to_json(frame) + b"\n"


def decode_child_frame(line: bytes, ceilings: FrameCeilings = CHANNEL_CEILINGS) -> ChildFrame:
    """Rebuild one child frame from its line, or raise ProtocolViolation saying what was wrong.

    Nothing is parsed until the line's kind, length and shape are known to be within their
    limits. The caller has already bounded ``line`` while reading; this checks again so the
    codec is safe on its own.
    """
    if len(line) > MAX_CHILD_FRAME_BYTES:
        raise ProtocolViolation(
            f"child frame of {len(line)} bytes exceeds the {MAX_CHILD_FRAME_BYTES}-byte ceiling"
        )
    kind = frame_kind(line, complete=True)
    assert kind is not None
    check_length(kind, len(line), ceilings)
    check_shape(line, FRAME_SHAPE, f"a {kind} frame")
    # One pause for the parse and the validation that rebuilds the frame from it.
    with collector_paused():
        try:
            if _may_hold_non_finite(line):
                # Parsed apart from validation so no non-finite number can ride inside an
                # untyped field (a tool's arguments): NaN/Infinity literals are refused by the
                # parser, and an overflowing literal such as 1e999 (parsed as infinity) by
                # the walk.
                try:
                    parsed = from_json(line, allow_inf_nan=False, cache_strings=False)
                    _refuse_non_finite(parsed)
                except ValueError as exc:
                    raise ProtocolViolation(f"malformed frame from child: {exc}") from None
                frame = _CHILD_FRAMES.validate_python(parsed, strict=True)
            else:
                # Nothing that could parse as non-finite: parsed and validated in one pass,
                # which costs about two thirds of parsing and then validating.
                frame = _CHILD_FRAMES.validate_json(line, strict=True)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in err['loc']) or '<frame>'}: {err['msg']}"
                for err in exc.errors(include_url=False, include_input=False)[:5]
            )
            raise ProtocolViolation(f"malformed frame from child: {problems}") from None
    if frame.type != kind:
        # A second "type" key later in the line: the ceiling applied was another kind's.
        raise ProtocolViolation(
            f"malformed frame from child: it begins as {kind!r} but parses as {frame.type!r}"
        )
    return frame


def decode_value_json(text: str, cap: int) -> Any:
    """The JSON value a child's frame carries as text, under ``cap`` bytes and finite only,
    or ProtocolViolation: the honest bootstrap never sends anything else."""
    data = text.encode("utf-8", errors="surrogatepass")
    if len(data) > cap:
        raise ProtocolViolation(f"a value of {len(data)} bytes exceeds the {cap}-byte cap")
    check_shape(data, VALUE_SHAPE, "a value")
    try:
        with collector_paused():
            value = from_json(data, allow_inf_nan=False, cache_strings=False)
        _refuse_non_finite(value)
    except ValueError as exc:
        raise ProtocolViolation(f"a value in a frame is not JSON: {exc}") from None
    return value


class collector_paused:  # lower case: used like a function, ``with collector_paused():``
    """No cyclic garbage collection while the parser builds a tree (it holds the interpreter
    lock throughout, so nothing else allocates meanwhile). Each collection during the parse
    would find the half-built tree alive and age it, until a full collection walks every
    object of the process: a frame of tens of thousands of elements would then stall the
    host for tens of milliseconds. A tree that is dropped soon after (a refused call) is
    freed young. Left paused if something else paused it. A class, not a generator: it is
    entered for every frame, and a generator's context manager costs several times more."""

    __slots__ = ("_paused",)

    def __enter__(self) -> None:
        self._paused = gc.isenabled()
        if self._paused:
            gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self._paused:
            gc.enable()


#: Digits, "N" and "I" as "0"; the marks a float literal has right after a digit (".", "e",
#: "E"), and the letters after the first of NaN and Infinity ("a", "n"), as "e"; everything
#: else as " ". Every float literal, NaN and Infinity shows as "0e" in a line translated so.
_NON_FINITE_MARKS = bytes(
    48 if c in b"0123456789NI" else 101 if c in b".eEan" else 32 for c in range(256)
)
#: A line is translated a slice at a time: one call over a long line would hold the
#: interpreter lock throughout, and every other execution's clock waits on it.
_FLOAT_SCAN_BYTES = 64 * 1024


def _may_hold_non_finite(line: bytes) -> bool:
    # Integers parse exactly however long they are; only a literal with a fraction or an
    # exponent can become infinite, and NaN and Infinity are what the parser must refuse.
    # Most frames have none. Such marks inside a string also count: that costs the slower
    # decoding, never a miss.
    if len(line) <= _FLOAT_SCAN_BYTES:
        return b"0e" in line.translate(_NON_FINITE_MARKS)
    for start in range(0, len(line), _FLOAT_SCAN_BYTES):
        # One byte of overlap: a digit that ends one slice and a mark that starts the next.
        piece = line[max(0, start - 1) : start + _FLOAT_SCAN_BYTES]
        if b"0e" in piece.translate(_NON_FINITE_MARKS):
            return True
    return False


def _refuse_non_finite(value: Any) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError("non-finite number in frame")
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def decode_host_frame(line: bytes) -> HostFrame:
    """Parse a host frame (used by tests and by peers that speak the host's side)."""
    return _HOST_FRAMES.validate_json(line, strict=True)


def decode_chunk(data: str) -> bytes:
    """The bytes of an artifact chunk's base64 text, or ProtocolViolation. The frame model
    already bounded its length, so this never decodes more than one chunk."""
    if len(data) % 4:
        raise ProtocolViolation("an artifact chunk is not base64 (length not a multiple of 4)")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ProtocolViolation(f"an artifact chunk is not base64: {exc}") from None


def chunk_size_at_least(data: str) -> int:
    """The fewest bytes ``data`` can decode to (padding aside), known before decoding."""
    return max(0, len(data) // 4 * 3 - 2)
