"""The engine restarted during an execution: a failure of its own kind (backend_not_ready,
never the program's worker_exit), and nothing left behind, judged from the host side.

The engine restarted is a second dockerd of the test's own (its own socket, data root and
exec root, the image loaded into it from the first), never the engine other work on the
host uses. Starting it and loading the image into it cost 10-15 s, so the test runs only
when PSYCH_SANDBOX_SECOND_ENGINE is set."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from docker_support import FAST_LIMITS, PROFILE
from psych_sandbox_core import (
    DeploymentConfig,
    ExecutionLimits,
    FunctionBindings,
    ProfileConfig,
    Sandbox,
)
from psych_sandbox_testing import census

from psych_sandbox_docker.image import DEFAULT_TAG

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        not os.environ.get("PSYCH_SANDBOX_SECOND_ENGINE"),
        reason="starts a second dockerd of its own: set PSYCH_SANDBOX_SECOND_ENGINE=1",
    ),
]

#: How long a dockerd of its own may take to answer once started (polled: the engine offers
#: no notification of its readiness to a process that did not start it through systemd).
ENGINE_START_SECONDS = 60.0


class SecondEngine:
    """A dockerd on a socket, data root and exec root of its own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.socket = root / "docker.sock"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def environment(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": f"unix://{self.socket}"}

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["docker", *args],
            env=self.environment,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    async def start(self) -> None:
        log = open(self.root / "dockerd.log", "ab")  # noqa: SIM115 - held by the daemon
        with log:
            self.process = subprocess.Popen(
                [
                    "dockerd",
                    "--data-root",
                    str(self.root / "data"),
                    "--exec-root",
                    str(self.root / "exec"),
                    "-H",
                    f"unix://{self.socket}",
                    "--pidfile",
                    str(self.root / "docker.pid"),
                    "--bridge=none",
                    "--iptables=false",
                    "--ip6tables=false",
                    "--ip-masq=false",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        with anyio.fail_after(ENGINE_START_SECONDS):
            while self.cli("info").returncode != 0:
                assert self.process.poll() is None, (self.root / "dockerd.log").read_text()
                await anyio.sleep(0.1)

    async def stop(self) -> None:
        """SIGTERM, as a restart does, and wait for the daemon's exit (by its pidfd)."""
        assert self.process is not None
        process, self.process = self.process, None
        handle = os.pidfd_open(process.pid)
        try:
            process.send_signal(signal.SIGTERM)
            await anyio.wait_readable(handle)
        finally:
            os.close(handle)
        process.wait()


@pytest.fixture
def second_engine(engine: str) -> Iterator[SecondEngine]:
    root = Path(tempfile.mkdtemp(prefix="psych-engine-", dir="/var/tmp"))
    second = SecondEngine(root)
    try:
        yield second
    finally:
        if second.process is not None:
            second.process.terminate()
            second.process.wait()
        shutil.rmtree(root, ignore_errors=True)


async def test_an_engine_restarted_mid_execution_is_its_own_failure_and_leaves_nothing(
    second_engine: SecondEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    await second_engine.start()
    saved = subprocess.run(["docker", "save", DEFAULT_TAG], capture_output=True, check=True)
    loaded = subprocess.run(
        ["docker", "load"],
        input=saved.stdout,
        env=second_engine.environment,
        capture_output=True,
        check=False,
    )
    assert loaded.returncode == 0, loaded.stderr
    monkeypatch.setenv("DOCKER_HOST", f"unix://{second_engine.socket}")
    in_call, release = anyio.Event(), anyio.Event()

    async def block() -> int:
        in_call.set()
        await release.wait()
        return 1

    # Cold executions only: a prepared child's container would be one more on the engine.
    config = DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(backend="docker", limits=ExecutionLimits(**FAST_LIMITS), warm=0)
        }
    )
    async with Sandbox(config) as sandbox:
        result = None

        async def execution() -> None:
            nonlocal result
            result = await sandbox.run(
                "await block()\n2", profile=PROFILE, bindings=FunctionBindings({"block": block})
            )

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(execution)
            await in_call.wait()
            assert len(second_engine.cli("ps", "-q").stdout.split()) == 1
            # The engine goes away while the program waits on its call; the execution's
            # teardown finds it gone.
            await second_engine.stop()
            release.set()
        assert result is not None and result.error is not None
        assert result.error.kind == "backend_not_ready", result.error
        assert "engine went away" in result.error.message
        # Back again: the container it could not remove then goes before the next launch.
        await second_engine.start()
        following = await sandbox.run("3", profile=PROFILE)
        assert following.error is None and following.return_value == 3
    # Once the Sandbox has closed (a result may come back before its container's removal,
    # which the Sandbox awaits): neither container is left.
    assert second_engine.cli("ps", "-aq").stdout.split() == []
    await second_engine.stop()
    # Judged from the host, once the engine of the test's own is gone too.
    left = census.take(extra_prefixes=("psych-docker-",))
    assert (left.processes, left.temp_dirs, left.cgroups, left.leases) == (0, 0, 0, 0), left
