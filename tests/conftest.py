"""Shared fixtures: a sandbox on the subprocess backend, private temp dirs, host-side probes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

# Host-side probes, shared with every backend's tests; re-exported for this suite's modules.
from psych_sandbox_testing.host import (  # noqa: F401
    marker,
    open_fds,
    pids_with,
    private_tempdir,
    wait_for_pids,
)

from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core.kit.backend import ProbeTargets
from psych_sandbox_core.kit.probe_harness import ProbeHarness

PROFILE = "test"

#: Small budgets so a test that needs a timeout reaches it quickly.
FAST_LIMITS: dict[str, Any] = {"cpu_seconds": 5, "wall_seconds": 30.0, "grace_seconds": 0.5}


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def probe_targets(monkeypatch: pytest.MonkeyPatch) -> list[ProbeTargets]:
    """The probe targets this test's executions make, as their harnesses make them: a test
    that reaches listeners reaches these and no other (the host's other listeners belong to
    executions of other tests running beside it, whose evidence it must not become)."""
    made: list[ProbeTargets] = []
    original = ProbeHarness.made

    def recording(self: ProbeHarness) -> ProbeTargets:
        targets = original(self)
        made.append(targets)
        return targets

    monkeypatch.setattr(ProbeHarness, "made", recording)
    return made


def config(
    *,
    options: dict[str, Any] | None = None,
    required_level: Any = None,
    warm: int | None = None,
    **limits: Any,
) -> DeploymentConfig:
    """A deployment with one profile, ``test``, on the subprocess backend (``warm``: its
    prepared children; unset is the Sandbox's default pool)."""
    extra: dict[str, Any] = {"warm": warm}
    if required_level is not None:
        extra["required_level"] = required_level
    return DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(
                backend="subprocess",
                options=options or {},
                limits=ExecutionLimits(**{**FAST_LIMITS, **limits}),
                **extra,
            )
        }
    )


async def run(source: str, **limits: Any) -> Any:
    """Run one program under the test profile with the given limits."""
    async with Sandbox(config(**limits)) as sandbox:
        return await sandbox.run(source, profile=PROFILE)


@pytest.fixture
def private_tmp() -> Iterator[Path]:
    """Point the host's temp dir at a fresh directory, so what an execution leaves behind
    is visible there and not mixed with anyone else's files."""
    with private_tempdir() as root:
        yield Path(root)


def sleeper_argv_source(mark: str) -> str:
    """Program text for an argv that runs a long-lived interpreter carrying ``mark``."""
    return f"[sys.executable, '-c', 'import time\\nwhile True: time.sleep(1)', {mark!r}]"


def host_rss_peak_reset() -> bool:
    """Reset this process's peak RSS counter (VmHWM); False where the kernel does not allow."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def host_rss_peak() -> int:
    """This process's peak resident set, in bytes."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def host_rss() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox(config()) as box:
        yield box
