"""Helpers for the bwrap backend's tests: every test runs real bubblewrap and asserts from
the host side."""

from __future__ import annotations

import os
import shutil
import uuid
from typing import Any

import anyio
import pytest
from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core.result import ExecutionResult

PROFILE = "jail"
FAST_LIMITS: dict[str, Any] = {"cpu_seconds": 10, "wall_seconds": 60.0, "grace_seconds": 0.5}

requires_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed"
)


def config(options: dict[str, Any] | None = None, **limits: Any) -> DeploymentConfig:
    return DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(
                backend="bwrap",
                options=options or {},
                limits=ExecutionLimits(**{**FAST_LIMITS, **limits}),
            )
        }
    )


async def run(source: str, options: dict[str, Any] | None = None, **limits: Any) -> ExecutionResult:
    async with Sandbox(config(options, **limits)) as sandbox:
        return await sandbox.run(source, profile=PROFILE)


def marker() -> str:
    return f"psych-bwrap-marker-{uuid.uuid4().hex}"


def pids_with(mark: str) -> list[int]:
    """Live processes whose command line contains ``mark``, seen from the host."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if mark.encode() in cmdline and state != b"Z":
            found.append(int(entry))
    return found


async def wait_for_pids(mark: str, deadline: float = 20.0) -> list[int]:
    """Poll /proc until a process carrying ``mark`` appears: there is no event to wait on
    for a process the host did not spawn itself."""
    with anyio.fail_after(deadline):
        while True:
            pids = pids_with(mark)
            if pids:
                return pids
            await anyio.sleep(0.02)
