"""The windows backend where it can be tested off Windows: registration and doctor, the
environment allow-list, grades and level through the core's grading, refusals, and the real
bootstrap started the way the backend starts it (the loader on stdin, the token channel),
with the POSIX-only calls it guards removed from its interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import anyio
import pytest
from psych_sandbox_core import (
    DeploymentConfig,
    ExecutionLimits,
    Grade,
    Guarantee,
    Level,
    ProfileConfig,
    level_of,
)
from psych_sandbox_core.kit import LaunchRequest, LoopbackTokenChannel, ProbeTargets
from psych_sandbox_core.kit.relay import (
    ChildLimits,
    ContainmentReport,
    HelloFrame,
    ResultFrame,
    RunFrame,
    bootstrap_source,
    grade,
)
from psych_sandbox_testing.cli_run import cli_main
from psych_sandbox_testing.host_frames import FrameChannel
from psych_sandbox_testing.selection import BackendRegistry, config_problems

from psych_sandbox_windows.backend import (
    LOADER,
    WindowsBackend,
    WindowsOptions,
    stdin_payload,
    windows_environment,
)

off_windows = pytest.mark.skipif(sys.platform == "win32", reason="tests the other platforms")
needs_windows = pytest.mark.skipif(sys.platform != "win32", reason="needs Windows (run in CI)")


def windows_report(**overrides: Any) -> ContainmentReport:
    """What the bootstrap reports on Windows: no POSIX ids, no rlimits, the host's network
    and files in reach."""
    data: dict[str, Any] = {
        "uid": -1,
        "euid": -1,
        "gid": -1,
        "pid": 4242,
        "canary_readable": True,
        "network": {"ipv4": "connected", "ipv6": "connected", "interfaces_up": ["Ethernet"]},
        "limits": [],
        "capabilities": None,
        "sees_foreign_processes": None,
        "python": "3.12.7",
        "platform": "win32",
    }
    data.update(overrides)
    return ContainmentReport.model_validate(data)


@off_windows
def test_installed_registered_and_unavailable_here() -> None:
    registry = BackendRegistry()
    assert "windows" in registry.ids()
    registered = registry.get("windows")
    assert registered.cls is WindowsBackend
    assert registered.distribution == "psych-sandbox-windows"
    backend = registry.create("windows", {})
    assert backend.unavailable_reason() == (
        f"requires Windows (Job Objects); this host is {sys.platform}"
    )


@off_windows
def test_doctor_reports_it_unavailable_and_fails_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Through the CLI's entry point in this process: the trials doctor runs are remembered.
    code = cli_main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    row = next(b for b in report["backends"] if b["id"] == "windows")
    assert row["works"] is False and row["reason"].startswith("requires Windows")
    assert row["distribution"] == "psych-sandbox-windows"
    # An installed backend that cannot work here is information, not a failure: doctor's
    # exit status is what it would be without it.
    assert not any("windows" in error for error in report["errors"])
    if report["verdict"]["backend"] != "windows":
        assert code in (0, 1)


@needs_windows
def test_doctor_shows_it_working_with_its_level_and_grades() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "psych_sandbox_core", "doctor", "--json"],
        capture_output=True,
        timeout=300,
    )
    row = next(b for b in json.loads(completed.stdout)["backends"] if b["id"] == "windows")
    assert row["works"] is True, row
    assert row["level"] == "process"
    assert row["grades"]["identity"] == "unavailable"
    assert row["grades"]["environment"] == "enforced"


def test_the_environment_is_an_allow_list() -> None:
    os.environ["PSYCH_TEST_SECRET"] = "hunter2"
    try:
        environment = windows_environment(r"C:\ws")
    finally:
        del os.environ["PSYCH_TEST_SECRET"]
    assert set(environment) == {"SYSTEMROOT", "TEMP", "TMP", "TMPDIR"}
    assert environment["TEMP"] == environment["TMP"] == r"C:\ws"


def test_grades_and_level_on_windows() -> None:
    grades = grade(WindowsBackend.mechanisms(limits_memory=True), windows_report(), host_uid=-1)
    assert grades == {
        Guarantee.FILESYSTEM: Grade.UNAVAILABLE,
        Guarantee.NETWORK: Grade.UNAVAILABLE,
        # The job holds the tree, but the program can reach the worker that holds the job.
        Guarantee.PROCESS_TREE: Grade.UNVERIFIED,
        # The worker's own account: no identity of its own.
        Guarantee.IDENTITY: Grade.UNAVAILABLE,
        Guarantee.CPU: Grade.UNVERIFIED,
        Guarantee.MEMORY: Grade.UNVERIFIED,
        Guarantee.FILE_SIZE: Grade.UNAVAILABLE,
        Guarantee.PROCESS_COUNT: Grade.UNVERIFIED,
        Guarantee.WALL_CLOCK: Grade.UNVERIFIED,
        Guarantee.ENVIRONMENT: Grade.ENFORCED,
    }
    assert level_of(grades) is Level.PROCESS
    without_memory = grade(
        WindowsBackend.mechanisms(limits_memory=False), windows_report(), host_uid=-1
    )
    assert without_memory[Guarantee.MEMORY] is Grade.UNAVAILABLE
    assert WindowsBackend.claims is Level.PROCESS


def test_a_profile_requiring_isolated_is_refused_at_configuration() -> None:
    config = DeploymentConfig(
        profiles={"strict": ProfileConfig(backend="windows", required_level=Level.ISOLATED)}
    )
    problems = config_problems(config, BackendRegistry())
    assert any(p.profile == "strict" and "can never be reached" in p.message for p in problems)


@off_windows
@pytest.mark.anyio
async def test_launch_off_windows_is_backend_unavailable() -> None:
    from psych_sandbox_core.kit import BackendUnavailable

    backend = WindowsBackend(WindowsOptions())
    request = LaunchRequest(
        bootstrap_source="",
        targets=lambda: ProbeTargets(None, None, None, os.getpid()),
        limits=ExecutionLimits(),
    )
    with pytest.raises(BackendUnavailable, match="requires Windows"):
        async with backend.launch(request):
            pass


#: Run before the loader: the interpreter looks like Windows' where the bootstrap guards
#: POSIX-only calls (no POSIX ids, no resource module, no directory descriptors).
WINDOWS_LIKE = (
    "import os,sys\n"
    "for _name in ('getuid','geteuid','getgid','O_DIRECTORY'):\n"
    "    if hasattr(os,_name): delattr(os,_name)\n"
    "sys.modules['resource']=None\n"
)


@pytest.mark.anyio
async def test_the_bootstrap_runs_as_the_backend_starts_it_with_posix_calls_absent() -> None:
    channel = LoopbackTokenChannel()
    await channel.open()
    probe = ProbeTargets(None, None, None, os.getpid()).as_json_object()
    process = await anyio.open_process(
        [
            sys.executable,
            "-I",
            "-u",
            "-c",
            WINDOWS_LIKE + LOADER,
            f"channel={channel.child_spec}",
            "probe=" + json.dumps(probe),
        ],
        env=windows_environment(os.getcwd()),
    )
    try:
        assert process.stdin is not None
        await process.stdin.send(stdin_payload(bootstrap_source(), channel))
        await process.stdin.aclose()
        with anyio.fail_after(60):
            frames = FrameChannel(await channel.accept())
            hello = await frames.receive()
        assert isinstance(hello, HelloFrame)
        report = hello.report
        assert (report.uid, report.euid, report.gid) == (-1, -1, -1)
        assert report.limits == []
        # Graded with the backend's mechanisms: the process level, identity unavailable.
        grades = grade(WindowsBackend.mechanisms(True), report, host_uid=-1)
        assert grades[Guarantee.IDENTITY] is Grade.UNAVAILABLE
        assert level_of(grades) is Level.PROCESS
        await frames.send(
            RunFrame(
                source="import os\nreturn [6 * 7, hasattr(os, 'getuid')]",
                tools=[],
                limits=ChildLimits(
                    cpu_seconds=10,
                    memory_bytes=None,
                    file_size_bytes=None,
                    processes=None,
                    return_value_bytes=65536,
                ),
            )
        )
        with anyio.fail_after(60):
            result = await frames.receive()
        assert isinstance(result, ResultFrame), result
        assert result.outcome == "returned" and json.loads(result.value_json or "") == [42, False]
        await frames.aclose()
        with anyio.fail_after(60):
            assert await process.wait() == 0
    finally:
        with anyio.CancelScope(shield=True):
            process.kill() if process.returncode is None else None
            await process.aclose()
            await channel.aclose()
