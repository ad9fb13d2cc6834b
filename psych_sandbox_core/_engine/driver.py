"""The driver of one launched child: it owns the child's streams, timers and tasks.

It carries the conversation over the child's link (conversing.py: frames in, actions
performed, the program's calls served by calls_in_flight.py), supervises the child under the
wall clock and tears it down, hands a warm result back early (early_result.py), and records
what happened for the outcome functions (outcome.py, ending.py). host.py decides when a
child is launched and which program it gets.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import partial

import anyio
from anyio.abc import ByteReceiveStream

from .._bindings.call_server import CallServer
from .._output.artifact_channel import ChannelCollector
from .._output.artifacts import Collection, collection_failure
from .._output.capture import StreamCapture
from .._output.preservation import artifact_collector, collect_artifacts
from ..kit.backend import Launched
from ..kit.capabilities import ProcessesNoted, Relayed, UsageSoFar
from ..kit.exit_status import ExitStatus
from ..kit.phases import mark
from ..kit.probe_harness import ProbeHarness
from ..kit.starting import HANDSHAKE_SECONDS
from ..kit.watchers import waited
from ..result import ExecutionFailure, ExecutionResult
from . import wall_clock
from .conversation import Conversation, ProgramTerms, State
from .conversing import LinkedConversation
from .early_result import (
    EXIT_AFTER_EARLY_RESULT_SECONDS,
    EarlyDelivery,
    end_marker,
    host_walks,
    marker_for_program,
    settled_or_exited,
)
from .ending import Ending, conclude_ending
from .outcome import Happened, refusal_of
from .plan import ExecutionPlan

#: After teardown, how long the host keeps draining output a dying tree may still flush.
DRAIN_AFTER_EXIT_SECONDS = 2.0


class StartupFailed(Exception):
    """The child never connected or reported in time."""


class _CpuSpentWithHost(Exception):
    """Host work for the program (pattern searches) used up what was left of its CPU."""


class ChildDriver:
    """One launched child as the driver sees it: its link, its conversation, and what the
    host itself observed (deadlines, cancellation, connections, exit status)."""

    def __init__(self, launched: Launched, harness: ProbeHarness) -> None:
        self._launched = launched
        self._harness = harness
        # -1 where there are no POSIX ids (Windows), as the child reports its own there.
        host_uid = os.getuid() if hasattr(os, "getuid") else -1
        self.conversation = Conversation(launched.mechanisms, host_uid=host_uid)
        self._talk = LinkedConversation(self.conversation)
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
        #: The program's wall clock while it is supervised (cancel() ends it early).
        self._wall: anyio.CancelScope | None = None
        self.timed_out = False
        self.cpu_spent_with_host = False

    # ------------------------------------------------------------------ the handshake

    async def handshake(self) -> None:
        """Accept the child's connection and its report (the conversation grades it).
        Raises StartupFailed on a deadline."""
        talk = self._talk
        try:
            with anyio.fail_after(HANDSHAKE_SECONDS):
                await talk.connect(self._launched.channel)
            mark("connected")
        except TimeoutError:
            raise StartupFailed(
                f"the sandboxed interpreter did not connect within {HANDSHAKE_SECONDS:g} s"
            ) from None
        try:
            with anyio.fail_after(HANDSHAKE_SECONDS):
                far = self._launched.host_uid if isinstance(self._launched, Relayed) else None
                actions = await talk.next((self._launched.mechanisms, far))
        except TimeoutError:
            await talk.close()
            raise StartupFailed(
                f"the sandboxed interpreter did not report within {HANDSHAKE_SECONDS:g} s"
            ) from None
        except BaseException:
            await talk.close()
            raise
        await talk.perform(actions)
        mark("hello")

    async def close_link(self) -> None:
        await self._talk.close()

    # ------------------------------------------------------------------ one program

    async def run(
        self,
        plan: ExecutionPlan,
        started: float,
        on_early_result: Callable[[ExecutionResult], None] | None = None,
    ) -> None:
        """Give the child its program (the handshake first if not done) and supervise it to
        its end; with ``on_early_result``, a result final before the teardown is handed to
        it: one complete before the child's exit, or a timeout once the whole tree was seen
        ended (see docs/architecture.md, early results)."""
        launched = self._launched
        marker = None if on_early_result is None else end_marker(launched)
        encoded = None if marker is None else marker.encode("ascii")
        relay = plan.relay
        self._stdout = StreamCapture(
            plan.limits.stdout_bytes, encoded, None if relay is None else relay.listener("stdout")
        )
        self._stderr = StreamCapture(
            plan.limits.stderr_bytes, encoded, None if relay is None else relay.listener("stderr")
        )
        early: EarlyDelivery | None = None
        if marker is not None and on_early_result is not None:
            deliver_to = on_early_result

            async def deliver() -> None:
                self.account_connections()
                collection = self._collection or self._channel_collection()
                result = await conclude_ending(
                    self._ending(plan, started, collection, _usage_so_far(launched))
                )
                self._hand_back(result, deliver_to)

            early = EarlyDelivery(marker, deliver)
        self._status = await self._supervise(plan, early)
        if self._delivered is not None:
            return
        if self.conversation.ran:
            self._collection = self._channel_collection()
            if self._collection is None:
                # The program has ended and its workspace still exists: collect now.
                self._collection = await _collected(plan, launched.workspace_path)
        if on_early_result is not None and self.timed_out and self._status.tree_ended:
            # A timeout is final once the host saw the whole tree end: handed back now, as a
            # warm result is, and the launch's teardown finishes after it.
            self.account_connections()
            with anyio.CancelScope(shield=True):
                result = await self.conclude(plan, started)
            self._hand_back(result, on_early_result)
            mark("result handed back")

    async def _supervise(self, plan: ExecutionPlan, early: EarlyDelivery | None) -> ExitStatus:
        launched = self._launched
        assert self._stdout is not None and self._stderr is not None
        drained = [anyio.Event(), anyio.Event()]
        # Set when a stream's end marker went by or the stream ended, whichever came first.
        settled = [anyio.Event(), anyio.Event()]
        async with anyio.create_task_group() as drains:
            drains.start_soon(_drain, self._stdout, launched.stdout, drained[0], settled[0])
            drains.start_soon(_drain, self._stderr, launched.stderr, drained[1], settled[1])
            wall_seconds = plan.limits.wall_seconds
            # The deadline is the loop's (it ends the execution) and, struck on time whatever
            # the loop is busy with, the wall clock thread's (it starts the termination).
            strike = wall_clock.arm(wall_seconds, launched.terminate_from_thread)
            try:
                with anyio.move_on_after(wall_seconds) as wall:
                    self._wall = wall
                    if plan.cancel is not None:
                        drains.start_soon(self._watch_cancel, plan.cancel)

                    def program_given() -> None:
                        # The program's own wall clock starts as it is given to the child:
                        # a cold child's launch and handshake (slow under load) do not
                        # count against it, only against the first deadline. Unless that
                        # deadline was struck already (the child is being terminated): a
                        # loop late to its own timer must not move it then.
                        if strike.move(wall_seconds):
                            wall.deadline = anyio.current_time() + wall_seconds

                    try:
                        await self._converse(
                            plan, None if early is None else early.marker, program_given
                        )
                    except StartupFailed as exc:
                        self.startup_failure = str(exc)
                    except _CpuSpentWithHost:
                        self.cpu_spent_with_host = True
                        await launched.terminate(plan.limits.grace_seconds)
                    else:
                        if self.conversation.state is State.VIOLATED:
                            pass  # killed by the teardown below
                        elif early is not None and await self._complete_before_exit(plan, settled):
                            self._seen_late(wall)
                            with anyio.CancelScope(shield=True):
                                await early.deliver()
                            mark("result handed back")
                            # The caller's turn first: its wake-up was queued as the result
                            # was handed back, and what follows would run ahead of it.
                            await anyio.lowlevel.cancel_shielded_checkpoint()
                            # The child exits right after its result; one that does not has
                            # nothing left to say and is killed by the teardown below.
                            with anyio.move_on_after(EXIT_AFTER_EARLY_RESULT_SECONDS):
                                await launched.wait_exited()
                        else:
                            await launched.wait_exited()
                            mark("exited")
                self._wall = None
                if wall.cancelled_caught:
                    self.timed_out = not self.cancelled
                    await launched.terminate(plan.limits.grace_seconds)
                else:
                    self._seen_late(wall)
            finally:
                strike.disarm()
                with anyio.CancelScope(shield=True):
                    status = await launched.finish()
                    mark("reaped")
                    if status.tree_ended is False:
                        self.conversation.tree_not_seen_ended()
                    # Every process is gone; what they wrote is flushed. Bound the wait
                    # anyway: a descendant that escaped the tree must not hold the host.
                    with anyio.move_on_after(DRAIN_AFTER_EXIT_SECONDS):
                        for event in drained:
                            if not event.is_set():  # (waiting on a set one yields a turn)
                                await event.wait()
                        await self._talk.nothing_after_result()
                    mark("streams drained")
                    if isinstance(launched, Relayed):
                        self._stdout.passed_unseen(*launched.unrelayed("stdout"))
                        self._stderr.passed_unseen(*launched.unrelayed("stderr"))
                    drains.cancel_scope.cancel()
                    await self._talk.release_held()
        return status

    async def _converse(
        self, plan: ExecutionPlan, end_marker: str | None, program_given: Callable[[], None]
    ) -> None:
        conversation = self.conversation
        try:
            if conversation.state is State.AWAITING_HELLO:
                await self.handshake()
            if conversation.state is not State.GRADED:
                return
            if self._harness.connections:
                conversation.network_reached()
            terms, calls = self._terms(plan, marker_for_program(self._launched, plan, end_marker))
            program_given()
            cpu_spent = await self._talk.program(terms, calls)
            mark("result frame")
            if cpu_spent:
                raise _CpuSpentWithHost()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            conversation.receive(None)  # the child went away; its exit status says how
        finally:
            await self.close_link()

    def _terms(
        self, plan: ExecutionPlan, end_marker: str | None
    ) -> tuple[ProgramTerms, CallServer]:
        calls = plan.calls if plan.calls is not None else CallServer(None, [])
        wanted = artifact_collector(plan.output, self._launched.workspace_path)
        terms = ProgramTerms(
            program=plan.program,
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
            # The launch's reading, not a method of this driver: the call server outlives the
            # execution in its record, and a reference back here would make the execution's
            # whole state a cycle, left for the garbage collector's pauses to free.
            calls.work.bind(
                plan.limits.cpu_seconds,
                plan.limits.memory_bytes,
                partial(_program_cpu, self._launched),
            )
            # Fixed before the program can run: anything counted beyond this came from it.
            # The child's own report is taken too, since the count may lag its probe's.
            self._probe_connections = max(
                self._harness.connections, self.conversation.reported_connections()
            )
            if isinstance(wanted, Collection):
                self._collection_refused = wanted
        return terms, calls

    async def _watch_cancel(self, event: anyio.Event) -> None:
        # Cancelled when the execution ends uncancelled, which must not leave this driver to
        # the garbage collector (watchers.py).
        if await waited(event.wait):
            self.cancel()

    def _hand_back(self, result: ExecutionResult, to: Callable[[ExecutionResult], None]) -> None:
        """Hand ``result`` back ahead of the teardown: the launch learns it first (a leased
        identity is then on its way back), before the caller can go on and lease again."""
        self._delivered = result
        self._launched.handed_back()
        to(result)

    def cancel(self) -> None:
        """End the execution as cancelled, as a set cancel event does (from the task of a
        caller that went away: no task waits on an event for it). Nothing once it is over."""
        if self._status is not None:
            return
        self.cancelled = True
        if self._wall is not None:
            self._wall.cancel()

    def _seen_late(self, wall: anyio.CancelScope) -> None:
        """An end the host saw only after the deadline is a timeout all the same: the
        deadline fires at the loop's next turn, and the program's last frames may have been
        read first."""
        if anyio.current_time() >= wall.deadline:
            self.timed_out = not self.cancelled

    # ------------------------------------------------------------------ after the result

    async def _complete_before_exit(self, plan: ExecutionPlan, settled: list[anyio.Event]) -> bool:
        """Whether the program's output and result are complete before the child's exit was
        even reported: a result frame, nothing wrong so far, and both end markers seen."""
        conversation = self.conversation
        assert self._stdout is not None and self._stderr is not None
        if conversation.result is None or conversation.violation is not None or self.cancelled:
            return False
        await settled_or_exited(settled, self._launched)
        if not (self._stdout.marker_seen and self._stderr.marker_seen):
            return False
        launched = self._launched
        walks = host_walks(launched, plan)
        if walks and not (
            isinstance(launched, ProcessesNoted) and launched.only_processes_from_before()
        ):
            return False  # something the program started may still write its files
        # A collecting run: its channel is read to its end (the child shuts it for writing
        # after its result) before anything it sent counts, as in the teardown.
        await self._talk.nothing_after_result()
        await self._talk.release_held()
        if conversation.violation is not None:
            return False
        if walks:
            # The program has ended and nothing of it is left: its files are final.
            self._collection = await _collected(plan, launched.workspace_path)
        return True

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
        elsewhere = self._launched
        seen = self._harness.connections + (
            elsewhere.connections_elsewhere() if isinstance(elsewhere, Relayed) else 0
        )
        if seen:
            # Host-side evidence outranks anything the child said about itself.
            self.conversation.network_reached()
        if self.conversation.ran:
            self._connections_during_run = max(0, seen - self._probe_connections)

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


async def _collected(plan: ExecutionPlan, workspace: str | None) -> Collection | None:
    """The workspace's artifacts (collect_artifacts): in a worker thread, since a program can
    leave many files, except for an empty workspace, which has nothing to walk."""
    if workspace is not None and _empty_directory(workspace):
        return collect_artifacts(plan.output, workspace, empty=True)
    return await anyio.to_thread.run_sync(collect_artifacts, plan.output, workspace)


def _empty_directory(path: str) -> bool:
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False


async def _drain(
    capture: StreamCapture, stream: ByteReceiveStream, done: anyio.Event, marked: anyio.Event
) -> None:
    try:
        await capture.drain(stream, marked)
    finally:
        marked.set()
        done.set()


def _program_cpu(launched: Launched) -> float | None:
    usage = _usage_so_far(launched)
    return None if usage is None else usage[0]


def _usage_so_far(launched: Launched) -> tuple[float | None, int | None] | None:
    return launched.usage_so_far() if isinstance(launched, UsageSoFar) else None
