"""One execution's binding calls while its program runs: several in flight at once.

The driver hands each call frame here as it reads it and goes on reading. A call is
accepted in the order the program made it (call_server.CallServer.accept: the id must be the
exact successor of the last, the call and argument budgets and the run log are charged in
that order), then served in a task of its own, so a slow tool holds neither the channel nor
the calls after it. Replies go out as tools finish, one writer at a time on the link; the
result budget is therefore charged in the order replies go out.

A call is in flight from its acceptance until its reply starts to be written. The child
frees a place only when it reads a reply, so it never has more in flight than the host
counts; a child with more than the run frame's limit ignored the limit, and that is a
protocol violation (a hostile child cannot make the host run unbounded tasks).

A cancel frame cancels one call's tool, which is then answered as ``cancelled``; a cancel
that races the reply is answered by that reply (exactly one reply per id). When the program
ends (its files or result arrive, a violation, the channel's end) or the execution does (the
wall clock, a cancellation), every call still in flight is cancelled and recorded as such.

Reading is a role, not a task. A call made while no other is in flight (a program awaiting
its calls one by one) is served by the task that read it, so its reply goes out in the same
turn of the event loop; if that serving suspends (the tool waits), a standby worker is woken
as it does and takes over the reading, so the next frames (a cancel, more calls) are read
meanwhile and concurrency is what it was. A tool that answers without waiting costs no other
task a turn. Whoever finishes serving while another reads becomes a worker.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
from anyio.abc import TaskGroup

from .._bindings.call_server import AcceptedCall, CallServer
from ..errors import ProtocolViolation
from ..kit.watchers import waited
from ..protocol import CallFrame
from .conversation import Action, Conversation, State
from .link import FrameLink
from .suspension import watching

#: Calls in flight when the run frame names no limit (the child's default).
DEFAULT_CALLS_IN_FLIGHT = 16


class CallsInFlight:
    """The calls of one running program: accepted in order, served concurrently."""

    def __init__(
        self,
        calls: CallServer,
        link: FrameLink,
        conversation: Conversation,
        tasks: TaskGroup,
        limit: int | None,
    ) -> None:
        self._calls = calls
        self._link = link
        self._conversation = conversation
        self._tasks = tasks
        self._limit = limit or DEFAULT_CALLS_IN_FLIGHT
        #: Each call in flight's id and the scope its tool runs in.
        self._flying: dict[int, anyio.CancelScope] = {}
        #: Calls accepted whose record is not closed yet (see close_unfinished).
        self._unfinished: dict[int, AcceptedCall] = {}
        #: Ids the child cancelled: one cancel per call, so this is bounded by the calls.
        self._cancelled: set[int] = set()
        # One reply at a time: a reply's writing waits only while the socket is full.
        self._writing = anyio.Lock()
        # Calls go to workers that stay for the execution: a task started per call, or a
        # queue that passes through the event loop, would cost a single call's round trip
        # more than the rest of the host's work for it.
        self._pending: deque[tuple[AcceptedCall, anyio.CancelScope]] = deque()
        #: How to wake each idle worker. Every call queued wakes one or starts one, so
        #: there are never more workers than calls were in flight at once (the limit, and
        #: one whose reply is being written).
        self._idle: list[anyio.Event] = []
        #: The host's work for the program (pattern searches) used up its CPU limit.
        self.cpu_spent = False
        #: Reads one frame and performs its actions (see read); None until reading starts.
        self._read_one: Callable[[], Awaitable[None]] | None = None
        #: Bumped each time a standby takes the reading role: the task that read before
        #: stops reading once it is back from the call it served.
        self._generation = 0
        #: The generation of a reader serving a call, whose role a standby may take.
        self._free_role: int | None = None
        #: Set once the program's frames are read to their end, by whoever read last.
        self._read_to_end = anyio.Event()
        #: A cancel scope made ahead for the next call (see accept); each is used once.
        self._next_scope: anyio.CancelScope | None = anyio.CancelScope()
        #: Whether a worker was ever started (otherwise the task group has nothing to end).
        self.workers = False

    async def read(self, read_one: Callable[[], Awaitable[None]]) -> None:
        """Read the program's frames until the conversation stops listening: ``read_one``
        reads one and performs its actions, in whichever task holds the reading role."""
        self._read_one = read_one
        await self._reading()
        await self._read_to_end.wait()

    async def _reading(self) -> None:
        read_one = self._read_one
        assert read_one is not None
        generation = self._generation
        while self._conversation.listening:
            await read_one()
            if generation != self._generation:
                return  # a standby took the role while this task served a call
        self._read_to_end.set()

    async def accept(self, frame: CallFrame) -> list[Action]:
        """Accept the next call and start serving it; the conversation's actions for a
        violation (a forged, repeated or skipped id; more in flight than the limit)."""
        if len(self._flying) >= self._limit:
            return self._conversation.violate(
                f"call {frame.id} would be more than {self._limit} calls in flight, the "
                "run frame's limit"
            )
        try:
            call = await self._calls.accept(frame)
        except ProtocolViolation as exc:
            return self._conversation.violate(str(exc))
        scope, self._next_scope = self._next_scope or anyio.CancelScope(), None
        self._flying[frame.id] = scope
        self._unfinished[frame.id] = call
        if self._read_one is not None and len(self._flying) == 1:
            # Alone in flight: served here, by the reader. Only if the serving suspends (the
            # tool waits) is a standby woken, to take over the reading while it waits (it
            # runs once this task yields, or finds the role taken back and goes idle again).
            offered = self._generation
            await watching(self._serve(call, scope), self._offer_role)
            if self._free_role == offered:
                self._free_role = None  # nobody took it: this task reads on
            if self._next_scope is None:
                # The next call's scope, made now that this reply is out: making one costs
                # about as much as entering and leaving it.
                self._next_scope = anyio.CancelScope()
            return []
        self._pending.append((call, scope))
        self._wake_worker()
        return []

    def _offer_role(self) -> None:
        """The reader's call waits: a standby may take the reading meanwhile."""
        self._free_role = self._generation
        self._wake_worker()

    def _wake_worker(self) -> None:
        if self._idle:
            self._idle.pop().set()
        else:
            self.workers = True
            self._tasks.start_soon(self._worker)

    def cancel(self, call_id: int) -> list[Action]:
        """The program stopped waiting for ``call_id``: cancel its tool (its reply says
        so). A cancel for a call already answered raced its reply and changes nothing."""
        if call_id >= self._calls.expected_id:
            return self._conversation.violate(f"a cancel for call {call_id}, which was never made")
        if call_id in self._cancelled:
            return self._conversation.violate(f"a second cancel for call {call_id}")
        self._cancelled.add(call_id)
        scope = self._flying.get(call_id)
        if scope is not None:
            scope.cancel()
        return []

    def end(self) -> None:
        """The program is over: cancel every tool still running; no reply goes out now."""
        for scope in self._flying.values():
            scope.cancel()

    async def close_unfinished(self) -> None:
        """Record as cancelled every call whose serving never began or never got to close
        its record (the execution ended first): none is left dangling in the run log."""
        for call in self._unfinished.values():
            await self._calls.close(call)
        self._unfinished.clear()

    async def _worker(self) -> None:
        while True:
            while self._pending:
                await self._serve(*self._pending.popleft())
            if self._free_role is not None:
                # The reader is still serving its call: read meanwhile, from now on.
                self._free_role = None
                self._generation += 1
                await self._reading()
                continue
            wake = anyio.Event()
            self._idle.append(wake)
            # An idle worker is cancelled with the calls' task group when the program ends,
            # and must leave nothing behind it (watchers.py).
            if not await waited(wake.wait):
                return

    async def _serve(self, call: AcceptedCall, scope: anyio.CancelScope) -> None:
        call_id = call.frame.id
        try:
            reply = await self._calls.complete(call, scope)
            del self._unfinished[call_id]
            try:
                # Taken at once when nobody writes, with no trip through the event loop.
                self._writing.acquire_nowait()
            except anyio.WouldBlock:
                await self._writing.acquire()
            try:
                if self._conversation.state is not State.RUNNING:
                    return  # the program ended: nobody reads this reply
                # No longer in flight once its reply starts out: the child may read it and
                # make its next call before this write returns.
                del self._flying[call_id]
                try:
                    await self._link.send(reply)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return  # the child went away; the reader sees the end
                self._conversation.sent(reply)
            finally:
                self._writing.release()
        finally:
            self._flying.pop(call_id, None)
        if self._calls.work.exhausted():
            # The host's work for it and its own CPU reached its CPU limit.
            self.cpu_spent = True
            self._tasks.cancel_scope.cancel()


@asynccontextmanager
async def calls_in_flight(
    calls: CallServer, link: FrameLink, conversation: Conversation, limit: int | None
) -> AsyncIterator[CallsInFlight]:
    """Serve the program's calls for as long as the body reads its frames; on the way out
    every call still in flight is cancelled (and recorded so)."""
    flight: CallsInFlight | None = None
    try:
        async with anyio.create_task_group() as tasks:
            flight = CallsInFlight(calls, link, conversation, tasks, limit)
            try:
                yield flight
            finally:
                flight.end()
                if flight.workers:
                    # (A cancel costs about 40 us, most of it the message it composes: a
                    # program that made no call, or one at a time, started no worker.)
                    tasks.cancel_scope.cancel()
    finally:
        if flight is not None:
            with anyio.CancelScope(shield=True):
                await flight.close_unfinished()
