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
memory cap). Within them it keeps as many as demand calls for: one more than the most
programs that ran at once within the last ``idle_seconds`` (the one more is being replaced
while the others serve). It shrinks to that when demand falls, to nothing after
``idle_seconds`` without a program, and fills again with the next one.

A program that finds no child ready waits for one that is being prepared and no other caller
waits for, unless that one has taken so long that a cold start would come first (it looks
stuck); where none is on its way and the bounds leave room, it starts one and waits for it.
Only where the bounds leave no room, or the start it waited for failed, does it start cold
(a backend that cannot start a child here then says why on the result). A child comes
back to the caller that has waited longest.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import anyio
from anyio.abc import TaskGroup

from ..kit.backend import Backend
from ..result import ExecutionResult
from ..terms import ExecutionLimits
from .host import ExecutionPlan, PreparedChild, execute, prepare

#: Children a profile keeps prepared when it does not say (``warm`` unset), once a Sandbox
#: has shown it is long-lived by running the profile a second time.
AUTOMATIC_SIZE = 2

#: A child being prepared is waited for until it has taken this many times as long as
#: preparing one usually does; after that it looks stuck, and a cold start comes first.
PATIENCE = 2.0
#: The weight of the latest start-up in the usual one (a moving average: the host's load
#: changes, and the estimate follows within a few starts).
START_WEIGHT = 0.25


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
    #: How many children demand calls for now (never above ``size``), and programs waiting
    #: for a child that is being prepared.
    target: int = 0
    waiting: int = 0
    #: Programs the pool has run, and how many of them started cold (no child could be had
    #: sooner), since it was made.
    runs: int = 0
    started_cold: int = 0


class _Waiter:
    """A program waiting for the next child to be ready."""

    def __init__(self) -> None:
        self.child: PreparedChild | None = None
        self.answered = anyio.Event()


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
        #: When each child being prepared was started, oldest first.
        self._preparing: list[float] = []
        self._waiters: deque[_Waiter] = deque()
        self._became_ready = anyio.Event()
        self._runs = 0
        self._total_runs = self._started_cold = 0
        #: Programs being run right now, and when each number of them (1, 2, ...) last ran
        #: at once: what demand is.
        self._running = 0
        self._last_at: dict[int, float] = {}
        #: How long starting a child usually takes here (None until one was timed).
        self._start_seconds: float | None = None
        #: What one more child is counted at before it is measured: the largest one so far
        #: (None until the first is prepared; until then one is prepared at a time).
        self._per_child: int | None = None
        self._last_used = anyio.current_time()
        self._idle_watch = False

    def status(self) -> WarmStatus:
        settings = self._settings
        return WarmStatus(
            len(self._ready),
            len(self._preparing),
            self.held_bytes,
            settings.size,
            settings.memory_bytes,
            self.target(),
            len(self._waiters),
            self._total_runs,
            self._started_cold,
        )

    @property
    def held_bytes(self) -> int:
        """The memory the waiting children hold, as counted against ``memory_bytes``."""
        return sum(self._counted(child) for child in self._ready)

    def target(self) -> int:
        """How many children to keep ready or on their way: one more than the most programs
        run at once within the last ``idle_seconds``, within ``size``."""
        since = anyio.current_time() - self._settings.idle_seconds
        recent = max((n for n, at in self._last_at.items() if at >= since), default=0)
        return min(self._settings.size, recent + 1)

    async def wait_ready(self) -> None:
        """Return once a prepared child is waiting (refilling first if none is on its way).
        Returns at once when the memory budget leaves room for none."""
        self._last_used = anyio.current_time()
        self.refill(force=True)
        while not self._ready and self._preparing:
            event = self._became_ready
            await event.wait()

    def refill(self, *, force: bool = False) -> None:
        """Start preparing children until ``target()`` are ready or on their way besides
        those waited for, within ``size`` and the memory budget (an automatic pool only once
        it was used twice, unless ``force``); discard ready ones beyond the target."""
        settings = self._settings
        if settings.automatic and self._runs < 2 and not force:
            return
        target = max(1, self.target()) if force else self.target()
        while len(self._ready) > target:
            self._ready.popleft().discard()  # demand fell: the longest idle goes
        while (
            len(self._ready) + len(self._preparing) - len(self._waiters) < target
            and self._room_for_one()
        ):
            self._start_one()
        if not self._idle_watch and (self._ready or self._preparing):
            self._idle_watch = True
            self._task_group.start_soon(self._shrink_when_idle)

    async def run(self, plan: ExecutionPlan) -> ExecutionResult:
        """Run ``plan`` on a prepared child: a ready one, else one about to be; cold when
        none can be had sooner."""
        self._runs += 1
        self._total_runs += 1
        now = self._last_used = anyio.current_time()
        self._running += 1
        for n in range(1, min(self._running, self._settings.size) + 1):
            self._last_at[n] = now
        try:
            child = await self._child()
            if child is None:
                return await self._cold(plan)
            if self._running > len(self._ready) + len(self._preparing) - len(self._waiters):
                # More programs than children on their way: replace this one now, or the
                # next program waits for a whole start-up.
                self.refill()
            try:
                result = await child.serve(plan)
            finally:
                # Otherwise only now: spawning competes for the CPU and the event loop with
                # the program being served, which is the latency this pool exists to cut.
                self.refill()
            if result is None:
                # The child died between being taken and being given its program: run cold.
                return await self._cold(plan)
            return result
        finally:
            self._running -= 1

    async def _cold(self, plan: ExecutionPlan) -> ExecutionResult:
        self._started_cold += 1
        try:
            return await execute(self._backend, plan, self._task_group)
        finally:
            # Only now: a child prepared alongside would take what this run needs first
            # (one of a small identity range's uids, say).
            self.refill()

    async def _child(self) -> PreparedChild | None:
        """A ready child, or the next one prepared where waiting for it is the sooner way to
        a child; None: start cold (also when the start waited for failed, so that a backend
        that cannot start a child here says why on the result)."""
        if self._ready:
            return self._ready.popleft()
        if self._settings.automatic and self._runs < 2:
            return None  # a Sandbox that may run one program prepares nothing
        patience = self._patience()
        if patience is None:
            if not self._room_for_one():
                return None
            self._start_one()
            patience = math.inf  # its own start-up deadlines bound the wait
        waiter = _Waiter()
        self._waiters.append(waiter)
        try:
            # Past the patience it looks stuck: a cold start comes first.
            with anyio.move_on_after(patience):
                await waiter.answered.wait()
        except BaseException:
            if waiter.child is not None:
                self._keep(waiter.child)  # handed over as the caller went away
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        return waiter.child

    def _patience(self) -> float | None:
        """How long to wait for the oldest child being prepared that no caller waits for;
        None when there is none."""
        unclaimed = self._preparing[len(self._waiters) :]
        if not unclaimed:
            return None
        if self._start_seconds is None:
            return math.inf
        return unclaimed[0] + PATIENCE * self._start_seconds - anyio.current_time()

    def _timed(self, seconds: float) -> None:
        usual = self._start_seconds
        self._start_seconds = seconds if usual is None else usual + START_WEIGHT * (seconds - usual)

    def _room_for_one(self) -> bool:
        preparing = len(self._preparing)
        if len(self._ready) + preparing >= self._settings.size:
            return False
        if self._per_child is None:
            return preparing == 0
        counted = self.held_bytes + (preparing + 1) * self._per_child
        return counted <= self._settings.memory_bytes

    def _counted(self, child: PreparedChild) -> int:
        """A child's memory as measured once graded; one the backend cannot measure counts
        at the execution's memory cap (or the whole budget, with no cap)."""
        if child.memory_bytes is not None:
            return child.memory_bytes
        cap = self._limits.memory_bytes
        return cap if cap is not None else self._settings.memory_bytes

    def _start_one(self) -> None:
        self._preparing.append(anyio.current_time())
        self._task_group.start_soon(self._prepare_one, self._preparing[-1])

    async def _prepare_one(self, started: float) -> None:
        try:
            child = await prepare(self._task_group, self._backend, self._limits, self._gone)
        except Exception:
            # Not prepared (or a bug, which must not take down every other execution
            # sharing this task group): with no caller yet, the next run starts cold.
            child = None
        self._preparing.remove(started)
        if child is not None:
            self._timed(anyio.current_time() - started)
            counted = self._counted(child)
            self._per_child = max(counted, self._per_child or 0)
            if self._waiters:
                # Straight to the caller that has waited longest: it is not held, so it
                # counts against no budget.
                waiter = self._waiters.popleft()
                waiter.child = child
                waiter.answered.set()
            else:
                self._keep(child)
        elif self._waiters:
            self._waiters.popleft().answered.set()  # none coming is an answer too
        # Whoever waits for a child learns either way (none coming is an answer too).
        self._became_ready.set()
        self._became_ready = anyio.Event()

    def _keep(self, child: PreparedChild) -> None:
        if self.held_bytes + self._counted(child) > self._settings.memory_bytes:
            # Larger than counted on: it does not fit, so it is not kept.
            child.discard()
        else:
            self._ready.append(child)
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
