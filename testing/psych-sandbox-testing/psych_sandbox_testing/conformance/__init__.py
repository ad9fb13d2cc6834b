"""The behaviour every backend must show, as a pytest base class.

A backend's test module subclasses :class:`BackendConformance`, names the backend and what it
claims, and inherits the tests::

    from psych_sandbox_testing.conformance import BackendConformance

    class TestMyBackendConformance(BackendConformance):
        backend = "mine"
        level = "isolated"
        enforced = frozenset({"filesystem", "network"})

The tests run real programs and assert from the host: processes looked up in /proc, opens of
a canary watched with inotify, connections counted by loopback listeners, the host's
temporary directory listed. They need pytest and anyio's pytest plugin (the core's ``test``
extra); pytest is not a run-time dependency of the core.

Which tests a backend inherits follows from what its test class declares (``enforced``,
``workspace_on_host``, ``processes_visible`` and the rest): a backend that claims a
filesystem boundary gets the tests of one, a backend whose workspace the host cannot reach gets
the tests of artifacts sent over the channel, one that enforces identity on a root host the
tests of leased uids. What a backend does not claim is not asked of it, and is graded so.

The tests live in one module per theme (running.py, commands.py, boundaries.py, identity.py)
on what they all stand on (base.py); :class:`BackendConformance` is all of them together.
"""

from __future__ import annotations

from typing import Any

from .boundaries import BoundaryTests
from .commands import CommandTests
from .identity import IdentityTests
from .running import RunningTests

__all__ = ["BackendConformance", "gated_tests"]


class BackendConformance(RunningTests, CommandTests, BoundaryTests, IdentityTests):
    """Tests every backend must pass. Subclasses set the class attributes of
    :class:`~psych_sandbox_testing.conformance.base.ConformanceBase`; the hooks
    (:meth:`leftovers`, :meth:`registry`, :meth:`identity_uids`) may be overridden."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Each subclass inherits exactly the tests its declarations ask for (see applies).
        super().__init_subclass__(**kwargs)
        for name, test in gated_tests().items():
            if name not in vars(cls):
                setattr(cls, name, test if test.applies_when(cls) else None)


def gated_tests() -> dict[str, Any]:
    """The suite's tests that only some declarations ask for (marked with ``applies``), by
    name."""
    return {
        name: test
        for theme in BackendConformance.__mro__
        for name, test in vars(theme).items()
        if getattr(test, "applies_when", None) is not None
    }
