"""Helpers for the bwrap backend's tests: every test runs real bubblewrap and asserts from
the host side."""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import anyio
import pytest
from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core.result import ExecutionResult

PROFILE = "jail"
FAST_LIMITS: dict[str, Any] = {"cpu_seconds": 10, "wall_seconds": 60.0, "grace_seconds": 0.5}

#: Set in CI to the backends that must be tested, e.g. "bwrap-root,docker,gvisor": a test
#: that would skip for want of one of them fails instead, naming what was missing.
REQUIRE_VARIABLE = "PSYCH_SANDBOX_REQUIRE_BACKENDS"
#: What the root-only tests need: bwrap, a root host, per-execution cgroups, and test files
#: another user can reach.
BWRAP_ROOT = "bwrap-root"


def required(requirement: str) -> bool:
    wanted = os.environ.get(REQUIRE_VARIABLE, "")
    return requirement in {part.strip() for part in wanted.split(",")}


def skip_unless_required(requirement: str, reason: str) -> NoReturn:
    """Skip, or fail when the environment says ``requirement`` must be tested here."""
    if required(requirement):
        pytest.fail(f"{REQUIRE_VARIABLE} requires {requirement!r}, but {reason}", pytrace=False)
    pytest.skip(reason)


def needs(condition: bool, requirement: str, reason: str) -> pytest.MarkDecorator:
    """Marks tests that cannot run here unless ``condition``: they skip, or fail under the
    variable (conftest.py reads the mark)."""
    if condition:
        return pytest.mark.skipif(False, reason=reason)
    return pytest.mark.psych_missing(requirement, reason)


requires_bwrap = needs(
    shutil.which("bwrap") is not None, BWRAP_ROOT, "bubblewrap is not installed"
)
needs_root = needs(os.geteuid() == 0, BWRAP_ROOT, "the host does not run as root")


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


def uids_of(pid: int) -> list[int]:
    """Real, effective, saved and filesystem uids of ``pid``, read from the host."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("Uid:"):
                return [int(value) for value in line.split()[1:]]
    raise AssertionError(f"no Uid line for {pid}")


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
