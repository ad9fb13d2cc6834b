"""Artifacts from a container's workspace: a tmpfs the host cannot reach, so the child sends
its files over the control channel. Checked from the host: the bytes, digests and content
types that come back, what is skipped, and the caps."""

from __future__ import annotations

from typing import Any

import pytest
from docker_support import FAST_LIMITS
from psych_sandbox_core import (
    DeploymentConfig,
    ErrorKind,
    ExecutionLimits,
    ProfileConfig,
    Sandbox,
)
from psych_sandbox_core.output import OutputPolicy
from psych_sandbox_core.result import SkippedEntry
from psych_sandbox_core.testing.programs import (
    PLANTED_ARTIFACTS,
    check_planted_artifacts,
)

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("engine")]

PROFILE = "box-artifacts"

def sandbox(**policy: Any) -> Sandbox:
    profile = ProfileConfig(
        backend="docker",
        options={"runtime": "runc"},
        limits=ExecutionLimits(**FAST_LIMITS),
        output=OutputPolicy(**policy),
    )
    return Sandbox(DeploymentConfig(profiles={PROFILE: profile}))


async def test_files_in_the_container_come_back_with_digest_and_type() -> None:
    async with sandbox(inline_bytes=4 << 20) as box:
        result = await box.run(PLANTED_ARTIFACTS, profile=PROFILE)
        assert result.backend.id == "docker"
        await check_planted_artifacts(box, result)


async def test_caps_and_the_output_folder_hold() -> None:
    source = """
import os
os.makedirs("out")
open("elsewhere", "w").write("not in the folder")
for name, size in (("a", 10), ("b", 500), ("c", 10), ("d", 10), ("e", 1), ("f", 1)):
    open(f"out/{name}", "w").write("x" * size)
"""
    async with sandbox(
        artifacts_folder="out", artifact_bytes=100, artifacts_total_bytes=25, max_artifacts=3
    ) as box:
        result = await box.run(source, profile=PROFILE)
    assert result.error is None, result.error
    assert sorted(a.path for a in result.artifacts) == ["out/a", "out/c", "out/e"]
    assert {s.path: s.reason for s in result.skipped_artifacts} == {
        "out/b": "too_large", "out/d": "total_cap", "out/f": "too_many",
    }


async def test_a_run_killed_before_sending_says_nothing_was_collected() -> None:
    source = "open('kept', 'w').write('x')\nimport time\ntime.sleep(60)\n"
    async with sandbox() as box:
        result = await box.run(source, profile=PROFILE, timeout=2.0)
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT
    assert result.artifacts == []
    assert result.skipped_artifacts == [SkippedEntry(path=".", reason="interrupted")]
