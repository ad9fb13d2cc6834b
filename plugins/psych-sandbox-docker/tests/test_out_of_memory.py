"""An out-of-memory kill the engine did not flag is still read as one: a SIGKILL nobody on
the host sent, with the container's memory at its cap (the engine's flag comes from an event
that can lose the race with the exit's; the cgroup's peak does not). The end-to-end case, a
real container filling its memory, is test_containment's."""

from __future__ import annotations

import signal

from psych_sandbox_docker.backend import OOM_PEAK_SLACK, out_of_memory

MiB = 2**20
CAP = 256 * MiB
KILLED = 128 + signal.SIGKILL


def test_a_sigkill_at_the_cap_is_the_out_of_memory_killers() -> None:
    assert out_of_memory(KILLED, CAP, CAP)
    assert out_of_memory(KILLED, CAP, CAP - OOM_PEAK_SLACK)


def test_a_sigkill_below_the_cap_is_not() -> None:
    assert not out_of_memory(KILLED, CAP, CAP - OOM_PEAK_SLACK - 1)
    assert not out_of_memory(KILLED, CAP, 40 * MiB)


def test_other_endings_and_unknowns_are_not() -> None:
    assert not out_of_memory(0, CAP, CAP)
    assert not out_of_memory(1, CAP, CAP)
    assert not out_of_memory(128 + signal.SIGTERM, CAP, CAP)
    assert not out_of_memory(KILLED, None, CAP)
    assert not out_of_memory(KILLED, CAP, None)
