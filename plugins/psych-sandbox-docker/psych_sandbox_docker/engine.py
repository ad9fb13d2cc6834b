"""The container engine seen from the host: which CLI, who owns a container, orphan reaping.

Every container this plugin starts carries labels naming the host process that owns it
(machine, boot, pid and the pid's start time), so a host that restarted after a crash can
tell its own dead predecessors' containers from a live neighbour's and remove only those.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from contextlib import suppress
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from psych_sandbox_core.identity import EmptyCgroup, remove_execution_cgroup

#: Labels on every container this plugin starts.
MANAGED_LABEL = "io.psych-sandbox.managed"
OWNER_LABEL = "io.psych-sandbox.owner"
MACHINE_LABEL = "io.psych-sandbox.machine"
EXECUTION_LABEL = "io.psych-sandbox.execution"
#: Per-execution cgroup parents (cgroup v1, cgroupfs driver) live under this name in each
#: controller hierarchy: they outlive the container so usage can be read after it exited.
CGROUP_ROOT = "psych-sandbox"
CGROUP_MOUNT = Path("/sys/fs/cgroup")
#: Prefix of the per-execution host directories holding the control socket.
SOCKET_DIR_PREFIX = "psych-docker-"
#: Bound on any one engine command run synchronously (reaping, availability checks).
ENGINE_COMMAND_SECONDS = 20.0
#: Environment variables the engine's CLI may need; nothing else of the host's is passed on.
ENGINE_ENVIRONMENT = (
    "PATH", "HOME", "DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY", "CONTAINER_HOST", "CONTAINERS_CONF", "XDG_RUNTIME_DIR",
)


def engine_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in ENGINE_ENVIRONMENT}


def detect_engine(configured: str | None) -> tuple[str, str] | None:
    """(engine name, CLI path): the configured one, else Docker where its CLI and an engine
    endpoint exist, else Podman (whose CLI speaks the same flags), else whatever CLI exists."""
    if configured is not None:
        path = shutil.which(configured)
        return (configured, path) if path else None
    docker, podman = shutil.which("docker"), shutil.which("podman")
    docker_endpoint = bool(os.environ.get("DOCKER_HOST")) or os.path.exists("/var/run/docker.sock")
    if docker and docker_endpoint:
        return "docker", docker
    if podman:
        return "podman", podman
    if docker:
        return "docker", docker
    return None


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            # Field 22 (after the parenthesised command, which may contain spaces).
            return fh.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Owner:
    machine: str
    boot: str
    pid: int
    started: str

    @property
    def label(self) -> str:
        return f"{self.boot}:{self.pid}:{self.started}"

    @property
    def token(self) -> str:
        """Short form used in host paths (cgroup and socket directory names)."""
        return f"{self.pid}-{self.started}"

    @classmethod
    def parse(cls, machine: str, label: str) -> Owner | None:
        parts = label.split(":")
        if len(parts) != 3 or not parts[1].isdigit():
            return None
        return cls(machine, parts[0], int(parts[1]), parts[2])

    def alive(self) -> bool:
        """Whether the owning host process still runs (same boot, same pid, same start)."""
        me = current_owner()
        if self.machine != me.machine or self.boot != me.boot:
            # Another boot of this machine: dead. Another machine: we cannot tell, so alive.
            return self.machine != me.machine
        return _start_time(self.pid) == self.started


@lru_cache(maxsize=1)
def _machine_and_boot() -> tuple[str, str]:
    machine = _read("/etc/machine-id") or socket.gethostname()
    boot = _read("/proc/sys/kernel/random/boot_id").replace("-", "")[:16] or "noboot"
    return machine[:32], boot


def current_owner() -> Owner:
    # Not cached: a forked host is a different owner.
    machine, boot = _machine_and_boot()
    pid = os.getpid()
    return Owner(machine, boot, pid, _start_time(pid) or "0")


def owner_label_map() -> dict[str, str]:
    """The labels that mark a container as ours and name its owner, as the engine's API
    takes them."""
    owner = current_owner()
    return {MANAGED_LABEL: "1", MACHINE_LABEL: owner.machine, OWNER_LABEL: owner.label}


def cgroup_controllers() -> list[Path]:
    """The cgroup v1 hierarchies a container's cgroup is created in (empty on cgroup v2)."""
    if not CGROUP_MOUNT.is_dir() or (CGROUP_MOUNT / "cgroup.controllers").exists():
        return []
    return [p for p in CGROUP_MOUNT.iterdir() if p.is_dir() and not p.is_symlink()
            and p.name != "unified"]


def remove_cgroup_parent(name: str) -> EmptyCgroup | None:
    """rmdir the per-execution parent in every hierarchy it was made in (only succeeds once
    it is empty): the kernel's proof that no process of the container is left, when every
    one was removed. Not empty yet (a container still inside) or not ours: the reaper tries
    again once its owner is gone."""
    made = [path for controller in cgroup_controllers()
            if (path := controller / CGROUP_ROOT / name).is_dir()]
    return remove_execution_cgroup(made)


def reap_orphans(engine: str = "docker", *, everything: bool = False) -> list[str]:
    """Remove containers (and their socket directories and cgroups) whose owning host process
    on this machine is gone. ``everything`` removes this machine's containers regardless.
    Returns the removed container ids. Never raises for an engine that does not answer."""
    path = shutil.which(engine)
    if path is None:
        return []
    me = current_owner()
    try:
        listed = subprocess.run(
            [path, "ps", "-a", "--no-trunc", "--filter", f"label={MANAGED_LABEL}=1",
             "--filter", f"label={MACHINE_LABEL}={me.machine}",
             "--format", '{{.ID}} {{.Label "' + OWNER_LABEL + '"}}'],
            env=engine_environment(), capture_output=True, text=True,
            timeout=ENGINE_COMMAND_SECONDS, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if listed.returncode != 0:
        return []
    doomed: list[str] = []
    for line in listed.stdout.splitlines():
        container, _, label = line.strip().partition(" ")
        if not container:
            continue
        owner = Owner.parse(me.machine, label.strip())
        if everything or owner is None or not owner.alive():
            doomed.append(container)
    if doomed:
        try:
            subprocess.run(
                [path, "rm", "-f", *doomed], env=engine_environment(), capture_output=True,
                timeout=ENGINE_COMMAND_SECONDS, check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return []
    _reap_host_leftovers(everything)
    return doomed


def _dead_token(token: str, everything: bool) -> bool:
    pid, _, started = token.partition("-")
    if not pid.isdigit():
        return False
    if everything:
        return True
    return _start_time(int(pid)) != started.split("-", 1)[0]


def _reap_host_leftovers(everything: bool) -> None:
    for controller in cgroup_controllers():
        root = controller / CGROUP_ROOT
        try:
            entries = list(root.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir() and _dead_token(entry.name, everything):
                with suppress(OSError):
                    entry.rmdir()
    tmp = Path(tempfile.gettempdir())
    try:
        leftovers = [p for p in tmp.iterdir() if p.name.startswith(SOCKET_DIR_PREFIX)]
    except OSError:
        return
    for directory in leftovers:
        token = directory.name[len(SOCKET_DIR_PREFIX):]
        if directory.is_dir() and not directory.is_symlink() and _dead_token(token, everything):
            shutil.rmtree(directory, ignore_errors=True)
