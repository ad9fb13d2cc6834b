"""Helpers for the docker backend's tests: every test runs a real engine and asserts from
the host side."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from typing import Any

import pytest
from psych_sandbox_core import (
    DeploymentConfig,
    ExecutionLimits,
    ExecutionResult,
    ProfileConfig,
    Sandbox,
)
from psych_sandbox_core.kit.posix import DEFAULT_COUNT, DEFAULT_FIRST_UID

from psych_sandbox_docker.engine import (
    CGROUP_ROOT,
    OWNER_LABEL,
    cgroup_controllers,
    current_owner,
)
from psych_sandbox_docker.image import DEFAULT_TAG, build_local_image

PROFILE = "box"
FAST_LIMITS: dict[str, Any] = {"cpu_seconds": 10, "wall_seconds": 60.0, "grace_seconds": 0.5}
RUNTIMES = pytest.mark.parametrize("runtime", ["runc", "runsc"])


def engine_problem() -> tuple[str, str] | None:
    """Why no Docker engine (with runsc) can be used here, and which requirement that
    misses ("docker" or "gvisor"), or None."""
    if shutil.which("docker") is None:
        return "docker", "the docker CLI is not installed"
    info = subprocess.run(
        ["docker", "info", "--format", "{{json .Runtimes}}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if info.returncode != 0:
        return "docker", f"the docker engine does not answer: {info.stderr.strip()}"
    if "runsc" not in (json.loads(info.stdout or "{}") or {}):
        return "gvisor", (
            "the docker engine has no runsc runtime (run the plugin's ci/install-engine.sh)"
        )
    return None


def ensure_image() -> str | None:
    """Build the local image when it is absent; why it could not be, or None. The suite's
    workers ask at once on a fresh machine: one builds, the others wait for it."""
    # Locked on this very file, which every worker has and nothing must clean up after.
    with open(__file__, "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        present = subprocess.run(
            ["docker", "image", "inspect", DEFAULT_TAG], capture_output=True, check=False
        )
        if present.returncode != 0:
            try:
                build_local_image(DEFAULT_TAG)
            except Exception as exc:  # any failure of the build is reported, not raised
                return f"the image {DEFAULT_TAG} is absent and could not be built: {exc}"
    return None


def leased(uid: int) -> bool:
    """Whether ``uid`` is one of the per-execution identities (the default range)."""
    return DEFAULT_FIRST_UID <= uid < DEFAULT_FIRST_UID + DEFAULT_COUNT


def leftover_containers() -> list[str]:
    listed = subprocess.run(
        ["docker", "ps", "-a", "-q", "--filter", f"label={OWNER_LABEL}={current_owner().label}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return listed.stdout.split()


def live_in_containers() -> list[int]:
    """Live (non-zombie) processes in the cgroups of this process's containers, as the kernel
    lists them (the per-execution cgroup parents, named for their owner), whatever the
    engine has noticed yet."""
    found = []
    for controller in cgroup_controllers():
        parents = (controller / CGROUP_ROOT).glob(f"{current_owner().token}-*")
        # Walked without failing on a directory the engine removes meanwhile (a container it
        # is tearing down): what is gone holds no process.
        listings = (
            os.path.join(directory, "cgroup.procs")
            for parent in parents
            for directory, _, files in os.walk(parent)
            if "cgroup.procs" in files
        )
        for procs in listings:
            try:
                with open(procs) as fh:
                    pids = fh.read().split()
            except OSError:
                continue
            for pid in pids:
                try:
                    with open(f"/proc/{pid}/stat", "rb") as fh:
                        state = fh.read().rsplit(b")", 1)[1].split()[0]
                except (OSError, IndexError):
                    continue
                if state not in (b"Z", b"X"):
                    found.append(int(pid))
    return sorted(set(found))


def held_by(host_pid: int) -> list[str]:
    """The containers and cgroup directories of executions run by the host process
    ``host_pid`` (another process: a CLI run), found by the owner they are labelled and named
    with."""
    listed = subprocess.run(
        [
            "docker",
            "ps",
            "-a",
            "--filter",
            f"label={OWNER_LABEL}",
            "--format",
            f'{{{{.ID}}}} {{{{.Label "{OWNER_LABEL}"}}}}',
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    held = [
        f"container {ident}"
        for ident, _, owner in (line.partition(" ") for line in listed.stdout.splitlines())
        if owner.split(":")[1:2] == [str(host_pid)]
    ]
    for controller in cgroup_controllers():
        held.extend(str(path) for path in (controller / CGROUP_ROOT).glob(f"{host_pid}-*"))
    return held


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
