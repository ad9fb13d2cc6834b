"""Artifacts from a container's workspace: a tmpfs the host cannot reach, so the child sends
its files over the control channel. Checked from the host: the bytes, digests and content
types that come back, what is skipped, and the caps."""

from __future__ import annotations

import hashlib
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
from psych_sandbox_core.artifacts import SkippedEntry
from psych_sandbox_core.output import OutputPolicy

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("engine")]

PROFILE = "box-artifacts"

PROGRAM = """
import os
os.makedirs("out/deep")
open("out/report.txt", "w").write("hello\\n")
open("out/data.json", "w").write('{"a": [1, 2]}')
open("out/deep/image.png", "wb").write(b"\\x89PNG\\r\\n\\x1a\\n" + bytes(range(256)) * 8)
open("out/big.bin", "wb").write(bytes(range(256)) * 8192 + b"end")
open("out/original", "w").write("linked")
os.link("out/original", "out/hardlink")
os.symlink("/etc/passwd", "out/leak")
os.mkfifo("out/pipe")
os.chdir("/")
"done"
"""

EXPECTED = {
    "out/report.txt": (b"hello\n", "text/plain; charset=utf-8"),
    "out/data.json": (b'{"a": [1, 2]}', "application/json"),
    "out/deep/image.png": (b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8, "image/png"),
    "out/big.bin": (bytes(range(256)) * 8192 + b"end", "application/octet-stream"),
}


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
        result = await box.run(PROGRAM, profile=PROFILE)
        assert result.error is None, result.error
        assert result.backend.id == "docker"
        got = {a.path: a for a in result.artifacts}
        assert set(got) == set(EXPECTED)
        for path, (data, kind) in EXPECTED.items():
            assert got[path].sha256 == hashlib.sha256(data).hexdigest(), path
            assert got[path].content_type == kind, path
            kept = await box.attachments.read_all(
                got[path].attachment, tenant=result.tenant or "default", run_id=result.run_id or ""
            )
            assert kept == data
        assert {s.path: s.reason for s in result.skipped_artifacts} == {
            "out/leak": "symlink",
            "out/pipe": "fifo",
            "out/hardlink": "hard_link",
            "out/original": "hard_link",
        }


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
