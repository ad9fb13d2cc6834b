"""A host killed outright (SIGKILL) at each point of an execution, on the subprocess and bwrap
backends, and a restarted host that reaps what it left, judged from the host side: no
process, temporary directory, cgroup or uid lease of the dead host remains, and the run's
call budget is not given back (the durable run log counts the calls the dead host accepted,
the one in flight too). The hooks that stop a host at its point, and the loop over random
points, are in psych_sandbox_testing/faults.py and benchmarks/faults.py."""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from psych_sandbox_testing import census, faults
from psych_sandbox_testing.requirements import skip_unless_required

from psych_sandbox_core._bindings.runlog import SQLiteRunLog
from psych_sandbox_core.kit.posix.identity import IdentityRange
from psych_sandbox_core.kit.posix.sweep import sweep

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="uid leases and cgroups are made only by a root host"
)

#: Each point once, on the backend where the suite has the most to learn from it: bwrap's
#: files come over the channel and its tree is a pid namespace behind bwrap itself;
#: benchmarks/faults.py loops over every point on every backend.
POINTS = {
    "spawn": "bwrap",
    "handshake": "subprocess",
    "binding": "subprocess",
    "artifacts": "bwrap",
    "teardown": "bwrap",
}
BACKENDS = sorted(set(POINTS.values()))


@pytest.fixture
def uid_ranges() -> Iterator[dict[str, dict[str, Any]]]:
    """Per backend, options leasing from a range of this test's own (more uids than hosts: the
    restarted host must reap a dead one's uid before the range comes round to it); swept and
    their cursors removed after."""
    count = 2 * len(POINTS)
    base = 1_970_000_000 + 2 * count * random.randrange(1_000_000)
    ranges = {
        backend: {"identity_first_uid": base + index * count, "identity_count": count}
        for index, backend in enumerate(BACKENDS)
    }
    yield ranges
    for options in ranges.values():
        first = options["identity_first_uid"]
        for uid in range(first, first + count):
            sweep(uid, uid)
        IdentityRange(first, count).forget()


def test_a_host_killed_at_each_point_is_reaped_by_the_next(
    uid_ranges: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    if shutil.which("bwrap") is None:
        skip_unless_required("bwrap-root", "bubblewrap is not installed")
    logs = {backend: str(tmp_path / f"{backend}.sqlite") for backend in BACKENDS}
    assert set(POINTS) == set(faults.POINTS)
    points = {backend: [p for p, b in POINTS.items() if b == backend] for backend in BACKENDS}
    # Every host at once (they lease different uids of the range), each stopped at its point.
    runs = {
        backend: faults.Hosts(backend, uid_ranges[backend], logs[backend], points[backend])
        for backend in BACKENDS
    }
    try:
        pids = {backend: hosts.wait_at_points() for backend, hosts in runs.items()}
        for point, backend in POINTS.items():
            # What the host made is there as it is killed (else the checks below could not
            # fail). Counted before the kill: once it is dead, any host's first lease reaps
            # its uid (a command run by another test at the same time, say), as it should.
            # (in teardown its cgroup was already removed, as proof its tree is gone)
            made = census.take(pids[backend][point])
            assert all((made.temp_dirs, made.leases, made.cgroups or point == "teardown")), (
                backend,
                point,
                made,
            )
        for hosts in runs.values():
            hosts.kill()
        for point, backend in POINTS.items():
            spent, dangling = anyio.run(_calls_in_run, logs[backend], faults.run_id(point))
            assert spent == faults.calls_spent(point), (backend, point)
            # The call in flight when the host died has no recorded end, and counts.
            assert dangling == (["block"] if point == "binding" else []), (backend, point)
        # ...until a restarted host reaps it, and finds each run's budget as the dead one
        # left it: the calls it accepted stay spent, the one in flight too.
        for backend, hosts in runs.items():
            left_in_run = hosts.restart()
            for point in points[backend]:
                expected = faults.RUN_CALLS - faults.calls_spent(point)
                assert left_in_run[point] == [expected, "budget_exhausted"], (backend, point)
    finally:
        for hosts in runs.values():
            hosts.close()
    for point, backend in POINTS.items():
        after = census.take(pids[backend][point])
        assert (after.processes, after.temp_dirs, after.cgroups, after.leases) == (0, 0, 0, 0), (
            backend,
            point,
            after,
        )


async def _calls_in_run(path: str, run: str) -> tuple[int, list[str]]:
    """The calls the run spent, and the names of those with no recorded end."""
    log = SQLiteRunLog(path)
    try:
        return await log.calls_in_run(run), [entry.name for entry in await log.dangling(run)]
    finally:
        await log.aclose()
