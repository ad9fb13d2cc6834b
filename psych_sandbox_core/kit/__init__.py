"""The backend kit: the one part of the core a backend imports.

A backend (a plugin distribution, or one shipped inside the core) takes what it needs from
this package and from nothing else of ``psych_sandbox_core``; every other module is internal
and changes without notice. docs/writing-a-backend.md explains each name, and the core's tests
fail when a backend in its repository, or a plugin's tests, import past it.

The kit is three modules:

* this one, the contract every backend holds in its head: :class:`Backend` (subclass it,
  ``Backend[MyOptions]``, stating its id, claim and command mode as class keywords),
  :class:`BackendOptions` (the base of its strict settings), :class:`LaunchRequest` (one
  execution's bootstrap, :class:`ProbeTargets`, :class:`ExecutionLimits` and environment),
  :class:`Launched` (what ``launch`` yields; :class:`ProcessLaunched` for one local process
  tree) and the optional capabilities it may implement (:class:`UsageSoFar`,
  :class:`MemoryNow`, :class:`ProcessesNoted`, :class:`Relayed`), :class:`ExitStatus`,
  :class:`Mechanisms` and :class:`Level`, the errors a backend raises
  (:class:`BackendUnavailable`, :class:`ConfigurationError`, and :class:`ErrorKind` for a
  failure hint), the child's command line and environment (:func:`bootstrap_argv`,
  :func:`child_environment`, :class:`InterpreterOptions`), the control channel by transport
  (:class:`ChannelListener`, :class:`InheritedSocketChannel`, :class:`LoopbackTokenChannel`),
  :func:`wait_started` (the bootstrap reaching the channel raced against its launcher ending),
  :func:`spawn` (the local spawn sequence and its unwinding, composed once), registration
  (:func:`hookimpl`, :class:`BackendRegistrar`), and the built-in :class:`SubprocessBackend`
  and :class:`SubprocessOptions` to subclass;
* :mod:`psych_sandbox_core.kit.posix`, the local toolbox: the process tree, the pid namespace,
  cgroups, a uid of the execution's own and its sweep, owned directories, the workspace;
* :mod:`psych_sandbox_core.kit.relay`, what a relaying backend needs: the bootstrap source,
  the probe harness, the protocol's frames and codec, the handshake's ceilings, grading.

Compatibility policy. :data:`KIT_VERSION` is the core's major.minor version. Within one
minor series (0.2.0, 0.2.1, ...) every name in the ``__all__`` of these three modules keeps its
signature and meaning: a patch release adds nothing a backend must implement and removes
nothing. A minor release may change the kit, and its release notes say how; a name it moves
or retires stays importable from its old place for that one release. A backend therefore
declares one minor series of the core, ``psych-sandbox-core>=0.2,<0.3``, and raises the range
once it has been checked against the next; from 1.0 on the policy is semantic versioning of
the kit.

What changed in 0.2: the kit moved from ``psych_sandbox_core.backend_kit`` to this package and
split into the contract, the toolbox (``kit.posix``) and the relay (``kit.relay``); names no
backend used left the public kit; the optional methods of ``Launched`` (``usage_so_far``,
``memory_bytes_now``, ``before_program``, ``only_processes_from_before``,
``connections_elsewhere``, ``unrelayed``, the attribute ``host_uid``) became the protocols
above, implemented where a launch offers them; :func:`spawn` is new.
``psych_sandbox_core.backend_kit`` still provides every name of 0.1, from wherever it now
lives, for the 0.2 series only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError, ErrorKind
from ..grading import Level, Mechanisms
from ..terms import ExecutionLimits

# The toolbox first: it re-exports helpers of this package built on the contract, so it must
# be entered before them (a kit module that imports a toolbox module enters the toolbox's
# package, which then finds those helpers loaded).
from . import posix as posix
from .backend import (
    Backend,
    BackendOptions,
    BackendUnavailable,
    Launched,
    LaunchRequest,
    ProbeTargets,
)
from .capabilities import MemoryNow, ProcessesNoted, Relayed, UsageSoFar
from .channel import ChannelListener, InheritedSocketChannel
from .channel_loopback import LoopbackTokenChannel
from .child_env import child_environment
from .exit_status import ExitStatus
from .hookspecs import BackendRegistrar, hookimpl
from .interpreter import InterpreterOptions
from .posix.launched import ProcessLaunched
from .spawning import spawn
from .starting import bootstrap_argv, wait_started

if TYPE_CHECKING:
    from ..backends.subprocess import SubprocessBackend, SubprocessOptions

#: The core's major.minor version this kit belongs to (see the compatibility policy above).
KIT_VERSION = "0.2"

__all__ = [
    "KIT_VERSION",
    "Backend",
    "BackendOptions",
    "BackendRegistrar",
    "BackendUnavailable",
    "ChannelListener",
    "ConfigurationError",
    "ErrorKind",
    "ExecutionLimits",
    "ExitStatus",
    "InheritedSocketChannel",
    "InterpreterOptions",
    "LaunchRequest",
    "Launched",
    "Level",
    "LoopbackTokenChannel",
    "Mechanisms",
    "MemoryNow",
    "ProbeTargets",
    "ProcessLaunched",
    "ProcessesNoted",
    "Relayed",
    "SubprocessBackend",
    "SubprocessOptions",
    "UsageSoFar",
    "bootstrap_argv",
    "child_environment",
    "hookimpl",
    "spawn",
    "wait_started",
]


def __getattr__(name: str) -> Any:
    # The built-in subprocess backend, for a backend that only changes its settings: loaded
    # on first use, since it is itself built on this kit.
    if name in ("SubprocessBackend", "SubprocessOptions"):
        from ..backends import subprocess

        return getattr(subprocess, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
