"""Helpers for the bwrap backend's tests: every test runs real bubblewrap and asserts from
the host side."""

from __future__ import annotations

import os
import shutil
from typing import Any

from psych_sandbox_core import (
    DeploymentConfig,
    ExecutionLimits,
    ExecutionResult,
    ProfileConfig,
    Sandbox,
)
from psych_sandbox_testing.requirements import needs

PROFILE = "jail"
FAST_LIMITS: dict[str, Any] = {"cpu_seconds": 10, "wall_seconds": 60.0, "grace_seconds": 0.5}

#: What the root-only tests need: bwrap, a root host, per-execution cgroups, and test files
#: another user can reach.
BWRAP_ROOT = "bwrap-root"


requires_bwrap = needs(shutil.which("bwrap") is not None, BWRAP_ROOT, "bubblewrap is not installed")
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
