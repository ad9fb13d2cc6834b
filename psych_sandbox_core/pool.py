"""Warm children: launched, connected and graded before their program exists.

A warm child is still one fresh process per program: it is prepared ahead (spawned, probed,
handshake done) and then given exactly one program, after which it is torn down like any
other. What a run saves is the start-up of the interpreter and the sandbox around it. The
grades it carries are its own report, made by that very process. On a backend that allows
it, the result is handed back once the program's output and result are complete, and the
child's teardown finishes afterwards in this pool's task group (the Sandbox's).
"""

from __future__ import annotations

import dataclasses
from collections import deque

import anyio
from anyio.abc import TaskGroup

from .backend import Backend
from .host import ExecutionPlan, execute, run_child
from .result import ExecutionResult
from .terms import ExecutionLimits


class _Slot:
    """One prepared child waiting for its program, and the way its result comes back."""

    def __init__(self) -> None:
        self._assigned = anyio.Event()
        self._done = anyio.Event()
        self.plan: ExecutionPlan | None = None
        self.result: ExecutionResult | None = None
        self.error: BaseException | None = None
        self.abandoned = False

    async def wait_for_plan(self) -> ExecutionPlan | None:
        await self._assigned.wait()
        return self.plan

    def assign(self, plan: ExecutionPlan) -> None:
        self.plan = plan
        self._assigned.set()

    def finish(self, result: ExecutionResult | None, error: BaseException | None) -> None:
        if self._done.is_set():
            return  # handed back early: the teardown's own ending changes nothing
        self.result = result
        self.error = error
        self._done.set()

    async def wait_done(self) -> None:
        await self._done.wait()


class WarmPool:
    """Keeps ``size`` children of one backend prepared, in the caller's task group."""

    def __init__(
        self,
        backend: Backend,
        launch_limits: ExecutionLimits,
        size: int,
        task_group: TaskGroup,
    ) -> None:
        self._backend = backend
        self._limits = launch_limits
        self._size = size
        self._task_group = task_group
        self._ready: deque[_Slot] = deque()
        self._preparing = 0
        self._became_ready = anyio.Event()

    async def wait_ready(self) -> None:
        """Return once a prepared child is waiting (refilling first if none is on its way)."""
        self.refill()
        while not self._ready:
            event = self._became_ready
            await event.wait()

    def refill(self) -> None:
        """Start preparing children until ``size`` are ready or on their way."""
        while len(self._ready) + self._preparing < self._size:
            self._preparing += 1
            self._task_group.start_soon(self._serve_one)

    async def run(self, plan: ExecutionPlan) -> ExecutionResult:
        """Run ``plan`` on a prepared child, or cold when none is ready."""
        slot = self._ready.popleft() if self._ready else None
        if slot is None:
            try:
                return await execute(self._backend, plan)
            finally:
                self.refill()
        cancel = plan.cancel if plan.cancel is not None else anyio.Event()
        slot.assign(dataclasses.replace(plan, cancel=cancel))
        try:
            await slot.wait_done()
        except BaseException:
            # The caller went away: the execution must not outlive it.
            cancel.set()
            raise
        finally:
            # Replace the child only now: spawning competes for the CPU and the event loop
            # with the program being served, which is the latency this pool exists to cut.
            self.refill()
        if slot.error is not None:
            raise slot.error
        if slot.result is None:
            # The child died between being taken and being given its program: run cold.
            return await execute(self._backend, plan)
        return slot.result

    async def _serve_one(self) -> None:
        slot = _Slot()
        announced = False

        async def obtain() -> ExecutionPlan | None:
            nonlocal announced
            self._preparing -= 1
            announced = True
            self._ready.append(slot)
            self._became_ready.set()
            self._became_ready = anyio.Event()
            return await slot.wait_for_plan()

        scope = anyio.CancelScope()

        def early(result: ExecutionResult) -> None:
            # From here on only teardown remains, bounded by the backend's own deadlines:
            # closing the Sandbox waits for it rather than cutting it (and its reads) short.
            scope.shield = True
            slot.finish(result, None)

        try:
            with scope:
                result = await run_child(
                    self._backend, self._limits, obtain, on_early_result=early
                )
        except Exception as exc:
            # A bug must reach the caller it concerns, not take down every other execution
            # sharing this task group; with no caller yet, the next run starts cold.
            self._forget(slot, announced)
            if slot.plan is not None:
                slot.finish(None, exc)
            return
        except BaseException:
            self._forget(slot, announced)
            raise
        self._forget(slot, announced)
        slot.finish(result, None)

    def _forget(self, slot: _Slot, announced: bool) -> None:
        if not announced:
            self._preparing -= 1
        elif slot in self._ready:
            self._ready.remove(slot)
