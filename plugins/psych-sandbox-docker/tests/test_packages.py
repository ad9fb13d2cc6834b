"""Programs that need libraries, in containers: packages are installed into an image variant
when it is built (``python -m psych_sandbox_docker.image --packages ...``), never at run
time, and a profile names that image. Judged by the program's return value, the image the
engine holds, and the files written into the image's root file system."""

from __future__ import annotations

import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from docker_support import FAST_LIMITS, PROFILE, RUNTIMES
from psych_sandbox_core import (
    DeploymentConfig,
    ErrorKind,
    ExecutionLimits,
    OutputPolicy,
    ProfileConfig,
    Sandbox,
)
from psych_sandbox_testing.environments import (
    IMPORT_TINY,
    MATPLOTLIB_CHART,
    TINY_ANSWER,
    TINY_MODULE,
    TINY_VERSION,
    build_wheel,
    chart_bytes,
)

from psych_sandbox_docker.image import (
    DEFAULT_TAG,
    IMAGE_SITE_PACKAGES,
    ImageBuildError,
    build_local_image,
    main,
)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip may use no index: what it installs must come from the files the test gives."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")


def sandbox(image: str, runtime: str = "runc") -> Sandbox:
    profile = ProfileConfig(
        backend="docker",
        options={"image": image, "runtime": runtime},
        limits=ExecutionLimits(**FAST_LIMITS),
        output=OutputPolicy(inline_bytes=4 << 20),
    )
    return Sandbox(DeploymentConfig(profiles={PROFILE: profile}))


def image_exists(tag: str) -> bool:
    inspected = subprocess.run(
        ["docker", "image", "inspect", tag], capture_output=True, timeout=60, check=False
    )
    return inspected.returncode == 0


@contextmanager
def variant(packages: list[str]) -> Iterator[str]:
    """An image variant built with ``packages``, removed afterwards."""
    tag = f"psych-sandbox-python:test-{uuid.uuid4().hex[:12]}"
    try:
        build_local_image(tag, packages=packages)
        assert image_exists(tag)
        yield tag
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True, check=False)
        assert not image_exists(tag)


@pytest.mark.anyio
@pytest.mark.usefixtures("engine", "offline")
@RUNTIMES
async def test_a_program_imports_a_package_built_into_the_image(
    tmp_path: Path, runtime: str
) -> None:
    wheel = build_wheel(tmp_path)
    with variant([str(wheel)]) as tag:
        async with sandbox(tag, runtime) as box:
            result = await box.run(IMPORT_TINY, profile=PROFILE)
    assert result.error is None, result.error
    assert result.return_value == [TINY_ANSWER, TINY_VERSION]
    assert result.level == "isolated"


@pytest.mark.anyio
@pytest.mark.usefixtures("engine")
async def test_the_default_image_has_only_the_standard_library() -> None:
    async with sandbox(DEFAULT_TAG) as box:
        result = await box.run(IMPORT_TINY, profile=PROFILE)
    assert result.error is not None and result.error.kind is ErrorKind.EXCEPTION
    assert result.error.exception_type == "ModuleNotFoundError"


@pytest.mark.anyio
@pytest.mark.usefixtures("engine")
@pytest.mark.timeout(900)
async def test_a_matplotlib_chart_comes_back_as_an_artifact() -> None:
    # Installed from pip's configured package index when the image is built.
    try:
        with variant(["matplotlib"]) as tag:
            async with sandbox(tag) as box:
                result = await box.run(MATPLOTLIB_CHART, profile=PROFILE)
                await chart_bytes(box, result)
    except ImageBuildError as exc:
        if "installing" not in str(exc):
            raise
        pytest.skip(f"matplotlib is not installable from pip's configured index here: {exc}")


@pytest.mark.usefixtures("offline")
def test_packages_land_on_the_images_path(tmp_path: Path) -> None:
    # No engine needed: the root file system the builder would import, written to a file.
    wheel = build_wheel(tmp_path)
    rootfs = tmp_path / "rootfs.tar"
    assert main(["--tar", str(rootfs), "--packages", str(wheel)]) == 0
    with tarfile.open(rootfs) as tar:
        names = tar.getnames()
        module = tar.getmember(f"{IMAGE_SITE_PACKAGES}/{TINY_MODULE}/__init__.py")
        assert module.isfile() and module.uid == 0 and module.mode & 0o022 == 0
    # Each path once (the engine refuses duplicates), the interpreter still there.
    assert len(names) == len(set(names))
    assert "usr/bin/python3.11" in names


@pytest.mark.usefixtures("offline")
def test_a_package_that_cannot_be_installed_fails_the_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rootfs = tmp_path / "rootfs.tar"
    assert main(["--tar", str(rootfs), "--packages", "psych-no-such-distribution"]) == 1
    assert "psych-no-such-distribution" in capsys.readouterr().err
    missing = tmp_path / "requirements.txt"
    assert main(["--tar", str(rootfs), "--requirements", str(missing)]) == 1
    assert "does not exist" in capsys.readouterr().err
