"""The docker backend's declarations for the shared behaviour suite, under runc; the runc and
gVisor test classes (one file each, so the two can run at the same time) build on it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import pytest
from docker_support import held_by, leftover_containers
from psych_sandbox_testing.conformance import BackendConformance

#: Addresses on the host's side of a container network: the engine's bridge and the cloud
#: metadata service.
ENGINE_SIDE = (("172.17.0.1", 2375), ("169.254.169.254", 80))
NOBODY = 65534


@pytest.mark.usefixtures("engine")
class DockerConformance(BackendConformance):
    backend = "docker"
    options: ClassVar[dict[str, Any]] = {"runtime": "runc"}
    level = "isolated"
    runs_commands = True
    # The image holds the interpreter and its libraries only: no /bin/sh.
    has_shell = False
    enforced = frozenset(
        {"filesystem", "network", "process_tree", "identity", "memory", "process_count"}
    )
    unreachable = ENGINE_SIDE
    workspace_path = "/workspace"
    # A tmpfs in the container: artifacts come over the channel.
    workspace_on_host = False
    capped_filesystems = True
    # A warm result does not wait for the container's removal.
    early_result = True
    # runc maps no user namespace: a container's uid is a host uid, and shared, any program
    # on the host under it reads a running container's workspace.
    shared_identity: ClassVar[tuple[dict[str, Any], tuple[int, int]] | None] = (
        {"container_uid": NOBODY, "container_gid": NOBODY},
        (NOBODY, NOBODY),
    )

    def leftovers(self) -> list[str]:
        stale = [
            str(path) for path in Path(tempfile.gettempdir()).glob(f"psych-docker-{os.getpid()}-*")
        ]
        return leftover_containers() + stale

    holds_resources = True

    def resources_of(self, host_pid: int) -> list[str]:
        return held_by(host_pid)
