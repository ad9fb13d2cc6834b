"""Artifacts from a workspace the host cannot reach: bwrap's workspace is a tmpfs inside its
own mount namespace, so the child sends its files over the control channel. Checked from the
host: the bytes, digests and content types that come back, what is skipped, the caps, and what
the CLI writes."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
from bwrap_support import FAST_LIMITS, requires_bwrap
from psych_sandbox_core import (
    DeploymentConfig,
    ErrorKind,
    ExecutionLimits,
    ProfileConfig,
    Sandbox,
)
from psych_sandbox_core.cli import main
from psych_sandbox_core.output import OutputPolicy
from psych_sandbox_core.result import SkippedEntry
from psych_sandbox_core.testing.programs import (
    PLANTED_ARTIFACTS,
    PLANTED_EXPECTED,
    check_planted_artifacts,
)

pytestmark = [requires_bwrap]

PROFILE = "jail-artifacts"

def sandbox(**policy: Any) -> Sandbox:
    profile = ProfileConfig(
        backend="bwrap", limits=ExecutionLimits(**FAST_LIMITS), output=OutputPolicy(**policy)
    )
    return Sandbox(DeploymentConfig(profiles={PROFILE: profile}))


@pytest.mark.anyio
async def test_files_in_the_workspace_come_back_with_digest_and_type() -> None:
    async with sandbox(inline_bytes=4 << 20) as box:
        result = await box.run(PLANTED_ARTIFACTS, profile=PROFILE)
        assert result.backend.id == "bwrap"
        await check_planted_artifacts(box, result)


@pytest.mark.anyio
async def test_caps_hold() -> None:
    source = """
for name, size in (("a", 10), ("b", 500), ("c", 10), ("d", 10), ("e", 1), ("f", 1)):
    open(name, "w").write("x" * size)
"""
    async with sandbox(artifact_bytes=100, artifacts_total_bytes=25, max_artifacts=3) as box:
        result = await box.run(source, profile=PROFILE)
    assert result.error is None, result.error
    assert sorted(a.path for a in result.artifacts) == ["a", "c", "e"]
    assert {s.path: s.reason for s in result.skipped_artifacts} == {
        "b": "too_large", "d": "total_cap", "f": "too_many",
    }


@pytest.mark.anyio
async def test_a_run_killed_before_sending_says_nothing_was_collected() -> None:
    source = "open('kept', 'w').write('x')\nimport time\ntime.sleep(60)\n"
    async with sandbox() as box:
        result = await box.run(source, profile=PROFILE, timeout=1.0)
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT
    assert result.artifacts == []
    assert result.skipped_artifacts == [SkippedEntry(path=".", reason="interrupted")]


def test_cli_writes_the_files_under_bwrap(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text(PLANTED_ARTIFACTS)
    target = tmp_path / "artifacts"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(["run", "--profile", "bwrap", "--artifacts", str(target), str(program)])
    assert status == 0, err.getvalue()
    for path, (data, _) in PLANTED_EXPECTED.items():
        assert (target / path).read_bytes() == data
    written = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert written == sorted(PLANTED_EXPECTED)
    assert f"wrote {len(PLANTED_EXPECTED)} artifact(s)" in err.getvalue()


def test_cli_says_why_nothing_was_collected(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text("open('x', 'w').write('x')\nimport time\ntime.sleep(60)\n")
    target = tmp_path / "artifacts"
    err = io.StringIO()
    argv = ["run", "--profile", "bwrap", "--timeout", "1", "--artifacts", str(target)]
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main([*argv, str(program)])
    assert status == 1
    assert "no artifacts could be collected: the execution ended before" in err.getvalue()
    assert "wrote 0" not in err.getvalue()
    assert not any(target.rglob("*"))
