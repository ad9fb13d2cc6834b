"""Warm executions hand their result back once the program's output and result are complete
(end markers on both streams, then the result frame); the container's teardown finishes in
the Sandbox's task group. Asserted against a real engine, from the host side."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
from docker_support import (
    PROFILE,
    RUNTIMES,
    config,
    leftover_containers,
    live_in_containers,
)
from psych_sandbox_core import DeploymentConfig, ErrorKind, ExecutionResult, Sandbox
from psych_sandbox_testing.host import marker, pids_with
from psych_sandbox_testing.leases import held_leases
from psych_sandbox_testing.phases import recording
from psych_sandbox_testing.programs import DAEMON

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("engine")]

MiB = 1024 * 1024


def warm(runtime: str = "runc", **limits: Any) -> DeploymentConfig:
    base = config(runtime, **limits)
    profile = base.profiles[PROFILE].model_copy(update={"warm": 1})
    return base.model_copy(update={"profiles": {PROFILE: profile}})


async def run_warm(source: str, runtime: str = "runc", **limits: Any) -> ExecutionResult:
    async with Sandbox(warm(runtime, **limits)) as sandbox:
        await sandbox.warmed(PROFILE)
        return await sandbox.run(source, profile=PROFILE)


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


#: Finds the execution's end marker in the bootstrap's own frames, as a hostile program can.
FIND_MARKER = src(
    """
    import sys
    _f = sys._getframe()
    while _f is not None and "end_marker" not in _f.f_locals:
        _f = _f.f_back
    marker = _f.f_locals["end_marker"].encode()
    """
)

PROGRAM = src(
    """
    import sys
    print("out", 2 + 2)
    print("err line", file=sys.stderr)
    {"answer": [1, 2, 3]}
    """
)


@RUNTIMES
async def test_warm_result_matches_cold(runtime: str) -> None:
    async with Sandbox(config(runtime)) as sandbox:
        cold = await sandbox.run(PROGRAM, profile=PROFILE)
    early = await run_warm(PROGRAM, runtime)
    assert cold.error is None and early.error is None, (cold.error, early.error)
    assert (early.stdout, early.stderr) == (cold.stdout, cold.stderr) == ("out 4\n", "err line\n")
    assert early.return_value == cold.return_value == {"answer": [1, 2, 3]}
    assert early.level == cold.level == "isolated"
    assert early.grades == cold.grades
    assert early.stdout_info.after_end_bytes == early.stderr_info.after_end_bytes == 0


async def test_five_megabytes_of_output_arrive_whole() -> None:
    size = 5 * MiB
    source = src(
        f"""
        import sys
        line = "x" * 1023 + "\\n"
        for _ in range({size // 1024} - 1):
            sys.stdout.write(line)
        sys.stdout.write("y" * 1023 + "\\n")
        """
    )
    result = await run_warm(source, stdout_bytes=8 * MiB)
    assert result.error is None, result.error
    info = result.stdout_info
    assert info.total_bytes == info.captured_bytes == size
    assert info.dropped_bytes == 0 and info.after_end_bytes == 0
    assert result.stdout.endswith("y" * 1023 + "\n")


async def test_printing_the_marker_only_cuts_the_programs_own_output() -> None:
    # The program prints the marker mid-output, then a background process writes after it:
    # both are dropped and counted, and the result itself is untouched.
    source = FIND_MARKER + src(
        """
        import os
        os.write(1, b"before\\n")
        os.write(1, marker[:7])
        os.write(1, marker[7:] + b"after\\n")
        child = os.fork()
        if child == 0:
            os.write(1, b"late\\n")
            os._exit(0)
        os.waitpid(child, 0)
        print("also dropped")
        7
        """
    )
    result = await run_warm(source)
    assert result.error is None, result.error
    assert result.return_value == 7
    assert result.stdout == "before\n"
    assert result.stderr == ""
    dropped = len("after\n") + len("late\n") + len("also dropped\n")
    # The bootstrap's own marker comes after all of it, and is counted with it.
    marker_length = len("<psych-sandbox-end:>") + 32
    assert result.stdout_info.after_end_bytes == dropped + marker_length
    assert result.stdout_info.total_bytes == len("before\n")
    assert result.level == "isolated"


async def test_nothing_is_left_once_the_sandbox_closes() -> None:
    source = src(
        """
        import subprocess, sys
        # Left running after the result: the container's end takes it.
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print("done")
        """
    )
    async with Sandbox(warm()) as sandbox:
        for _ in range(3):
            await sandbox.warmed(PROFILE)
            result = await sandbox.run(source, profile=PROFILE)
            assert result.error is None, result.error
            assert result.stdout == "done\n"
    assert leftover_containers() == []
    assert held_leases() == []


async def test_a_closed_stdout_falls_back_to_the_full_teardown() -> None:
    # No marker can be written: the result waits for the stream's end, as a cold one does.
    result = await run_warm("import os\nos.close(1)\n5")
    assert result.error is None, result.error
    assert result.return_value == 5
    assert result.stdout == "" and result.stdout_info.after_end_bytes == 0


async def test_a_timeout_comes_back_with_the_container_ended_before_its_removal() -> None:
    mark = marker()
    # A daemon that left the program's session and ignores SIGTERM, and the program asleep.
    program = DAEMON.format(mark=mark) + "while True:\n    time.sleep(1)\n"
    with recording() as reached:
        async with Sandbox(config(wall_seconds=1.0, grace_seconds=0.2)) as sandbox:
            result = await sandbox.run(program, profile=PROFILE)
            # Judged from the host's kernel the moment the result is back, the Sandbox still
            # open (the engine may not have noticed the container's end yet).
            left = pids_with(mark)
            running = live_in_containers()
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT, result.error
    assert "wall-clock" in result.error.message
    assert left == [] and running == []
    points = [point for point, _ in reached]
    # Handed back once the host saw the container's init end; removed after it.
    assert points.index("result handed back") < points.index("launch left"), points
