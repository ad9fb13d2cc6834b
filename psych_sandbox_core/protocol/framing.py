"""A child frame's kind, known from its first bytes, and the ceiling each kind has. No I/O.

Every child frame begins with its type (``{"type":"call",...``): the reader learns the kind
from the head of a line and holds the line to that kind's ceiling while it arrives, so a
call frame longer than the execution's argument budget allows is refused by its length,
before any of it is parsed. The decoder checks the parsed type against the head again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ProtocolViolation
from .limits import (
    MAX_ARTIFACT_FRAME_BYTES,
    MAX_CANCEL_FRAME_BYTES,
    MAX_CHILD_FRAME_BYTES,
    MAX_FRAME_HEAD_BYTES,
    MAX_HELLO_FRAME_BYTES,
    call_frame_ceiling,
    result_frame_ceiling,
)

#: The kinds of frame a child may send.
CHILD_FRAME_KINDS = ("hello", "call", "cancel", "result", "artifact", "artifact_skipped")

# JSON whitespace is allowed around the tokens; a frame is one line, so never a newline.
_HEAD = re.compile(rb'\{[ \t\r]*"type"[ \t\r]*:[ \t\r]*"([a-z_]{1,32})"[ \t\r]*[,}]')


@dataclass(frozen=True)
class FrameCeilings:
    """Longest frame of each kind the host reads, in bytes, newline excluded."""

    hello: int
    call: int
    result: int
    artifact: int

    @classmethod
    def for_execution(cls, *, argument_bytes: int, return_value_bytes: int) -> FrameCeilings:
        """The ceilings of one execution: calls follow its argument budget and results its
        return-value cap."""
        return cls(
            hello=MAX_HELLO_FRAME_BYTES,
            call=call_frame_ceiling(argument_bytes),
            result=result_frame_ceiling(return_value_bytes),
            artifact=MAX_ARTIFACT_FRAME_BYTES,
        )

    def of(self, kind: str) -> int:
        if kind == "cancel":
            return MAX_CANCEL_FRAME_BYTES  # an id only, whatever the terms
        if kind == "hello":
            return self.hello
        if kind == "call":
            return self.call
        if kind == "result":
            return self.result
        return self.artifact  # artifact, artifact_skipped


#: Before the program's terms are known only a hello may arrive: every kind is held to the
#: hello's ceiling (any other kind is refused once read, by the conversation).
HANDSHAKE_CEILINGS = FrameCeilings(
    hello=MAX_HELLO_FRAME_BYTES,
    call=MAX_HELLO_FRAME_BYTES,
    result=MAX_HELLO_FRAME_BYTES,
    artifact=MAX_HELLO_FRAME_BYTES,
)

#: Only the channel's absolute ceiling, for a decoder used on its own.
CHANNEL_CEILINGS = FrameCeilings(
    hello=MAX_CHILD_FRAME_BYTES,
    call=MAX_CHILD_FRAME_BYTES,
    result=MAX_CHILD_FRAME_BYTES,
    artifact=MAX_CHILD_FRAME_BYTES,
)


def frame_kind(head: bytes, *, complete: bool) -> str | None:
    """The kind of child frame whose line begins with ``head``; None while too few bytes
    have arrived to tell. ``complete`` says ``head`` is the whole line. Raises
    ProtocolViolation for a line that does not begin with the type of a child frame."""
    match = _HEAD.match(head, 0, MAX_FRAME_HEAD_BYTES)
    if match is None:
        if not complete and len(head) < MAX_FRAME_HEAD_BYTES:
            return None
        raise ProtocolViolation(
            "malformed frame from child: a frame must begin with its type "
            f'({{"type":"KIND",...}} within {MAX_FRAME_HEAD_BYTES} bytes); got {head[:32]!r}'
        )
    kind = match.group(1).decode("ascii")
    if kind not in CHILD_FRAME_KINDS:
        raise ProtocolViolation(f"malformed frame from child: a frame of type {kind!r}")
    return kind


def check_length(kind: str, length: int, ceilings: FrameCeilings) -> None:
    """Raise ProtocolViolation if a ``kind`` frame of ``length`` bytes (or more, while it
    still arrives) passes its ceiling."""
    ceiling = ceilings.of(kind)
    if length > ceiling:
        raise ProtocolViolation(
            f"a {kind} frame longer than its ceiling of {ceiling} bytes"
            + (
                " (the argument budget plus the call's envelope, CALL_FRAME_ENVELOPE_BYTES)"
                if kind == "call"
                else ""
            )
        )
