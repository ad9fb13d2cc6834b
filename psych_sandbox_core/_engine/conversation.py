"""The host's conversation with one child, as a state machine with no I/O.

Frames go in (``receive``), decisions come out as actions for a driver to perform (send a
frame, answer or cancel a call, decode a value, narrow the ceilings, close the channel).
Nothing here awaits, owns a socket or reads a clock: the same object is driven by a local
socket, an HTTP stream from a remote backend, or a test feeding it canned frames (see
driver.py for the driver and testing/fake_backend.py for a double of the launch contract).

The states and every move between them are in :data:`TRANSITIONS`; a frame the table does not
allow in the current state ends the conversation as a protocol violation, whatever the
frame's content. Everything the child sends is hostile.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._output.artifact_channel import ChannelCollector
from ..errors import ErrorKind, ProtocolViolation
from ..grading import Grade, Guarantee, Mechanisms, grade, weaker
from ..protocol import (
    PROTOCOL_VERSION,
    AbortFrame,
    ArtifactFrame,
    ArtifactSkippedFrame,
    CallFrame,
    CancelFrame,
    ChildFrame,
    ChildLimits,
    HelloFrame,
    HostFrame,
    ResultFrame,
)
from ..protocol.frames import CatalogueEntry
from ..protocol.framing import FrameCeilings
from ..result import ExecutionFailure
from ..terms import ExecutionLimits
from .program import Program


class State(enum.Enum):
    AWAITING_HELLO = "awaiting hello"
    #: The child reported and was graded; it waits for its program (or a refusal).
    GRADED = "graded"
    #: Answered with abort: nothing ran.
    REFUSED = "refused"
    RUNNING = "running"
    #: The program ended and the child is sending its files; no call may come now.
    COLLECTING_ARTIFACTS = "collecting artifacts"
    #: Over: a result was accepted or the child went away. A collecting run's channel is
    #: still read to its end, and anything on it is a violation.
    DONE = "done"
    VIOLATED = "violated"


#: Inputs that move the conversation: a child frame's type, ``end`` (the channel ended),
#: and the frames the host sends (``sent:run``, ``sent:abort``). ``result`` moves only once
#: its value was checked (see :meth:`Conversation.value_decoded`).
TRANSITIONS: Mapping[State, Mapping[str, State]] = {
    State.AWAITING_HELLO: {"hello": State.GRADED, "end": State.DONE},
    State.GRADED: {"sent:run": State.RUNNING, "sent:abort": State.REFUSED, "end": State.DONE},
    State.REFUSED: {"end": State.REFUSED},
    State.RUNNING: {
        "call": State.RUNNING,
        "cancel": State.RUNNING,
        "sent:reply": State.RUNNING,
        "artifact": State.COLLECTING_ARTIFACTS,
        "artifact_skipped": State.COLLECTING_ARTIFACTS,
        "result": State.DONE,
        "end": State.DONE,
    },
    State.COLLECTING_ARTIFACTS: {
        "artifact": State.COLLECTING_ARTIFACTS,
        "artifact_skipped": State.COLLECTING_ARTIFACTS,
        "result": State.DONE,
        "end": State.DONE,
    },
    State.DONE: {"end": State.DONE},
    State.VIOLATED: {"end": State.VIOLATED},
}

_SENT = {kind: f"sent:{kind}" for kind in ("run", "abort", "reply")}

#: States in which the channel is still read.
LISTENING = frozenset({State.AWAITING_HELLO, State.RUNNING, State.COLLECTING_ARTIFACTS})


@dataclass(frozen=True)
class Send:
    frame: HostFrame


@dataclass(frozen=True)
class Answer:
    """Answer this call through the execution's call server and send the reply."""

    call: CallFrame


@dataclass(frozen=True)
class CancelCall:
    """The program stopped waiting for this call: cancel its tool and answer it as
    cancelled (or let the reply already under way answer it)."""

    frame: CancelFrame


@dataclass(frozen=True)
class DecodeValue:
    """Decode the result's value (off the event loop when large) and hand it back through
    :meth:`Conversation.value_decoded`, or a ProtocolViolation through ``violate``."""

    frame: ResultFrame
    cap: int


@dataclass(frozen=True)
class Narrow:
    """From now on hold each kind of frame to these ceilings while it arrives."""

    ceilings: FrameCeilings


@dataclass(frozen=True)
class Close:
    """Nothing more is read from the channel: close it."""


Action = Send | Answer | CancelCall | DecodeValue | Narrow | Close


@dataclass(frozen=True)
class ProgramTerms:
    """What the conversation needs to know to give the child its program (or refuse it)."""

    #: The caller's program, unchanged since Sandbox.run or exec built it.
    program: Program
    limits: ExecutionLimits
    #: The execution's argument budget per call (the call server's), in bytes.
    argument_bytes: int
    #: Names offered to the program (the call server's).
    tools: list[str]
    #: A refusal the outcome functions found in the terms and the grades as they stand
    #: now (see outcome.refusal_of).
    refusal: ExecutionFailure | None
    #: The execution was cancelled before its program was sent.
    cancelled: bool = False
    collector: ChannelCollector | None = None
    end_marker: str | None = None
    #: What the program's TOOLS says about each (bounded; see catalogue.py).
    catalogue: list[CatalogueEntry] | None = None
    #: How many of the program's calls may be in flight at once (None: the child's default).
    calls_in_flight: int | None = None

    @property
    def refused(self) -> bool:
        """Whether the child is answered with abort instead of its program."""
        return self.refusal is not None or self.cancelled


class Conversation:
    """One child's conversation: states, transitions and the facts the outcome needs."""

    def __init__(self, mechanisms: Mechanisms, *, host_uid: int) -> None:
        self.state = State.AWAITING_HELLO
        #: The current state's row of the table, and whether the channel is still read for
        #: the program's frames: looked up once per change of state, not per frame.
        self._allowed = TRANSITIONS[self.state]
        self.listening = True
        #: What the backend applied; graded against the report when it arrives.
        self.mechanisms = mechanisms
        self._host_uid = host_uid
        #: The uid of the host process beside a child that runs elsewhere (a relay's
        #: service), when the backend knows it: graded against too (see _hello).
        self.far_host_uid: int | None = None
        self.hello: HelloFrame | None = None
        self.grades: dict[Guarantee, Grade] = {}
        #: The program's refusal (not a cancellation's), decided before anything ran.
        self.refusal: ExecutionFailure | None = None
        self.violation: str | None = None
        #: The run frame went out: from here the program may have run.
        self.ran = False
        self.result: ResultFrame | None = None
        #: The value the result frame returns, parsed once when it was checked.
        self.value: Any = None
        self.collector: ChannelCollector | None = None
        self._value_cap = 0
        self._keep_variables = False
        self._pending: ResultFrame | None = None
        #: The run frame carried a command: only its result may say "exited".
        self._command = False

    # ------------------------------------------------------------------ child frames

    def receive(self, frame: ChildFrame | None) -> list[Action]:
        """The child's next frame, or None when the channel ended."""
        if frame is None:
            self._move("end")
            return [Close()]
        kind = frame.type
        if kind not in self._allowed:
            return self._violated(self._unexpected(kind))
        if isinstance(frame, CallFrame):
            return [Answer(frame)]
        if isinstance(frame, CancelFrame):
            return [CancelCall(frame)]
        if isinstance(frame, HelloFrame):
            return self._hello(frame)
        if isinstance(frame, ResultFrame):
            return self._result(frame)
        assert isinstance(frame, (ArtifactFrame, ArtifactSkippedFrame))
        return self._artifact(frame)

    def _move(self, key: str) -> None:
        """Follow the table (the caller has checked that ``key`` is in the current row)."""
        state = self._allowed[key]
        if state is not self.state:
            self._enter(state)

    def _enter(self, state: State) -> None:
        self.state = state
        self._allowed = TRANSITIONS[state]
        self.listening = state in LISTENING

    def _unexpected(self, kind: str) -> str:
        if self.state is State.DONE:
            return f"a frame of type {kind!r} after the result"
        if self.state is State.AWAITING_HELLO:
            return f"expected a hello frame first, got {kind!r}"
        if kind in ("call", "cancel") and self.state is State.COLLECTING_ARTIFACTS:
            return f"a {kind} after the program's files were sent"
        if self.state in (State.RUNNING, State.COLLECTING_ARTIFACTS):
            return f"unexpected {kind!r} frame after the handshake"
        return f"a frame of type {kind!r} in the conversation's {self.state.value} state"

    def _hello(self, hello: HelloFrame) -> list[Action]:
        if hello.protocol != PROTOCOL_VERSION:
            return self._violated(
                f"child speaks protocol {hello.protocol}, host speaks {PROTOCOL_VERSION}"
            )
        grades = grade(self.mechanisms, hello.report, host_uid=self._host_uid)
        far = self.far_host_uid
        if far is not None and far != self._host_uid:
            # The child's uid must be neither host's: the two may share a machine (a service
            # on loopback), so each guarantee keeps the weaker of the two readings.
            there = grade(self.mechanisms, hello.report, host_uid=far)
            grades = {
                guarantee: weaker(held, there[guarantee]) for guarantee, held in grades.items()
            }
        self.grades = grades
        self.hello = hello
        self._move("hello")
        return []

    def _artifact(self, frame: ArtifactFrame | ArtifactSkippedFrame) -> list[Action]:
        if self.collector is None:
            return self._violated(
                f"a frame of type {frame.type!r}, but the host asked for no files"
            )
        try:
            self.collector.receive(frame)
        except ProtocolViolation as exc:
            return self._violated(str(exc))
        self._move(frame.type)
        return []

    def _result(self, frame: ResultFrame) -> list[Action]:
        try:
            if self.collector is not None:
                self.collector.at_result()
        except ProtocolViolation as exc:
            return self._violated(str(exc))
        # Checked again here: the program can write a result frame itself, bypassing the
        # bootstrap's own checks.
        if frame.outcome == "raised" and frame.error is None:
            return self._violated("a result frame with outcome 'raised' carries no error")
        if (frame.outcome == "exited") != (frame.exit_status is not None) or (
            frame.outcome == "exited" and not self._command
        ):
            return self._violated(
                "a result frame's exit status belongs to outcome 'exited', of a command only"
            )
        if self._command and frame.outcome not in ("exited", "raised"):
            # A bootstrap that does not know command mode ran the empty source instead.
            return self._violated(f"a command's result has outcome {frame.outcome!r}")
        if frame.variables_json is not None and not (
            self._keep_variables and frame.outcome == "returned"
        ):
            return self._violated("a result frame carries variables the run frame did not ask for")
        if frame.outcome != "returned" or frame.value_json is None:
            return self.value_decoded(None, frame)
        self._pending = frame
        return [DecodeValue(frame, self._value_cap)]

    def value_decoded(self, value: Any, frame: ResultFrame | None = None) -> list[Action]:
        """The result's value was checked: the result is accepted."""
        frame = frame if frame is not None else self._pending
        assert frame is not None and self.state in (State.RUNNING, State.COLLECTING_ARTIFACTS)
        self._pending = None
        self.result, self.value = frame, value
        self._move("result")
        # A collecting run's channel is read to its end once every process is gone (the
        # driver holds it until then): files sent after the result are not taken.
        return [] if self.collector is not None else [Close()]

    def violate(self, message: str) -> list[Action]:
        """The child broke the protocol (a frame the table does not allow, or one the codec
        or a checker refused). The first violation is the one reported."""
        if self.state is State.DONE:
            message = f"after the result: {message}"
        return self._violated(message)

    def _violated(self, message: str) -> list[Action]:
        self.violation = self.violation or message
        # Reachable from every state, like an error state: not a row of the table.
        self._enter(State.VIOLATED)
        return [Close()]

    # ------------------------------------------------------------------ the host's side

    def start(self, terms: ProgramTerms) -> list[Action]:
        """Give the graded child its program, or refuse it."""
        assert self.state is State.GRADED, self.state
        if terms.refused:
            refusal = terms.refusal or ExecutionFailure.of(
                ErrorKind.CANCELLED, "cancelled before the program ran"
            )
            if not terms.cancelled:
                self.refusal = refusal
            return [Send(AbortFrame(reason=refusal.message)), Close()]
        self.collector = terms.collector
        self._command = terms.program.command is not None
        limits = terms.limits
        self._value_cap = limits.return_value_bytes
        self._keep_variables = terms.program.keep_variables
        return [
            # From here on each kind of frame is held to what these terms allow it to weigh.
            Narrow(
                FrameCeilings.for_execution(
                    argument_bytes=terms.argument_bytes,
                    return_value_bytes=limits.return_value_bytes,
                )
            ),
            Send(
                terms.program.run_frame(
                    tools=terms.tools,
                    catalogue=terms.catalogue,
                    limits=ChildLimits(
                        cpu_seconds=limits.cpu_seconds,
                        memory_bytes=limits.memory_bytes,
                        file_size_bytes=limits.file_size_bytes,
                        processes=limits.processes,
                        return_value_bytes=limits.return_value_bytes,
                        argument_bytes=terms.argument_bytes,
                        calls_in_flight=terms.calls_in_flight,
                    ),
                    artifacts=None if terms.collector is None else terms.collector.request,
                    end_marker=terms.end_marker,
                )
            ),
        ]

    def sent(self, frame: HostFrame) -> None:
        """A frame of ours went out (the run frame only now counts as given)."""
        key = _SENT[frame.type]
        if key not in self._allowed:
            if self.state is State.VIOLATED or (key == "sent:reply" and self.ran):
                # A reply whose writing began while the program ran and ended after its
                # end (its files or result read meanwhile) or a violation.
                return
            raise AssertionError(f"host sent {frame.type!r} in the {self.state.value} state")
        self._move(key)
        if key == "sent:run":
            self.ran = True

    def reported_connections(self) -> int:
        """Loopback connections the child's own probe says it made."""
        if self.hello is None:
            return 0
        network = self.hello.report.network
        return [network.ipv4, network.ipv6].count("connected")

    def tree_not_seen_ended(self) -> None:
        """The host could not see the process tree end at teardown (a pid namespace not
        found empty in time): the execution did not have that guarantee."""
        if self.grades.get(Guarantee.PROCESS_TREE) is Grade.ENFORCED:
            self.grades[Guarantee.PROCESS_TREE] = Grade.UNVERIFIED

    def network_reached(self) -> None:
        """Host-side evidence (a listener saw a connection) outranks anything the child said
        about itself."""
        if self.grades:
            self.grades[Guarantee.NETWORK] = Grade.UNAVAILABLE
