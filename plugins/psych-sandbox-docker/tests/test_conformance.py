"""The docker backend passes the shared behaviour suite, under runc and under gVisor."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import pytest
from docker_support import held_by, leftover_containers
from psych_sandbox_core.testing.conformance import BackendConformance

#: Addresses on the host's side of a container network: the engine's bridge and the cloud
#: metadata service.
ENGINE_SIDE = (("172.17.0.1", 2375), ("169.254.169.254", 80))


@pytest.mark.usefixtures("engine")
class TestDockerConformance(BackendConformance):
    backend = "docker"
    options: ClassVar[dict[str, Any]] = {"runtime": "runc"}
    level = "isolated"
    enforced = frozenset(
        {"filesystem", "network", "process_tree", "identity", "memory", "process_count"}
    )
    unreachable = ENGINE_SIDE

    def leftovers(self) -> list[str]:
        stale = [
            str(path)
            for path in Path(tempfile.gettempdir()).glob(f"psych-docker-{os.getpid()}-*")
        ]
        return leftover_containers() + stale

    holds_resources = True

    def resources_of(self, host_pid: int) -> list[str]:
        return held_by(host_pid)


class TestGvisorConformance(TestDockerConformance):
    options: ClassVar[dict[str, Any]] = {"runtime": "runsc"}
    # The pids cgroup is the process limit only under runc (see the README).
    enforced = TestDockerConformance.enforced - {"process_count"}
    # The program's processes live in gVisor's own kernel, not in the host's /proc: what is
    # left is judged by the containers left.
    processes_visible = False
