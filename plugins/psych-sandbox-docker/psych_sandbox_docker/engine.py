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

from psych_sandbox_core.kit import posix as toolbox
from psych_sandbox_core.kit.posix import (
    EmptyCgroup,
    host_alive,
    owner_of,
    reap_owned_directories,
    remove_cgroup_tree,
    remove_execution_cgroup,
    start_time,
)

#: Labels on every container this plugin starts.
MANAGED_LABEL = "io.psych-sandbox.managed"
OWNER_LABEL = "io.psych-sandbox.owner"
MACHINE_LABEL = "io.psych-sandbox.machine"
EXECUTION_LABEL = "io.psych-sandbox.execution"
#: Per-execution cgroup parents (cgroupfs driver) live under this name in every hierarchy:
#: they outlive the container so usage can be read after it exited, and are removed after.
CGROUP_ROOT = "psych-sandbox"
CGROUP_MOUNT = Path("/sys/fs/cgroup")
#: Prefix of the per-execution host directories holding the control socket.
SOCKET_DIR_PREFIX = "psych-docker-"
#: Bound on any one engine command run synchronously (reaping, availability checks).
ENGINE_COMMAND_SECONDS = 20.0
#: Environment variables the engine's CLI may need; nothing else of the host's is passed on.
ENGINE_ENVIRONMENT = (
    "PATH",
    "HOME",
    "DOCKER_HOST",
    "DOCKER_CONTEXT",
    "DOCKER_CONFIG",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
    "CONTAINER_HOST",
    "CONTAINERS_CONF",
    "XDG_RUNTIME_DIR",
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
        """Short form used in cgroup names: the kit's owner tag of this host process."""
        return f"{self.pid}.{self.started}"

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
        return start_time(self.pid) == self.started


@lru_cache(maxsize=1)
def _machine_and_boot() -> tuple[str, str]:
    machine = _read("/etc/machine-id") or socket.gethostname()
    boot = _read("/proc/sys/kernel/random/boot_id").replace("-", "")[:16] or "noboot"
    return machine[:32], boot


def current_owner() -> Owner:
    # Not cached: a forked host is a different owner.
    machine, boot = _machine_and_boot()
    pid = os.getpid()
    return Owner(machine, boot, pid, start_time(pid) or "0")


def owner_label_map() -> dict[str, str]:
    """The labels that mark a container as ours and name its owner, as the engine's API
    takes them."""
    owner = current_owner()
    return {MANAGED_LABEL: "1", MACHINE_LABEL: owner.machine, OWNER_LABEL: owner.label}


def cgroup_controllers() -> list[Path]:
    """The cgroup v1 hierarchies usage is read from (empty on a cgroup v2 host)."""
    if not CGROUP_MOUNT.is_dir() or (CGROUP_MOUNT / "cgroup.controllers").exists():
        return []
    return [
        p
        for p in CGROUP_MOUNT.iterdir()
        if p.is_dir() and not p.is_symlink() and p.name != "unified"
    ]


def cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy, v1 and v2 alike: the runtime creates a container's
    cgroup in each of them (on a hybrid host, in the unified one too)."""
    return [hierarchy.point for hierarchy in toolbox.cgroup_hierarchies()]


#: How often creating the per-execution parent may find the shared root just removed by
#: another execution's teardown before it gives up (each retry recreates the root).
CREATE_ATTEMPTS = 5


def create_cgroup_parent(name: str) -> None:
    """Make the per-execution parent in every hierarchy before the container starts.

    The runtime would create it itself, but only where it uses it and without ever removing
    it; made here, teardown knows every directory to remove, and the shared root always has
    a child while an execution needs it, so another execution's teardown can remove the root
    only when no execution is using it. OSError if the kernel refuses."""
    made: list[Path] = []
    try:
        for hierarchy in cgroup_hierarchies():
            root = hierarchy / CGROUP_ROOT
            for attempt in range(CREATE_ATTEMPTS):
                with suppress(FileExistsError):
                    root.mkdir(mode=0o755)
                try:
                    (root / name).mkdir(mode=0o755)
                except FileNotFoundError:
                    # Another teardown removed the empty root between the two mkdirs.
                    if attempt + 1 == CREATE_ATTEMPTS:
                        raise
                    continue
                made.append(hierarchy)
                break
    except OSError:
        for hierarchy in made:
            _remove_parent(hierarchy, name)
        raise


#: The CPU weight a killed container's parent is given, the most the kernel allows (cgroup v1
#: cpu.shares, v2 cpu.weight): its processes' exits come before the running executions.
DYING_CPU_SHARES = 262144
DYING_CPU_WEIGHT = 10000


def dying_weight_files(name: str) -> list[tuple[Path, bytes]]:
    """Where and what to write to give the per-execution parent (made already) the dying
    weight: its file in each hierarchy that weighs CPU there (found once, so that the write
    at the deadline is a write alone)."""
    found: list[tuple[Path, bytes]] = []
    for hierarchy in toolbox.cgroup_hierarchies():
        parent = hierarchy.point / CGROUP_ROOT / name
        if hierarchy.version == 2:
            weight = (parent / "cpu.weight", str(DYING_CPU_WEIGHT).encode())
        elif "cpu" in hierarchy.options:
            weight = (parent / "cpu.shares", str(DYING_CPU_SHARES).encode())
        else:
            continue
        if weight[0].exists():  # (not where the cpu controller is not enabled)
            found.append(weight)
    return found


def hasten(files: list[tuple[Path, bytes]]) -> None:
    """Give a container that was just killed the most CPU weight among the executions.

    Under load a killed container's processes take long to exit (their pages to free, the
    runtime's work after them) at an execution's share of the CPU; its caller waits for that
    (a result comes back once the whole tree was seen ended). Nothing of the program runs once
    the kill landed, so nothing of the program gains by it. Quick, thread-safe, never raises
    (a hierarchy without the weight, or a parent already gone, is left as it is)."""
    for path, value in files:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            os.write(fd, value)
        except OSError:
            pass
        finally:
            os.close(fd)


def remove_cgroup_parent(name: str) -> EmptyCgroup | None:
    """Remove the per-execution parent, and whatever the runtime left below it, in every
    hierarchy, then the shared root where no other execution uses it. Only empty cgroups are
    removed (the kernel refuses one with a process in it), so removing every parent is the
    kernel's proof that no process of the container is left: returned, else None (a
    container still inside, or not ours; the reaper tries again once its owner is gone)."""
    parents: list[Path] = []
    for hierarchy in cgroup_hierarchies():
        parent = hierarchy / CGROUP_ROOT / name
        if not parent.is_dir():
            continue
        for child in parent.iterdir():
            if child.is_dir() and not child.is_symlink():
                remove_cgroup_tree(child)
        parents.append(parent)
    proof = remove_execution_cgroup(parents)
    for hierarchy in cgroup_hierarchies():
        # Busy while another execution has its parent there; then that one removes it.
        with suppress(OSError):
            (hierarchy / CGROUP_ROOT).rmdir()
    return proof


def _remove_parent(hierarchy: Path, name: str) -> bool:
    root = hierarchy / CGROUP_ROOT
    # A container still inside (or not ours to remove) refuses: the reaper tries again once
    # its owner is gone.
    clean = remove_cgroup_tree(root / name)
    # Busy while another execution has its parent there; then that one removes it.
    with suppress(OSError):
        root.rmdir()
    return clean


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
            [
                path,
                "ps",
                "-a",
                "--no-trunc",
                "--filter",
                f"label={MANAGED_LABEL}=1",
                "--filter",
                f"label={MACHINE_LABEL}={me.machine}",
                "--format",
                '{{.ID}} {{.Label "' + OWNER_LABEL + '"}}',
            ],
            env=engine_environment(),
            capture_output=True,
            text=True,
            timeout=ENGINE_COMMAND_SECONDS,
            check=False,
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
                [path, "rm", "-f", *doomed],
                env=engine_environment(),
                capture_output=True,
                timeout=ENGINE_COMMAND_SECONDS,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return []
    _reap_host_leftovers(everything)
    return doomed


def _reaped(name: str, everything: bool) -> bool:
    owner = owner_of(name)
    return owner is not None and (everything or not host_alive(*owner))


def _reap_host_leftovers(everything: bool) -> None:
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / CGROUP_ROOT
        try:
            entries = list(root.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir() and _reaped(entry.name, everything):
                _remove_parent(hierarchy, entry.name)
    reap_owned_directories(tempfile.gettempdir(), (SOCKET_DIR_PREFIX,), everything=everything)
