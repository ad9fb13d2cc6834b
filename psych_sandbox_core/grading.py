"""Guarantees, grades and the one function that turns grades into a level.

A backend never states its level: it states which mechanisms it applied, the child reports
what it observes, and :func:`grade` turns both into a grade per guarantee. :func:`level_of`
is the only place a level is computed. The table is in docs/levels.md.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Strict

from .protocol.frames import ContainmentReport


class _Named(str, enum.Enum):
    """Shown as its value (as ``enum.StrEnum`` is, which 3.10 lacks): results carry these,
    and a reader printing ``result.level`` sees ``isolated``, as in the JSON."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Guarantee(_Named):
    FILESYSTEM = "filesystem"
    NETWORK = "network"
    PROCESS_TREE = "process_tree"
    IDENTITY = "identity"
    CPU = "cpu"
    MEMORY = "memory"
    FILE_SIZE = "file_size"
    PROCESS_COUNT = "process_count"
    WALL_CLOCK = "wall_clock"
    ENVIRONMENT = "environment"


class Grade(_Named):
    #: A mechanism whose boundary was applied and whose evidence agrees.
    ENFORCED = "enforced"
    #: Requested and not contradicted: a weaker claim, on purpose.
    UNVERIFIED = "unverified"
    #: Not offered here, or contradicted by evidence.
    UNAVAILABLE = "unavailable"


_GRADE_ORDER = {Grade.UNAVAILABLE: 0, Grade.UNVERIFIED: 1, Grade.ENFORCED: 2}


def weaker(a: Grade, b: Grade) -> Grade:
    return a if _GRADE_ORDER[a] <= _GRADE_ORDER[b] else b


def at_least(grade: Grade, floor: Grade) -> bool:
    return _GRADE_ORDER[grade] >= _GRADE_ORDER[floor]


class Level(_Named):
    ISOLATED = "isolated"
    PROCESS = "process"
    NONE = "none"


#: A Level as configuration gives it, in strict models too: the enum or its value as a plain
#: str ("isolated"), the same in Python as in TOML.
LevelSetting = Annotated[Level, Strict(False)]

_LEVEL_ORDER = {Level.NONE: 0, Level.PROCESS: 1, Level.ISOLATED: 2}


def level_at_least(level: Level, floor: Level) -> bool:
    return _LEVEL_ORDER[level] >= _LEVEL_ORDER[floor]


#: Guarantees that must be enforced for the isolated level: the kernel boundary itself.
ISOLATED_ENFORCED = frozenset(
    {
        Guarantee.FILESYSTEM,
        Guarantee.NETWORK,
        Guarantee.PROCESS_TREE,
        Guarantee.IDENTITY,
        Guarantee.WALL_CLOCK,
        Guarantee.ENVIRONMENT,
    }
)
#: Guarantees that must not be unavailable for the process level.
PROCESS_REQUIRED = frozenset(
    {Guarantee.CPU, Guarantee.WALL_CLOCK, Guarantee.ENVIRONMENT, Guarantee.PROCESS_TREE}
)


Grades = Mapping[Guarantee, Grade]


def level_of(grades: Grades) -> Level:
    """The level the grades earn. The only place a level is computed."""

    def get(guarantee: Guarantee) -> Grade:
        return grades.get(guarantee, Grade.UNAVAILABLE)

    if all(get(g) is Grade.ENFORCED for g in ISOLATED_ENFORCED) and all(
        get(g) is not Grade.UNAVAILABLE for g in Guarantee
    ):
        return Level.ISOLATED
    if all(get(g) is not Grade.UNAVAILABLE for g in PROCESS_REQUIRED):
        return Level.PROCESS
    return Level.NONE


class Mechanisms(BaseModel):
    """What a backend applied for one execution. Claims, to be checked against evidence."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: A mount namespace or container: nothing of the host is there unless bound in.
    filesystem_boundary: bool = False
    #: Some weaker filesystem confinement (e.g. a deny-list profile).
    filesystem_confinement: bool = False
    #: A kernel network boundary: a network namespace, --network=none, or a sandbox profile
    #: that denies every network operation (macOS seatbelt).
    network_namespace: bool = False
    #: A pid namespace, cgroup or job object: descendants cannot outlive teardown (enforced
    #: only while the program cannot reach its supervisor, see below).
    process_tree_boundary: bool = False
    #: The program can signal, trace or write the memory of a process that supervises its
    #: execution (the host, a namespace's init, a launcher), so it could stop it or keep it
    #: alive past teardown.
    supervisor_reachable: bool = False
    #: An IPC namespace: SysV objects and POSIX message queues die with the execution, and
    #: executions cannot meet through them (whatever uid each runs as, or ran as before).
    ipc_namespace: bool = False
    #: Only a process group: a descendant that calls setsid can escape it.
    process_group: bool = True
    #: The program runs as an identity other than the host's, without capabilities.
    unprivileged_identity: bool = False
    #: That identity is this execution's alone while it runs (leased, and swept before anyone
    #: gets it again): no other execution, and no account of the host, runs as it.
    exclusive_identity: bool = False
    #: The child sets rlimits on itself (CPU, address space, file size, process count).
    rlimits: bool = True
    #: The address-space rlimit caps memory here. False where a platform accepts the limit
    #: without enforcing it (macOS): memory is then capped by nothing.
    address_space_rlimit: bool = True
    #: A memory cap enforced from outside the process (cgroup, job object).
    memory_cgroup: bool = False
    #: A process-count cap enforced from outside (pids cgroup, job object).
    pids_cgroup: bool = False
    #: A CPU-time cap enforced from outside the process (a job object's).
    cpu_limit_outside: bool = False
    #: The host's wall-clock timer kills the tree.
    wall_clock: bool = True
    #: The environment is built from an allow-list.
    environment_allow_list: bool = True

    @classmethod
    def boundary(cls, *, memory_cgroup: bool, pids_cgroup: bool) -> Mechanisms:
        """A boundary that shares nothing with the host (a container, or namespaces of every
        kind): a filesystem, network, IPC and process tree of its own, the program as an
        unprivileged identity, and no process group needed. The caps it enforces from
        outside are the caller's to state: only those actually applied."""
        return cls(
            filesystem_boundary=True,
            network_namespace=True,
            ipc_namespace=True,
            process_tree_boundary=True,
            process_group=False,
            unprivileged_identity=True,
            memory_cgroup=memory_cgroup,
            pids_cgroup=pids_cgroup,
        )


def _limit(report: ContainmentReport, name: str) -> tuple[int, int] | None:
    for item in report.limits:
        if item.name == name:
            return item.soft, item.hard
    return None


def _no_capabilities(mask: str | None) -> bool:
    """True only for a mask that parses and is zero: the report is hostile input, and a mask
    that cannot be read is no evidence of having none."""
    if not mask:
        return False
    try:
        return int(mask, 16) == 0
    except ValueError:
        return False


def grade(
    mechanisms: Mechanisms, report: ContainmentReport, *, host_uid: int
) -> dict[Guarantee, Grade]:
    """Grade each guarantee from what the backend applied and what the child observed.

    Evidence is asymmetric: evidence of exposure always wins (unavailable), evidence of
    absence earns enforced only where the backend's boundary makes the question moot.
    """
    grades: dict[Guarantee, Grade] = {}

    # Filesystem: a readable canary proves exposure whatever the mechanism claims.
    if report.canary_readable is True:
        grades[Guarantee.FILESYSTEM] = Grade.UNAVAILABLE
    elif mechanisms.filesystem_boundary and report.canary_readable is False:
        grades[Guarantee.FILESYSTEM] = Grade.ENFORCED
    elif mechanisms.filesystem_confinement or mechanisms.filesystem_boundary:
        grades[Guarantee.FILESYSTEM] = Grade.UNVERIFIED
    else:
        grades[Guarantee.FILESYSTEM] = Grade.UNAVAILABLE

    # Network: a connection, or an interface that is up, proves exposure.
    network = report.network
    exposed = "connected" in (network.ipv4, network.ipv6) or bool(network.interfaces_up)
    probed = network.ipv4 != "skipped" and network.ipv6 != "skipped"
    if exposed:
        grades[Guarantee.NETWORK] = Grade.UNAVAILABLE
    elif mechanisms.network_namespace and probed:
        grades[Guarantee.NETWORK] = Grade.ENFORCED
    elif mechanisms.network_namespace:
        grades[Guarantee.NETWORK] = Grade.UNVERIFIED
    else:
        grades[Guarantee.NETWORK] = Grade.UNAVAILABLE

    # Process tree: a boundary the program can reach the supervisor of is not enforced.
    if mechanisms.process_tree_boundary and not mechanisms.supervisor_reachable:
        grades[Guarantee.PROCESS_TREE] = Grade.ENFORCED
    elif mechanisms.process_group or mechanisms.process_tree_boundary:
        grades[Guarantee.PROCESS_TREE] = Grade.UNVERIFIED
    else:
        grades[Guarantee.PROCESS_TREE] = Grade.UNAVAILABLE

    # Identity: the child must not be root, nor the host's own account, nor hold capabilities;
    # and without an IPC namespace, SysV objects outlive an execution under its uid and are
    # shared by every execution on the host, so identity alone separates nothing there. A uid
    # shared with other executions (a fixed drop_to_uid) separates them only where mount and
    # pid namespaces already keep each out of the others' files and processes.
    no_caps = _no_capabilities(report.capabilities)
    foreign_identity = report.euid != 0 and (report.euid != host_uid or host_uid == 0)
    separated = mechanisms.exclusive_identity or (
        mechanisms.filesystem_boundary and mechanisms.process_tree_boundary
    )
    if report.euid == 0 and not no_caps:
        grades[Guarantee.IDENTITY] = Grade.UNAVAILABLE
    elif (
        mechanisms.unprivileged_identity
        and mechanisms.ipc_namespace
        and separated
        and no_caps
        and foreign_identity
    ):
        grades[Guarantee.IDENTITY] = Grade.ENFORCED
    elif mechanisms.unprivileged_identity and report.euid != 0:
        grades[Guarantee.IDENTITY] = Grade.UNVERIFIED
    else:
        grades[Guarantee.IDENTITY] = Grade.UNAVAILABLE

    # Resource limits the child applies to itself after the handshake: requested, and
    # contradicted only if the inherited hard limit could not be lowered (never happens) —
    # so unverified unless enforced from outside.
    rlimit = Grade.UNVERIFIED if mechanisms.rlimits else Grade.UNAVAILABLE
    # A cap held from outside is enforced, unless the program can reach the supervisor that
    # holds it (a job object's handle, taken from a process of its own account).
    outside = Grade.UNVERIFIED if mechanisms.supervisor_reachable else Grade.ENFORCED
    if mechanisms.cpu_limit_outside:
        grades[Guarantee.CPU] = outside
    else:
        grades[Guarantee.CPU] = rlimit if _limit(report, "CPU") is not None else (Grade.UNAVAILABLE)
    memory = outside if mechanisms.memory_cgroup else rlimit
    grades[Guarantee.MEMORY] = (
        memory
        if mechanisms.memory_cgroup
        or (mechanisms.address_space_rlimit and _limit(report, "AS") is not None)
        else Grade.UNAVAILABLE
    )
    grades[Guarantee.FILE_SIZE] = (
        rlimit if _limit(report, "FSIZE") is not None else (Grade.UNAVAILABLE)
    )
    pids = outside if mechanisms.pids_cgroup else rlimit
    grades[Guarantee.PROCESS_COUNT] = (
        pids
        if (mechanisms.pids_cgroup or _limit(report, "NPROC") is not None)
        else Grade.UNAVAILABLE
    )

    # A program that can stop its supervisor can stop the clock that was to kill it.
    if not mechanisms.wall_clock:
        grades[Guarantee.WALL_CLOCK] = Grade.UNAVAILABLE
    elif mechanisms.supervisor_reachable:
        grades[Guarantee.WALL_CLOCK] = Grade.UNVERIFIED
    else:
        grades[Guarantee.WALL_CLOCK] = Grade.ENFORCED
    grades[Guarantee.ENVIRONMENT] = (
        Grade.ENFORCED if mechanisms.environment_allow_list else Grade.UNAVAILABLE
    )
    return grades
