"""Containment in a container that is the docker backend's own, asserted from the host: its
grades and usage, its runtime's process and memory accounting, under runc and under gVisor's
runsc. Host files and sockets, writes outside the workspace, host processes, identity, the
fork and memory bombs, the tmpfs caps, loopback listeners, limits, the detached daemon and
cancellation are the shared suite's (test_conformance.py)."""

from __future__ import annotations

import os
import signal

import anyio
import pytest
from docker_support import RUNTIMES, leased, run
from psych_sandbox_testing.host import marker, pids_with, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("engine")]

ISOLATING = ("filesystem", "network", "process_tree", "identity", "memory")


@RUNTIMES
async def test_level_isolated_grades_and_usage_from_the_cgroup(runtime: str) -> None:
    result = await run("print(2 + 2)\nimport os\n[os.getuid(), os.getpid()]", runtime)
    assert result.error is None, result.error
    assert result.stdout == "4\n"
    assert result.level == "isolated"
    for guarantee in ISOLATING:
        assert result.grades[guarantee] == "enforced", guarantee
    # The pids cgroup is the process limit only under runc (see the README).
    assert result.grades["process_count"] == ("enforced" if runtime == "runc" else "unverified")
    uid, pid = result.return_value
    # A uid leased for this execution (no user namespace: the host's uid too).
    assert leased(uid) if os.geteuid() == 0 else uid == 65534
    assert pid != 1, "the program must run below the container's init"
    assert result.backend.id == "docker"
    assert result.backend.distribution == "psych-sandbox-docker"
    assert result.usage.measured_by == "host"
    assert result.usage.cpu_seconds is not None and result.usage.cpu_seconds > 0
    assert result.usage.peak_memory_bytes is not None and result.usage.peak_memory_bytes > 0


async def test_run_holds_only_the_control_socket_directory() -> None:
    # The only host path in the container (host files, service sockets and writes outside
    # the workspace are the shared suite's).
    result = await run("import os\nsorted(os.listdir('/run'))")
    assert result.error is None, result.error
    assert result.return_value == ["psych"]


@RUNTIMES
async def test_multi_process_program_works(runtime: str) -> None:
    """Processes are not a gVisor sandbox killer: the program's limit applies, not the
    runtime's own task count."""
    result = await run(
        "import os, subprocess, sys\n"
        "runs = [subprocess.run([sys.executable, '-c', 'print(1)'], capture_output=True)"
        ".stdout for _ in range(20)]\n"
        "forks = []\n"
        "for _ in range(20):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n        os._exit(7)\n"
        "    forks.append(os.waitpid(pid, 0)[1] >> 8)\n"
        "procs = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(0.5)'])"
        " for _ in range(20)]\n"
        "codes = [p.wait() for p in procs]\n"
        "[runs.count(b'1\\n'), forks.count(7), codes.count(0)]",
        runtime,
    )
    assert result.error is None, result.error
    assert result.return_value == [20, 20, 20]


@RUNTIMES
async def test_cgroup_oom_kill_is_memory_limit_not_a_crash(runtime: str) -> None:
    """Memory the address-space limit does not see (tmpfs pages) plus the heap exhausts the
    container's memory cgroup: the kernel's OOM killer ends the program, and that is reported
    as memory exhaustion."""
    result = await run(
        "for d in ('/workspace', '/tmp'):\n"
        "    with open(f'{d}/fill', 'wb') as fh:\n"
        "        for _ in range(100):\n            fh.write(b'x' * 2**20)\n"
        "x = bytearray(b'y') * (200 * 2**20)\n"
        "len(x)",
        runtime,
        options={"workspace_bytes": 128 * 2**20, "tmp_bytes": 128 * 2**20},
        memory_bytes=256 * 2**20,
        file_size_bytes=128 * 2**20,
    )
    assert result.error is not None
    assert result.error.kind.value == "memory_limit", result.error
    assert "out-of-memory" in result.error.message


async def test_the_program_has_a_network_namespace_of_its_own_with_only_loopback() -> None:
    # From the host: the program's process (runc: a host process) is in a network namespace
    # other than the host's, whose only interface is lo.
    mark = marker()
    seen: dict[str, object] = {}

    async def inspect() -> None:
        (pid,) = await wait_until(lambda: pids_with(mark))
        seen["namespace"] = os.stat(f"/proc/{pid}/ns/net").st_ino
        with open(f"/proc/{pid}/net/dev") as table:
            seen["interfaces"] = sorted(
                line.split(":")[0].strip() for line in table.read().splitlines()[2:]
            )
        os.kill(pid, signal.SIGKILL)

    async with anyio.create_task_group() as tg:
        tg.start_soon(inspect)
        result = await run(
            "import subprocess, sys\n"
            "sleeper = [sys.executable, '-c', 'import time; time.sleep(60)']\n"
            f"ended = subprocess.run([*sleeper, {mark!r}])\n"
        )
    assert result.error is None, result.error
    assert seen["namespace"] != os.stat("/proc/self/ns/net").st_ino
    assert seen["interfaces"] == ["lo"]
