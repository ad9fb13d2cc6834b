"""What a backend that relays a child running elsewhere needs (a remote service, and the
service side that runs it): the bootstrap itself (:func:`bootstrap_source`), the canary and
listeners an execution is judged by where the child runs (:class:`ProbeHarness`), how long the
child may take to report (:data:`HANDSHAKE_SECONDS`), the protocol's frames and codec it reads,
checks or writes on the way (:data:`PROTOCOL_VERSION`, :class:`HelloFrame` and its
:class:`ContainmentReport`, :class:`RunFrame` and its :class:`ChildLimits`,
:class:`ResultFrame`, :class:`AbortFrame`, :func:`decode_child_frame`,
:func:`decode_host_frame`, :func:`encode_host_frame`) under the protocol's own ceilings
(:data:`HANDSHAKE_CEILINGS`, :data:`MAX_HELLO_FRAME_BYTES`, :data:`MAX_HOST_FRAME_BYTES`; see
protocol.md), and grading a relayed child's report as the host would (:class:`Guarantee`,
:func:`grade`, :func:`level_at_least`).

Under the kit's compatibility policy (``psych_sandbox_core.kit``).
"""

from __future__ import annotations

from ..child.loader import bootstrap_source
from ..grading import Guarantee, grade, level_at_least
from ..protocol import (
    PROTOCOL_VERSION,
    AbortFrame,
    ChildLimits,
    HelloFrame,
    RunFrame,
    decode_child_frame,
    decode_host_frame,
)
from ..protocol.codec import encode_host_frame
from ..protocol.frames import ContainmentReport, ResultFrame
from ..protocol.framing import HANDSHAKE_CEILINGS
from ..protocol.limits import MAX_HELLO_FRAME_BYTES, MAX_HOST_FRAME_BYTES
from .probe_harness import ProbeHarness
from .starting import HANDSHAKE_SECONDS

__all__ = [
    "HANDSHAKE_CEILINGS",
    "HANDSHAKE_SECONDS",
    "MAX_HELLO_FRAME_BYTES",
    "MAX_HOST_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "AbortFrame",
    "ChildLimits",
    "ContainmentReport",
    "Guarantee",
    "HelloFrame",
    "ProbeHarness",
    "ResultFrame",
    "RunFrame",
    "bootstrap_source",
    "decode_child_frame",
    "decode_host_frame",
    "encode_host_frame",
    "grade",
    "level_at_least",
]
