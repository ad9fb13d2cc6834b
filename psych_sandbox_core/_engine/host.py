"""Drives one execution: probe targets, launch, the child's driver, result, teardown.

A cold execution (:func:`execute`) launches its child with its program known: the handshake
runs under a first deadline of the program's wall clock (the program's own starts as it is
given, see driver.py) and every failure ends in a result. A warm one is split
in two (see pool.py): :func:`prepare` launches a child and takes it to the graded state in a
task of the caller's task group, and :meth:`PreparedChild.serve` gives it its one program.
What happens between host and child is the driver's (driver.py) and the conversation's
(conversation.py); what the ending means is the outcome's (outcome.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import anyio
from anyio.abc import TaskGroup, TaskStatus

from .._output.capture import StreamCapture
from ..child.loader import bootstrap_source
from ..errors import ErrorKind
from ..kit.backend import Backend, BackendUnavailable, Launched, LaunchRequest
from ..kit.capabilities import MemoryNow, ProcessesNoted
from ..kit.phases import mark
from ..kit.probe_harness import ProbeHarness
from ..result import ExecutionFailure, ExecutionResult
from ..terms import ExecutionLimits
from .conversation import State
from .driver import ChildDriver, StartupFailed
from .ending import Ending, conclude_ending
from .outcome import Happened
from .plan import ExecutionPlan

__all__ = [
    "ExecutionPlan",
    "NotPrepared",
    "PreparedChild",
    "bootstrap_source",
    "execute",
    "prepare",
]


async def execute(
    backend: Backend, plan: ExecutionPlan, task_group: TaskGroup | None = None
) -> ExecutionResult:
    """Run one program to a result on a fresh child (the handshake under a first deadline of
    the plan's wall clock). A program's failure is data; this does not raise for it.

    With ``task_group`` (a long-lived Sandbox's), the execution runs there and its result
    comes back as soon as it is final, which on a backend that allows it is before the
    child's teardown has finished (a result complete before the child's exit, or a timeout
    once the host saw the whole tree end); the teardown then finishes in that group,
    shielded, and closing the Sandbox awaits it. A caller cancelled before its result still
    waits for the teardown: its execution does not outlive it."""
    if task_group is None:
        return await _execute(backend, plan)
    # The caller going away sets this: the execution then ends as a cancelled one does (the
    # grace window, then the kill), and its caller returns once it is torn down.
    cancel = plan.cancel if plan.cancel is not None else anyio.Event()
    plan = dataclasses.replace(plan, cancel=cancel)
    scope = anyio.CancelScope()
    handed, finished = anyio.Event(), anyio.Event()
    outcome: list[ExecutionResult | Exception] = []

    def hand(result: ExecutionResult | Exception) -> None:
        if not handed.is_set():
            outcome.append(result)
            handed.set()

    def early(result: ExecutionResult) -> None:
        # Only teardown remains, bounded by the backend's own deadlines: closing the
        # Sandbox waits for it rather than cutting it short.
        scope.shield = True
        hand(result)

    async def in_group() -> None:
        try:
            with scope:
                hand(await _execute(backend, plan, early))
        except Exception as exc:
            # A bug reaches the caller it concerns, not every execution in the group.
            hand(exc)
        finally:
            finished.set()
            handed.set()

    task_group.start_soon(in_group)
    try:
        await handed.wait()
    except BaseException:
        # The caller went away: the execution ends with it, torn down before it returns.
        cancel.set()
        with anyio.CancelScope(shield=True):
            await finished.wait()
        raise
    if not outcome:
        raise RuntimeError("the Sandbox closed while the execution ran")
    if isinstance(outcome[0], Exception):
        raise outcome[0]
    return outcome[0]


async def _execute(
    backend: Backend,
    plan: ExecutionPlan,
    on_early_result: Callable[[ExecutionResult], None] | None = None,
) -> ExecutionResult:
    started = time.monotonic()
    mark("start")
    child: ChildDriver | None = None
    cancelled = False
    backend_failure: ExecutionFailure | None = None
    async with ProbeHarness().active() as harness:
        try:
            if plan.cancel is not None and plan.cancel.is_set():
                cancelled = True
            else:
                async with backend.launch(_launch_request(harness, plan.limits)) as launched:
                    child = ChildDriver(launched, harness)
                    await child.run(plan, started, on_early_result)
                mark("launch left")
        except BackendUnavailable as exc:
            backend_failure = ExecutionFailure.of(ErrorKind.BACKEND_NOT_READY, str(exc))
        if child is not None:
            child.account_connections()
    mark("probe targets removed")
    if child is None:
        happened = Happened(
            plan,
            grades={},
            cancelled=cancelled,
            backend_failure=backend_failure,
            wall_seconds=time.monotonic() - started,
        )
        stdout = StreamCapture(plan.limits.stdout_bytes)
        stderr = StreamCapture(plan.limits.stderr_bytes)
        return await conclude_ending(Ending(happened, stdout, stderr))
    result = await child.conclude(plan, started, backend_failure)
    mark("result")
    return result


class NotPrepared(Exception):
    """A child could not be taken to the graded state (the backend refused to start one, or
    the child died, lied or timed out before reporting). No program was given to it."""


class PreparedChild:
    """A child launched, connected and graded, waiting for its one program. Its resources
    are held by the task :func:`prepare` started; :meth:`serve` hands it the program."""

    def __init__(self, memory_bytes: int | None = None) -> None:
        #: The memory the waiting child held once graded, as measured from the host (None:
        #: its backend cannot say).
        self.memory_bytes = memory_bytes
        self._assigned = anyio.Event()
        #: The wait for the program (or the child's exit): cancelled by whoever assigns one.
        self._waiting: anyio.CancelScope | None = None
        self._done = anyio.Event()
        self._plan: ExecutionPlan | None = None
        #: The child's driver, told directly when the caller goes away.
        self._driver: ChildDriver | None = None
        self._result: ExecutionResult | None = None
        self._error: Exception | None = None

    async def serve(self, plan: ExecutionPlan) -> ExecutionResult | None:
        """Run ``plan`` on this child. None when the child was gone before it got the
        program (run it elsewhere); the result as soon as it is complete, which on a backend
        that allows it is before the child's teardown has finished."""
        if self._assigned.is_set():
            raise RuntimeError("a prepared child serves exactly one program")
        self._plan = plan
        self._assign()
        try:
            await self._done.wait()
        except BaseException:
            # The caller went away: the execution must not outlive it.
            if plan.cancel is not None:
                plan.cancel.set()
            if self._driver is not None:
                self._driver.cancel()
            raise
        if self._error is not None:
            raise self._error
        return self._result

    def discard(self) -> None:
        """Tear this child down without a program (a pool shrinking or over its budget)."""
        if not self._assigned.is_set():
            self._plan = None
            self._assign()

    def _assign(self) -> None:
        self._assigned.set()
        if self._waiting is not None:
            self._waiting.cancel()

    async def _wait_for_plan(self, launched: Launched) -> ExecutionPlan | None:
        """The program, or None if the child exits first or is discarded."""
        # The wait for the child's exit is cut short by the assignment itself (no watcher
        # task to start, cancel and wait for on the program's path).
        self._waiting = anyio.CancelScope()
        try:
            with self._waiting:
                if not self._assigned.is_set():
                    await launched.wait_exited()
                    return None  # it exited first
        finally:
            self._waiting = None
        return self._plan

    def _finish(self, result: ExecutionResult | None, error: Exception | None = None) -> None:
        if self._done.is_set():
            return  # handed back early: the teardown's own ending changes nothing
        self._result, self._error = result, error
        self._done.set()


async def prepare(
    task_group: TaskGroup,
    backend: Backend,
    launch_limits: ExecutionLimits,
    on_gone: Callable[[PreparedChild], None] = lambda child: None,
) -> PreparedChild:
    """Launch a child in ``task_group`` and return once it is graded; raises NotPrepared if
    it cannot get there. The child lives in ``task_group`` until its program was served and
    it was torn down (or it died waiting: ``on_gone`` is called whenever it stops waiting)."""
    child: PreparedChild = await task_group.start(_hold, backend, launch_limits, on_gone)
    return child


async def _hold(
    backend: Backend,
    launch_limits: ExecutionLimits,
    on_gone: Callable[[PreparedChild], None],
    *,
    task_status: TaskStatus[PreparedChild],
) -> None:
    prepared: PreparedChild | None = None
    given = False
    scope = anyio.CancelScope()

    def early(result: ExecutionResult) -> None:
        # From here on only teardown remains, bounded by the backend's own deadlines:
        # closing the Sandbox waits for it rather than cutting it (and its reads) short.
        scope.shield = True
        assert prepared is not None
        prepared._finish(result)

    # Nothing is raised across the harness's or the launch's context (a task group there
    # would wrap it): why a child was not prepared is raised once both are left.
    not_prepared: str | None = None
    plan: ExecutionPlan | None = None
    started = 0.0
    try:
        with scope:
            async with ProbeHarness().active() as harness:
                try:
                    async with backend.launch(_launch_request(harness, launch_limits)) as launched:
                        child = ChildDriver(launched, harness)
                        not_prepared = await _prepared(child)
                        if not_prepared is None:
                            # Every process of the bootstrap exists once it has reported.
                            if isinstance(launched, ProcessesNoted):
                                launched.before_program()
                            prepared = PreparedChild(
                                launched.memory_bytes_now()
                                if isinstance(launched, MemoryNow)
                                else None
                            )
                            prepared._driver = child
                            task_status.started(prepared)
                            plan = await _given(prepared, child, launched, on_gone)
                        if plan is not None:
                            given = True
                            started = time.monotonic()
                            child.cancelled = child.cancelled or (
                                plan.cancel is not None and plan.cancel.is_set()
                            )
                            await child.run(plan, started, early)
                except BackendUnavailable as exc:
                    if prepared is not None:
                        raise
                    not_prepared = str(exc)
                if plan is not None:
                    child.account_connections()
            if plan is not None:
                assert prepared is not None
                prepared._finish(await child.conclude(plan, started))
    except Exception as exc:
        if prepared is None:
            raise
        # A bug must reach the caller it concerns, not take down every other execution
        # sharing this task group; with no caller yet, the next run starts cold.
        prepared._finish(None, exc)
    finally:
        if prepared is not None and not given:
            prepared._finish(None)  # it never got the program: run it elsewhere
    if not_prepared is not None:
        raise NotPrepared(not_prepared)


async def _prepared(child: ChildDriver) -> str | None:
    """Take a launched child to the graded state; why it could not get there, or None."""
    try:
        await child.handshake()
    except StartupFailed as exc:
        return str(exc)
    state = child.conversation.state
    if state is not State.GRADED:
        return child.conversation.violation or f"the child ended in the {state.value} state"
    return None


async def _given(
    prepared: PreparedChild,
    child: ChildDriver,
    launched: Launched,
    on_gone: Callable[[PreparedChild], None],
) -> ExecutionPlan | None:
    """The program a prepared child is given, or None if it died waiting or was discarded."""
    plan: ExecutionPlan | None = None
    try:
        plan = await prepared._wait_for_plan(launched)
    finally:
        on_gone(prepared)
        if plan is None:
            # Also when the wait was cancelled (the Sandbox closing): the link is the core's
            # to close, whatever the launch's teardown closes of its own.
            with anyio.CancelScope(shield=True):
                await child.close_link()
    return plan


def _launch_request(harness: ProbeHarness, limits: ExecutionLimits) -> LaunchRequest:
    return LaunchRequest(
        bootstrap_source=bootstrap_source(),
        targets=harness.made,
        limits=limits,
        runs_as=harness.attribute_to,
    )
