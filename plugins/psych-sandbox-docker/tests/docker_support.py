"""Helpers for the docker backend's tests: every test runs a real engine and asserts from
the host side."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import struct
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import anyio
import pytest
from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core.identity import DEFAULT_COUNT, DEFAULT_FIRST_UID
from psych_sandbox_core.result import ExecutionResult

from psych_sandbox_docker.engine import OWNER_LABEL, current_owner
from psych_sandbox_docker.image import DEFAULT_TAG, build_local_image

PROFILE = "box"
FAST_LIMITS: dict[str, Any] = {"cpu_seconds": 10, "wall_seconds": 60.0, "grace_seconds": 0.5}
RUNTIMES = pytest.mark.parametrize("runtime", ["runc", "runsc"])


#: Set in CI to the backends that must be tested, e.g. "bwrap-root,docker,gvisor": a test
#: that would skip for want of one of them fails instead, naming what was missing.
REQUIRE_VARIABLE = "PSYCH_SANDBOX_REQUIRE_BACKENDS"


def required(requirement: str) -> bool:
    wanted = os.environ.get(REQUIRE_VARIABLE, "")
    return requirement in {part.strip() for part in wanted.split(",")}


def skip_unless_required(requirement: str, reason: str) -> NoReturn:
    """Skip, or fail when the environment says ``requirement`` must be tested here."""
    if required(requirement):
        pytest.fail(f"{REQUIRE_VARIABLE} requires {requirement!r}, but {reason}", pytrace=False)
    pytest.skip(reason)


def engine_problem() -> tuple[str, str] | None:
    """Why no Docker engine (with runsc) can be used here, and which requirement that
    misses ("docker" or "gvisor"), or None."""
    if shutil.which("docker") is None:
        return "docker", "the docker CLI is not installed"
    info = subprocess.run(
        ["docker", "info", "--format", "{{json .Runtimes}}"],
        capture_output=True, text=True, timeout=30, check=False,
    )
    if info.returncode != 0:
        return "docker", f"the docker engine does not answer: {info.stderr.strip()}"
    if "runsc" not in (json.loads(info.stdout or "{}") or {}):
        return "gvisor", (
            "the docker engine has no runsc runtime (run the plugin's ci/install-engine.sh)"
        )
    return None


def ensure_image() -> str | None:
    """Build the local image when it is absent; why it could not be, or None."""
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


def uids_of(pid: int) -> list[int]:
    """Real, effective, saved and filesystem uids of ``pid``, read from the host."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("Uid:"):
                return [int(value) for value in line.split()[1:]]
    raise AssertionError(f"no Uid line for {pid}")


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


# ---------------------------------------------------------------- opens seen from the host

_IN_ACCESS = 0x1
_IN_OPEN = 0x20
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000


@contextmanager
def opens_of(*paths: str) -> Iterator[list[str]]:
    """Record, from the host, every open or read of ``paths`` (inotify watches the inode,
    whatever mount or namespace the opener reached it through). The list fills when the
    block ends; a test should open one path itself as a control that the watch works."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    seen: list[str] = []
    try:
        watches = {}
        for path in paths:
            wd = libc.inotify_add_watch(fd, os.fsencode(path), _IN_OPEN | _IN_ACCESS)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
            watches[wd] = path
        yield seen
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                break
            offset = 0
            while offset < len(data):
                wd, _mask, _cookie, length = struct.unpack_from("iIII", data, offset)
                offset += 16 + length
                if wd in watches:
                    seen.append(watches[wd])
    finally:
        os.close(fd)
