"""Usage and outside caps from the execution's cgroup, asserted from the host: CPU time and
peak memory of the whole tree, an out-of-memory kill reported as such, a fork bomb stopped by
the pids cgroup, and no cgroup left behind."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bwrap_support import BWRAP_ROOT, PROFILE, config, requires_bwrap, run
from psych_sandbox_core.kit.posix import (
    owner_tag,
)
from psych_sandbox_testing.cgroups_here import CGROUP_PREFIX, CgroupHost, cgroup_host
from psych_sandbox_testing.programs import cgroups_of_one_execution
from psych_sandbox_testing.requirements import needs

from psych_sandbox_bwrap import backend
from psych_sandbox_bwrap.backend import (
    DEFAULT_PIDS,
    PIDS_CGROUP_HEADROOM,
    BwrapBackend,
    BwrapOptions,
)

pytestmark = [pytest.mark.anyio]

MiB = 1024 * 1024
HOST = cgroup_host()
needs_cgroups = needs(isinstance(HOST, CgroupHost), BWRAP_ROOT, f"no per-execution cgroups: {HOST}")
pytestmark.append(needs_cgroups)


def our_cgroups() -> list[Path]:
    """Per-execution cgroup directories this test process made, found by walking every
    mounted hierarchy (not by asking the code under test where it put them)."""
    mine = f"{CGROUP_PREFIX}bwrap-{owner_tag()}-"
    found = []
    for top, dirs, _ in os.walk("/sys/fs/cgroup"):
        for name in dirs:
            if name.startswith(mine):
                found.append(Path(top) / name)
    return found


@pytest.fixture(autouse=True)
def nothing_left() -> Iterator[None]:
    assert our_cgroups() == []
    yield
    assert our_cgroups() == []


@pytest.mark.parametrize("joined_by", ["setpriv", "pre-exec step"])
async def test_cpu_of_the_whole_tree_measured_from_the_host(
    joined_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if joined_by == "setpriv":
        assert backend._setpriv() is not None, "setpriv with --pdeathsig is missing here"
    else:
        # A host without setpriv: the forked child joins the cgroup in Python instead.
        monkeypatch.setattr(backend, "_setpriv", lambda: None)
    # A child burns the CPU, not the process bwrap started: wait4 on bwrap saw ~0.003 s.
    result = await run(
        "import os, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    t = time.process_time()\n"
        "    while time.process_time() - t < 1.0:\n        pass\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n'done'"
    )
    assert result.error is None, result.error
    assert result.usage.measured_by == "host"
    assert result.usage.cpu_seconds is not None
    assert 1.0 <= result.usage.cpu_seconds < 10


async def test_peak_memory_measured() -> None:
    result = await run("x = b'x' * (200 * 1024 * 1024)\nlen(x)")
    assert result.error is None, result.error
    assert result.return_value == 200 * MiB
    assert result.usage.measured_by == "host"
    assert result.usage.peak_memory_bytes is not None
    assert result.usage.peak_memory_bytes > 200 * MiB


async def test_caps_graded_enforced() -> None:
    result = await run("1")
    assert result.error is None, result.error
    assert result.grades["memory"] == "enforced"
    assert result.grades["process_count"] == "enforced"
    assert result.level == "isolated"


async def test_memory_bomb_beyond_the_cgroup_is_memory_limit() -> None:
    """Every process stays under its own address-space limit (128 MiB); together they pass
    the tree's cap (128 MiB + 3 x 1 MiB of tmpfs + headroom), which only the cgroup sees."""
    result = await run(
        "import os\n"
        "ready_r, ready_w = os.pipe()\nhold_r, hold_w = os.pipe()\n"
        "for _ in range(3):\n"
        "    if os.fork() == 0:\n"
        "        held = b'c' * (30 * 1024 * 1024)\n"
        "        os.write(ready_w, b'1')\n"
        "        os.read(hold_r, 1)\n"
        "        os._exit(0)\n"
        "got = b''\n"
        "while len(got) < 3:\n    got += os.read(ready_r, 3)\n"
        "big = b'p' * (90 * 1024 * 1024)\n"
        "len(big)",
        options={"workspace_bytes": MiB, "tmp_bytes": MiB, "shm_bytes": MiB},
        memory_bytes=128 * MiB,
    )
    assert result.error is not None, result.return_value
    assert result.error.kind.value == "memory_limit"
    assert "memory cgroup" in result.error.message
    assert result.usage.peak_memory_bytes is not None
    assert result.usage.peak_memory_bytes > 128 * MiB


async def test_fork_bomb_stopped_by_the_pids_cgroup_with_host_responsive() -> None:
    # No process-count rlimit: only the pids cgroup (the default cap) stops it.
    result = await run(
        "import os, time\nmade = 0\n"
        "try:\n    for _ in range(2000):\n        pid = os.fork()\n"
        "        if pid == 0:\n            time.sleep(60)\n            os._exit(0)\n"
        "        made += 1\nexcept OSError as e:\n    err = type(e).__name__\n"
        "else:\n    err = None\n"
        "[made, err]",
        processes=None,
    )
    assert subprocess.run(["true"], check=False).returncode == 0
    assert result.error is None, result.error
    made, err = result.return_value
    assert err == "BlockingIOError"
    # The cgroup's cap counts bwrap's two processes and the program besides the children.
    assert made <= DEFAULT_PIDS + PIDS_CGROUP_HEADROOM - 3
    assert result.grades["process_count"] == "enforced"


async def test_no_cgroup_left_after_a_failed_start(tmp_path: Path) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: refused (simulated)' >&2\nexit 1\n")
    fake.chmod(0o755)
    tmp_path.chmod(0o755)
    result = await run("1", options={"bwrap": str(fake)})
    assert result.error is not None
    assert result.error.kind.value == "backend_not_ready"
    # The autouse fixture checks the filesystem afterwards.


#: Three children hold 30 MiB each, then the parent takes 90 MiB: each process stays under
#: its address-space limit, the tree passes its memory cgroup's cap.
CGROUP_OOM = (
    "import os\n"
    "ready_r, ready_w = os.pipe()\nhold_r, hold_w = os.pipe()\n"
    "for _ in range(3):\n"
    "    if os.fork() == 0:\n"
    "        held = b'c' * (30 * 1024 * 1024)\n"
    "        os.write(ready_w, b'1')\n"
    "        os.read(hold_r, 1)\n"
    "        os._exit(0)\n"
    "got = b''\n"
    "while len(got) < 3:\n    got += os.read(ready_r, 3)\n"
    "big = b'p' * (90 * 1024 * 1024)\n"
    "len(big)"
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
        CGROUP_OOM,
        {"workspace_bytes": MiB, "tmp_bytes": MiB, "shm_bytes": MiB},
        {"memory_bytes": 128 * MiB},
        "memory_limit",
    ),
    "cancelled": ("import time\nwhile True:\n    time.sleep(1)", {}, {}, None),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
async def test_no_cgroup_left_in_any_hierarchy(ending: str) -> None:
    """Every mounted hierarchy (v1 controllers and, on a hybrid host, the unified one) is
    listed from the host before and after an execution ending each way."""
    program, options, limits, kind = ENDINGS[ending]
    result, during, left = await cgroups_of_one_execution(
        config(options, **limits),
        PROFILE,
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
    # The control: while the program ran, the host saw its cgroup in each hierarchy used.
    assert isinstance(HOST, CgroupHost)
    mine = f"{CGROUP_PREFIX}bwrap-{owner_tag()}-"
    made = {Path(path).parent for path in during if Path(path).name.startswith(mine)}
    assert made == set(HOST.parents.values()), during
    assert left == []


@requires_bwrap
def test_the_bare_equivalent_is_the_same_sandbox_without_the_bootstrap() -> None:
    """What benchmarks compare a cold execution with: bubblewrap with the backend's own
    options, up to the command, running the interpreter's start-up, and it does start."""
    backend = BwrapBackend(BwrapOptions())
    bare = backend.bare_command()
    assert bare[-4:] == [backend.interpreter, "-I", "-c", "pass"]
    options = bare[: bare.index("--")]
    for isolation in ("--unshare-all", "--unshare-user", "--disable-userns", "--clearenv"):
        assert isolation in options
    assert options.count("--tmpfs") >= 3
    done = subprocess.run(bare, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
