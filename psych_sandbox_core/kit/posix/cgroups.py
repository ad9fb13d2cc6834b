"""A cgroup per execution: usage measured, and memory and process count capped, from outside.

The kernel's rusage reaches the host only through wait4, and only for what was reaped along
the way: bubblewrap's monitor never reaps its pid namespace's init, and a program that sets
SIGCHLD to SIG_IGN has its children reaped by the kernel with their usage discarded. A cgroup
counts every process in it whatever they do: the execution's first process is moved in before
it can fork (while still root), so everything it starts is counted there, and nothing inside
can leave (the tree runs unprivileged, and cgroupfs is root's). After the tree is gone the
host reads CPU time and peak memory, and whether the kernel's out-of-memory killer fired,
then removes the cgroup. Used by the subprocess backend and the bwrap plugin.

Each execution's cgroup is created under the host process's own cgroup in each hierarchy, so
limits the host itself is under still apply to the sandbox.

Where the cpu controller is there too, each execution's cgroup gets an eighth of the default
CPU weight: the host supervises every execution (the wall clock that ends a timed-out one,
teardown, every conversation), and on a machine busy with programs it must not wait behind
them. The weight is against everything else on the machine too: under contention an
untrusted program is the guest, and the machine's other work comes first; an idle machine
gives it all the CPU it asks for either way. A program cannot leave its cgroup, so cannot
take the weight back. Without a cpu controller the weight is not set (nothing else depends
on it).

Supported: cgroup v1 with the cpuacct, memory and pids controllers mounted, or cgroup v2
whose controllers memory and pids are (or can be) enabled for children of the host's cgroup.
Only a root host creates cgroups; elsewhere :func:`detect` says why not and usage stays
unmeasured.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import anyio

from psych_sandbox_core.kit.posix.cgroupfs import Hierarchy, hierarchies

from ..phases import mark
from .identity import EmptyCgroup, remove_execution_cgroup
from .temp_dirs import host_alive, owner_of, owner_tag

#: Per-execution cgroups are named ``<PREFIX><backend>-<host pid>-<random>``, so a later host
#: can tell a leftover (its host died before teardown) from a live one.
PREFIX = "psych-sandbox-"
#: v1 controllers each execution needs: CPU time, memory (peak and cap), process count.
V1_CONTROLLERS = ("cpuacct", "memory", "pids")
V2_CONTROLLERS = ("memory", "pids")
#: The execution's CPU weight where the cpu controller is there: an eighth of the default
#: (cgroup v1 cpu.shares 1024, v2 cpu.weight 100), so the host comes first under contention.
V1_CPU_SHARES = 128
V2_CPU_WEIGHT = 12
#: After the namespace is empty, how long to keep killing anything still in the cgroup.
DRAIN_SECONDS = 5.0
#: How often to look again while draining: cgroup v1 has no event for "now empty".
DRAIN_POLL_SECONDS = 0.005


@dataclass(frozen=True)
class CgroupHost:
    """Where this host creates per-execution cgroups."""

    version: int
    #: v1: one parent directory per controller; v2: the one unified parent.
    parents: dict[str, Path]
    #: v1: whether memory+swap can be capped too (swap accounting enabled).
    memsw: bool = False
    #: Whether an execution's CPU weight can be set (the cpu controller is there).
    cpu: bool = False

    def create(self, backend: str) -> ExecutionCgroup:
        """A fresh, empty cgroup for one execution of ``backend`` (OSError if the kernel
        refuses)."""
        name = f"{PREFIX}{backend}-{owner_tag()}-{uuid.uuid4().hex[:12]}"
        made: list[Path] = []
        try:
            for parent in dict.fromkeys(self.parents.values()):
                path = parent / name
                path.mkdir(mode=0o755)
                made.append(path)
        except OSError:
            for path in made:
                _rmdir(path)
            raise
        dirs = {controller: parent / name for controller, parent in self.parents.items()}
        return ExecutionCgroup(self, dirs)


@dataclass
class ExecutionCgroup:
    host: CgroupHost
    #: Controller (v1) or "unified" (v2) to this execution's directory.
    dirs: dict[str, Path]
    memory_limited: bool = False
    pids_limited: bool = False
    _join_fds: list[int] = field(default_factory=list)

    @property
    def directories(self) -> list[Path]:
        return list(dict.fromkeys(self.dirs.values()))

    def limit(self, memory_bytes: int | None, pids: int | None) -> None:
        """Write the caps; each flag records only a cap that was actually written."""
        if memory_bytes is not None:
            if self.host.version == 1:
                memory = self.dirs["memory"]
                _write(memory / "memory.limit_in_bytes", str(memory_bytes))
                if self.host.memsw:
                    # Equal to the memory cap: no swap to spill into.
                    _write(memory / "memory.memsw.limit_in_bytes", str(memory_bytes))
            else:
                unified = self.dirs["unified"]
                _write(unified / "memory.max", str(memory_bytes))
                if (unified / "memory.swap.max").exists():
                    _write(unified / "memory.swap.max", "0")
            self.memory_limited = True
        if pids is not None:
            directory = self.dirs["pids"] if self.host.version == 1 else self.dirs["unified"]
            _write(directory / "pids.max", str(pids))
            self.pids_limited = True

    def weigh(self) -> None:
        """Give the execution its CPU weight (see the module's docstring), where it can be
        set; nothing depends on it, so a failure is left at that."""
        if not self.host.cpu:
            return
        with contextlib.suppress(OSError, KeyError):
            if self.host.version == 1:
                _write(self.dirs["cpu"] / "cpu.shares", str(V1_CPU_SHARES))
            else:
                _write(self.dirs["unified"] / "cpu.weight", str(V2_CPU_WEIGHT))

    def open_for_joining(self) -> None:
        """Open the files that move a process in now, so the forked child only writes.

        v1: ``tasks``, not ``cgroup.procs``. The child is single-threaded after the fork, and
        the kernel moves the writing thread itself ("0") without taking the global
        threadgroup lock, whose write side waits out an RCU grace period per hierarchy
        (about 10 ms for three hierarchies on a loaded host, measured). v2 has no such
        shortcut outside threaded cgroups, so it writes ``cgroup.procs``.
        """
        for path in self.join_files():
            self._join_fds.append(os.open(path, os.O_WRONLY | os.O_CLOEXEC))

    def join_files(self) -> list[Path]:
        """The files a process writes "0" to, as root, to move itself in (see
        open_for_joining for which)."""
        name = "tasks" if self.host.version == 1 else "cgroup.procs"
        return [directory / name for directory in self.directories]

    @property
    def join_fds(self) -> list[int]:
        """The descriptors open_for_joining opened, for a child that moves itself in by
        writing "0" to each (the subprocess backend's bootstrap does)."""
        return list(self._join_fds)

    def join_current_process(self) -> None:
        """Move the calling process in (safe in a pre-exec step: only writes to descriptors
        opened before the fork). "0" is the writer itself."""
        for fd in self._join_fds:
            os.write(fd, b"0")

    def close_join_fds(self) -> None:
        for fd in self._join_fds:
            os.close(fd)
        self._join_fds.clear()

    def pids(self) -> set[int]:
        """The processes found in every directory that can be read (to kill stragglers)."""
        found: set[int] = set()
        for directory in self.directories:
            with contextlib.suppress(OSError):
                found.update(_pid_set(_read(directory / "cgroup.procs")))
        return found

    def processes(self) -> set[int] | None:
        """The processes in the cgroup, or None when they cannot be read (an empty set is
        then never mistaken for an empty cgroup).

        Read from one hierarchy: every process of the execution is in its cgroup of every
        hierarchy (the first one joined all of them before anything forked, a child is born
        in its parent's, and moving a process out takes root, whose cgroupfs it is), so one
        list is the whole list. Teardown's :meth:`pids` still reads every one."""
        try:
            return _pid_set(_read(self._listing))
        except OSError:
            return None

    @property
    def _listing(self) -> str:
        """The process list of the pids controller's directory (v2: the one directory)."""
        return os.path.join(
            self.dirs["pids" if self.host.version == 1 else "unified"], "cgroup.procs"
        )

    async def drain(self, deadline_seconds: float = DRAIN_SECONDS, *, every: bool = True) -> bool:
        """SIGKILL everything still in the cgroup until it is empty; True once it is.
        ``every``: read every hierarchy's list (else the one :meth:`processes` reads, the
        whole list where it can be read)."""
        deadline = time.monotonic() + deadline_seconds
        while True:
            listed = None if every else self.processes()
            remaining = self.pids() if listed is None else listed
            if not remaining:
                return True
            for pid in remaining:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() >= deadline:
                return False
            await anyio.sleep(DRAIN_POLL_SECONDS)

    def usage(self) -> tuple[float | None, int | None]:
        """CPU seconds and peak memory of everything that ran in the cgroup."""
        try:
            if self.host.version == 1:
                cpu = int(_read(self.dirs["cpuacct"] / "cpuacct.usage")) / 1e9
                peak = int(_read(self.dirs["memory"] / "memory.max_usage_in_bytes"))
                return cpu, peak
            unified = self.dirs["unified"]
            stat = _keyed(_read(unified / "cpu.stat"))
            cpu = stat["usage_usec"] / 1e6
            peak_path = unified / "memory.peak"
            # memory.peak arrived in Linux 5.19; without it, peak memory is not measured.
            return cpu, int(_read(peak_path)) if peak_path.exists() else None
        except (OSError, ValueError, KeyError):
            return None, None

    def memory_now(self) -> int | None:
        """The memory charged to the cgroup now (None: not readable here)."""
        try:
            if self.host.version == 1:
                return int(_read(self.dirs["memory"] / "memory.usage_in_bytes"))
            return int(_read(self.dirs["unified"] / "memory.current"))
        except (OSError, ValueError, KeyError):
            return None

    async def final_usage(self) -> tuple[float | None, int | None]:
        """CPU seconds and peak memory once nothing is left to run in the cgroup (stragglers
        are killed first, shielded); (None, None) when it could not be emptied, since usage
        is final only then."""
        with anyio.CancelScope(shield=True):
            # One hierarchy's list: it is the whole list (see processes). The removal still
            # reads every one if the kernel refuses to remove a directory (see remove).
            empty = await self.drain(every=False)
        return self.usage() if empty else (None, None)

    def oom_killed(self) -> bool | None:
        """Whether the out-of-memory killer ended a process of this cgroup (None: unknown)."""
        try:
            if self.host.version == 1:
                control = _keyed(_read(self.dirs["memory"] / "memory.oom_control"))
                if "oom_kill" in control:
                    return control["oom_kill"] > 0
                # Kernels before 4.13 do not count kills; hitting the cap is the best sign.
                return int(_read(self.dirs["memory"] / "memory.failcnt")) > 0 or None
            events = _keyed(_read(self.dirs["unified"] / "memory.events"))
            return events.get("oom_kill", 0) > 0
        except (OSError, ValueError):
            return None

    async def remove(self) -> EmptyCgroup | None:
        """Kill stragglers, then rmdir every directory: the kernel's proof that the tree is
        gone when every one was removed, else None (one is left behind)."""
        self.close_join_fds()
        # Usually emptied already (its usage was read once it was): the kernel removes only
        # an empty cgroup, so try that first and drain only when it refuses.
        removed = remove_execution_cgroup(self.directories)
        if removed is not None:
            return removed
        await self.drain()
        left = [directory for directory in self.directories if directory.exists()]
        proof = remove_execution_cgroup(left)
        # Proof only of a whole cgroup removed by one call (not of a part left over).
        return proof if len(left) == len(self.directories) else None


def _read(path: Path | str) -> str:
    # Read raw: a text file object costs more than a small cgroup file's read itself, and
    # several are read per execution.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


def _pid_set(text: str) -> set[int]:
    return {int(line) for line in text.split() if line.isdigit()}


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _keyed(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


# ---------------------------------------------------------------------------- detection


def _own_cgroups() -> dict[str, str]:
    """Controller (or "" for v2) to this process's cgroup path in that hierarchy."""
    own: dict[str, str] = {}
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            parts = line.rstrip("\n").split(":", 2)
            if len(parts) != 3:
                continue
            _, controllers, path = parts
            for controller in controllers.split(",") if controllers else [""]:
                own[controller] = path
    return own


def _inside(mount: Hierarchy, cgroup_path: str) -> Path | None:
    """Where ``cgroup_path`` of the mount's hierarchy appears on the filesystem."""
    root = mount.root.rstrip("/")
    if cgroup_path != root and not cgroup_path.startswith(root + "/"):
        return None
    directory = mount.point / cgroup_path[len(root) :].lstrip("/")
    return directory if directory.is_dir() else None


def _detect_v1(mounts: list[Hierarchy], own: dict[str, str]) -> CgroupHost | str:
    parents: dict[str, Path] = {}
    for controller in V1_CONTROLLERS:
        mount = next((m for m in mounts if m.fstype == "cgroup" and controller in m.options), None)
        if mount is None or controller not in own:
            return f"the cgroup v1 {controller} controller is not mounted"
        parent = _inside(mount, own[controller])
        if parent is None or not os.access(parent, os.W_OK):
            return f"this process's cgroup v1 {controller} directory is not writable"
        parents[controller] = parent
    memsw = (parents["memory"] / "memory.memsw.limit_in_bytes").exists()
    # The cpu controller only weighs the execution against the host: used where it is there.
    cpu = next((m for m in mounts if m.fstype == "cgroup" and "cpu" in m.options), None)
    parent = None if cpu is None or "cpu" not in own else _inside(cpu, own["cpu"])
    if parent is not None and os.access(parent, os.W_OK):
        parents["cpu"] = parent
    return CgroupHost(1, parents, memsw=memsw, cpu="cpu" in parents)


def _detect_v2(mounts: list[Hierarchy], own: dict[str, str]) -> CgroupHost | str:
    mount = next((m for m in mounts if m.fstype == "cgroup2"), None)
    if mount is None or "" not in own:
        return "no cgroup v2 hierarchy is mounted"
    parent = _inside(mount, own[""])
    if parent is None or not os.access(parent, os.W_OK):
        return "this process's cgroup v2 directory is not writable"
    try:
        available = set(_read(parent / "cgroup.controllers").split())
        enabled = set(_read(parent / "cgroup.subtree_control").split())
    except OSError as exc:
        return f"cannot read this process's cgroup v2 controllers: {exc}"
    missing = [c for c in V2_CONTROLLERS if c not in available]
    if missing:
        return f"the cgroup v2 controllers {', '.join(missing)} are not available here"
    wanted = [c for c in V2_CONTROLLERS if c not in enabled]
    if wanted:
        # Succeeds only where no process lives in this cgroup itself (the root cgroup, or a
        # delegated one): cgroup v2 keeps processes and controlled children apart.
        try:
            _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
        except OSError as exc:
            return (
                f"cannot enable the cgroup v2 controllers {', '.join(wanted)} for children of "
                f"this process's cgroup: {exc}"
            )
    return CgroupHost(2, {"unified": parent}, cpu=_enable_cpu(parent, available, enabled))


def _enable_cpu(parent: Path, available: set[str], enabled: set[str]) -> bool:
    """Whether children of ``parent`` can be given a CPU weight (the cpu controller enabled
    for them, here if need be)."""
    if "cpu" in enabled:
        return True
    if "cpu" not in available:
        return False
    try:
        _write(parent / "cgroup.subtree_control", "+cpu")
    except OSError:
        return False
    return True


@lru_cache(maxsize=1)
def detect() -> CgroupHost | str:
    """Where this host can create per-execution cgroups, or why it cannot."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the host is not root, so it cannot create cgroups"
    try:
        mounts, own = hierarchies(), _own_cgroups()
    except OSError as exc:
        return f"cannot read this process's cgroups: {exc}"
    # A hybrid host (v1 controllers beside an empty v2 hierarchy) is used as v1.
    v1 = _detect_v1(mounts, own)
    if isinstance(v1, CgroupHost):
        result: CgroupHost | str = v1
    else:
        v2 = _detect_v2(mounts, own)
        result = v2 if isinstance(v2, CgroupHost) else f"{v1}; {v2}"
    if isinstance(result, CgroupHost):
        remove_leftovers(result)
    return result


async def prepared(
    backend: str, *, memory_bytes: int | None = None, pids: int | None = None
) -> ExecutionCgroup | None:
    """A fresh cgroup for one execution of ``backend``, capped as asked and ready to be
    joined; None where this host can make none. A cgroup that cannot be fully set up measures
    nothing trustworthy, so it is removed and None returned: the execution runs without."""
    host = detect()
    if isinstance(host, str):
        return None
    try:
        cgroup = host.create(backend)
    except OSError:
        return None
    try:
        cgroup.limit(memory_bytes, pids)
        cgroup.weigh()
        cgroup.open_for_joining()
    except OSError:
        await cgroup.remove()
        return None
    mark("cgroup made")
    return cgroup


def remove_leftovers(host: CgroupHost) -> None:
    """Remove per-execution cgroups whose host process is gone (it died before teardown;
    its sandbox died with it, so they are empty)."""
    for parent in dict.fromkeys(host.parents.values()):
        try:
            entries = list(parent.iterdir())
        except OSError:
            continue
        for entry in entries:
            if not entry.name.startswith(PREFIX):
                continue
            parts = entry.name[len(PREFIX) :].rsplit("-", 2)
            owner = owner_of(parts[1]) if len(parts) == 3 else None
            if owner is not None and not host_alive(*owner):
                _rmdir(entry)
