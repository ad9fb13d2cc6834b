"""A launched child that is one local process tree: what a backend built on the toolbox
yields from its launch (the subprocess backend, bwrap, the guide's tutorial)."""

from __future__ import annotations

from typing import Generic

from typing_extensions import TypeVar

from ...grading import Mechanisms
from ..backend import Launched
from ..channel import ChannelListener
from .cgroups import ExecutionCgroup
from .process import ManagedProcess

Channel = TypeVar("Channel", bound=ChannelListener)


class ProcessLaunched(Launched, Generic[Channel]):
    """A started child that is one local process tree (a :class:`ManagedProcess`): its
    streams are the process's, and it has exited when the process has. A subclass adds its
    teardown (``terminate`` and ``finish``). Given the execution's cgroup it reads usage and
    memory while the child lives and notes its processes (the :class:`UsageSoFar`,
    :class:`MemoryNow` and :class:`ProcessesNoted` capabilities); without one, those answer
    as unmeasured."""

    def __init__(
        self,
        process: ManagedProcess,
        channel: Channel,
        mechanisms: Mechanisms,
        cgroup: ExecutionCgroup | None = None,
    ) -> None:
        self.process = process
        self.channel: Channel = channel
        self.mechanisms = mechanisms
        self.stdout = process.stdout
        self.stderr = process.stderr
        #: The execution's own cgroup, where the host could make one: usage, memory and the
        #: processes of the tree are read from it while the child lives.
        self.cgroup = cgroup
        self._before_program: set[int] | None = None

    async def wait_exited(self) -> None:
        await self.process.wait_exited()

    def terminate_from_thread(self) -> None:
        # The first step of ManagedProcess.terminate; signal_group is safe from any thread.
        self.process.ask_to_end()

    def usage_so_far(self) -> tuple[float | None, int | None] | None:
        return None if self.cgroup is None else self.cgroup.usage()

    def memory_bytes_now(self) -> int | None:
        return None if self.cgroup is None else self.cgroup.memory_now()

    def before_program(self) -> bool:
        if self._before_program is None and self.cgroup is not None:
            self._before_program = self.cgroup.processes() or None
        return self._before_program is not None

    def only_processes_from_before(self) -> bool:
        # Some of those may have exited since (the bootstrap, right after its result). A
        # process the program started could only pass for one of them with that very pid,
        # handed out again only once the kernel's pid counter wrapped around since.
        before = self._before_program
        now = None if before is None or self.cgroup is None else self.cgroup.processes()
        return before is not None and now is not None and now <= before
