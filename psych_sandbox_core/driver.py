"""The driver of one launched child: it owns the child's link, streams, timers and tasks.

It reads frames from a :class:`FrameLink`, whatever carries them (an inherited socket, a Unix
socket, a remote backend's stream), feeds them to the conversation (conversation.py, no I/O)
and performs the actions the conversation returns; it supervises the child under the wall
clock and tears it down; and it records what happened for the outcome functions
(outcome.py). host.py decides when a child is launched and which program it gets.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
from anyio.abc import ByteReceiveStream, ByteStream

from .artifact_channel import ChannelCollector
from .artifacts import Collection, collection_failure
from .backend import Launched
from .bindings import CallServer
from .channel import INLINE_DECODE_BYTES, ChannelListener, FrameChannel
from .conversation import (
    Action,
    Answer,
    Close,
    Conversation,
    DecodeValue,
    Narrow,
    ProgramTerms,
    Send,
    State,
)
from .errors import ProtocolViolation
from .outcome import Happened, assemble, failure_of, refusal_of, returned_json, withheld
from .output import StreamCapture
from .phases import mark
from .plan import ExecutionPlan
from .preservation import artifact_collector, collect_artifacts, preserve, unavailable_failure
from .probe_harness import ProbeHarness
from .process import ExitStatus
from .protocol import ChildFrame, HostFrame
from .protocol.codec import decode_value_json
from .protocol.framing import FrameCeilings
from .result import ExecutionFailure, ExecutionResult
from .starting import HANDSHAKE_SECONDS

#: After teardown, how long the host keeps draining output a dying tree may still flush.
DRAIN_AFTER_EXIT_SECONDS = 2.0
#: After a warm result was handed back early, how long the teardown waits for the child's
#: own exit before killing it (it exits right after its result frame).
EXIT_AFTER_EARLY_RESULT_SECONDS = 2.0


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


@dataclass(frozen=True)
class Ending:
    """What happened, and what preserving the output needs beyond it."""

    happened: Happened
    stdout: StreamCapture
    stderr: StreamCapture
    collection: Collection | None = None
    calls: CallServer | None = None


async def conclude_ending(ending: Ending) -> ExecutionResult:
    """The result: classified, its output preserved (or withheld), assembled."""
    happened = ending.happened
    failure = failure_of(happened)
    kept = await preserve(
        happened.plan.output,
        stdout=ending.stdout,
        stderr=ending.stderr,
        value_json=returned_json(happened, failure),
        collection=ending.collection,
        withheld=withheld(failure),
        meter=None if ending.calls is None else ending.calls.meter,
    )
    if kept.unavailable is not None:
        failure = unavailable_failure(kept.unavailable, failure)
    return assemble(happened, failure, kept)


class StartupFailed(Exception):
    """The child never connected or reported in time."""


class _CpuSpentWithHost(Exception):
    """Host work for the program (pattern searches) used up what was left of its CPU."""


@dataclass(frozen=True)
class _EarlyDelivery:
    """The end marker of a warm execution, and how its result is handed back early."""

    marker: str
    deliver: Callable[[], Awaitable[None]]


class ChildDriver:
    """One launched child as the driver sees it: its link, its conversation, and what the
    host itself observed (deadlines, cancellation, connections, exit status)."""

    def __init__(self, launched: Launched, harness: ProbeHarness) -> None:
        self._launched = launched
        self._harness = harness
        # -1 where there are no POSIX ids (Windows), as the child reports its own there.
        host_uid = os.getuid() if hasattr(os, "getuid") else -1
        self.conversation = Conversation(launched.mechanisms, host_uid=host_uid)
        self._link: FrameLink | None = None
        #: A collecting run's link, kept past the result: once every process is gone it is
        #: read to its end, and a frame after the result is a protocol violation.
        self._held: FrameLink | None = None
        self._calls: CallServer | None = None
        #: Listener connections accounted to the child's own probe, and those seen after it.
        self._probe_connections = 0
        self._connections_during_run = 0
        #: What stands for the artifacts when no collection could even be asked for.
        self._collection_refused: Collection | None = None
        self._collection: Collection | None = None
        self._stdout: StreamCapture | None = None
        self._stderr: StreamCapture | None = None
        self._status: ExitStatus | None = None
        self._delivered: ExecutionResult | None = None
        self.startup_failure: str | None = None
        self.cancelled = False
        self.timed_out = False
        self.cpu_spent_with_host = False

    # ------------------------------------------------------------------ the handshake

    async def handshake(self) -> None:
        """Accept the child's connection and its report (the conversation grades it).
        Raises StartupFailed on a deadline."""
        try:
            with anyio.fail_after(HANDSHAKE_SECONDS):
                self._link = await open_link(self._launched.channel)
            mark("connected")
        except TimeoutError:
            raise StartupFailed(
                f"the sandboxed interpreter did not connect within {HANDSHAKE_SECONDS:g} s"
            ) from None
        try:
            with anyio.fail_after(HANDSHAKE_SECONDS):
                actions = await self._next()
        except TimeoutError:
            await self.close_link()
            raise StartupFailed(
                f"the sandboxed interpreter did not report within {HANDSHAKE_SECONDS:g} s"
            ) from None
        except BaseException:
            await self.close_link()
            raise
        await self._perform(actions)
        mark("hello")

    async def _next(self) -> list[Action]:
        """Read the next frame and feed it to the conversation."""
        assert self._link is not None
        try:
            frame = await self._link.receive()
        except ProtocolViolation as exc:
            return self.conversation.violate(str(exc))
        if self.conversation.state is State.AWAITING_HELLO:
            # As they stand when the report arrives: a backend relaying a child that runs
            # elsewhere learns what was applied there from the report's way through.
            self.conversation.mechanisms = self._launched.mechanisms
        return self.conversation.receive(frame)

    async def close_link(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            with anyio.CancelScope(shield=True):
                await link.aclose()

    # ------------------------------------------------------------------ one program

    async def run(
        self,
        plan: ExecutionPlan,
        started: float,
        on_early_result: Callable[[ExecutionResult], None] | None = None,
    ) -> None:
        """Give the child its program (the handshake first if not done) and supervise it to
        its end; with ``on_early_result``, see docs/architecture.md (warm results)."""
        launched = self._launched
        marker: str | None = None
        if (
            on_early_result is not None
            and launched.early_result_ok
            and (plan.output is None or launched.workspace_path is None)
        ):
            # Random per execution: output cannot end a stream early by chance (a program
            # that finds and prints it only cuts its own output short).
            marker = f"<psych-sandbox-end:{secrets.token_hex(16)}>"
        encoded = None if marker is None else marker.encode("ascii")
        self._stdout = StreamCapture(plan.limits.stdout_bytes, encoded)
        self._stderr = StreamCapture(plan.limits.stderr_bytes, encoded)
        early: _EarlyDelivery | None = None
        if marker is not None and on_early_result is not None:
            deliver_to = on_early_result

            async def deliver() -> None:
                self.account_connections()
                self._delivered = await conclude_ending(
                    self._ending(plan, started, self._channel_collection(), launched.usage_so_far())
                )
                deliver_to(self._delivered)

            early = _EarlyDelivery(marker, deliver)
        self._status = await self._supervise(plan, early)
        if self._delivered is not None or not self.conversation.ran:
            return
        self._collection = self._channel_collection()
        if self._collection is None:
            # The program has ended and its workspace still exists: collect now.
            self._collection = await anyio.to_thread.run_sync(
                collect_artifacts, plan.output, launched.workspace_path
            )

    async def _supervise(self, plan: ExecutionPlan, early: _EarlyDelivery | None) -> ExitStatus:
        launched = self._launched
        assert self._stdout is not None and self._stderr is not None
        drained = [anyio.Event(), anyio.Event()]
        # Set when a stream's end marker went by or the stream ended, whichever came first.
        settled = [anyio.Event(), anyio.Event()]
        async with anyio.create_task_group() as drains:
            drains.start_soon(_drain, self._stdout, launched.stdout, drained[0], settled[0])
            drains.start_soon(_drain, self._stderr, launched.stderr, drained[1], settled[1])
            try:
                with anyio.move_on_after(plan.limits.wall_seconds) as wall:
                    if plan.cancel is not None:
                        drains.start_soon(self._watch_cancel, plan.cancel, wall)
                    try:
                        await self._converse(plan, None if early is None else early.marker)
                    except StartupFailed as exc:
                        self.startup_failure = str(exc)
                    except _CpuSpentWithHost:
                        self.cpu_spent_with_host = True
                        await launched.terminate(plan.limits.grace_seconds)
                    else:
                        if self.conversation.state is State.VIOLATED:
                            pass  # killed by the teardown below
                        elif early is not None and await self._complete_before_exit(settled):
                            self._seen_late(wall)
                            with anyio.CancelScope(shield=True):
                                await early.deliver()
                            # The child exits right after its result; one that does not has
                            # nothing left to say and is killed by the teardown below.
                            with anyio.move_on_after(EXIT_AFTER_EARLY_RESULT_SECONDS):
                                await launched.wait_exited()
                        else:
                            await launched.wait_exited()
                            mark("exited")
                if wall.cancelled_caught:
                    self.timed_out = not self.cancelled
                    await launched.terminate(plan.limits.grace_seconds)
                else:
                    self._seen_late(wall)
            finally:
                with anyio.CancelScope(shield=True):
                    status = await launched.finish()
                    mark("reaped")
                    if status.tree_ended is False:
                        self.conversation.tree_not_seen_ended()
                    # Every process is gone; what they wrote is flushed. Bound the wait
                    # anyway: a descendant that escaped the tree must not hold the host.
                    with anyio.move_on_after(DRAIN_AFTER_EXIT_SECONDS):
                        for event in drained:
                            await event.wait()
                        await self._nothing_after_result()
                    mark("streams drained")
                    drains.cancel_scope.cancel()
                    await self._release_held()
        return status

    async def _converse(self, plan: ExecutionPlan, end_marker: str | None) -> None:
        conversation = self.conversation
        try:
            if conversation.state is State.AWAITING_HELLO:
                await self.handshake()
            if conversation.state is not State.GRADED:
                return
            if self._harness.connections:
                conversation.network_reached()
            terms = self._terms(plan, end_marker)
            await self._perform(conversation.start(terms))
            mark("run sent")
            while conversation.listening:
                actions = await self._next()
                await self._perform(actions)
                # Dropped before the next frame is read: a wide tree freed young is never
                # aged by the collector (see protocol/codec.py).
                del actions
            mark("result frame")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            conversation.receive(None)  # the child went away; its exit status says how
        finally:
            if (
                self._link is not None
                and conversation.state is State.DONE
                and (conversation.collector is not None and conversation.result is not None)
            ):
                self._held, self._link = self._link, None
            await self.close_link()

    def _terms(self, plan: ExecutionPlan, end_marker: str | None) -> ProgramTerms:
        calls = plan.calls if plan.calls is not None else CallServer(None, [])
        wanted = artifact_collector(plan.output, self._launched.workspace_path)
        terms = ProgramTerms(
            source=plan.source,
            limits=plan.limits,
            argument_bytes=calls.budgets.argument_bytes_per_call,
            tools=calls.offered,
            catalogue=calls.catalogue(),
            calls_in_flight=calls.budgets.calls_in_flight,
            refusal=refusal_of(plan, self.conversation.grades),
            cancelled=self.cancelled,
            collector=wanted if isinstance(wanted, ChannelCollector) else None,
            end_marker=end_marker,
        )
        if not terms.refused:
            self._calls = calls
            calls.work.bind(plan.limits.cpu_seconds, plan.limits.memory_bytes, self._program_cpu)
            # Fixed before the program can run: anything counted beyond this came from it.
            # The child's own report is taken too, since the count may lag its probe's.
            self._probe_connections = max(
                self._harness.connections, self.conversation.reported_connections()
            )
            if isinstance(wanted, Collection):
                self._collection_refused = wanted
        return terms

    async def _perform(self, actions: list[Action]) -> None:
        conversation = self.conversation
        for action in actions:
            if isinstance(action, Answer):
                calls, link = self._calls, self._link
                assert calls is not None and link is not None
                try:
                    reply = await calls.answer(action.call)
                except ProtocolViolation as exc:
                    await self._perform(conversation.violate(str(exc)))
                    return
                del action
                await link.send(reply)
                conversation.sent(reply)
                if calls.work.exhausted():
                    # The host's work for it and its own CPU reached its CPU limit.
                    raise _CpuSpentWithHost()
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
                    await self._perform(conversation.violate(str(exc)))
                else:
                    await self._perform(conversation.value_decoded(value))
            else:
                assert isinstance(action, Close)
                await self.close_link()

    def _program_cpu(self) -> float | None:
        usage = self._launched.usage_so_far()
        return None if usage is None else usage[0]

    async def _watch_cancel(self, event: anyio.Event, scope: anyio.CancelScope) -> None:
        await event.wait()
        self.cancelled = True
        scope.cancel()

    def _seen_late(self, wall: anyio.CancelScope) -> None:
        """An end the host saw only after the deadline is a timeout all the same: the
        deadline fires at the loop's next turn, and the program's last frames may have been
        read first."""
        if anyio.current_time() >= wall.deadline:
            self.timed_out = not self.cancelled

    # ------------------------------------------------------------------ after the result

    async def _complete_before_exit(self, settled: list[anyio.Event]) -> bool:
        """Whether the program's output and result are complete before the child's exit was
        even reported: a result frame, nothing wrong so far, and both end markers seen."""
        conversation = self.conversation
        assert self._stdout is not None and self._stderr is not None
        if conversation.result is None or conversation.violation is not None or self.cancelled:
            return False
        async with anyio.create_task_group() as race:

            async def markers() -> None:
                for event in settled:
                    await event.wait()
                race.cancel_scope.cancel()

            async def exited() -> None:
                await self._launched.wait_exited()
                race.cancel_scope.cancel()

            race.start_soon(markers)
            race.start_soon(exited)
        if not (self._stdout.marker_seen and self._stderr.marker_seen):
            return False
        # A collecting run: its channel is read to its end (the child closes it by exiting)
        # before anything it sent counts, as in the teardown.
        await self._nothing_after_result()
        await self._release_held()
        return conversation.violation is None

    async def _nothing_after_result(self) -> None:
        """Read a collecting run's channel to its end: its writers are gone, so this ends at
        once, and any frame after the result is a violation (files sent late are not
        taken)."""
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

    async def _release_held(self) -> None:
        link, self._held = self._held, None
        if link is not None:
            with anyio.CancelScope(shield=True):
                await link.aclose()

    def _channel_collection(self) -> Collection | None:
        """What a collection over the channel produced, or None when the host walks the
        workspace itself."""
        conversation = self.conversation
        if self._collection_refused is not None:
            return self._collection_refused
        if conversation.collector is None:
            return None
        if conversation.result is None or conversation.violation is not None or self.cancelled:
            # Nothing the child sent is kept unless it got all the way to an accepted result.
            return collection_failure(conversation.collector.request.folder, "interrupted")
        return conversation.collector.collection()

    # ------------------------------------------------------------------ the ending

    def account_connections(self) -> None:
        if self._harness.connections:
            # Host-side evidence outranks anything the child said about itself.
            self.conversation.network_reached()
        if self.conversation.ran:
            self._connections_during_run = max(
                0, self._harness.connections - self._probe_connections
            )

    async def conclude(
        self, plan: ExecutionPlan, started: float, backend_failure: ExecutionFailure | None = None
    ) -> ExecutionResult:
        """The result, once the child was torn down (the one handed back early if any)."""
        if self._delivered is not None:
            return self._delivered
        status = self._status
        usage = None if status is None else (status.cpu_seconds, status.peak_memory_bytes)
        ending = self._ending(plan, started, self._collection, usage, backend_failure)
        return await conclude_ending(ending)

    def _ending(
        self,
        plan: ExecutionPlan,
        started: float,
        collection: Collection | None,
        usage: tuple[float | None, int | None] | None,
        backend_failure: ExecutionFailure | None = None,
    ) -> Ending:
        conversation, calls = self.conversation, self._calls
        happened = Happened(
            plan,
            grades=dict(conversation.grades),
            ran=conversation.ran,
            cancelled=self.cancelled,
            refusal=conversation.refusal,
            violation=conversation.violation,
            startup_failure=self.startup_failure,
            backend_failure=backend_failure,
            timed_out=self.timed_out,
            cpu_spent_with_host=self.cpu_spent_with_host,
            connections_during_run=self._connections_during_run,
            result=conversation.result,
            value=conversation.value,
            status=self._status,
            calls=[] if calls is None else calls.record,
            host_cpu_seconds=None if calls is None else calls.work.cpu_seconds,
            wall_seconds=time.monotonic() - started,
            usage=usage,
        )
        stdout = self._stdout or StreamCapture(plan.limits.stdout_bytes)
        stderr = self._stderr or StreamCapture(plan.limits.stderr_bytes)
        return Ending(happened, stdout, stderr, collection, calls)


async def _drain(
    capture: StreamCapture, stream: ByteReceiveStream, done: anyio.Event, marked: anyio.Event
) -> None:
    try:
        await capture.drain(stream, marked)
    finally:
        marked.set()
        done.set()


async def _decoded(value_json: str | None, cap: int) -> Any:
    assert value_json is not None
    if len(value_json) > INLINE_DECODE_BYTES:
        # Off the event loop, as a large frame is (see channel.py).
        return await anyio.to_thread.run_sync(decode_value_json, value_json, cap)
    return decode_value_json(value_json, cap)
