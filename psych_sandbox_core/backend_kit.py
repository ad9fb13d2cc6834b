"""Deprecated: the backend kit moved to :mod:`psych_sandbox_core.kit` (the contract),
:mod:`psych_sandbox_core.kit.posix` (the local toolbox) and :mod:`psych_sandbox_core.kit.relay`
(what a relaying backend needs).

Kept for one release (0.2) so that backends written against 0.1 still import: it provides
every name the 0.1 kit exported, from wherever it now lives, including those that left the
public kit. New code imports from the kit's three modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import kit
from .errors import (
    InterpreterNotFoundError,
)
from .kit import (
    KIT_VERSION,
    Backend,
    BackendOptions,
    BackendRegistrar,
    BackendUnavailable,
    ChannelListener,
    ConfigurationError,
    ErrorKind,
    ExecutionLimits,
    ExitStatus,
    InheritedSocketChannel,
    InterpreterOptions,
    Launched,
    LaunchRequest,
    Level,
    LoopbackTokenChannel,
    Mechanisms,
    ProbeTargets,
    ProcessLaunched,
    bootstrap_argv,
    child_environment,
    hookimpl,
    wait_started,
)
from .kit.interpreter import (
    ChildInterpreter,
    resolve_environment,
    resolve_interpreter,
)
from .kit.posix import (
    DEFAULT_COUNT,
    DEFAULT_FIRST_UID,
    EXECUTION_CPU_SHARES,
    SYSTEM_CANDIDATES,
    EmptyCgroup,
    ExecutionCgroup,
    ExecutionIdentity,
    InitReport,
    LateTerms,
    LeasedIdentityBackend,
    LeasedIdentityOptions,
    ManagedProcess,
    PassedFds,
    SocketByteStream,
    UnixSocketChannel,
    cgroup_hierarchies,
    create_workspace,
    execution_cgroup,
    host_alive,
    interpreter_prefixes,
    make_owned_directory,
    mark,
    owner_of,
    owner_tag,
    reap_owned_directories,
    remove_cgroup_tree,
    remove_execution_cgroup,
    remove_tree,
    start_time,
)
from .kit.posix.cgroupfs import (
    Hierarchy,
)
from .kit.posix.identity import IdentityRange, host_is_root
from .kit.posix.leased import leased_identity
from .kit.relay import (
    HANDSHAKE_CEILINGS,
    HANDSHAKE_SECONDS,
    MAX_HELLO_FRAME_BYTES,
    MAX_HOST_FRAME_BYTES,
    PROTOCOL_VERSION,
    AbortFrame,
    Guarantee,
    HelloFrame,
    ProbeHarness,
    RunFrame,
    bootstrap_source,
    decode_child_frame,
    decode_host_frame,
    grade,
    level_at_least,
)
from .kit.starting import (
    read_some,
)

if TYPE_CHECKING:
    from .backends.subprocess import SubprocessBackend, SubprocessOptions

#: The 0.1 kit's names, every one still importable from here.
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
    # SubprocessBackend and SubprocessOptions, loaded on first use as the kit loads them.
    return getattr(kit, name)
