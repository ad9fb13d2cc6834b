"""Warm children: launched, connected and graded before their program exists.

A warm child is still one fresh process per program: it is prepared ahead (spawned, probed,
handshake done, see host.prepare) and then given exactly one program (PreparedChild.serve),
after which it is torn down like any other. What a run saves is the start-up of the
interpreter and the sandbox around it. The grades it carries are its own report, made by
that very process. Each child lives in this pool's task group (the Sandbox's), started with
the group's own ``start``: it returns once the child is graded. On a backend that allows it,
the result is handed back once the program's output and result are complete, and the child's
teardown finishes afterwards in that task group.

The pool stays within two bounds, never exceeding either: ``size`` children ready or on
their way, and ``memory_bytes`` held by the ready ones together, as measured from the host
once each is graded (a backend that cannot measure a child counts it at the execution's
memory cap). It shrinks to nothing after ``idle_seconds`` without a program, and fills
again with the next one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import anyio
from anyio.abc import TaskGroup

from .backend import Backend
from .host import ExecutionPlan, PreparedChild, execute, prepare
from .result import ExecutionResult
from .terms import ExecutionLimits

#: Children a profile keeps prepared when it does not say (``warm`` unset), once a Sandbox
#: has shown it is long-lived by running the profile a second time.
AUTOMATIC_SIZE = 2


@dataclass(frozen=True)
class WarmSettings:
    """How many children a pool keeps prepared, in how much memory, for how long idle."""

    size: int
    memory_bytes: int
    idle_seconds: float
    #: Whether the pool starts filling only at a profile's second execution (``warm``
    #: unset): a Sandbox that runs one program never prepares a child it will not use.
    automatic: bool = False


@dataclass(frozen=True)
class WarmStatus:
    """A pool's state at one moment, as the host counts it."""

    #: Prepared children waiting for a program, and children being prepared.
    ready: int
    preparing: int
    #: The memory the waiting children hold together (see WarmPool.held_bytes).
    held_bytes: int
    #: The pool's bounds.
    size: int
    memory_bytes: int


class WarmPool:
    """Keeps children of one backend prepared, in the caller's task group."""

    def __init__(
        self,
        backend: Backend,
        launch_limits: ExecutionLimits,
        settings: WarmSettings,
        task_group: TaskGroup,
    ) -> None:
        self._backend = backend
        self._limits = launch_limits
        self._settings = settings
        self._task_group = task_group
        self._ready: deque[PreparedChild] = deque()
        self._preparing = 0
        self._became_ready = anyio.Event()
        self._runs = 0
        #: What one more child is counted at before it is measured: the largest one so far
        #: (None until the first is prepared; until then one is prepared at a time).
        self._per_child: int | None = None
        self._last_used = anyio.current_time()
        self._idle_watch = False

    def status(self) -> WarmStatus:
        settings = self._settings
        return WarmStatus(
            len(self._ready),
            self._preparing,
            self.held_bytes,
            settings.size,
            settings.memory_bytes,
        )

    @property
    def held_bytes(self) -> int:
        """The memory the waiting children hold, as counted against ``memory_bytes``."""
        return sum(self._counted(child) for child in self._ready)

    async def wait_ready(self) -> None:
        """Return once a prepared child is waiting (refilling first if none is on its way).
        Returns at once when the memory budget leaves room for none."""
        self._last_used = anyio.current_time()
        self.refill(force=True)
        while not self._ready and self._preparing:
            event = self._became_ready
            await event.wait()

    def refill(self, *, force: bool = False) -> None:
        """Start preparing children until ``size`` are ready or on their way, within the
        memory budget (an automatic pool only once it was used twice, unless ``force``)."""
        settings = self._settings
        if settings.automatic and self._runs < 2 and not force:
            return
        while len(self._ready) + self._preparing < settings.size and self._room_for_one():
            self._preparing += 1
            self._task_group.start_soon(self._prepare_one)
        if not self._idle_watch and (self._ready or self._preparing):
            self._idle_watch = True
            self._task_group.start_soon(self._shrink_when_idle)

    async def run(self, plan: ExecutionPlan) -> ExecutionResult:
        """Run ``plan`` on a prepared child, or cold when none is ready."""
        self._runs += 1
        self._last_used = anyio.current_time()
        child = self._ready.popleft() if self._ready else None
        if child is None:
            try:
                return await execute(self._backend, plan, self._task_group)
            finally:
                # Only now: a child prepared alongside would take what this run needs first
                # (one of a small identity range's uids, say).
                self.refill()
        try:
            result = await child.serve(plan)
        finally:
            # Replace the child only now: spawning competes for the CPU and the event loop
            # with the program being served, which is the latency this pool exists to cut.
            self.refill()
        if result is None:
            # The child died between being taken and being given its program: run cold.
            return await execute(self._backend, plan, self._task_group)
        return result

    def _room_for_one(self) -> bool:
        if self._per_child is None:
            return self._preparing == 0
        counted = self.held_bytes + (self._preparing + 1) * self._per_child
        return counted <= self._settings.memory_bytes

    def _counted(self, child: PreparedChild) -> int:
        """A child's memory as measured once graded; one the backend cannot measure counts
        at the execution's memory cap (or the whole budget, with no cap)."""
        if child.memory_bytes is not None:
            return child.memory_bytes
        cap = self._limits.memory_bytes
        return cap if cap is not None else self._settings.memory_bytes

    async def _prepare_one(self) -> None:
        try:
            child = await prepare(self._task_group, self._backend, self._limits, self._gone)
        except Exception:
            # Not prepared (or a bug, which must not take down every other execution
            # sharing this task group): with no caller yet, the next run starts cold.
            child = None
        self._preparing -= 1
        if child is not None:
            counted = self._counted(child)
            self._per_child = max(counted, self._per_child or 0)
            if self.held_bytes + counted > self._settings.memory_bytes:
                # Larger than counted on: it does not fit, so it is not kept.
                child.discard()
            else:
                self._ready.append(child)
        # Whoever waits for a child learns either way (none coming is an answer too).
        self._became_ready.set()
        self._became_ready = anyio.Event()

    async def _shrink_when_idle(self) -> None:
        """Discard every waiting child once no program came for ``idle_seconds``."""
        idle = self._settings.idle_seconds
        try:
            while self._ready or self._preparing:
                deadline = self._last_used + idle
                if anyio.current_time() < deadline:
                    await anyio.sleep_until(deadline)
                    continue
                while self._ready:
                    self._ready.popleft().discard()
                self._runs = 0  # an automatic pool waits for a second use again
                if not self._preparing:
                    break
                await anyio.sleep(idle)  # for the children still on their way
        finally:
            self._idle_watch = False

    def _gone(self, child: PreparedChild) -> None:
        """A child stopped waiting (taken, discarded, or dead before its program came)."""
        if child in self._ready:
            self._ready.remove(child)
