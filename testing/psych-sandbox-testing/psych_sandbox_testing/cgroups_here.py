"""Whether this host makes per-execution cgroups, as the core's own detection answers it: for
tests that need cgroups, or check what an execution made, or run as if there were none."""

from __future__ import annotations

import pytest
from psych_sandbox_core.kit.posix import cgroups
from psych_sandbox_core.kit.posix.cgroups import PREFIX, CgroupHost

__all__ = ["CGROUP_PREFIX", "CgroupHost", "cgroup_host", "makes_cgroups", "without_cgroups"]

#: What the name of every cgroup an execution makes begins with.
CGROUP_PREFIX = PREFIX


def cgroup_host() -> CgroupHost | str:
    """Where this host creates per-execution cgroups (the hierarchies and their parents), or
    why it cannot."""
    return cgroups.detect()


def makes_cgroups() -> bool:
    """Whether executions on this host get cgroups of their own."""
    return isinstance(cgroups.detect(), CgroupHost)


def without_cgroups(
    monkeypatch: pytest.MonkeyPatch, reason: str = "no cgroups in this test"
) -> None:
    """Make the core find no way to create cgroups (for ``reason``) until ``monkeypatch``
    is undone: what a host without them does."""
    monkeypatch.setattr(cgroups, "detect", lambda: reason)
