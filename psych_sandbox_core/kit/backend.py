"""The interface every backend implements (see docs/writing-a-backend.md).

A backend knows how to start the bootstrap somewhere contained and how to tear it down.
It does not grade itself and never states a level: it reports the :class:`Mechanisms` it
applied, the child reports what it observes, and the core grades both.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, get_args, get_origin

from anyio.abc import ByteReceiveStream
from pydantic import BaseModel, ConfigDict
from typing_extensions import TypeVar

from ..grading import Level, Mechanisms
from ..terms import ExecutionLimits
from .channel import ChannelListener
from .exit_status import ExitStatus


class BackendUnavailable(Exception):
    """Raised by a backend's launch when it cannot start a child here. Not a program error:
    the execution fails with backend_not_ready."""


class BackendOptions(BaseModel):
    """Base for a backend's own settings: strict, unknown keys rejected."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


@dataclass(frozen=True)
class ProbeTargets:
    """What the child probes before the program runs: a canary file the host wrote outside
    the workspace, and loopback listeners the host opened for this execution."""

    canary_path: str | None
    port4: int | None
    port6: int | None
    host_pid: int

    def as_json_object(self) -> dict[str, object]:
        return {
            "canary": self.canary_path,
            "port4": self.port4,
            "port6": self.port6,
            "host_pid": self.host_pid,
        }


@dataclass(frozen=True)
class LaunchRequest:
    """Everything a backend needs to start one execution's child."""

    bootstrap_source: str
    #: Makes the probe's targets the first time it is called, the same ones after (see
    #: :attr:`probe`).
    targets: Callable[[], ProbeTargets]
    limits: ExecutionLimits
    #: The child's whole environment (an allow-list; backends add nothing secret).
    environment: dict[str, str] = field(default_factory=dict)
    #: To be told the uid, on this host, that the child runs as where it has one of its own
    #: (a leased or configured identity): only sockets of that uid then count as the child's
    #: when they reach the probe's listeners (a process of another uid, such as another
    #: execution's program scanning the host's ports, is not this execution's evidence).
    runs_as: Callable[[int], None] = lambda uid: None

    @property
    def probe(self) -> ProbeTargets:
        """The probe's targets, made by the host when first asked for: a backend that hands
        them to its child after spawning it (late_terms.py) asks only then, and the host
        makes them while the child's interpreter starts."""
        return self.targets()

    def bootstrap_command(
        self, interpreter: str | None = None, passed_fds: list[int] | None = None
    ) -> list[str]:
        """Interpreter arguments that run the bootstrap (``-c`` and what follows).

        Pass the interpreter when the host can run the same binary the child will: the
        bootstrap is then compiled once for it instead of at every start. Pass
        ``passed_fds`` when the child is given descriptors: the compiled code may then come
        in one, added to the list (close it once the child is spawned).
        """
        from ..child.loader import bootstrap_arguments

        return bootstrap_arguments(interpreter, self.bootstrap_source, passed_fds)


class Launched(ABC):
    """A started child: its streams, its channel and its teardown. What a launch may offer
    besides (usage while it runs, its processes noted, a relayed child's evidence) is a small
    protocol of its own (capabilities.py), implemented only where the mechanism gives it."""

    mechanisms: Mechanisms
    stdout: ByteReceiveStream
    stderr: ByteReceiveStream
    channel: ChannelListener
    #: The child's workspace as a path on the host, readable after the child ended and until
    #: the launch context exits, so the core can collect artifacts. None means this backend
    #: cannot hand back artifacts (its workspace is not reachable from the host).
    workspace_path: str | None = None
    #: Whether a warm execution may hand its result back once the program's output and
    #: result are complete, finishing this launch's teardown afterwards (see pool.py). Only
    #: for a backend whose output streams carry exactly what the child wrote, in order.
    early_result_ok: bool = False
    #: What to call once the result is handed back ahead of the teardown (see handed_back).
    _on_handed_back: tuple[Callable[[], None], ...] = ()

    def when_handed_back(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once this execution's result is handed back ahead of its
        teardown (a leased identity then knows it is on its way back)."""
        self._on_handed_back = (*self._on_handed_back, callback)

    def handed_back(self) -> None:
        """The execution's result is being handed back ahead of the teardown: only the
        teardown remains (called by the core, before the caller can go on)."""
        for callback in self._on_handed_back:
            callback()

    @abstractmethod
    async def wait_exited(self) -> None:
        """Return when the child has exited (not yet reaped)."""

    @abstractmethod
    async def terminate(self, grace_seconds: float) -> None:
        """SIGTERM (or the platform's equivalent) to the whole tree, grace, then kill."""

    def terminate_from_thread(self) -> None:
        """The first step of :meth:`terminate` (the signal that starts the grace window, or
        the kill where there is none), struck at the wall clock's deadline from a thread of
        the host's own so that a busy event loop does not delay it (wall_clock.py);
        :meth:`terminate` follows at the loop's turn. Called from another thread, at any
        time, even during or after teardown: it must be thread-safe, quick, never raise,
        and never signal a process that is no longer the child's (a reaped pid may be
        reused). Does nothing where the backend has no such step (then the loop's turn
        starts the termination)."""
        return None

    @abstractmethod
    async def finish(self) -> ExitStatus:
        """Kill whatever is left of the tree, reap, and return how the child ended.
        Idempotent; must be safe to call after any failure."""


@dataclass(frozen=True)
class Availability:
    available: bool
    #: Why not, for a person reading `psych-sandbox doctor`.
    reason: str | None = None
    #: The level a trial execution reached here (from its grades), when one ran.
    level: Level | None = None
    grades: dict[str, str] = field(default_factory=dict)


#: A backend's own settings model, as ``self.options`` is typed. Covariant: a backend is read
#: as a backend of any base of its options (the core knows only ``BackendOptions``).
OptionsT = TypeVar("OptionsT", bound=BackendOptions, default=BackendOptions, covariant=True)


class Backend(ABC, Generic[OptionsT]):
    """A way of running the bootstrap contained. Register subclasses through the
    ``psych_sandbox_register_backends`` hook.

    A subclass states what is its own as class keywords, and its settings model as the type
    argument, which also types ``self.options``::

        class MyBackend(Backend[MyOptions], id="mine", claims=Level.PROCESS): ...

    A subclass of a concrete backend that narrows its settings passes ``options=`` (a
    subclass of the model it inherits). The keywords set the class attributes below, which
    are what the core reads (a subclass may also assign them in its body).
    """

    #: Identifier used in configuration and as the entry-point name.
    id: ClassVar[str]
    #: The backend's own strict settings model.
    Options: ClassVar[type[BackendOptions]] = BackendOptions
    #: The level this backend aims for on a host where it works; a report weaker than this
    #: gets the output withheld.
    claims: ClassVar[Level]
    #: Whether a child of this backend runs commands (command mode, Sandbox.exec) as well as
    #: programs: true of every backend whose child runs the bootstrap where a process can
    #: start another. A profile whose backend does not gets a refusal as data.
    runs_commands: ClassVar[bool] = False
    #: Whether a long-lived Sandbox keeps children of this backend prepared when the profile
    #: does not say (``warm`` unset; pool.py). False for a backend whose prepared child holds
    #: a resource others share, such as a remote service's execution slot.
    prepared_by_default: ClassVar[bool] = True

    def __init_subclass__(
        cls,
        *,
        id: str | None = None,
        options: type[BackendOptions] | None = None,
        claims: Level | None = None,
        runs_commands: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        options = options or _options_argument(cls)
        if options is not None:
            if not issubclass(options, cls.Options):
                # self.options is typed as the inherited model: a narrower one only.
                raise TypeError(
                    f"{cls.__name__}: options {options.__name__} is not a subclass of "
                    f"{cls.Options.__name__}, the settings model it inherits"
                )
            cls.Options = options
        if id is not None:
            cls.id = id
        if claims is not None:
            cls.claims = claims
        if runs_commands is not None:
            cls.runs_commands = runs_commands

    def __init__(self, options: OptionsT) -> None:
        #: The validated settings (an instance of ``Options``).
        self.options: OptionsT = options

    def workspace_bytes(self) -> int | None:
        """The workspace's size cap when this backend enforces one (its ``workspace_bytes``
        option): files given to a run (inputs=) must fit in it. None: no cap known here."""
        value = getattr(self.options, "workspace_bytes", None)
        return value if isinstance(value, int) else None

    @abstractmethod
    def unavailable_reason(self) -> str | None:
        """A quick, side-effect-free reason this backend cannot work here, or None.
        The real answer comes from a trial execution (see registry.select)."""

    @abstractmethod
    def launch(self, request: LaunchRequest) -> AbstractAsyncContextManager[Launched]:
        """Start the child. Leaving the context tears everything down: no process, fd,
        temporary directory or mount survives it, whatever happened inside."""


def _options_argument(cls: type[Backend[Any]]) -> type[BackendOptions] | None:
    """The settings model ``cls`` names as its type argument (``Backend[MyOptions]``, or a
    generic backend base's), if it names one itself."""
    for base in cls.__dict__.get("__orig_bases__", ()):
        origin = get_origin(base)
        if isinstance(origin, type) and issubclass(origin, Backend):
            for argument in get_args(base):
                if isinstance(argument, type) and issubclass(argument, BackendOptions):
                    return argument
    return None
