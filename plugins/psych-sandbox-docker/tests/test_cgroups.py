"""No cgroup of an execution outlives it, in any hierarchy: the cgroup directories of every
mounted hierarchy (v1 controllers and, on a hybrid host, the unified v2 one) are listed from
the host before and after executions that succeed, time out, are OOM-killed and are
cancelled."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from docker_support import PROFILE, RUNTIMES, config
from psych_sandbox_core import FunctionBindings, Sandbox
from psych_sandbox_core.kit.posix import (
    EXECUTION_CPU_SHARES,
    owner_tag,
)
from psych_sandbox_core.kit.posix import cgroup_hierarchies as hierarchies
from psych_sandbox_testing.host import cgroup_directories
from psych_sandbox_testing.programs import cgroups_of_one_execution

from psych_sandbox_docker import engine as eng
from psych_sandbox_docker.engine import CGROUP_ROOT, current_owner

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("engine")]

#: Fills both tmpfs mounts (which the address-space limit does not see), then the heap: the
#: container's memory cgroup is exhausted and the kernel's OOM killer ends the program.
OOM = (
    "for d in ('/workspace', '/tmp'):\n"
    "    with open(f'{d}/fill', 'wb') as fh:\n"
    "        for _ in range(100):\n            fh.write(b'x' * 2**20)\n"
    "x = bytearray(b'y') * (200 * 2**20)\n"
    "len(x)"
)

ENDINGS: dict[str, tuple[str, dict[str, Any], dict[str, Any], str | None]] = {
    # name: (program after seen(), options, limits, error kind)
    "success": ("'done'", {}, {}, None),
    "timeout": (
        "import time\nwhile True:\n    time.sleep(1)",
        {},
        {"wall_seconds": 1.0, "grace_seconds": 0.2},
        "timeout",
    ),
    "oom-kill": (
        OOM,
        {"workspace_bytes": 128 * 2**20, "tmp_bytes": 128 * 2**20},
        {"memory_bytes": 256 * 2**20, "file_size_bytes": 128 * 2**20},
        "memory_limit",
    ),
    "cancelled": ("import time\nwhile True:\n    time.sleep(1)", {}, {}, None),
}


@RUNTIMES
@pytest.mark.parametrize("ending", sorted(ENDINGS))
async def test_no_cgroup_left_in_any_hierarchy(runtime: str, ending: str) -> None:
    program, options, limits, kind = ENDINGS[ending]
    result, during, left = await cgroups_of_one_execution(
        config(runtime, options, **limits),
        "box",
        "await seen()\n" + program,
        cancel=ending == "cancelled",
    )
    if ending == "cancelled":
        assert result is None
    else:
        assert result is not None
        if kind is None:
            assert result.error is None, result.error
        else:
            assert result.error is not None and result.error.kind.value == kind, result.error
    # The control: while the program ran, the host saw the execution's cgroups, in every
    # hierarchy the runtime used (on a hybrid host, the unified one among them).
    if result is None or result.usage.measured_by == "host":
        ours = f"/{CGROUP_ROOT}/{current_owner().token}-"
        made = {path.split(ours)[0] for path in during if ours in path}
        expected = {str(h.point) for h in hierarchies()}
        assert made == expected, (sorted(during), sorted(expected))
    assert left == []


def test_reaper_removes_dead_hosts_cgroup_parents_in_every_hierarchy() -> None:
    """A host that died before teardown left its parents in every hierarchy, the unified one
    included: the reaper removes them there too, and leaves a live host's alone."""
    me = eng.current_owner()
    # Our pid with another start time: the process that made it is gone.
    dead = f"{me.pid}.1-{uuid.uuid4().hex[:12]}"
    alive = f"{me.token}-{uuid.uuid4().hex[:12]}"
    points = [h.point for h in hierarchies()]
    try:
        for name in (dead, alive):
            eng.create_cgroup_parent(name)
        # The runtime's own cgroup below the parent, as a container that ended would leave.
        for point in points:
            (point / CGROUP_ROOT / dead / "container").mkdir()
        eng.reap_orphans("docker")
        assert [p for p in points if (p / CGROUP_ROOT / dead).exists()] == []
        assert [p for p in points if not (p / CGROUP_ROOT / alive).is_dir()] == []
    finally:
        for name in (dead, alive):
            eng.remove_cgroup_parent(name)


#: The weight file of a cgroup v1 cpu hierarchy and of v2, and what the engine writes there
#: for the execution's shares (v2: runc's conversion of shares to a weight).
CPU_WEIGHTS = {
    "cpu.shares": EXECUTION_CPU_SHARES,
    "cpu.weight": 1 + (EXECUTION_CPU_SHARES - 2) * 9999 // 262142,
}


def own_processes(directory: str) -> bool:
    try:
        with open(os.path.join(directory, "cgroup.procs")) as file:
            return bool(file.read().split())
    except OSError:
        return False


@RUNTIMES
async def test_the_container_runs_at_the_executions_cpu_weight(runtime: str) -> None:
    # Read from the container's own cgroup while the program runs: the weight every
    # execution gets, so the host and the machine's other work come first when it is busy.
    before = cgroup_directories()
    seen_weights: list[tuple[str, int]] = []

    def seen() -> None:
        for directory in sorted(cgroup_directories() - before):
            if owner_tag() not in directory:
                continue  # another host process's (tests run side by side)
            for name in CPU_WEIGHTS:
                path = os.path.join(directory, name)
                if os.path.exists(path) and own_processes(directory):
                    with open(path) as file:
                        seen_weights.append((name, int(file.read())))

    async with Sandbox(config(runtime)) as sandbox:
        result = await sandbox.run(
            "await seen()\n'done'", profile=PROFILE, bindings=FunctionBindings({"seen": seen})
        )
    assert result.error is None, result.error
    assert seen_weights
    assert all(value == CPU_WEIGHTS[name] for name, value in seen_weights), seen_weights
