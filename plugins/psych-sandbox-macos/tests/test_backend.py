"""The macos backend where it can be tested off macOS: registration and doctor, grades and
level through the core's grading, the refusal of the isolated level; and on macOS (CI), real
executions under the generated profile, judged from the host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from psych_sandbox_core import DeploymentConfig, Grade, Guarantee, Level, ProfileConfig, level_of
from psych_sandbox_core.kit.relay import ContainmentReport, grade
from psych_sandbox_testing.cli_run import cli_main
from psych_sandbox_testing.selection import BackendRegistry, config_problems

from psych_sandbox_macos.backend import MacosBackend

on_macos = sys.platform == "darwin"
off_macos = pytest.mark.skipif(on_macos, reason="tests the other platforms")
needs_macos = pytest.mark.skipif(not on_macos, reason="needs seatbelt (macOS; run in CI)")

#: What the bootstrap reports on macOS: rlimits listed, the canary out of reach, no network.
LIMITS = [
    {"name": name, "soft": -1, "hard": -1} for name in ("CORE", "CPU", "AS", "FSIZE", "NPROC")
]


def macos_report(**overrides: Any) -> ContainmentReport:
    data: dict[str, Any] = {
        "uid": 501,
        "euid": 501,
        "gid": 20,
        "pid": 4242,
        "canary_readable": False,
        "network": {"ipv4": "unreachable", "ipv6": "unreachable", "interfaces_up": []},
        "limits": LIMITS,
        "capabilities": None,
        "sees_foreign_processes": None,
        "python": "3.12.7",
        "platform": "darwin",
    }
    data.update(overrides)
    return ContainmentReport.model_validate(data)


@off_macos
def test_installed_registered_and_unavailable_here() -> None:
    registry = BackendRegistry()
    registered = registry.get("macos")
    assert registered.cls is MacosBackend
    assert registered.distribution == "psych-sandbox-macos"
    backend = registry.create("macos", {})
    assert backend.unavailable_reason() == (
        f"requires macOS (seatbelt); this host is {sys.platform}"
    )


@off_macos
def test_doctor_reports_it_unavailable_and_fails_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Through the CLI's entry point in this process: the trials doctor runs are remembered.
    cli_main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    row = next(b for b in report["backends"] if b["id"] == "macos")
    assert row["works"] is False and row["reason"].startswith("requires macOS")
    assert not any("macos" in error for error in report["errors"])
    cli_main(["doctor"])
    text = capsys.readouterr().out
    assert (
        "macos (psych-sandbox-macos 0.2.0; claims process): does not work here: "
        "requires macOS" in text
    )


@needs_macos
def test_doctor_shows_it_working_with_its_level_and_grades() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "psych_sandbox_core", "doctor", "--json"],
        capture_output=True,
        timeout=300,
    )
    row = next(b for b in json.loads(completed.stdout)["backends"] if b["id"] == "macos")
    assert row["works"] is True, row
    assert row["level"] == "process"
    assert row["grades"]["filesystem"] == "unverified"
    assert row["grades"]["memory"] == "unavailable"


def test_grades_and_level_on_macos() -> None:
    grades = grade(MacosBackend.mechanisms(), macos_report(), host_uid=501)
    assert grades == {
        # A deny-list profile: unverified however the canary came back.
        Guarantee.FILESYSTEM: Grade.UNVERIFIED,
        Guarantee.NETWORK: Grade.ENFORCED,
        Guarantee.PROCESS_TREE: Grade.UNVERIFIED,
        Guarantee.IDENTITY: Grade.UNAVAILABLE,
        Guarantee.CPU: Grade.UNVERIFIED,
        # RLIMIT_AS is accepted and not enforced: nothing caps memory.
        Guarantee.MEMORY: Grade.UNAVAILABLE,
        Guarantee.FILE_SIZE: Grade.UNVERIFIED,
        Guarantee.PROCESS_COUNT: Grade.UNVERIFIED,
        Guarantee.WALL_CLOCK: Grade.UNVERIFIED,
        Guarantee.ENVIRONMENT: Grade.ENFORCED,
    }
    assert level_of(grades) is Level.PROCESS
    # A canary the child could read proves exposure: unavailable, whatever the profile says.
    exposed = grade(MacosBackend.mechanisms(), macos_report(canary_readable=True), host_uid=501)
    assert exposed[Guarantee.FILESYSTEM] is Grade.UNAVAILABLE
    assert level_of(exposed) is Level.PROCESS
    # A network probe that connected proves exposure too.
    reached = grade(
        MacosBackend.mechanisms(),
        macos_report(network={"ipv4": "connected", "ipv6": "unreachable", "interfaces_up": []}),
        host_uid=501,
    )
    assert reached[Guarantee.NETWORK] is Grade.UNAVAILABLE


def test_a_request_for_isolated_is_refused_not_approximated() -> None:
    assert MacosBackend.claims is Level.PROCESS
    config = DeploymentConfig(
        profiles={"strict": ProfileConfig(backend="macos", required_level=Level.ISOLATED)}
    )
    problems = config_problems(config, BackendRegistry())
    assert any(p.profile == "strict" and "can never be reached" in p.message for p in problems)


# ---------------------------------------------------------------- on macOS (CI)


@needs_macos
@pytest.mark.anyio
async def test_writes_are_confined_and_the_network_denied() -> None:
    import tempfile

    from psych_sandbox_core import ExecutionLimits, Sandbox

    outside = tempfile.mkdtemp(prefix="psych-outside-")
    target = os.path.join(outside, "written")
    home_file = os.path.join(os.path.expanduser("~"), ".psych-sandbox-test-canary")
    with open(home_file, "w") as fh:
        fh.write("secret")
    try:
        config = DeploymentConfig(
            profiles={
                "mac": ProfileConfig(
                    backend="macos",
                    limits=ExecutionLimits(cpu_seconds=10, wall_seconds=60.0),
                )
            }
        )
        source = f"""
import socket
out = {{}}
for name, path in (("outside", {target!r}), ("home", {home_file!r} + ".w")):
    try:
        open(path, "w").write("x"); out[name] = "wrote"
    except OSError as exc:
        out[name] = type(exc).__name__
try:
    open({home_file!r}).read(); out["read_home"] = "read"
except OSError as exc:
    out["read_home"] = type(exc).__name__
open("inside.txt", "w").write("ok")
out["inside"] = open("inside.txt").read()
try:
    socket.create_connection(("1.1.1.1", 53), timeout=3); out["net"] = "connected"
except OSError as exc:
    out["net"] = type(exc).__name__
return out
"""
        async with Sandbox(config) as sandbox:
            result = await sandbox.run(source, profile="mac")
        assert result.error is None, result.error
        assert result.return_value["inside"] == "ok"
        # Judged from the host: nothing was written outside the workspace.
        assert not os.path.exists(target)
        assert not os.path.exists(home_file + ".w")
        assert result.return_value["read_home"] != "read"
        assert result.return_value["net"] != "connected"
        assert result.level == "process"
        assert result.grades["filesystem"] == "unverified"
        assert result.grades["memory"] == "unavailable"
    finally:
        os.unlink(home_file)
        os.rmdir(outside)
