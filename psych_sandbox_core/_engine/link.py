"""The link a driver reads a child's frames from and writes the host's frames to.

:class:`~psych_sandbox_core.kit.channel.FrameChannel` is the link over any byte stream or socket;
a transport that is not a byte stream implements :class:`FrameLink` instead.
"""

from __future__ import annotations

import socket
from typing import Protocol

from anyio.abc import ByteStream

from ..kit.channel import ChannelListener, FrameChannel
from ..protocol import ChildFrame, HostFrame
from ..protocol.framing import FrameCeilings


class FrameLink(Protocol):
    """Where the driver reads child frames and writes host frames. :class:`FrameChannel` is
    the link over any byte stream or socket (it holds each frame to ``ceilings`` while the
    frame arrives); a transport that is not a byte stream implements this instead."""

    ceilings: FrameCeilings

    async def receive(self) -> ChildFrame | None: ...

    async def send(self, frame: HostFrame) -> None: ...

    async def aclose(self) -> None: ...


async def open_link(listener: ChannelListener) -> FrameLink:
    """The link over the connection a child made to ``listener``."""
    accepted: ByteStream | socket.socket = await listener.accept()
    return FrameChannel(accepted)
