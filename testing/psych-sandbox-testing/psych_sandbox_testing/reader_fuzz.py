"""The byte-level fuzzing target for the frame reader and codec.

:func:`feed_reader` is the target (for atheris, and for hypothesis on random bytes): the
bytes, cut into pieces, go through a :class:`~psych_sandbox_core.kit.channel.FrameChannel`
and the codec; only frames, the end, or ProtocolViolation may come out.
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import anyio.from_thread
from psych_sandbox_core.errors import ProtocolViolation
from psych_sandbox_core.kit.channel import FrameChannel
from psych_sandbox_core.protocol import PROTOCOL_VERSION, ResultFrame, decode_child_frame
from psych_sandbox_core.protocol.codec import decode_chunk, decode_value_json
from psych_sandbox_core.protocol.framing import FrameCeilings

from .fake_backend import _pipe
from .hostile import ARGUMENT_BYTES, RETURN_VALUE_BYTES, deep, frame_line, hello_line

# ---------------------------------------------------------------- the byte target


def _pieces(data: bytes) -> Iterator[bytes]:
    """``data`` cut where its own bytes say (so a fuzzer explores the reader's splits)."""
    position = 0
    while position < len(data):
        step = 1 + data[position] % 97
        yield data[position : position + step]
        position += step


def feed_reader(data: bytes) -> None:
    """Feed ``data`` (in pieces) through a FrameChannel under the execution's ceilings and
    decode what each frame carries as the host would: only frames, the end, or
    ProtocolViolation may come out. Anything else propagates (a finding)."""
    ceilings = FrameCeilings.for_execution(
        argument_bytes=ARGUMENT_BYTES, return_value_bytes=RETURN_VALUE_BYTES
    )

    async def run() -> None:
        child, host = _pipe()
        channel = FrameChannel(host, ceilings)
        for piece in _pieces(data):
            await child.send(piece)
        await child.send_eof()
        try:
            while (frame := await channel.receive()) is not None:
                if isinstance(frame, ResultFrame) and frame.value_json is not None:
                    decode_value_json(frame.value_json, RETURN_VALUE_BYTES)
                elif frame.type == "artifact":
                    decode_chunk(frame.data)
        except ProtocolViolation:
            pass
        finally:
            await channel.aclose()
            child.close()

    anyio.run(run)
    # The codec alone, on the whole input as one line: the same promise.
    try:
        decode_child_frame(data.replace(b"\n", b" "))
    except ProtocolViolation:
        pass


#: A call's fields without its arguments (the seeds' worst ones are given raw).
CALL_ADD = {"type": "call", "id": 0, "name": "add"}


def interesting_seeds() -> list[bytes]:
    """A corpus to start from: one honest line of each kind, and the worst shapes."""
    return [
        hello_line(PROTOCOL_VERSION) + b"\n",
        frame_line({"type": "call", "id": 0, "name": "add", "arguments": {"a": 1}}) + b"\n",
        frame_line(
            {
                "type": "result",
                "outcome": "returned",
                "value_json": "[1]",
                "error": None,
                "detail": None,
            }
        )
        + b"\n",
        frame_line({"type": "artifact", "path": "out/a", "offset": 0, "data": "QUJD", "last": True})
        + b"\n",
        frame_line(CALL_ADD, {"arguments": '{"x":' + deep(200) + "}"}),
        frame_line(CALL_ADD, {"arguments": '{"x":' + "9" * 5000 + "}"}),
    ]
