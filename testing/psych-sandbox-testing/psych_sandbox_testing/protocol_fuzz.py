"""Fuzzing the host's side of the protocol: hostile lines for the conversation. Needs
hypothesis (the ``fuzz`` extra).

:class:`ConversationMachine` is a hypothesis state machine over what the host does with a
child's lines (see driver.py): each line is held to the ceilings in force, decoded by the
codec, given to the :class:`~psych_sandbox_core._engine.conversation.Conversation`, and its actions
are performed as the driver performs them (calls answered by a real
:class:`~psych_sandbox_core._bindings.call_server.CallServer`, values decoded, ceilings narrowed).
Lines are frames of every kind in every state, forged and reordered call ids, truncated and
oversized lines, and hostile JSON (deep, wide, huge numbers). After every step:

* nothing raised but ProtocolViolation, and only on the documented path (the codec or a
  checker refusing a line, which the conversation then records as a violation);
* the state moved as :data:`~psych_sandbox_core._engine.conversation.TRANSITIONS` says, or to the
  violated state, which is final;
* the state the host keeps is bounded: what a call carries, or a refused line, is not kept.

The lines themselves are hostile.py's; the byte-level target is reader_fuzz.py.
"""

from __future__ import annotations

import sys
import types
from contextlib import ExitStack

import anyio
import anyio.from_thread
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from psych_sandbox_core._bindings.bindings import FunctionBindings
from psych_sandbox_core._bindings.call_server import CallServer
from psych_sandbox_core._engine.conversation import (
    TRANSITIONS,
    Action,
    Answer,
    Close,
    Conversation,
    DecodeValue,
    Narrow,
    ProgramTerms,
    Send,
    State,
)
from psych_sandbox_core._engine.program import Program
from psych_sandbox_core._output.artifact_channel import ChannelCollector, channel_request
from psych_sandbox_core.errors import ProtocolViolation
from psych_sandbox_core.grading import Mechanisms
from psych_sandbox_core.protocol import PROTOCOL_VERSION, decode_child_frame, encode_host_frame
from psych_sandbox_core.protocol.codec import decode_value_json
from psych_sandbox_core.protocol.framing import HANDSHAKE_CEILINGS, check_length, frame_kind

from .hostile import (
    ARGUMENT_BYTES,
    COLLECTION,
    LIMITS,
    RETAINED_PER_CALL,
    RETAINED_SLACK,
    TOOLS,
    call_ids,
    frame_line,
    hello_line,
    hostile_lines,
    oversized,
)

# ---------------------------------------------------------------- the state machine


#: What is shared by every execution, not kept for one: classes, code, modules.
_NOT_STATE = (
    type,
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    types.ModuleType,
)


def retained_bytes(root: object) -> int:
    """Roughly what ``root`` keeps alive: the sizes of the objects reachable through its
    attributes and containers (classes, functions and modules not counted)."""
    seen: set[int] = set()
    stack: list[object] = [root]
    total = 0
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(item, _NOT_STATE):
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif hasattr(item, "__dict__"):
            stack.extend(vars(item).values())
        for slot in getattr(type(item), "__slots__", ()):
            if isinstance(slot, str) and hasattr(item, slot):
                stack.append(getattr(item, slot))
    return total


class ConversationMachine(RuleBasedStateMachine):
    """The host's side of one child's conversation, driven by hostile lines (see the module
    docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._exits = ExitStack()
        # The call server's answers are coroutines: one event loop, in a thread, per machine.
        self._portal = self._exits.enter_context(anyio.from_thread.start_blocking_portal())
        self.conversation = Conversation(Mechanisms(), host_uid=0)
        self.server = CallServer(
            FunctionBindings({"add": lambda a, b: a + b, "echo": lambda value: value}), TOOLS
        )
        self.ceilings = HANDSHAKE_CEILINGS
        self.closed = False
        self.started = False
        self.calls = 0
        #: Bytes of accepted frames the host keeps by design, and the conversation's size
        #: before any of them.
        self.kept = 0
        self.baseline = retained_bytes(self.conversation)
        self.log: list[str] = []

    def teardown(self) -> None:
        self._exits.close()

    # ---------------------------------------------------------------- rules

    @initialize(start=st.sampled_from(["nothing", "hello", "run", "collect", "refuse"]))
    def from_a_later_state(self, start: str) -> None:
        """Most runs begin where a hostile child has the most to say: after the handshake."""
        if start == "nothing":
            return
        self.honest_hello()
        if start != "hello":
            self.host_starts(collect=start == "collect", refuse=start == "refuse")

    @rule(line=st.integers(0, 15).flatmap(lambda n: st.none() if n == 0 else hostile_lines))
    def child_line(self, line: bytes | None) -> None:
        """A line, or (rarely) the channel's end."""
        if line is not None:
            self._line(line)
            return
        before = self.conversation.state
        self._perform(self.conversation.receive(None))
        assert self.conversation.state is TRANSITIONS[before]["end"]

    @rule(path=st.sampled_from(["out/a.txt", "out/b.txt", "out/c/d.txt"]), last=st.booleans())
    def honest_artifact(self, path: str, last: bool) -> None:
        fields = {"type": "artifact", "path": path, "offset": 0, "data": "QUJD", "last": last}
        self._line(frame_line(fields))

    @rule(
        kind=st.sampled_from(["hello", "call", "result", "artifact", "artifact_skipped"]),
        now=st.integers(0, 3),
    )
    def oversized_line(self, kind: str, now: int) -> None:
        # Final when it comes (a violation): rarely, so the other rules get their turn.
        if now == 0:
            self._line(oversized(kind, self.ceilings))

    @rule(call_id=call_ids, burst=st.integers(1, 40))
    def honest_calls(self, call_id: int, burst: int) -> None:
        """Calls one after another, each with the id the host expects next, the last of them
        sometimes forged (replayed, skipped ahead, reordered)."""
        for left in range(burst, 0, -1):
            forged = left == 1 and call_id % 3 == 1
            self._line(
                frame_line(
                    {
                        "type": "call",
                        "id": call_id if forged else self.server.expected_id,
                        "name": "add",
                        "arguments": {"a": left, "b": 2},
                    }
                )
            )

    def honest_hello(self) -> None:
        self._line(hello_line(PROTOCOL_VERSION))

    @rule(collect=st.booleans(), refuse=st.booleans())
    def host_starts(self, collect: bool, refuse: bool) -> None:
        """The host gives the graded child its program (or refuses it), once."""
        if self.started or self.conversation.state is not State.GRADED:
            return
        self.started = True
        collector = None
        if collect:
            request = channel_request("out", COLLECTION)
            assert request is not None
            collector = ChannelCollector(request)
        terms = ProgramTerms(
            program=Program(source="1"),
            limits=LIMITS,
            argument_bytes=ARGUMENT_BYTES,
            tools=self.server.offered,
            refusal=None,
            cancelled=refuse,
            collector=collector,
        )
        self._perform(self.conversation.start(terms))
        # What the host gave it (its terms, the collector) is the host's own: measured anew.
        self.baseline, self.kept = retained_bytes(self.conversation), 0

    # ---------------------------------------------------------------- the driver's part

    def _line(self, line: bytes) -> None:
        if self.closed:
            return  # the driver reads nothing more once it closed the channel
        conversation = self.conversation
        before = conversation.state
        try:
            kind = frame_kind(line[:64], complete=True)
            assert kind is not None
            check_length(kind, len(line), self.ceilings)
            frame = decode_child_frame(line, self.ceilings)
        except ProtocolViolation as exc:
            self._perform(conversation.violate(str(exc)))
            assert conversation.state is State.VIOLATED
            return
        self.calls += frame.type == "call"
        self._perform(conversation.receive(frame))
        after = conversation.state
        moved = TRANSITIONS[before].get(frame.type)
        # A result moves on once its value is decoded (done here at once): to done.
        assert after is State.VIOLATED or after is moved, (before, frame.type, after)
        if after is not State.VIOLATED and frame.type != "call":
            self.kept += len(line)

    def _perform(self, actions: list[Action]) -> None:
        conversation = self.conversation
        for action in actions:
            if isinstance(action, Answer):
                try:
                    reply = self._portal.call(self.server.answer, action.call)
                except ProtocolViolation as exc:
                    self._perform(conversation.violate(str(exc)))
                    return
                assert reply.id == action.call.id
                encode_host_frame(reply)
                conversation.sent(reply)
            elif isinstance(action, Send):
                encode_host_frame(action.frame)
                conversation.sent(action.frame)
            elif isinstance(action, Narrow):
                self.ceilings = action.ceilings
            elif isinstance(action, DecodeValue):
                assert action.frame.value_json is not None
                try:
                    value = decode_value_json(action.frame.value_json, action.cap)
                except ProtocolViolation as exc:
                    self._perform(conversation.violate(str(exc)))
                else:
                    self._perform(conversation.value_decoded(value))
            else:
                assert isinstance(action, Close)
                self.closed = True

    # ---------------------------------------------------------------- invariants

    @invariant()
    def a_violation_is_final_and_says_what_happened(self) -> None:
        conversation = self.conversation
        assert (conversation.violation is not None) == (conversation.state is State.VIOLATED)
        assert not (conversation.ran and conversation.refusal is not None)
        if conversation.result is not None:
            assert conversation.state in (State.DONE, State.VIOLATED)
        if conversation.state is State.VIOLATED:
            assert self.closed

    @invariant()
    def what_the_host_keeps_is_bounded(self) -> None:
        conversation = retained_bytes(self.conversation)
        assert conversation <= self.baseline + 2 * self.kept + RETAINED_SLACK, (
            conversation,
            self.baseline,
            self.kept,
        )
        record = retained_bytes(self.server.record)
        assert record <= RETAINED_PER_CALL * (self.calls + 1), (record, self.calls)
