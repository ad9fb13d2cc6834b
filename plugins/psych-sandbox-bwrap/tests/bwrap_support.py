"""Helpers for the bwrap backend's tests: every test runs real bubblewrap and asserts from
the host side."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest
from psych_sandbox_core import (
    DeploymentConfig,
    ExecutionLimits,
    ExecutionResult,
    ProfileConfig,
    Sandbox,
)

# Host-side probes and requirement handling shared with every backend's tests.
from psych_sandbox_core.testing.host import (  # noqa: F401
    marker,
    opens_of,
    pids_with,
    uids_of,
    wait_for_pids,
)
from psych_sandbox_core.testing.requirements import skip_unless_required  # noqa: F401

PROFILE = "jail"
FAST_LIMITS: dict[str, Any] = {"cpu_seconds": 10, "wall_seconds": 60.0, "grace_seconds": 0.5}

#: What the root-only tests need: bwrap, a root host, per-execution cgroups, and test files
#: another user can reach.
BWRAP_ROOT = "bwrap-root"


def needs(condition: bool, requirement: str, reason: str) -> pytest.MarkDecorator:
    """Marks tests that cannot run here unless ``condition``: they skip, or fail under the
    variable (conftest.py reads the mark)."""
    if condition:
        return pytest.mark.skipif(False, reason=reason)
    return pytest.mark.psych_missing(requirement, reason)


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
