"""Drives one execution: probe targets, launch, the child's driver, result, teardown.

One launch path: every child lives its whole life in one task (:func:`_live`) and hands its
result back one way, through its :class:`PreparedChild`. A cold execution (:func:`execute`)
is a prepared child whose program is known from the start: the handshake runs under a first
deadline of the program's wall clock (the program's own starts as it is given, see
driver.py) and every failure ends in a result. A warm one (see pool.py) is prepared ahead:
:func:`prepare` launches a child and takes it to the graded state in a task of the caller's
task group, and :meth:`PreparedChild.serve` gives it its one program.
What happens between host and child is the driver's (driver.py) and the conversation's
(conversation.py); what the ending means is the outcome's (outcome.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from functools import partial

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
    "execute",
    "prepare",
]


async def execute(
    backend: Backend, plan: ExecutionPlan, task_group: TaskGroup | None = None
) -> ExecutionResult:
    """Run one program to a result on a fresh child: a child whose program is known from the
    start, so its handshake runs under a first deadline of the plan's wall clock. A
    program's failure is data; this does not raise for it.

    With ``task_group`` (a long-lived Sandbox's), the execution runs there and its result
    comes back as soon as it is final, which on a backend that allows it is before the
    child's teardown has finished (a result complete before the child's exit, or a timeout
    once the host saw the whole tree end); the teardown then finishes in that group,
    shielded, and closing the Sandbox awaits it. A caller cancelled before its result still
    waits for the teardown: its execution does not outlive it."""
    if task_group is None:
        child = PreparedChild(plan)
        await _live(backend, plan.limits, child, early=False)
    else:
        # The caller going away sets this: the execution then ends as a cancelled one does
        # (the grace window, then the kill), its launch and handshake cut short too.
        if plan.cancel is None:
            plan = dataclasses.replace(plan, cancel=anyio.Event())
        child = PreparedChild(plan)
        task_group.start_soon(partial(_live, backend, plan.limits, child, early=True))
    result = await child.handed_back()
    if result is None:
        raise RuntimeError("the Sandbox closed while the execution ran")
    return result


class NotPrepared(Exception):
    """A child could not be taken to the graded state (the backend refused to start one, or
    the child died, lied or timed out before reporting). No program was given to it."""


class PreparedChild:
    """One child and its one program: known from the start (a cold child, see
    :func:`execute`), or given once the child is launched, connected and graded (a warm
    one, see :func:`prepare` and :meth:`serve`). The child's resources are held by the one
    task that lives its whole life (:func:`_live`); its result comes back through
    :meth:`_hand_back`, early or after the teardown, and :meth:`handed_back` waits for it."""

    def __init__(self, plan: ExecutionPlan | None = None) -> None:
        #: The memory the waiting child held once graded, as measured from the host (None:
        #: its backend cannot say, or it was never prepared ahead).
        self.memory_bytes: int | None = None
        self._assigned = anyio.Event()
        self._plan = plan
        if plan is not None:
            self._assigned.set()
        #: The wait for the program (or the child's exit): cancelled by whoever assigns one.
        self._waiting: anyio.CancelScope | None = None
        #: Set once the result (or an error, or None: no program was run) is handed back,
        #: and once the task holding the child is over (its teardown done).
        self._handed = anyio.Event()
        self._ended = anyio.Event()
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
        return await self.handed_back()

    async def handed_back(self) -> ExecutionResult | None:
        """The result once handed back (None: no program ran on this child). A caller that
        goes away first ends the execution as a cancelled one, and returns only once its
        child is torn down: the execution does not outlive it."""
        try:
            await self._handed.wait()
        except BaseException:
            plan = self._plan
            if plan is not None and plan.cancel is not None:
                plan.cancel.set()
            if self._driver is not None:
                self._driver.cancel()
            with anyio.CancelScope(shield=True):
                await self._ended.wait()
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

    def _hand_back(self, result: ExecutionResult | None, error: Exception | None = None) -> None:
        """The one way a result reaches the caller: the first one handed back counts (an
        early result; the teardown's own ending then changes nothing)."""
        if self._handed.is_set():
            return
        self._result, self._error = result, error
        self._handed.set()


async def prepare(
    task_group: TaskGroup,
    backend: Backend,
    launch_limits: ExecutionLimits,
    on_gone: Callable[[PreparedChild], None] = lambda child: None,
) -> PreparedChild:
    """Launch a child in ``task_group`` and return once it is graded; raises NotPrepared if
    it cannot get there. The child lives in ``task_group`` until its program was served and
    it was torn down (or it died waiting: ``on_gone`` is called whenever it stops waiting)."""
    child: PreparedChild = await task_group.start(
        partial(_live, backend, launch_limits, PreparedChild(), on_gone, early=True)
    )
    return child


async def _live(
    backend: Backend,
    launch_limits: ExecutionLimits,
    child: PreparedChild,
    on_gone: Callable[[PreparedChild], None] = lambda child: None,
    *,
    early: bool,
    task_status: TaskStatus[PreparedChild] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """The whole life of one child, in one task: launched; given its program (known from
    the start for a cold child, whose handshake then runs under its wall clock; for a warm
    one, once graded, reported through ``task_status`` and waited for); supervised; torn
    down. The result is handed back through ``child``, and with ``early`` before the
    teardown where the backend allows it."""
    scope = anyio.CancelScope()

    def early_result(result: ExecutionResult) -> None:
        # From here on only teardown remains, bounded by the backend's own deadlines:
        # closing the Sandbox waits for it rather than cutting it (and its reads) short.
        scope.shield = True
        child._hand_back(result)

    plan = child._plan
    cold = plan is not None
    graded = False
    driver: ChildDriver | None = None
    cancelled = False
    backend_failure: ExecutionFailure | None = None
    # Nothing is raised across the harness's or the launch's context (a task group there
    # would wrap it): why a child was not prepared is raised once both are left.
    not_prepared: str | None = None
    started = time.monotonic()
    mark("start")
    try:
        with scope:
            async with ProbeHarness().active() as harness:
                try:
                    if plan is not None and plan.cancel is not None and plan.cancel.is_set():
                        cancelled = True
                    else:
                        request = _launch_request(harness, launch_limits)
                        async with backend.launch(request) as launched:
                            driver = child._driver = ChildDriver(launched, harness)
                            if not cold:
                                not_prepared = await _prepared(driver)
                                if not_prepared is None:
                                    # Every process of the bootstrap exists once it reported.
                                    if isinstance(launched, ProcessesNoted):
                                        launched.before_program()
                                    child.memory_bytes = (
                                        launched.memory_bytes_now()
                                        if isinstance(launched, MemoryNow)
                                        else None
                                    )
                                    graded = True
                                    task_status.started(child)
                                    plan = await _given(child, driver, launched, on_gone)
                                if plan is not None:
                                    started = time.monotonic()
                                    driver.cancelled = driver.cancelled or (
                                        plan.cancel is not None and plan.cancel.is_set()
                                    )
                            if plan is not None:
                                await driver.run(plan, started, early_result if early else None)
                        mark("launch left")
                except BackendUnavailable as exc:
                    if graded:
                        raise
                    if cold:
                        backend_failure = ExecutionFailure.of(ErrorKind.BACKEND_NOT_READY, str(exc))
                    else:
                        not_prepared = str(exc)
                if plan is not None and driver is not None:
                    driver.account_connections()
            mark("probe targets removed")
            if plan is not None:
                result = await _concluded(driver, plan, started, cancelled, backend_failure)
                child._hand_back(result)
                mark("result")
    except Exception as exc:
        if not (cold or graded):
            raise
        # A bug must reach the caller it concerns, not take down every other execution
        # sharing this task group; with no caller yet, the next run starts cold.
        child._hand_back(None, exc)
    finally:
        # Never given its program (or cancelled with the Sandbox): nothing ran; run it
        # elsewhere.
        child._hand_back(None)
        child._ended.set()
    if not_prepared is not None:
        raise NotPrepared(not_prepared)


async def _concluded(
    driver: ChildDriver | None,
    plan: ExecutionPlan,
    started: float,
    cancelled: bool,
    backend_failure: ExecutionFailure | None,
) -> ExecutionResult:
    """The result of an execution whose launch is left (the one handed back early, if any)."""
    if driver is not None:
        return await driver.conclude(plan, started, backend_failure)
    # No child was ever launched: cancelled first, or the backend could not start one.
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
