"""The backend kit: the one part of the core a backend imports.

A backend (a plugin distribution, or one shipped inside the core) takes everything it needs
from this module and from nothing else of ``psych_sandbox_core``; every other module is
internal and changes without notice. docs/writing-a-backend.md explains each name, and the
core's tests fail when a backend in its repository imports past the kit.

What is here:

* the contract: :class:`Backend` (subclass it, ``Backend[MyOptions]``, stating its id, claim
  and command mode as class keywords), :class:`BackendOptions` (the base of its
  strict settings), :class:`LaunchRequest` (one execution's bootstrap, probe targets, limits
  and environment), :class:`Launched` (what ``launch`` yields), :class:`BackendUnavailable`,
  :class:`Mechanisms` and :class:`Level`, :class:`ExitStatus`, the errors a backend raises;
* starting the child: :func:`bootstrap_argv` (its command line, and :class:`PassedFds`, the
  descriptors it may add for the child), :class:`LateTerms` (the probe's targets and the
  cgroup's join files handed to a child once it is spawned), :func:`child_environment`
  (its allow-listed environment), :class:`InitReport` (a pid namespace's init handed to the
  host, which tears the namespace down by it), the channel listeners by transport,
  :func:`wait_started`
  (the bootstrap reaching the channel raced against the launcher ending) and
  :func:`read_some` (a failed launcher's words);
* running it: :class:`ManagedProcess` (a local child tree: spawn, wait on a pidfd, kill,
  reap), :class:`SocketByteStream` (a connected socket as a byte stream),
  :func:`create_workspace` and :func:`remove_tree`, interpreter resolution
  (:meth:`InterpreterOptions.child_interpreter`, :class:`ChildInterpreter`,
  :func:`interpreter_prefixes`);
* separating executions: :class:`LeasedIdentityBackend` (the base of a backend that runs
  each execution as a uid of its own on a root host: it leases the uid around the launch),
  :func:`leased_identity` (that lease, swept and given back when the execution is over),
  :class:`LeasedIdentityOptions`;
  :func:`execution_cgroup` (a cgroup of the execution's own: usage, caps, a CPU weight, and the
  :class:`EmptyCgroup` proof a lease is retired with), :data:`EXECUTION_CPU_SHARES` (that
  weight as cgroup v1 shares, for a runtime that makes its own cgroups);
* what a killed host leaves behind: :func:`make_owned_directory` (a temporary directory named
  for its host process, :func:`owner_tag`), :func:`reap_owned_directories`, and telling a live
  host process from a dead one whose pid was reused (:func:`owner_of`, :func:`host_alive`,
  :func:`start_time`);
* saying where a launch's time goes: :func:`mark` (a point reached, for benchmarks: free
  unless a caller records; the kit's helpers mark their own points, such as ``spawned``);
* registering: :func:`hookimpl` and :class:`BackendRegistrar`;
* relaying a child that runs elsewhere (a remote service): :func:`bootstrap_source`,
  :class:`ProbeHarness` (the canary and listeners an execution is judged by, where the child
  runs), :data:`HANDSHAKE_SECONDS`, the protocol's frames and codec
  (:data:`PROTOCOL_VERSION`, :class:`HelloFrame`, :class:`RunFrame`, :class:`AbortFrame`,
  :func:`decode_child_frame`, :func:`decode_host_frame`, :data:`HANDSHAKE_CEILINGS`,
  :data:`MAX_HELLO_FRAME_BYTES`, :data:`MAX_HOST_FRAME_BYTES`) and grading
  (:class:`Guarantee`, :func:`grade`, :func:`level_at_least`).

Compatibility policy. :data:`KIT_VERSION` is the core's major.minor version. Within one
minor series (0.1.0, 0.1.1, ...) every name in ``__all__`` keeps its signature and meaning:
a patch release adds nothing a backend must implement and removes nothing. A minor release
may change the kit, and its release notes say how. A backend therefore declares one minor
series of the core, ``psych-sandbox-core>=0.2,<0.3``, and raises the range once it has been
checked against the next; from 1.0 on the policy is semantic versioning of this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..child.loader import bootstrap_source
from ..errors import ConfigurationError, ErrorKind, InterpreterNotFoundError
from ..grading import Guarantee, Level, Mechanisms, grade, level_at_least
from ..protocol import (
    PROTOCOL_VERSION,
    AbortFrame,
    HelloFrame,
    RunFrame,
    decode_child_frame,
    decode_host_frame,
)
from ..protocol.framing import HANDSHAKE_CEILINGS
from ..protocol.limits import MAX_HELLO_FRAME_BYTES, MAX_HOST_FRAME_BYTES
from ..terms import ExecutionLimits
from .backend import (
    Backend,
    BackendOptions,
    BackendUnavailable,
    Launched,
    LaunchRequest,
    ProbeTargets,
    ProcessLaunched,
)
from .channel import ChannelListener, InheritedSocketChannel, UnixSocketChannel
from .channel_loopback import LoopbackTokenChannel
from .child_env import child_environment
from .hookspecs import BackendRegistrar, hookimpl
from .interpreter import (
    SYSTEM_CANDIDATES,
    ChildInterpreter,
    InterpreterOptions,
    interpreter_prefixes,
    resolve_environment,
    resolve_interpreter,
)
from .late_terms import LateTerms
from .phases import mark
from .posix.cgroupfs import Hierarchy
from .posix.cgroupfs import hierarchies as cgroup_hierarchies
from .posix.cgroupfs import remove_tree as remove_cgroup_tree
from .posix.cgroups import V1_CPU_SHARES as EXECUTION_CPU_SHARES
from .posix.cgroups import ExecutionCgroup
from .posix.cgroups import prepared as execution_cgroup
from .posix.identity import (
    DEFAULT_COUNT,
    DEFAULT_FIRST_UID,
    EmptyCgroup,
    ExecutionIdentity,
    IdentityRange,
    LeasedIdentityBackend,
    LeasedIdentityOptions,
    host_is_root,
    leased_identity,
    remove_execution_cgroup,
)
from .posix.pid_namespace import InitReport
from .posix.process import ExitStatus, ManagedProcess
from .posix.removal import remove_tree
from .posix.socket_stream import SocketByteStream
from .posix.temp_dirs import (
    host_alive,
    make_owned_directory,
    owner_of,
    owner_tag,
    reap_owned_directories,
    start_time,
)
from .posix.workspace import create_workspace
from .probe_harness import ProbeHarness
from .starting import HANDSHAKE_SECONDS, PassedFds, bootstrap_argv, read_some, wait_started

if TYPE_CHECKING:
    from ..backends.subprocess import SubprocessBackend, SubprocessOptions

#: The core's major.minor version this kit belongs to (see the compatibility policy above).
KIT_VERSION = "0.2"

__all__ = [
    "DEFAULT_COUNT",
    "DEFAULT_FIRST_UID",
    "EXECUTION_CPU_SHARES",
    "HANDSHAKE_CEILINGS",
    "HANDSHAKE_SECONDS",
    "KIT_VERSION",
    "MAX_HELLO_FRAME_BYTES",
    "MAX_HOST_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "SYSTEM_CANDIDATES",
    "AbortFrame",
    "Backend",
    "BackendOptions",
    "BackendRegistrar",
    "BackendUnavailable",
    "ChannelListener",
    "ChildInterpreter",
    "ConfigurationError",
    "EmptyCgroup",
    "ErrorKind",
    "ExecutionCgroup",
    "ExecutionIdentity",
    "ExecutionLimits",
    "ExitStatus",
    "Guarantee",
    "HelloFrame",
    "Hierarchy",
    "IdentityRange",
    "InheritedSocketChannel",
    "InitReport",
    "InterpreterNotFoundError",
    "InterpreterOptions",
    "LateTerms",
    "LaunchRequest",
    "Launched",
    "LeasedIdentityBackend",
    "LeasedIdentityOptions",
    "Level",
    "LoopbackTokenChannel",
    "ManagedProcess",
    "Mechanisms",
    "PassedFds",
    "ProbeHarness",
    "ProbeTargets",
    "ProcessLaunched",
    "RunFrame",
    "SocketByteStream",
    "SubprocessBackend",
    "SubprocessOptions",
    "UnixSocketChannel",
    "bootstrap_argv",
    "bootstrap_source",
    "cgroup_hierarchies",
    "child_environment",
    "create_workspace",
    "decode_child_frame",
    "decode_host_frame",
    "execution_cgroup",
    "grade",
    "hookimpl",
    "host_alive",
    "host_is_root",
    "interpreter_prefixes",
    "leased_identity",
    "level_at_least",
    "make_owned_directory",
    "mark",
    "owner_of",
    "owner_tag",
    "read_some",
    "reap_owned_directories",
    "remove_cgroup_tree",
    "remove_execution_cgroup",
    "remove_tree",
    "resolve_environment",
    "resolve_interpreter",
    "start_time",
    "wait_started",
]


def __getattr__(name: str) -> Any:
    # The built-in subprocess backend, for a backend that only changes its settings: loaded
    # on first use, since it is itself built on this kit.
    if name in ("SubprocessBackend", "SubprocessOptions"):
        from ..backends import subprocess

        return getattr(subprocess, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
