"""The subprocess backend's usage comes from a cgroup of the execution's own, which a program
cannot hide from; without one it is marked not measured, never reported low. Judged from the
host: the CPU of the program's children read from /proc while they are alive, and the cgroup
directories found by walking /sys/fs/cgroup."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from psych_sandbox_testing.host import marker, pids_with

from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core._bindings.bindings import FunctionBindings
from psych_sandbox_core.kit.posix import cgroups, temp_dirs

pytestmark = pytest.mark.anyio

PROFILE = "usage"
HOST = cgroups.detect()
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
needs_cgroups = pytest.mark.skipif(
    not (ROOT and isinstance(HOST, cgroups.CgroupHost)), reason=f"no cgroups here: {HOST}"
)

#: Each child burns this much CPU, says so on a pipe, then blocks until the program lets go.
BURN_SECONDS = 1.0
CHILD = f"""
import os, sys, time
ready, hold = int(sys.argv[1]), int(sys.argv[2])
t = time.process_time()
while time.process_time() - t < {BURN_SECONDS}:
    pass
os.write(ready, b"1")
os.read(hold, 1)
"""

#: Children the kernel reaps itself (SIGCHLD ignored), so wait4 never sees their usage.
HIDING = """
import os, signal, sys
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
ready_r, ready_w = os.pipe()
hold_r, hold_w = os.pipe()
for _ in range(2):
    if os.fork() == 0:
        os.close(ready_r)
        os.close(hold_w)
        os.set_inheritable(ready_w, True)
        os.set_inheritable(hold_r, True)
        os.execv(sys.executable, [sys.executable, "-c", CHILD, str(ready_w), str(hold_r), MARK])
os.close(ready_w)
os.close(hold_r)
got = b""
while len(got) < 2:
    got += os.read(ready_r, 2)
await measure()
os.close(hold_w)
try:
    os.wait()  # with SIGCHLD ignored: returns once every child is gone, with nothing to reap
except ChildProcessError:
    pass
return "done"
"""


def deployment() -> DeploymentConfig:
    return DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(
                backend="subprocess",
                limits=ExecutionLimits(cpu_seconds=20, wall_seconds=60.0, grace_seconds=0.5),
            )
        }
    )


def our_cgroups() -> list[Path]:
    """Per-execution cgroup directories this test process made, found by walking every
    mounted hierarchy (not by asking the code under test where it put them)."""
    mine = f"{cgroups.PREFIX}subprocess-{temp_dirs.owner_tag()}-"
    found = []
    for top, dirs, _ in os.walk("/sys/fs/cgroup"):
        found += [Path(top) / name for name in dirs if name.startswith(mine)]
    return found


@pytest.fixture(autouse=True)
def nothing_left() -> Iterator[None]:
    assert our_cgroups() == []
    yield
    assert our_cgroups() == []


def cpu_from_proc(pid: int) -> float:
    """utime + stime of a live process, from the host's /proc."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        fields = fh.read().rsplit(b")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


async def run_hiding(sandbox: Sandbox) -> tuple[Any, list[float]]:
    mark = marker()
    seen: list[float] = []

    def measure() -> None:
        # Runs on the host while the children are alive and done burning.
        seen.extend(cpu_from_proc(pid) for pid in pids_with(mark))

    source = HIDING.replace("CHILD", repr(CHILD)).replace("MARK", repr(mark))
    result = await sandbox.run(
        source, profile=PROFILE, bindings=FunctionBindings({"measure": measure})
    )
    assert pids_with(mark) == []
    return result, seen


@needs_cgroups
async def test_children_reaped_by_the_kernel_are_still_counted() -> None:
    async with Sandbox(deployment()) as sandbox:
        result, seen = await run_hiding(sandbox)
    assert result.error is None, result.error
    assert len(seen) == 2
    assert sum(seen) >= 2 * BURN_SECONDS * 0.9
    assert result.usage.measured_by == "host"
    assert result.usage.cpu_seconds is not None
    # Everything the children burned, as the host saw it, and not wildly more.
    assert sum(seen) <= result.usage.cpu_seconds < sum(seen) + 2.0, (seen, result.usage)
    assert result.usage.peak_memory_bytes is not None and result.usage.peak_memory_bytes > 0


#: A program reads its own cgroup's CPU weight through the host, tries to raise it, and reads
#: it again: both reads are the host's.
RAISE_WEIGHT = """
path = await weight_file()
try:
    with open(path, "w") as file:
        file.write("1024" if path.endswith("shares") else "100")
    attempt = "written"
except OSError as exc:
    attempt = type(exc).__name__
[await weight_now(), attempt, await weight_now()]
"""


@needs_cgroups
async def test_a_program_runs_at_a_small_cpu_weight_it_cannot_raise() -> None:
    # The host comes first under contention (its wall clock ends timed-out programs on
    # time on a busy machine); the weight is set in a cgroup the program cannot change.
    assert isinstance(HOST, cgroups.CgroupHost)
    if not HOST.cpu:
        pytest.skip("no cpu controller here to weigh executions with")
    weight = "cpu.shares" if HOST.version == 1 else "cpu.weight"
    expected = str(cgroups.V1_CPU_SHARES if HOST.version == 1 else cgroups.V2_CPU_WEIGHT)
    found: list[Path] = []

    def weight_file() -> str:
        # The one cgroup of this process's with the weight file and a process in it.
        (directory,) = [
            d for d in our_cgroups() if (d / weight).exists() and (d / "cgroup.procs").read_text()
        ]
        found.append(directory)
        return str(directory / weight)

    def weight_now() -> str:
        return (found[0] / weight).read_text().strip()

    async with Sandbox(deployment()) as sandbox:
        result = await sandbox.run(
            RAISE_WEIGHT,
            profile=PROFILE,
            bindings=FunctionBindings({"weight_file": weight_file, "weight_now": weight_now}),
        )
    assert result.error is None, result.error
    before, attempt, after = result.return_value
    assert before == after == expected
    assert attempt != "written"


async def test_without_a_cgroup_usage_is_not_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroups, "detect", lambda: "no cgroups (made so by the test)")
    async with Sandbox(deployment()) as sandbox:
        result, seen = await run_hiding(sandbox)
    assert result.error is None, result.error
    assert sum(seen) >= 2 * BURN_SECONDS * 0.9
    # Not a low number: nothing here could count the hidden children.
    assert result.usage.measured_by == "none"
    assert result.usage.cpu_seconds is None
    assert result.usage.peak_memory_bytes is None


def test_leftover_cgroups_of_a_dead_host_are_removed_and_a_live_hosts_kept() -> None:
    """A host that died before teardown left its execution's (empty) cgroup behind; the next
    host removes it. Its name carries the owner's start time, so a pid reused by a live
    process does not keep it, and a live host's own cgroup stays."""
    host = cgroups.detect()
    if isinstance(host, str):
        pytest.skip(host)
    pid = os.getpid()
    dead = f"{cgroups.PREFIX}subprocess-{pid}.1-{uuid.uuid4().hex[:12]}"
    alive = f"{cgroups.PREFIX}subprocess-{temp_dirs.owner_tag()}-{uuid.uuid4().hex[:12]}"
    parents = list(dict.fromkeys(host.parents.values()))
    try:
        for parent in parents:
            (parent / dead).mkdir()
            (parent / alive).mkdir()
        cgroups.remove_leftovers(host)
        assert [p for p in parents if (p / dead).exists()] == []
        assert [p for p in parents if not (p / alive).is_dir()] == []
    finally:
        for parent in parents:
            for name in (dead, alive):
                with contextlib.suppress(OSError):
                    (parent / name).rmdir()
