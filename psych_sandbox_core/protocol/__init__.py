"""The wire protocol: frames, codec and limits. Free of I/O."""

from .codec import decode_child_frame, decode_host_frame, encode_host_frame
from .frames import (
    AbortFrame,
    ArtifactFrame,
    ArtifactRequest,
    ArtifactSkippedFrame,
    CallFrame,
    CancelFrame,
    ChildFrame,
    ChildLimits,
    ContainmentReport,
    HelloFrame,
    HostFrame,
    NetworkObservation,
    ProgramError,
    ReplyFrame,
    ResultFrame,
    RLimitObservation,
    RunFrame,
)
from .limits import PROTOCOL_VERSION

__all__ = [
    "PROTOCOL_VERSION",
    "AbortFrame",
    "ArtifactFrame",
    "ArtifactRequest",
    "ArtifactSkippedFrame",
    "CallFrame",
    "CancelFrame",
    "ChildFrame",
    "ChildLimits",
    "ContainmentReport",
    "HelloFrame",
    "HostFrame",
    "NetworkObservation",
    "ProgramError",
    "RLimitObservation",
    "ReplyFrame",
    "ResultFrame",
    "RunFrame",
    "decode_child_frame",
    "decode_host_frame",
    "encode_host_frame",
]
