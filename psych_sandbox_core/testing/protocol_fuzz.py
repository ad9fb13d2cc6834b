"""Fuzzing the host's side of the protocol: hostile lines for the conversation, and a byte
target for the frame reader and codec. Needs hypothesis (``psych-sandbox-core[test]``).

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

:func:`feed_reader` is the byte-level target (for atheris, and for hypothesis on random
bytes): the bytes, cut into pieces, go through a :class:`~psych_sandbox_core.kit.channel.
FrameChannel` and the codec; only frames, the end, or ProtocolViolation may come out.
"""

from __future__ import annotations

import base64
import json
import sys
import types
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import anyio
import anyio.from_thread
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from .._bindings.bindings import FunctionBindings
from .._bindings.call_server import CallServer
from .._engine.conversation import (
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
from .._engine.program import Program
from .._output.artifact_channel import ChannelCollector, channel_request
from .._output.artifacts import CollectionLimits
from ..errors import ProtocolViolation
from ..grading import Mechanisms
from ..kit.channel import FrameChannel
from ..protocol import PROTOCOL_VERSION, ResultFrame, decode_child_frame, encode_host_frame
from ..protocol.codec import decode_chunk, decode_value_json
from ..protocol.framing import HANDSHAKE_CEILINGS, FrameCeilings, check_length, frame_kind
from ..protocol.limits import MAX_CALL_ID
from ..terms import ExecutionLimits
from .fake_backend import _pipe, honest_report

#: The execution the machine plays: small budgets, so an oversized line is cheap to make.
ARGUMENT_BYTES = 1000
RETURN_VALUE_BYTES = 1000
LIMITS = ExecutionLimits(wall_seconds=5.0, return_value_bytes=RETURN_VALUE_BYTES)
COLLECTION = CollectionLimits(2000, 4000, 4)
TOOLS = ["add", "echo"]

#: What the conversation may keep beyond its size after the handshake and the frames it keeps
#: by design (the hello, the result, collected files and skipped names): its state, grades
#: and one violation's message. Nothing of a call, nor of a refused line.
RETAINED_SLACK = 8 * 1024
#: What the call server keeps per call: its record for the result (name, outcome, sizes).
RETAINED_PER_CALL = 2048

# ---------------------------------------------------------------- hostile JSON


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _wide(count: int) -> str:
    return "[" + ",".join(["0"] * count) + "]"


#: JSON values a hostile child can write: ordinary ones, and ones made to be expensive or
#: out of range (deep, wide, huge or non-finite numbers, lone surrogates, long strings).
hostile_values = st.one_of(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=12,
    ).map(json.dumps),
    st.integers(1, 400).map(_deep),
    st.sampled_from([2**16 - 1, 2**16 + 8, 2**17]).map(_wide),
    st.integers(1, 20_000).map(lambda n: "9" * n),
    st.integers(1, 5_000).map(lambda n: "-1" + "0" * n + ".5e-99999"),
    st.sampled_from(["1e999", "-1e999", "NaN", "Infinity", "-0", "1E400", "0.1e-400"]),
    st.sampled_from(['"\\ud800"', '"\\udfff\\ud800"', '"\\u0000"', '"\\x"', "[1,]", "{", "]"]),
    st.integers(0, 100_000).map(lambda n: json.dumps("é" * n)),
    st.integers(1, 3000).map(lambda n: "{" + ",".join(f'"{i}":{{}}' for i in range(n)) + "}"),
)

#: Call ids: mostly near the ones the host expects (replayed, skipped, reordered), sometimes
#: out of the protocol's range.
call_ids = st.integers(0, 7).flatmap(
    lambda n: (
        st.sampled_from([MAX_CALL_ID, MAX_CALL_ID + 1, -1, 2**64, 2**200])
        if n == 0
        else st.integers(0, 8)
    )
)


def _line(fields: dict[str, Any], raw: dict[str, str] | None = None) -> bytes:
    """A frame line with its type first, as the bootstrap writes it; ``raw`` members are
    spliced in as JSON text as they are (hostile values need not be valid JSON)."""
    text = json.dumps(fields, separators=(",", ":"))
    for name, value in (raw or {}).items():
        text = text[:-1] + ("," if len(text) > 2 else "") + f'"{name}":{value}' + "}"
    return text.encode("utf-8", errors="surrogatepass")


def _hello(protocol: int) -> bytes:
    report = json.loads(honest_report().model_dump_json())
    return _line({"type": "hello", "protocol": protocol, "report": report})


@st.composite
def call_lines(draw: st.DrawFn) -> bytes:
    name = draw(st.sampled_from([*TOOLS, "list_tools", "get_tool_info", "nope", ""]))
    arguments = draw(
        st.one_of(
            st.just('{"a":1,"b":2}'),
            st.just('{"value":"x"}'),
            st.just('{"name":"add"}'),
            hostile_values.map(lambda v: '{"x":' + v + "}"),
            # A tool's own parameters, hostile: what it is given and what it returns.
            hostile_values.map(lambda v: '{"value":' + v + "}"),
            hostile_values.map(lambda v: '{"a":' + v + ',"b":' + v + "}"),
            hostile_values.map(lambda v: '{"name":' + v + "}"),
            hostile_values,
        )
    )
    return _line({"type": "call", "id": draw(call_ids), "name": name}, {"arguments": arguments})


@st.composite
def result_lines(draw: st.DrawFn) -> bytes:
    outcome = draw(st.sampled_from(["returned", "raised", "invalid_output", "output_limit", "x"]))
    value = draw(st.none() | hostile_values)
    error = draw(
        st.none()
        | st.just({"type": "E", "message": "m", "traceback": "t", "line": None, "column": None})
    )
    return _line(
        {"type": "result", "outcome": outcome, "value_json": value, "error": error, "detail": None}
    )


@st.composite
def artifact_lines(draw: st.DrawFn) -> bytes:
    path = draw(
        st.sampled_from(["out/a.txt", "out/b.txt", "out/../x", "/etc/passwd", "out", "a.txt"])
        | st.text(min_size=1, max_size=20).map(lambda t: "out/" + t)
    )
    if draw(st.booleans()):
        return _line(
            {
                "type": "artifact_skipped",
                "path": path,
                "reason": draw(st.sampled_from(["symlink", "too_large", "nope"])),
            }
        )
    data = draw(
        st.binary(max_size=3000).map(lambda b: base64.b64encode(b).decode())
        | st.sampled_from(["", "=", "####", "QUJD", "QUJDRA"])
    )
    offset = draw(st.sampled_from([0, 1, 1000, MAX_CALL_ID, -1]))
    return _line(
        {
            "type": "artifact",
            "path": path,
            "offset": offset,
            "data": data,
            "last": draw(st.booleans()),
        }
    )


def _oversized(kind: str, ceilings: FrameCeilings) -> bytes:
    """A ``kind`` frame one byte longer than its ceiling."""
    head = b'{"type":"' + kind.encode() + b'","pad":"'
    return head + b"a" * (ceilings.of(kind) + 1 - len(head) - 2) + b'"}'


def _mutations(line: bytes) -> st.SearchStrategy[bytes]:
    # Most lines go as they are, so the conversation gets past them to its later states.
    return st.one_of(
        st.just(line),
        st.just(line),
        st.just(line),
        st.just(line),
        st.integers(0, max(0, len(line) - 1)).map(lambda cut: line[:cut]),
        st.just(line.replace(b'{"type":', b'{ "type" :', 1)),
        st.just(line[:-1] + b',"type":"hello"}'),
        st.just(line[:-1] + b',"extra":1}'),
        st.binary(max_size=64).map(lambda junk: line + junk),
    )


#: Any line a hostile child may write, ceilings aside (the machine adds oversized ones).
hostile_lines = (
    st.one_of(
        st.sampled_from([PROTOCOL_VERSION, PROTOCOL_VERSION + 1, 0]).map(_hello),
        call_lines(),
        result_lines(),
        artifact_lines(),
        st.binary(max_size=128).filter(lambda b: b"\n" not in b),
    )
    .flatmap(_mutations)
    .map(lambda line: line.replace(b"\n", b" "))
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
        self._line(
            _line({"type": "artifact", "path": path, "offset": 0, "data": "QUJD", "last": last})
        )

    @rule(
        kind=st.sampled_from(["hello", "call", "result", "artifact", "artifact_skipped"]),
        now=st.integers(0, 3),
    )
    def oversized_line(self, kind: str, now: int) -> None:
        # Final when it comes (a violation): rarely, so the other rules get their turn.
        if now == 0:
            self._line(_oversized(kind, self.ceilings))

    @rule(call_id=call_ids, burst=st.integers(1, 40))
    def honest_calls(self, call_id: int, burst: int) -> None:
        """Calls one after another, each with the id the host expects next, the last of them
        sometimes forged (replayed, skipped ahead, reordered)."""
        for left in range(burst, 0, -1):
            forged = left == 1 and call_id % 3 == 1
            self._line(
                _line(
                    {
                        "type": "call",
                        "id": call_id if forged else self.server.expected_id,
                        "name": "add",
                        "arguments": {"a": left, "b": 2},
                    }
                )
            )

    def honest_hello(self) -> None:
        self._line(_hello(PROTOCOL_VERSION))

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


# ---------------------------------------------------------------- the byte target


def _pieces(data: bytes) -> Iterator[bytes]:
    """``data`` cut where its own bytes say (so a fuzzer explores the reader's splits)."""
    position = 0
    while position < len(data):
        step = 1 + data[position] % 97
        yield data[position : position + step]
        position += step


def feed_reader(data: bytes) -> None:
    """Feed ``data`` (in pieces) through a FrameChannel under the execution's ceilings and
    decode what each frame carries as the host would: only frames, the end, or
    ProtocolViolation may come out. Anything else propagates (a finding)."""
    ceilings = FrameCeilings.for_execution(
        argument_bytes=ARGUMENT_BYTES, return_value_bytes=RETURN_VALUE_BYTES
    )

    async def run() -> None:
        child, host = _pipe()
        channel = FrameChannel(host, ceilings)
        for piece in _pieces(data):
            await child.send(piece)
        await child.send_eof()
        try:
            while (frame := await channel.receive()) is not None:
                if isinstance(frame, ResultFrame) and frame.value_json is not None:
                    decode_value_json(frame.value_json, RETURN_VALUE_BYTES)
                elif frame.type == "artifact":
                    decode_chunk(frame.data)
        except ProtocolViolation:
            pass
        finally:
            await channel.aclose()
            child.close()

    anyio.run(run)
    # The codec alone, on the whole input as one line: the same promise.
    try:
        decode_child_frame(data.replace(b"\n", b" "))
    except ProtocolViolation:
        pass


def interesting_seeds() -> list[bytes]:
    """A corpus to start from: one honest line of each kind, and the worst shapes."""
    return [
        _hello(PROTOCOL_VERSION) + b"\n",
        _line({"type": "call", "id": 0, "name": "add", "arguments": {"a": 1}}) + b"\n",
        _line(
            {
                "type": "result",
                "outcome": "returned",
                "value_json": "[1]",
                "error": None,
                "detail": None,
            }
        )
        + b"\n",
        _line({"type": "artifact", "path": "out/a", "offset": 0, "data": "QUJD", "last": True})
        + b"\n",
        _line({"type": "call", "id": 0, "name": "add"}, {"arguments": '{"x":' + _deep(200) + "}"}),
        _line({"type": "call", "id": 0, "name": "add"}, {"arguments": '{"x":' + "9" * 5000 + "}"}),
    ]
