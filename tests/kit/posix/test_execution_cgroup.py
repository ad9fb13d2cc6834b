"""An execution's cgroup on the real cgroup filesystem: its final usage is read once the
cgroup is empty, and its removal leaves nothing, whatever is still in it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from psych_sandbox_core.kit.posix import cgroups

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def host() -> cgroups.CgroupHost:
    found = cgroups.detect()
    if isinstance(found, str):
        pytest.skip(f"no cgroups for executions here: {found}")
    return found


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()
        assert process.stdin is not None
        process.stdin.close()


async def test_final_usage_kills_what_is_left_and_reads_it_once_empty(
    host: cgroups.CgroupHost, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    cgroup = host.create("test")
    try:
        sleepers.append(sleeper())
        for directory in cgroup.directories:
            (directory / "cgroup.procs").write_text(str(sleepers[0].pid))
        cpu, _peak = await cgroup.final_usage()
        assert sleepers[0].wait(timeout=10) == -signal.SIGKILL
        assert cgroup.processes() == set() and cpu is not None
    finally:
        assert await cgroup.remove() is not None
    assert not any(directory.exists() for directory in cgroup.directories)


async def test_removal_kills_a_process_in_any_one_hierarchy(
    host: cgroups.CgroupHost, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    # Only root can put a process in one hierarchy's cgroup and not the others' (the final
    # usage reads one list, the whole list otherwise); whatever is there, the removal reads
    # every hierarchy, kills it, and removes every directory.
    cgroup = host.create("test")
    listing = os.path.dirname(cgroup._listing)
    others = [directory for directory in cgroup.directories if str(directory) != listing]
    if not others:
        pytest.skip("one hierarchy here: nothing can be in one and not another")
    try:
        sleepers.append(sleeper())
        (others[0] / "cgroup.procs").write_text(str(sleepers[0].pid))
    finally:
        proof = await cgroup.remove()
    assert sleepers[0].wait(timeout=10) == -signal.SIGKILL
    assert not any(directory.exists() for directory in cgroup.directories)
    assert proof is None  # not removed by one call: no proof of anything
