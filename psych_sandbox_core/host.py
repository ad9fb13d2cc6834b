"""Drives one execution: probe targets, launch, handshake, program, calls, result, teardown.

Everything the child sends is hostile. The host decides, from the child's report and its own
evidence, whether the program may run at all; only then does it send the program.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

import anyio
from anyio.abc import ByteReceiveStream, Listener, SocketStream

from .artifacts import ChannelCollector, Collection, collection_failure
from .attachments import (
    OutputContext,
    artifact_collector,
    collect_artifacts,
    preserve,
    unavailable_failure,
)
from .backend import Backend, BackendUnavailable, Launched, LaunchRequest, ProbeTargets
from .bindings import BindingProvider, CallServer, ToolSpec
from .budgets import ExecutionMeter
from .channel import INLINE_DECODE_BYTES, FrameChannel
from .child_env import child_environment as child_environment  # moved; importable here too
from .errors import ErrorKind, ProtocolViolation
from .grading import Grade, Guarantee, Level, grade, level_at_least, level_of
from .host_work import HostWork
from .output import StreamCapture
from .process import ExitStatus
from .protocol import (
    PROTOCOL_VERSION,
    AbortFrame,
    ArtifactFrame,
    ArtifactSkippedFrame,
    CallFrame,
    ChildLimits,
    HelloFrame,
    ResultFrame,
    RunFrame,
)
from .protocol.codec import decode_value_json
from .protocol.framing import FrameCeilings
from .protocol.limits import MAX_SOURCE_BYTES
from .result import BackendIdentity, ExecutionFailure, ExecutionResult, Usage
from .terms import ExecutionLimits

#: How long a child may take to connect and report before the host gives up on it. Start-up
#: of a container runtime is the slowest case we know of (a few seconds cold).
HANDSHAKE_SECONDS = 30.0
#: After teardown, how long the host keeps draining output a dying tree may still flush.
DRAIN_AFTER_EXIT_SECONDS = 2.0
#: After a warm result was handed back early, how long the teardown waits for the child's
#: own exit before killing it (it exits right after its result frame).
EXIT_AFTER_EARLY_RESULT_SECONDS = 2.0


@lru_cache(maxsize=1)
def bootstrap_source() -> str:
    """The child-side bootstrap, passed to the interpreter as ``-c`` source."""
    return resources.files(__package__).joinpath("bootstrap.py").read_text(encoding="utf-8")


@dataclass(frozen=True)
class ExecutionPlan:
    """The narrowed terms of one execution (see terms.py and profiles.py)."""

    source: str
    limits: ExecutionLimits
    profile: str
    backend_identity: BackendIdentity
    #: The level the backend claimed at selection; a weaker report withholds the output.
    claimed_level: Level
    #: The lowest level this execution may run at.
    required_level: Level = Level.NONE
    #: Whether the program was granted network access.
    network_allowed: bool = False
    tools: Sequence[str] = ()
    bindings: BindingProvider | None = None
    #: This execution's call server (budgets, run log, paging); built from tools/bindings
    #: when absent.
    calls: CallServer | None = None
    #: Set from outside to cancel: the result then says cancelled (see docs/bindings.md).
    cancel: anyio.Event | None = None
    #: A refusal decided before launch (narrowing): the child is answered with abort.
    refusal: ExecutionFailure | None = None
    #: Previews, attachments and artifacts (see attachments.py); None gives previews only.
    output: OutputContext | None = None


@dataclass
class _State:
    grades: dict[Guarantee, Grade] = field(default_factory=dict)
    refusal: ExecutionFailure | None = None
    result: ResultFrame | None = None
    #: The value the result frame returns, parsed once when it was checked.
    value: Any = None
    violation: str | None = None
    timed_out: bool = False
    ran: bool = False
    #: Listener connections accounted to the child's own probe, and those seen after it.
    probe_connections: int = 0
    connections_during_run: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)
    cancelled: bool = False
    hello: HelloFrame | None = None
    startup_failure: str | None = None
    #: Files sent over the channel, when the run frame asked the child for them.
    artifacts: ChannelCollector | None = None
    #: What stands for the artifacts when no collection could even be asked for.
    artifacts_refused: Collection | None = None
    #: The channel, kept past the result of a collecting run: once every process is gone it
    #: is read to its end, and a frame after the result is a protocol violation.
    after_result: FrameChannel | None = None
    #: The call server's accounts: host work done for the program, and its byte budget
    #: (which its attachments are paid from too).
    work: HostWork | None = None
    meter: ExecutionMeter | None = None
    #: Host work on the program's behalf and its own CPU together reached its CPU limit.
    cpu_spent_with_host: bool = False


class ProbeHarness:
    """Host-side evidence for one execution: a canary outside any workspace and loopback
    listeners on both address families that count every connection they see."""

    def __init__(self) -> None:
        self.connections = 0
        self._dir: str | None = None
        self._listeners: list[Listener[SocketStream]] = []
        self.targets: ProbeTargets | None = None

    @asynccontextmanager
    async def active(self) -> AsyncIterator[ProbeHarness]:
        self._dir = tempfile.mkdtemp(prefix="psych-canary-")
        try:
            os.chmod(self._dir, 0o755)
            canary = os.path.join(self._dir, "canary")
            with open(canary, "w") as fh:
                fh.write("psych-sandbox canary: reading this proves filesystem exposure\n")
            # World-readable on purpose: only a real filesystem boundary can hide it.
            os.chmod(canary, 0o644)
            ports: dict[str, int | None] = {"4": None, "6": None}
            async with anyio.create_task_group() as tg:
                for family, host in (("4", "127.0.0.1"), ("6", "::1")):
                    try:
                        listener: Listener[SocketStream] = await anyio.create_tcp_listener(
                            local_host=host, local_port=0, family=(
                                socket.AF_INET if family == "4" else socket.AF_INET6
                            )
                        )
                    except OSError:
                        continue  # no such address family on this host: nothing to reach
                    self._listeners.append(listener)
                    ports[family] = listener.extra(anyio.abc.SocketAttribute.local_port)
                    tg.start_soon(self._count, listener)
                self.targets = ProbeTargets(
                    canary_path=canary, port4=ports["4"], port6=ports["6"], host_pid=os.getpid()
                )
                try:
                    yield self
                finally:
                    tg.cancel_scope.cancel()
        finally:
            # Shielded: on cancellation the listeners still close and the canary is removed.
            with anyio.CancelScope(shield=True):
                for listener in self._listeners:
                    await listener.aclose()
            shutil.rmtree(self._dir, ignore_errors=True)

    async def _count(self, listener: Listener[SocketStream]) -> None:
        async def on_connection(stream: SocketStream) -> None:
            self.connections += 1
            await stream.aclose()

        try:
            await listener.serve(on_connection)
        except anyio.ClosedResourceError:
            return


async def execute(backend: Backend, plan: ExecutionPlan) -> ExecutionResult:
    """Run one program to a result. A program's failure is data; this does not raise for it."""

    async def given() -> ExecutionPlan:
        return plan

    result = await run_child(backend, plan.limits, given, known_plan=plan)
    assert result is not None  # with a known plan every path ends in a result
    return result


#: Hands over the plan once the child has connected and reported (a warm child may wait).
PlanSource = Callable[[], Awaitable["ExecutionPlan | None"]]


async def run_child(
    backend: Backend,
    launch_limits: ExecutionLimits,
    obtain_plan: PlanSource,
    *,
    known_plan: ExecutionPlan | None = None,
    on_early_result: Callable[[ExecutionResult], None] | None = None,
) -> ExecutionResult | None:
    """Launch one child and run one program in it.

    With ``known_plan`` (a cold start) the handshake happens under the plan's wall clock and
    every failure ends in a result. Without it (a warm child, see pool.py) the child first
    connects and reports, then ``obtain_plan`` waits for its program; a child that fails before
    then returns None, since no program was ever given to it.

    With ``on_early_result``, on a backend that allows it, the result is handed to it as soon
    as the program's output and result are complete (end markers on both streams and a result
    frame), and the teardown goes on afterwards; the same result is returned at the end. Any
    other ending waits for the teardown, as without it.
    """
    started = time.monotonic()
    plan = known_plan
    state = _State()
    status: ExitStatus | None = None
    failure: ExecutionFailure | None = None
    collection: Collection | None = None
    stdout: StreamCapture | None = None
    stderr: StreamCapture | None = None
    delivered: ExecutionResult | None = None
    async with ProbeHarness().active() as harness:
        assert harness.targets is not None
        request = LaunchRequest(
            bootstrap_source=bootstrap_source(),
            probe=harness.targets,
            limits=launch_limits,
        )
        try:
            if plan is not None and plan.cancel is not None and plan.cancel.is_set():
                raise _CancelledBeforeStart()
            async with backend.launch(request) as launched:
                prepared: FrameChannel | None = None
                if known_plan is None:
                    try:
                        prepared = await _handshake(launched, state, harness)
                    except (ProtocolViolation, _StartupFailed):
                        return None
                    if prepared is None:
                        return None
                    try:
                        plan = await _await_plan(obtain_plan, launched)
                    except BaseException:
                        with anyio.CancelScope(shield=True):
                            await prepared.aclose()
                        raise
                    if plan is None:
                        with anyio.CancelScope(shield=True):
                            await prepared.aclose()
                        return None
                    started = time.monotonic()
                    if plan.cancel is not None and plan.cancel.is_set():
                        state.cancelled = True
                assert plan is not None
                marker: str | None = None
                if on_early_result is not None and launched.early_result_ok and (
                    plan.output is None or launched.workspace_path is None
                ):
                    # Random per execution: output cannot end a stream early by chance (a
                    # program that finds and prints it only cuts its own output short).
                    marker = f"<psych-sandbox-end:{secrets.token_hex(16)}>"
                encoded = None if marker is None else marker.encode("ascii")
                stdout = StreamCapture(plan.limits.stdout_bytes, encoded)
                stderr = StreamCapture(plan.limits.stderr_bytes, encoded)
                early: _EarlyDelivery | None = None
                if marker is not None and on_early_result is not None:
                    early_plan, early_out, early_err = plan, stdout, stderr
                    early_launched = launched

                    async def deliver() -> None:
                        nonlocal delivered
                        _account_connections(state, harness)
                        delivered = await _build_result(
                            early_plan, state, None, None, _channel_collection(early_plan, state),
                            early_out, early_err, started, early_launched.usage_so_far(),
                        )
                        assert on_early_result is not None
                        on_early_result(delivered)

                    early = _EarlyDelivery(marker, deliver)
                status = await _supervise(
                    launched, plan, state, stdout, stderr, harness, prepared, early
                )
                if delivered is not None:
                    pass  # handed back already; what remains is teardown
                elif state.ran:
                    collection = _channel_collection(plan, state)
                if state.ran and collection is None:
                    # The program has ended and its workspace still exists: collect now.
                    collection = await anyio.to_thread.run_sync(
                        collect_artifacts, plan.output, launched.workspace_path
                    )
        except BackendUnavailable as exc:
            if known_plan is None:
                return None
            failure = ExecutionFailure.of(ErrorKind.BACKEND_NOT_READY, str(exc))
        except _CancelledBeforeStart:
            state.cancelled = True
        if delivered is not None:
            return delivered
        _account_connections(state, harness)
    assert plan is not None
    if stdout is None or stderr is None:
        stdout = StreamCapture(plan.limits.stdout_bytes)
        stderr = StreamCapture(plan.limits.stderr_bytes)
    usage = None if status is None else (status.cpu_seconds, status.peak_memory_bytes)
    return await _build_result(
        plan, state, status, failure, collection, stdout, stderr, started, usage
    )


def _account_connections(state: _State, harness: ProbeHarness) -> None:
    if harness.connections and state.grades:
        # Host-side evidence outranks anything the child said about itself.
        state.grades[Guarantee.NETWORK] = Grade.UNAVAILABLE
    if state.ran:
        state.connections_during_run = max(0, harness.connections - state.probe_connections)


async def _build_result(
    plan: ExecutionPlan,
    state: _State,
    status: ExitStatus | None,
    failure: ExecutionFailure | None,
    collection: Collection | None,
    stdout: StreamCapture,
    stderr: StreamCapture,
    started: float,
    usage: tuple[float | None, int | None] | None,
) -> ExecutionResult:
    wall = time.monotonic() - started
    cpu, peak = usage if usage is not None else (None, None)
    if failure is None:
        failure = _classify(plan, state, status)
    withheld = failure is not None and failure.kind in (
        ErrorKind.ISOLATION_UNAVAILABLE,
        ErrorKind.NETWORK_NOT_ALLOWED,
    )
    value: Any = None
    value_json: str | None = None
    if failure is None and state.result is not None and state.result.value_json is not None:
        value_json = state.result.value_json
        value = state.value
    kept = await preserve(
        plan.output,
        stdout=stdout,
        stderr=stderr,
        value_json=value_json,
        collection=collection,
        withheld=withheld,
        meter=state.meter,
    )
    if kept.unavailable is not None:
        failure = unavailable_failure(kept.unavailable, failure)
        value = None
    return ExecutionResult(
        stdout=kept.stdout.text,
        stderr=kept.stderr.text,
        stdout_info=kept.stdout_info,
        stderr_info=kept.stderr_info,
        run_id=None if plan.output is None else plan.output.run_id,
        tenant=None if plan.output is None else plan.output.tenant,
        attachments=kept.attachments,
        artifacts=kept.artifacts,
        skipped_artifacts=kept.skipped,
        skipped_artifacts_unlisted=kept.skipped_unlisted,
        return_value=value,
        error=failure,
        level=level_of(state.grades).value,
        grades={g.value: state.grades[g].value for g in Guarantee if g in state.grades},
        usage=Usage(
            wall_seconds=round(wall, 6),
            cpu_seconds=cpu,
            peak_memory_bytes=peak,
            measured_by="none" if cpu is None else "host",
            host_cpu_seconds=round(state.work.cpu_seconds, 6) if state.work is not None else 0.0,
        ),
        profile=plan.profile,
        backend=plan.backend_identity,
        calls=state.calls,
    )



async def _supervise(
    launched: Launched,
    plan: ExecutionPlan,
    state: _State,
    stdout: StreamCapture,
    stderr: StreamCapture,
    harness: ProbeHarness,
    prepared: FrameChannel | None = None,
    early: _EarlyDelivery | None = None,
) -> ExitStatus:
    drained = [anyio.Event(), anyio.Event()]
    # Set when a stream's end marker went by or the stream ended, whichever came first.
    settled = [anyio.Event(), anyio.Event()]

    async def drain(
        capture: StreamCapture, stream: ByteReceiveStream, done: anyio.Event,
        marked: anyio.Event,
    ) -> None:
        try:
            await capture.drain(stream, marked)
        finally:
            marked.set()
            done.set()

    async with anyio.create_task_group() as drains:
        drains.start_soon(drain, stdout, launched.stdout, drained[0], settled[0])
        drains.start_soon(drain, stderr, launched.stderr, drained[1], settled[1])
        try:
            with anyio.move_on_after(plan.limits.wall_seconds) as wall:
                if plan.cancel is not None:
                    drains.start_soon(_watch_cancel, plan.cancel, state, wall)
                try:
                    await _converse(
                        launched, plan, state, harness, prepared,
                        None if early is None else early.marker,
                    )
                except ProtocolViolation as exc:
                    state.violation = str(exc)
                except _StartupFailed as exc:
                    state.startup_failure = str(exc)
                except _CpuSpentWithHost:
                    state.cpu_spent_with_host = True
                    await launched.terminate(plan.limits.grace_seconds)
                else:
                    if early is not None and await _complete_before_exit(
                        launched, state, stdout, stderr, settled
                    ):
                        _seen_late(wall, state)
                        with anyio.CancelScope(shield=True):
                            await early.deliver()
                        # The child exits right after its result; one that does not has
                        # nothing left to say and is killed by the teardown below.
                        with anyio.move_on_after(EXIT_AFTER_EARLY_RESULT_SECONDS):
                            await launched.wait_exited()
                    else:
                        await launched.wait_exited()
            if wall.cancelled_caught:
                state.timed_out = not state.cancelled
                await launched.terminate(plan.limits.grace_seconds)
            else:
                _seen_late(wall, state)
        finally:
            with anyio.CancelScope(shield=True):
                status = await launched.finish()
                # Every process is gone; what they wrote is flushed. Bound the wait anyway:
                # a descendant that escaped the tree must not hold the host.
                with anyio.move_on_after(DRAIN_AFTER_EXIT_SECONDS):
                    for event in drained:
                        await event.wait()
                    await _nothing_after_result(state)
                drains.cancel_scope.cancel()
                if state.after_result is not None:
                    await state.after_result.aclose()
                    state.after_result = None
    return status


def _seen_late(wall: anyio.CancelScope, state: _State) -> None:
    """An end the host saw only after the deadline is a timeout all the same: the deadline
    fires at the loop's next turn, and the program's last frames may have been read first."""
    if anyio.current_time() >= wall.deadline:
        state.timed_out = not state.cancelled


@dataclass(frozen=True)
class _EarlyDelivery:
    """The end marker of a warm execution, and how its result is handed back early."""

    marker: str
    deliver: Callable[[], Awaitable[None]]


async def _complete_before_exit(
    launched: Launched,
    state: _State,
    stdout: StreamCapture,
    stderr: StreamCapture,
    settled: list[anyio.Event],
) -> bool:
    """Whether the program's output and result are complete before the child's exit was
    even reported: a result frame, nothing wrong so far, and both end markers seen."""
    if state.result is None or state.violation is not None or state.cancelled:
        return False
    async with anyio.create_task_group() as race:

        async def markers() -> None:
            for event in settled:
                await event.wait()
            race.cancel_scope.cancel()

        async def exited() -> None:
            await launched.wait_exited()
            race.cancel_scope.cancel()

        race.start_soon(markers)
        race.start_soon(exited)
    if not (stdout.marker_seen and stderr.marker_seen):
        return False
    if state.after_result is not None:
        # A collecting run: its channel is read to its end (the child closes it by exiting)
        # before anything it sent counts, as in the teardown.
        await _nothing_after_result(state)
        channel, state.after_result = state.after_result, None
        with anyio.CancelScope(shield=True):
            await channel.aclose()
    return state.violation is None


async def _nothing_after_result(state: _State) -> None:
    """Read a collecting run's channel to its end: its writers are gone, so this ends at
    once, and any frame after the result is a violation (files sent late are not taken)."""
    channel = state.after_result
    if channel is None:
        return
    try:
        frame = await channel.receive()
    except ProtocolViolation as exc:
        state.violation = state.violation or f"after the result: {exc}"
        return
    if frame is not None:
        state.violation = state.violation or f"a frame of type {frame.type!r} after the result"


def _channel_collection(plan: ExecutionPlan, state: _State) -> Collection | None:
    """What a collection over the channel produced, or None when the host walks the
    workspace itself."""
    if state.artifacts_refused is not None:
        return state.artifacts_refused
    if state.artifacts is None:
        return None
    if state.result is None or state.violation is not None or state.cancelled:
        # Nothing the child sent is kept unless it got all the way to an accepted result.
        return collection_failure(state.artifacts.request.folder, "interrupted")
    return state.artifacts.collection()


async def _handshake(
    launched: Launched, state: _State, harness: ProbeHarness
) -> FrameChannel | None:
    """Accept the child's connection and its report; grade it. None if the child went away
    before reporting. Raises ProtocolViolation for a bad hello, _StartupFailed on a deadline."""
    try:
        with anyio.fail_after(HANDSHAKE_SECONDS):
            stream = await launched.channel.accept()
    except TimeoutError:
        raise _StartupFailed(
            f"the sandboxed interpreter did not connect within {HANDSHAKE_SECONDS:g} s"
        ) from None
    channel = FrameChannel(stream)
    try:
        try:
            with anyio.fail_after(HANDSHAKE_SECONDS):
                hello = await channel.receive()
        except TimeoutError:
            raise _StartupFailed(
                f"the sandboxed interpreter did not report within {HANDSHAKE_SECONDS:g} s"
            ) from None
        if hello is None:
            with anyio.CancelScope(shield=True):
                await channel.aclose()
            return None
        if not isinstance(hello, HelloFrame):
            raise ProtocolViolation(f"expected a hello frame first, got {hello.type!r}")
        if hello.protocol != PROTOCOL_VERSION:
            raise ProtocolViolation(
                f"child speaks protocol {hello.protocol}, host speaks {PROTOCOL_VERSION}"
            )
        state.grades = grade(launched.mechanisms, hello.report, host_uid=os.getuid())
        state.hello = hello
        return channel
    except BaseException:
        with anyio.CancelScope(shield=True):
            await channel.aclose()
        raise


async def _await_plan(obtain_plan: PlanSource, launched: Launched) -> ExecutionPlan | None:
    """Wait for a warm child's program; None if the child dies while it waits."""
    plan: ExecutionPlan | None = None
    async with anyio.create_task_group() as tg:

        async def watch_child() -> None:
            await launched.wait_exited()
            tg.cancel_scope.cancel()

        tg.start_soon(watch_child)
        plan = await obtain_plan()
        tg.cancel_scope.cancel()
    return plan


class _StartupFailed(Exception):
    """The child never connected or reported in time."""


async def _converse(
    launched: Launched,
    plan: ExecutionPlan,
    state: _State,
    harness: ProbeHarness,
    prepared: FrameChannel | None = None,
    end_marker: str | None = None,
) -> None:
    channel = prepared if prepared is not None else await _handshake(launched, state, harness)
    if channel is None:
        return
    hello = state.hello
    assert hello is not None
    try:
        if harness.connections:
            state.grades[Guarantee.NETWORK] = Grade.UNAVAILABLE
        refusal = _refusal(plan, state.grades) or _unsendable_source(plan.source)
        if state.cancelled and refusal is None:
            refusal = ExecutionFailure.of(ErrorKind.CANCELLED, "cancelled before the program ran")
        if refusal is not None:
            if not state.cancelled:
                state.refusal = refusal
            await channel.send(AbortFrame(reason=refusal.message))
            return
        calls = plan.calls
        if calls is None:
            calls = CallServer(plan.bindings, [ToolSpec(name) for name in plan.tools])
        state.work, state.meter = calls.work, calls.meter
        calls.work.bind(
            plan.limits.cpu_seconds, plan.limits.memory_bytes, lambda: _program_cpu(launched)
        )
        # Fixed before the program can run: anything counted beyond this came from it. The
        # child's own report is taken too, since the count may lag the probe's connections.
        state.probe_connections = max(harness.connections, _reported_connections(hello))
        wanted = artifact_collector(plan.output, launched.workspace_path)
        if isinstance(wanted, ChannelCollector):
            state.artifacts = wanted
        elif wanted is not None:
            state.artifacts_refused = wanted
        argument_bytes = calls.budgets.argument_bytes_per_call
        # From here on each kind of frame is held to what these terms allow it to weigh.
        channel.ceilings = FrameCeilings.for_execution(
            argument_bytes=argument_bytes, return_value_bytes=plan.limits.return_value_bytes
        )
        await channel.send(
            RunFrame(
                source=plan.source,
                tools=calls.offered,
                limits=ChildLimits(
                    cpu_seconds=plan.limits.cpu_seconds,
                    memory_bytes=plan.limits.memory_bytes,
                    file_size_bytes=plan.limits.file_size_bytes,
                    processes=plan.limits.processes,
                    return_value_bytes=plan.limits.return_value_bytes,
                    argument_bytes=argument_bytes,
                ),
                artifacts=None if state.artifacts is None else state.artifacts.request,
                end_marker=end_marker,
            )
        )
        state.ran = True
        try:
            while True:
                frame = await channel.receive()
                if frame is None:
                    return
                if isinstance(frame, CallFrame):
                    if state.artifacts is not None and state.artifacts.started:
                        raise ProtocolViolation("a call after the program's files were sent")
                    await channel.send(await calls.answer(frame))
                    # Dropped before the next frame is read: a wide tree freed young is never
                    # aged by the collector (see protocol/codec.py).
                    del frame
                    if calls.work.exhausted():
                        # The host's work for it and its own CPU reached its CPU limit.
                        raise _CpuSpentWithHost()
                elif isinstance(frame, ResultFrame):
                    if state.artifacts is not None:
                        state.artifacts.at_result()
                    state.value = await _checked_value(frame, plan.limits.return_value_bytes)
                    state.result = frame
                    if state.artifacts is not None:
                        state.after_result, channel = channel, None
                    return
                elif isinstance(frame, (ArtifactFrame, ArtifactSkippedFrame)):
                    if state.artifacts is None:
                        raise ProtocolViolation(
                            f"a frame of type {frame.type!r}, but the host asked for no files"
                        )
                    state.artifacts.receive(frame)
                else:
                    raise ProtocolViolation(f"unexpected {frame.type!r} frame after the handshake")
        finally:
            state.calls = calls.record
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        return  # the child went away; its exit status says how
    finally:
        if channel is not None:  # None: kept for _nothing_after_result
            with anyio.CancelScope(shield=True):
                await channel.aclose()


async def _checked_value(frame: ResultFrame, cap: int) -> Any:
    """The value a result frame returns (None if none), checked again: the program can write
    a result frame itself, bypassing the bootstrap's own checks."""
    if frame.outcome == "raised" and frame.error is None:
        raise ProtocolViolation("a result frame with outcome 'raised' carries no error")
    if frame.outcome != "returned" or frame.value_json is None:
        return None
    if len(frame.value_json) > INLINE_DECODE_BYTES:
        # Off the event loop, as a large frame is (see channel.py).
        return await anyio.to_thread.run_sync(decode_value_json, frame.value_json, cap)
    return decode_value_json(frame.value_json, cap)


def _reported_connections(hello: HelloFrame) -> int:
    network = hello.report.network
    return [network.ipv4, network.ipv6].count("connected")


class _CancelledBeforeStart(Exception):
    pass


class _CpuSpentWithHost(Exception):
    """Host work for the program (pattern searches) used up what was left of its CPU."""


def _program_cpu(launched: Launched) -> float | None:
    usage = launched.usage_so_far()
    return None if usage is None else usage[0]


async def _watch_cancel(event: anyio.Event, state: _State, scope: anyio.CancelScope) -> None:
    await event.wait()
    state.cancelled = True
    scope.cancel()


def _refusal(plan: ExecutionPlan, grades: dict[Guarantee, Grade]) -> ExecutionFailure | None:
    if plan.refusal is not None:
        return plan.refusal
    level = level_of(grades)
    if not plan.network_allowed and grades.get(Guarantee.NETWORK) is Grade.UNAVAILABLE and (
        level_at_least(plan.required_level, Level.ISOLATED)
    ):
        return ExecutionFailure.of(
            ErrorKind.ISOLATION_UNAVAILABLE,
            "the sandbox could not deny network access, which this execution requires",
        )
    if not level_at_least(level, plan.required_level):
        return ExecutionFailure.of(
            ErrorKind.ISOLATION_UNAVAILABLE,
            f"this execution requires the {plan.required_level.value} level but the backend "
            f"reached only {level.value} ({_weak_grades(grades)})",
        )
    if not level_at_least(level, plan.claimed_level):
        return ExecutionFailure.of(
            ErrorKind.ISOLATION_UNAVAILABLE,
            f"the backend claimed the {plan.claimed_level.value} level at selection but its "
            f"report reached only {level.value} ({_weak_grades(grades)}); not running under "
            "weaker terms",
        )
    return None


def _unsendable_source(source: str) -> ExecutionFailure | None:
    """A program text no run frame can carry: refused as data, before anything runs."""
    if len(source) > MAX_SOURCE_BYTES:
        return ExecutionFailure.of(
            ErrorKind.PROGRAM_REJECTED,
            f"the program text is {len(source)} characters; at most {MAX_SOURCE_BYTES} are "
            "accepted; nothing was run",
        )
    try:
        source.encode("utf-8")
    except UnicodeEncodeError as exc:
        return ExecutionFailure.of(
            ErrorKind.PROGRAM_REJECTED,
            f"the program text is not valid Unicode at character {exc.start} (a lone "
            "surrogate); nothing was run",
        )
    return None


def _weak_grades(grades: dict[Guarantee, Grade]) -> str:
    weak = [
        f"{g.value}={grades[g].value}" for g in Guarantee if grades.get(g) is not Grade.ENFORCED
    ]
    return ", ".join(weak) or "all enforced"


def _classify(
    plan: ExecutionPlan, state: _State, status: ExitStatus | None
) -> ExecutionFailure | None:
    if state.cancelled:
        return ExecutionFailure.of(
            ErrorKind.CANCELLED,
            "the execution was cancelled before it finished"
            + ("" if state.ran else "; the program never ran"),
        )
    if state.refusal is not None:
        return state.refusal
    if state.violation is not None:
        return ExecutionFailure.of(ErrorKind.PROTOCOL_ERROR, state.violation)
    if state.startup_failure is not None:
        return ExecutionFailure.of(ErrorKind.BACKEND_NOT_READY, state.startup_failure)
    if state.connections_during_run and not plan.network_allowed:
        # The program reached a listener while it ran, under terms that denied it network:
        # what it produced was produced under weaker terms.
        return ExecutionFailure.of(
            ErrorKind.ISOLATION_UNAVAILABLE,
            "a loopback listener the host opened for this execution saw a connection while "
            "the program ran, though network access was not granted; the output is withheld",
        )
    if state.grades and not level_at_least(level_of(state.grades), plan.claimed_level):
        # Evidence gathered while the program ran (a listener saw a connection) weakened the
        # terms after the fact: the output is withheld.
        return ExecutionFailure.of(
            ErrorKind.ISOLATION_UNAVAILABLE,
            "evidence gathered during the run showed weaker isolation than the backend "
            f"claimed ({_weak_grades(state.grades)}); the output is withheld",
        )
    if state.timed_out:
        return ExecutionFailure.of(
            ErrorKind.TIMEOUT,
            f"the program exceeded its wall-clock limit of {plan.limits.wall_seconds:g} s "
            "and was killed",
        )
    if state.cpu_spent_with_host and state.work is not None:
        return ExecutionFailure.of(
            ErrorKind.TIMEOUT,
            f"the program exceeded its CPU limit of {plan.limits.cpu_seconds} s and was "
            f"killed: {state.work.cpu_seconds:.2f} s of it were spent by the host searching "
            "tool results on its behalf (read_tool_output patterns)",
        )
    result = state.result
    if result is not None:
        if result.outcome == "returned":
            return None
        if result.outcome == "raised" and result.error is not None:
            error = result.error
            kind = ErrorKind.MEMORY_LIMIT if error.type == "MemoryError" else ErrorKind.EXCEPTION
            return ExecutionFailure.of(
                kind,
                f"{error.type}: {error.message}" if error.message else error.type,
                traceback=error.traceback,
                line=error.line,
                column=error.column,
                exception_type=error.type,
            )
        kind = ErrorKind.OUTPUT_LIMIT
        if result.outcome == "invalid_output":
            kind = ErrorKind.INVALID_OUTPUT
        return ExecutionFailure.of(kind, result.detail or result.outcome)
    if status is not None and status.failure_hint is not None:
        # The backend's runtime knows how the child ended (e.g. an OOM kill of a container).
        return ExecutionFailure.of(*status.failure_hint)
    if not state.ran:
        how = status.describe() if status is not None else "did not start"
        return ExecutionFailure.of(
            ErrorKind.WORKER_EXIT, f"the sandboxed interpreter {how} before the handshake"
        )
    if status is not None and _cpu_exhausted(status, plan.limits):
        return ExecutionFailure.of(
            ErrorKind.TIMEOUT,
            f"the program exceeded its CPU limit of {plan.limits.cpu_seconds} s and was killed",
        )
    if status is not None and status.signal == signal.SIGABRT:
        return ExecutionFailure.of(
            ErrorKind.ABORT,
            "the program aborted (SIGABRT: os.abort() or a failed assertion in native code) "
            "before returning a result",
        )
    how = status.describe() if status is not None else "ended"
    return ExecutionFailure.of(
        ErrorKind.WORKER_EXIT, f"the process running the program {how} before returning a result"
    )


def _cpu_exhausted(status: ExitStatus, limits: ExecutionLimits) -> bool:
    if status.signal == signal.SIGXCPU:
        return True
    # The hard limit's SIGKILL: the tree's CPU, or failing that wait4's lower bound, shows
    # the limit was reached.
    spent = max(status.cpu_seconds or 0.0, status.reaped_cpu_seconds or 0.0)
    return status.signal == signal.SIGKILL and spent >= limits.cpu_seconds
