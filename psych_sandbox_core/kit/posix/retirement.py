"""Leases given back: the uids of executions ending at the same time swept together, in one
pass over the host's tables, each as thoroughly as alone (:class:`_Sweeps`), then released;
and the leases on their way back that a leaser short of uids waits for (:class:`_Returns`).
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Protocol

import anyio

from .sweep import Swept, sweep_together

#: A range of identities (identity.IdentityRange), told apart by value: the only thing
#: retirement needs of one, so this module does not import the leases it serves.
IdentityRange = Hashable


class IdentityLease(Protocol):
    """What retirement needs of a lease (identity.IdentityLease): its ids, and giving it back."""

    @property
    def uid(self) -> int: ...

    @property
    def gid(self) -> int: ...

    def release(self) -> None: ...


class _Returns:
    """This process's leases being retired, by range and by the thread of the event loop
    retiring them, and who waits there for one to come back (an event is set only on the
    loop it was made on)."""

    def __init__(self) -> None:
        self._retiring: dict[tuple[IdentityRange, int], int] = {}
        self._returned: dict[tuple[IdentityRange, int], int] = {}
        self._waiting: dict[tuple[IdentityRange, int], list[anyio.Event]] = {}

    def retiring(self, identities: IdentityRange) -> bool:
        return self._retiring.get(_here(identities), 0) > 0

    def count(self, identities: IdentityRange) -> int:
        """How many leases of the range this loop has retired so far."""
        return self._returned.get(_here(identities), 0)

    async def wait(self, identities: IdentityRange) -> None:
        """Return once a lease of the range was retired here (or failed to be)."""
        event = anyio.Event()
        self._waiting.setdefault(_here(identities), []).append(event)
        await event.wait()

    def begin(self, identities: IdentityRange) -> None:
        key = _here(identities)
        self._retiring[key] = self._retiring.get(key, 0) + 1

    def end(self, identities: IdentityRange) -> None:
        """A lease of the range, begun returning, was retired (or failed to be)."""
        key = _here(identities)
        self._retiring[key] -= 1
        self._returned[key] = self._returned.get(key, 0) + 1
        for event in self._waiting.pop(key, []):
            event.set()


def _here(identities: IdentityRange) -> tuple[IdentityRange, int]:
    return identities, threading.get_ident()


returns = _Returns()


class _Retiring:
    """One lease waiting to be swept and given back, and why it could not be."""

    def __init__(self, lease: IdentityLease, processes: bool) -> None:
        self.lease = lease
        self.swept = Swept(lease.uid, lease.gid, processes)
        #: Set when the uid was swept (``finished``; ``failure`` says why not), or when its
        #: caller is to sweep it itself, with every other uid waiting.
        self.turn = anyio.Event()
        self.finished = False
        self.failure: OSError | None = None


class _Sweeps:
    """The uids this process retires, swept together: a sweep costs its passes over the
    host's tables (every process, every shared directory entry), whatever the uids it looks
    for, so one sweep at a time per event loop takes every uid that came to be retired
    while the previous one ran (sweep.sweep_together). Each uid is swept exactly as alone,
    and given back in the same worker thread (its lock file's removal is file system work,
    which can stall, kept off the event loop)."""

    def __init__(self) -> None:
        self._waiting: dict[int, list[_Retiring]] = {}
        self._sweeping: set[int] = set()

    async def retire(self, lease: IdentityLease, *, processes: bool) -> None:
        """Return once ``lease``'s uid was swept (its processes looked for, unless not
        ``processes``) and given back; OSError if it could not be (then it stays leased)."""
        loop = threading.get_ident()  # an event is set only on the loop it was made on
        me = _Retiring(lease, processes)
        self._waiting.setdefault(loop, []).append(me)
        if loop not in self._sweeping:
            self._sweeping.add(loop)
            me.turn.set()
        await me.turn.wait()
        if not me.finished:
            await self._sweep_waiting(loop)
        if me.failure is not None:
            raise me.failure

    async def _sweep_waiting(self, loop: int) -> None:
        """Sweep every uid waiting on this loop, then hand the next sweep to whoever came
        meanwhile (the caller sweeping returns once its own uid is done)."""
        batch = self._waiting.pop(loop)
        failures: dict[int, OSError] | None = None
        try:
            failures = await anyio.to_thread.run_sync(_retire_together, batch)
        finally:
            for retiring in batch:
                retiring.finished = True
                retiring.failure = (
                    OSError(f"the sweep of uid {retiring.swept.uid} did not finish")
                    if failures is None
                    else failures.get(retiring.swept.uid)
                )
                retiring.turn.set()
            following = self._waiting.get(loop)
            if following:
                following[0].turn.set()
            else:
                self._sweeping.discard(loop)


def _retire_together(batch: list[_Retiring]) -> dict[int, OSError]:
    """Sweep the batch's uids together and give back each one swept (blocking); why each of
    the others could not be."""
    failures = sweep_together([retiring.swept for retiring in batch])
    for retiring in batch:
        if retiring.swept.uid not in failures:
            try:
                retiring.lease.release()
            except OSError as exc:
                failures[retiring.swept.uid] = exc
    return failures


sweeps = _Sweeps()
