"""Identity leases seen from a test: the proof each lease is retired with, and the lease
files this process holds open."""

from __future__ import annotations

import os

import pytest
from psych_sandbox_core.kit.posix import EmptyCgroup
from psych_sandbox_core.kit.posix.identity import IdentityLease, _lock_directory

__all__ = ["held_leases", "lease_directory", "retirement_proofs"]


def retirement_proofs(monkeypatch: pytest.MonkeyPatch) -> list[EmptyCgroup | None]:
    """The proof (the removed cgroup, or none) every lease retired from now on is retired
    with, in order, until ``monkeypatch`` is undone; each is still retired as before."""
    proofs: list[EmptyCgroup | None] = []
    retire = IdentityLease.retire

    async def recording(self: IdentityLease, empty: EmptyCgroup | None = None) -> None:
        proofs.append(empty)
        await retire(self, empty)

    monkeypatch.setattr(IdentityLease, "retire", recording)
    return proofs


def lease_directory() -> str:
    """The directory of this host's uid lease files."""
    return _lock_directory()


def held_leases() -> list[str]:
    """Identity lock files this process still holds open, read from /proc (the host side)."""
    directory = os.path.realpath(lease_directory())
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if os.path.dirname(target) == directory:
            held.append(target)
    return held
