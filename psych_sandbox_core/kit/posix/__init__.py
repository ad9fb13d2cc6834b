"""The local toolbox of a backend on a POSIX host: what a backend that starts its child here,
as a process tree of its own, composes its launch from (the kit's ``spawn`` composes the usual
sequence of these for it).

* running the child: :class:`ManagedProcess` (spawn in its own session, wait on a pidfd,
  SIGTERM, grace, SIGKILL to the group, reap), :class:`PassedFds` (descriptors given at spawn),
  :class:`LateTerms` (the probe's targets and a cgroup's join files handed over once spawned),
  :class:`InitReport` (a pid namespace's init handed to the host, which tears the namespace
  down by it), :class:`SocketByteStream` and :class:`UnixSocketChannel` (sockets, a channel
  in a directory bound into a container), :func:`create_workspace` and :func:`remove_tree`,
  the interpreter on the host's filesystem (:data:`SYSTEM_CANDIDATES`,
  :func:`interpreter_prefixes`);
* separating executions: :class:`LeasedIdentityBackend` (the base of a backend that runs each
  execution as a uid of its own on a root host), :class:`LeasedIdentityOptions`,
  :class:`ExecutionIdentity` (the lease held), the range's defaults (:data:`DEFAULT_FIRST_UID`,
  :data:`DEFAULT_COUNT`); :func:`execution_cgroup` and :class:`ExecutionCgroup` (a cgroup of
  the execution's own), :data:`EXECUTION_CPU_SHARES`, and for a runtime that makes its own
  cgroups :func:`remove_execution_cgroup` (its :class:`EmptyCgroup` proof),
  :func:`cgroup_hierarchies` and :func:`remove_cgroup_tree`;
* what a killed host leaves behind: :func:`make_owned_directory`,
  :func:`reap_owned_directories`, :func:`owner_tag`, :func:`owner_of`, :func:`host_alive`,
  :func:`start_time`;
* where a launch's time goes: :func:`mark`.

Under the kit's compatibility policy (``psych_sandbox_core.kit``).
"""

from __future__ import annotations

from ..channel import UnixSocketChannel
from ..interpreter import SYSTEM_CANDIDATES, interpreter_prefixes
from ..late_terms import LateTerms
from ..phases import mark
from ..starting import PassedFds
from .cgroupfs import hierarchies as cgroup_hierarchies
from .cgroupfs import remove_tree as remove_cgroup_tree
from .cgroups import V1_CPU_SHARES as EXECUTION_CPU_SHARES
from .cgroups import ExecutionCgroup
from .cgroups import prepared as execution_cgroup
from .identity import (
    DEFAULT_COUNT,
    DEFAULT_FIRST_UID,
    EmptyCgroup,
    LeasedIdentityOptions,
    remove_execution_cgroup,
)
from .leased import ExecutionIdentity, LeasedIdentityBackend
from .pid_namespace import InitReport
from .process import ManagedProcess
from .removal import remove_tree
from .socket_stream import SocketByteStream
from .temp_dirs import (
    host_alive,
    make_owned_directory,
    owner_of,
    owner_tag,
    reap_owned_directories,
    start_time,
)
from .workspace import create_workspace

__all__ = [
    "DEFAULT_COUNT",
    "DEFAULT_FIRST_UID",
    "EXECUTION_CPU_SHARES",
    "SYSTEM_CANDIDATES",
    "EmptyCgroup",
    "ExecutionCgroup",
    "ExecutionIdentity",
    "InitReport",
    "LateTerms",
    "LeasedIdentityBackend",
    "LeasedIdentityOptions",
    "ManagedProcess",
    "PassedFds",
    "SocketByteStream",
    "UnixSocketChannel",
    "cgroup_hierarchies",
    "create_workspace",
    "execution_cgroup",
    "host_alive",
    "interpreter_prefixes",
    "make_owned_directory",
    "mark",
    "owner_of",
    "owner_tag",
    "reap_owned_directories",
    "remove_cgroup_tree",
    "remove_execution_cgroup",
    "remove_tree",
    "start_time",
]
