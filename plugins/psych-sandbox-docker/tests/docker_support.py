"""Helpers for the docker backend's tests: every test runs a real engine and asserts from
the host side."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from typing import Any

import anyio
import pytest
from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core.result import ExecutionResult

from psych_sandbox_docker.engine import OWNER_LABEL, current_owner
from psych_sandbox_docker.image import DEFAULT_TAG, build_local_image

PROFILE = "box"
FAST_LIMITS: dict[str, Any] = {"cpu_seconds": 10, "wall_seconds": 60.0, "grace_seconds": 0.5}
RUNTIMES = pytest.mark.parametrize("runtime", ["runc", "runsc"])


def engine_problem() -> str | None:
    """Why no Docker engine can be used here, or None."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    info = subprocess.run(
        ["docker", "info", "--format", "{{json .Runtimes}}"],
        capture_output=True, text=True, timeout=30, check=False,
    )
    if info.returncode != 0:
        return f"the docker engine does not answer: {info.stderr.strip()}"
    if "runsc" not in (json.loads(info.stdout or "{}") or {}):
        return "the docker engine has no runsc runtime (run the plugin's ci/install-engine.sh)"
    return None


def ensure_image() -> None:
    present = subprocess.run(
        ["docker", "image", "inspect", DEFAULT_TAG], capture_output=True, check=False
    )
    if present.returncode != 0:
        build_local_image(DEFAULT_TAG)


def leftover_containers() -> list[str]:
    listed = subprocess.run(
        ["docker", "ps", "-a", "-q", "--filter", f"label={OWNER_LABEL}={current_owner().label}"],
        capture_output=True, text=True, timeout=30, check=True,
    )
    return listed.stdout.split()


def config(
    runtime: str = "runc", options: dict[str, Any] | None = None, **limits: Any
) -> DeploymentConfig:
    return DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(
                backend="docker",
                options={"runtime": runtime, **(options or {})},
                limits=ExecutionLimits(**{**FAST_LIMITS, **limits}),
            )
        }
    )


async def run(
    source: str, runtime: str = "runc", options: dict[str, Any] | None = None, **limits: Any
) -> ExecutionResult:
    async with Sandbox(config(runtime, options, **limits)) as sandbox:
        return await sandbox.run(source, profile=PROFILE)


def marker() -> str:
    return f"psych-docker-marker-{uuid.uuid4().hex}"


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


async def wait_until(predicate: Any, deadline: float = 30.0) -> Any:
    """Poll ``predicate`` until it returns something truthy: there is no event to wait on for
    a process or container the host did not start itself."""
    with anyio.fail_after(deadline):
        while True:
            value = predicate()
            if value:
                return value
            await anyio.sleep(0.02)
