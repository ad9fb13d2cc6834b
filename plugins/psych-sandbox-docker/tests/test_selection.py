"""Configuration, availability and orphan reaping: what a deployment sees before and after
the containers."""

from __future__ import annotations

import subprocess
import sys

import pytest
from docker_support import PROFILE, config, run
from psych_sandbox_core import ConfigurationError, Sandbox
from psych_sandbox_testing.selection import BackendRegistry, availability, forget_trials

from psych_sandbox_docker import engine as eng
from psych_sandbox_docker.image import DEFAULT_TAG

pytestmark = [pytest.mark.anyio]

ABSENT = "psych-sandbox-absent:never-built"


def test_both_backends_registered_from_this_distribution() -> None:
    registry = BackendRegistry()
    for backend_id in ("docker", "gvisor"):
        registered = registry.get(backend_id)
        assert registered.distribution == "psych-sandbox-docker"
        assert registered.cls.claims.value == "isolated"


def test_options_are_strict() -> None:
    registry = BackendRegistry()
    with pytest.raises(ConfigurationError, match="privileged"):
        registry.create("docker", {"privileged": True})
    with pytest.raises(ConfigurationError, match="runtime"):
        registry.create("docker", {"runtime": "kata"})
    with pytest.raises(ConfigurationError, match="image"):
        registry.create("docker", {"image": "--privileged"})
    with pytest.raises(ConfigurationError, match="runsc"):
        registry.create("gvisor", {"runtime": "runc"})
    # A digest pins the image.
    registry.create("docker", {"image": "psych-sandbox-python@sha256:" + "0" * 64})


def test_windows_host_refused_at_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    with pytest.raises(ConfigurationError, match="Windows"):
        BackendRegistry().create("docker", {})


@pytest.mark.usefixtures("engine")
async def test_absent_image_is_backend_not_ready_with_build_guidance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    forget_trials(monkeypatch)
    before = subprocess.run(
        ["docker", "images", "-q"], capture_output=True, text=True, check=True
    ).stdout
    result = await run("print('never')", options={"image": ABSENT})
    assert result.error is not None
    assert result.error.kind.value == "backend_not_ready"
    assert "python -m psych_sandbox_docker.image" in result.error.message
    assert result.stdout == ""
    # Nothing was pulled.
    after = subprocess.run(
        ["docker", "images", "-q"], capture_output=True, text=True, check=True
    ).stdout
    assert after == before
    # doctor's quick answer says the same.
    backend = BackendRegistry().create("docker", {"image": ABSENT})
    reason = backend.unavailable_reason()
    assert reason is not None and "python -m psych_sandbox_docker.image" in reason
    assert BackendRegistry().create("docker", {"image": DEFAULT_TAG}).unavailable_reason() is None


@pytest.mark.usefixtures("engine")
async def test_gvisor_backend_runs_under_runsc() -> None:
    async with Sandbox(config()) as sandbox:
        status = await availability(sandbox.registry, "gvisor")
        assert status.available, status.reason
        assert status.level is not None and status.level.value == "isolated"
    # The kernel a gVisor program sees is gVisor's own.
    result = await run("import os\nos.uname().release", "runsc")
    assert result.error is None, result.error
    host_release = subprocess.run(
        ["uname", "-r"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert result.return_value != host_release
    assert PROFILE


@pytest.mark.usefixtures("engine")
def test_reaper_removes_only_containers_of_dead_hosts() -> None:
    me = eng.current_owner()
    # pid 2**22 + 1 exceeds pid_max: no live process can own this container.
    dead = eng.Owner(me.machine, me.boot, 2**22 + 1, "1").label
    started = []
    for label in (dead, me.label):
        started.append(
            subprocess.run(
                [
                    "docker",
                    "create",
                    "--label",
                    f"{eng.MANAGED_LABEL}=1",
                    "--label",
                    f"{eng.MACHINE_LABEL}={me.machine}",
                    "--label",
                    f"{eng.OWNER_LABEL}={label}",
                    "--network",
                    "none",
                    DEFAULT_TAG,
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
    orphan, alive = started
    try:
        removed = eng.reap_orphans("docker")
        assert orphan in removed
        assert alive not in removed
        remaining = subprocess.run(
            ["docker", "ps", "-a", "-q", "--no-trunc", "--filter", f"id={orphan}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert remaining.strip() == ""
        # The command line does the same.
        cli = subprocess.run(
            [sys.executable, "-m", "psych_sandbox_docker", "reap"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert cli.returncode == 0, cli.stderr
        assert "removed 0 container(s)" in cli.stdout
    finally:
        subprocess.run(["docker", "rm", "-f", *started], capture_output=True, check=False)
