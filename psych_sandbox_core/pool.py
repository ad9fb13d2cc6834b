"""Warm children: launched, connected and graded before their program exists.

A warm child is still one fresh process per program: it is prepared ahead (spawned, probed,
handshake done, see host.prepare) and then given exactly one program (PreparedChild.serve),
after which it is torn down like any other. What a run saves is the start-up of the
interpreter and the sandbox around it. The grades it carries are its own report, made by
that very process. Each child lives in this pool's task group (the Sandbox's), started with
the group's own ``start``: it returns once the child is graded. On a backend that allows it,
the result is handed back once the program's output and result are complete, and the child's
teardown finishes afterwards in that task group.
"""

from __future__ import annotations

from collections import deque

import anyio
from anyio.abc import TaskGroup

from .backend import Backend
from .host import ExecutionPlan, PreparedChild, execute, prepare
from .result import ExecutionResult
from .terms import ExecutionLimits


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
        self._ready: deque[PreparedChild] = deque()
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
            self._task_group.start_soon(self._prepare_one)

    async def run(self, plan: ExecutionPlan) -> ExecutionResult:
        """Run ``plan`` on a prepared child, or cold when none is ready."""
        child = self._ready.popleft() if self._ready else None
        if child is None:
            try:
                return await execute(self._backend, plan)
            finally:
                self.refill()
        try:
            result = await child.serve(plan)
        finally:
            # Replace the child only now: spawning competes for the CPU and the event loop
            # with the program being served, which is the latency this pool exists to cut.
            self.refill()
        if result is None:
            # The child died between being taken and being given its program: run cold.
            return await execute(self._backend, plan)
        return result

    async def _prepare_one(self) -> None:
        try:
            child = await prepare(self._task_group, self._backend, self._limits, self._gone)
        except Exception:
            # Not prepared (or a bug, which must not take down every other execution
            # sharing this task group): with no caller yet, the next run starts cold.
            return
        finally:
            self._preparing -= 1
        self._ready.append(child)
        self._became_ready.set()
        self._became_ready = anyio.Event()

    def _gone(self, child: PreparedChild) -> None:
        """A child stopped waiting (taken, or dead before its program came)."""
        if child in self._ready:
            self._ready.remove(child)
