"""What a launched child may offer beyond the essentials of :class:`~.backend.Launched`, each a
small protocol the engine checks for: a launch implements the ones its mechanism gives it and
nothing else (no method with a default on every backend's base).

Checked at run time by attribute (``isinstance``), so a launch need not name them as bases;
naming them documents the intent and lets a type checker hold the signatures."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class UsageSoFar(Protocol):
    """Usage read while the child may still be alive (a cgroup of the execution's own): what
    a result handed back before the teardown reports. Without it, such a result's usage is
    not measured."""

    def usage_so_far(self) -> tuple[float | None, int | None] | None:
        """CPU seconds and peak memory of the child so far; None where not measurable now."""
        ...


@runtime_checkable
class MemoryNow(Protocol):
    """The memory a prepared child holds, as the host measures it: a warm pool counts it
    against its budget (without it, each child counts at the profile's memory cap)."""

    def memory_bytes_now(self) -> int | None:
        """The child's memory now (its cgroup's count), or None where not measurable."""
        ...


@runtime_checkable
class ProcessesNoted(Protocol):
    """A child whose processes the host can list (its cgroup's): noted before its program
    runs, so that a result handed back early can tell that the program left none behind
    (only then are its workspace's files collected at once)."""

    def before_program(self) -> bool:
        """Note the processes the child has now, before its program runs (once); whether
        :meth:`only_processes_from_before` can answer later."""
        ...

    def only_processes_from_before(self) -> bool:
        """Whether every process of the child's tree now is one it had before its program
        ran. False where it cannot tell."""
        ...


@runtime_checkable
class Relayed(Protocol):
    """A child that runs beside another host (a remote service), relayed: what that side saw
    is the core's evidence too."""

    #: The uid of the host process the child runs beside, as the handshake made it known:
    #: the child's identity is graded against it and this process's both. None: unknown yet.
    host_uid: int | None

    def connections_elsewhere(self) -> int:
        """Connections to this execution's probe listeners seen where the child runs (asked
        after ``finish``), counted with this host's own."""
        ...

    def unrelayed(self, stream: str) -> tuple[int, int]:
        """Bytes and newlines of ``stream`` ("stdout" or "stderr") the child wrote but the
        relay did not hand over (a capped head and tail), asked once the stream ended."""
        ...
