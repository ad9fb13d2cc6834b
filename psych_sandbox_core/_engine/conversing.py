"""The conversation with one child carried over its link.

Frames are read from a :class:`~psych_sandbox_core._engine.link.FrameLink`, whatever carries them
(an inherited socket, a Unix socket, a remote backend's stream), fed to the conversation
(conversation.py, no I/O), and the actions it returns are performed: frames sent, the
program's calls served (calls_in_flight.py), values decoded, ceilings narrowed, the link
closed. A collecting run's link is held past the result and read to its end once every
process is gone. The driver (driver.py) decides when each of these happens.
"""

from __future__ import annotations

from typing import Any

import anyio

from .._bindings.call_server import CallServer
from ..errors import ProtocolViolation
from ..grading import Mechanisms
from ..kit.channel import INLINE_DECODE_BYTES, ChannelListener
from ..kit.phases import mark
from ..protocol.codec import decode_value_json
from .calls_in_flight import CallsInFlight, calls_in_flight
from .conversation import (
    Action,
    Answer,
    CancelCall,
    Close,
    Conversation,
    DecodeValue,
    Narrow,
    ProgramTerms,
    Send,
    State,
)
from .link import FrameLink, open_link


class LinkedConversation:
    """One child's conversation and the link it is carried over."""

    def __init__(self, conversation: Conversation) -> None:
        self.conversation = conversation
        self._link: FrameLink | None = None
        #: A collecting run's link, kept past the result: once every process is gone it is
        #: read to its end, and a frame after the result is a protocol violation.
        self._held: FrameLink | None = None
        self._flight: CallsInFlight | None = None

    async def connect(self, listener: ChannelListener) -> None:
        self._link = await open_link(listener)

    async def next(self, applied: tuple[Mechanisms, int | None] | None = None) -> list[Action]:
        """Read the next frame and feed it to the conversation; ``applied`` is, during the
        handshake, what the backend applied and the uid of the host beside the child, as
        they stand now (graded when the report arrives)."""
        assert self._link is not None
        try:
            frame = await self._link.receive()
        except ProtocolViolation as exc:
            return self.conversation.violate(str(exc))
        if self.conversation.state is State.AWAITING_HELLO and applied is not None:
            # As they stand when the report arrives: a backend relaying a child that runs
            # elsewhere learns what was applied there, and by whom, as the child starts.
            self.conversation.mechanisms, self.conversation.far_host_uid = applied
        return self.conversation.receive(frame)

    async def program(self, terms: ProgramTerms, calls: CallServer) -> bool:
        """Give the graded child its program (or refuse it) and read its frames to their
        end, its calls served meanwhile. Whether the host's work for the program used up
        its CPU (the caller ends the child)."""
        conversation = self.conversation
        try:
            await self.perform(conversation.start(terms))
            mark("run sent")
            if not conversation.listening:
                return False
            assert self._link is not None
            async with calls_in_flight(
                calls, self._link, conversation, terms.calls_in_flight
            ) as self._flight:
                await self._flight.read(self._read_one)
            return self._flight.cpu_spent
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            conversation.receive(None)
            return False
        finally:
            self._flight = None
            if (
                self._link is not None
                and conversation.state is State.DONE
                and (conversation.collector is not None and conversation.result is not None)
            ):
                self._held, self._link = self._link, None
            await self.close()

    async def _read_one(self) -> None:
        """Read the program's next frame and perform its actions (in whichever task holds
        the reading role, see calls_in_flight.py)."""
        conversation = self.conversation
        try:
            actions = await self.next()
            await self.perform(actions)
            # Dropped before the next frame is read: a wide tree freed young is never aged
            # by the collector (see protocol/codec.py).
            del actions
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            conversation.receive(None)  # the child went away; its exit status says how
        if conversation.state is not State.RUNNING:
            assert self._flight is not None
            self._flight.end()

    async def perform(self, actions: list[Action]) -> None:
        conversation = self.conversation
        for action in actions:
            if isinstance(action, Answer):
                assert self._flight is not None
                await self.perform(await self._flight.accept(action.call))
                del action
            elif isinstance(action, CancelCall):
                assert self._flight is not None
                await self.perform(self._flight.cancel(action.frame.id))
            elif isinstance(action, Send):
                assert self._link is not None
                await self._link.send(action.frame)
                conversation.sent(action.frame)
            elif isinstance(action, Narrow):
                assert self._link is not None
                self._link.ceilings = action.ceilings
            elif isinstance(action, DecodeValue):
                try:
                    value = await _decoded(action.frame.value_json, action.cap)
                except ProtocolViolation as exc:
                    await self.perform(conversation.violate(str(exc)))
                else:
                    await self.perform(conversation.value_decoded(value))
            else:
                assert isinstance(action, Close)
                await self.close()

    async def close(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            with anyio.CancelScope(shield=True):
                await link.aclose()

    async def nothing_after_result(self) -> None:
        """Read a collecting run's channel to its end: the child shut it for writing after
        its result (or its writers are gone), so this ends at once, and any frame after the
        result is a violation (files sent late are not taken)."""
        link = self._held
        if link is None:
            return
        try:
            frame = await link.receive()
        except ProtocolViolation as exc:
            self.conversation.violate(str(exc))
            return
        if frame is not None:
            self.conversation.receive(frame)

    async def release_held(self) -> None:
        link, self._held = self._held, None
        if link is not None:
            with anyio.CancelScope(shield=True):
                await link.aclose()


async def _decoded(value_json: str | None, cap: int) -> Any:
    assert value_json is not None
    if len(value_json) > INLINE_DECODE_BYTES:
        # Off the event loop, as a large frame is (see channel.py).
        return await anyio.to_thread.run_sync(decode_value_json, value_json, cap)
    return decode_value_json(value_json, cap)
