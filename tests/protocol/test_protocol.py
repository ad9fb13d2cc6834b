"""The wire protocol without processes: frames round-trip, hostile bytes only ever raise
ProtocolViolation, every limit has its countermeasure, and the bootstrap agrees with the host."""

from __future__ import annotations

import json
import socket
from typing import Any
from unittest import mock

import anyio
import pytest
from anyio.abc import SocketStream
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter
from pydantic_core import from_json

from psych_sandbox_core._bindings.bindings import FunctionBindings
from psych_sandbox_core._bindings.call_server import CallServer
from psych_sandbox_core.budgets import MAX_ARGUMENT_BYTES_PER_CALL
from psych_sandbox_core.child.loader import bootstrap_module
from psych_sandbox_core.errors import ProtocolViolation
from psych_sandbox_core.kit.channel import FrameChannel
from psych_sandbox_core.protocol import (
    AbortFrame,
    CallFrame,
    ChildFrame,
    ChildLimits,
    ContainmentReport,
    HelloFrame,
    NetworkObservation,
    ProgramError,
    ReplyFrame,
    ResultFrame,
    RLimitObservation,
    RunFrame,
    decode_child_frame,
    decode_host_frame,
    encode_host_frame,
    shape,
)
from psych_sandbox_core.protocol import limits as protocol_limits
from psych_sandbox_core.protocol.codec import FRAME_SHAPE, decode_value_json
from psych_sandbox_core.protocol.framing import (
    CHANNEL_CEILINGS,
    HANDSHAKE_CEILINGS,
    FrameCeilings,
    frame_kind,
)
from psych_sandbox_core.protocol.limits import (
    MAX_CALL_ID,
    MAX_CHILD_FRAME_BYTES,
    MAX_HELLO_FRAME_BYTES,
)
from psych_sandbox_core.protocol.shape import SCAN_CHUNK_BYTES, check_shape

#: The child's functions and constants, from the source the child runs.
bootstrap = bootstrap_module()

# ---------------------------------------------------------------- strategies

text = st.text(max_size=40)
small_int = st.integers(min_value=-1, max_value=2**40)
json_scalar = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
tool_name = st.text(min_size=1, max_size=40)
call_id = st.integers(min_value=0, max_value=MAX_CALL_ID)
outcome = st.sampled_from(["connected", "refused", "unreachable", "skipped"])

reports = st.builds(
    ContainmentReport,
    uid=small_int,
    euid=small_int,
    gid=small_int,
    pid=small_int,
    canary_readable=st.none() | st.booleans(),
    network=st.builds(
        NetworkObservation,
        ipv4=outcome,
        ipv6=outcome,
        interfaces_up=st.lists(st.text(max_size=16), max_size=4),
    ),
    limits=st.lists(
        st.builds(RLimitObservation, name=st.text(max_size=8), soft=small_int, hard=small_int),
        max_size=6,
    ),
    capabilities=st.none() | st.text(max_size=16),
    sees_foreign_processes=st.none() | st.booleans(),
    python=text,
    platform=text,
)
program_errors = st.builds(
    ProgramError,
    type=text,
    message=text,
    traceback=text,
    line=st.none() | st.integers(min_value=0, max_value=10**6),
    column=st.none() | st.integers(min_value=0, max_value=10**6),
)
child_frames = st.one_of(
    st.builds(HelloFrame, type=st.just("hello"), protocol=st.integers(0, 10), report=reports),
    st.builds(
        CallFrame,
        type=st.just("call"),
        id=call_id,
        name=tool_name,
        arguments=st.dictionaries(text, json_value, max_size=4),
    ),
    st.builds(
        ResultFrame,
        type=st.just("result"),
        outcome=st.sampled_from(["returned", "raised", "invalid_output", "output_limit"]),
        value_json=st.none() | json_value.map(json.dumps),
        error=st.none() | program_errors,
        detail=st.none() | text,
    ),
)
optional_positive = st.none() | st.integers(min_value=1, max_value=2**40)
host_frames = st.one_of(
    st.builds(
        RunFrame,
        source=st.text(max_size=200),
        tools=st.lists(tool_name, max_size=8),
        limits=st.builds(
            ChildLimits,
            cpu_seconds=optional_positive,
            memory_bytes=optional_positive,
            file_size_bytes=optional_positive,
            processes=optional_positive,
            return_value_bytes=st.integers(min_value=1, max_value=2**20),
        ),
    ),
    st.builds(AbortFrame, reason=text),
    st.builds(
        ReplyFrame,
        id=call_id,
        carries=st.sampled_from(["value", "handle", "error"]),
        value_json=st.none() | json_value.map(json.dumps),
        handle=st.none() | st.dictionaries(text, json_value, max_size=3),
        error_kind=st.none() | text,
        message=st.none() | text,
    ),
)


# ---------------------------------------------------------------- round trips


@given(child_frames)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_every_child_frame_round_trips(frame: Any) -> None:
    line = frame.model_dump_json().encode()
    assert decode_child_frame(line) == frame


@given(host_frames)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_every_host_frame_round_trips(frame: Any) -> None:
    line = encode_host_frame(frame)
    assert line.endswith(b"\n") and line.count(b"\n") == 1, "a host frame is one line"
    assert decode_host_frame(line[:-1]) == frame


@given(host_frames)
def test_host_frames_are_what_the_bootstrap_reads(frame: Any) -> None:
    # The bootstrap parses with the stdlib json module; what it sees must be the same data.
    decoded = json.loads(encode_host_frame(frame))
    assert decoded == json.loads(frame.model_dump_json())
    assert decoded["type"] in ("run", "abort", "reply")


# ---------------------------------------------------------------- hostile bytes


def _decodes_or_violates(data: bytes) -> None:
    try:
        decode_child_frame(data)
    except ProtocolViolation:
        pass


@given(st.binary(max_size=2048))
@settings(max_examples=500)
def test_arbitrary_bytes_raise_only_protocol_violation(data: bytes) -> None:
    _decodes_or_violates(data)


frame_like = st.dictionaries(
    st.sampled_from(
        [
            "type",
            "id",
            "name",
            "arguments",
            "protocol",
            "report",
            "outcome",
            "value_json",
            "error",
            "detail",
            "carries",
            "source",
            "extra",
        ]
    ),
    json_value | st.sampled_from(["hello", "call", "result", "reply", "run"]),
    max_size=6,
)


# Fewer here: the fuzzing state machine (test_fuzz.py) sends frame-shaped hostile lines in
# every state of the conversation.
@given(frame_like)
@settings(max_examples=150)
def test_arbitrary_frame_shaped_json_raises_only_protocol_violation(obj: dict[str, Any]) -> None:
    _decodes_or_violates(json.dumps(obj).encode())


@given(child_frames, st.data())
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_mutated_valid_frames_raise_only_protocol_violation(
    frame: Any, data: st.DataObject
) -> None:
    obj = json.loads(frame.model_dump_json())
    key = data.draw(st.sampled_from(sorted(obj)))
    mutation = data.draw(st.sampled_from(["drop", "replace", "extra"]))
    if mutation == "drop":
        del obj[key]
    elif mutation == "replace":
        obj[key] = data.draw(json_value)
    else:
        obj[data.draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in obj))] = 1
    _decodes_or_violates(json.dumps(obj).encode())


VALID_CALL = {"type": "call", "id": 0, "name": "search", "arguments": {"q": "x"}}


def _call(**changes: Any) -> bytes:
    obj = {**VALID_CALL, **changes}
    return json.dumps(obj).encode()


def _raw_call(call_id: str) -> bytes:
    return b'{"type":"call","id":%s,"name":"a","arguments":{}}' % call_id.encode()


@pytest.mark.parametrize(
    ("line", "names"),
    [
        pytest.param(_call(evil=1), "evil", id="junk-field"),
        pytest.param(json.dumps({"type": "call", "id": 0}).encode(), "name", id="missing-field"),
        pytest.param(_raw_call("NaN"), "column", id="nan-id"),
        pytest.param(_raw_call("Infinity"), "column", id="inf-id"),
        pytest.param(_raw_call("1e999"), "non-finite", id="huge-float"),
        pytest.param(_call(id=0.0), "id", id="float-id"),
        pytest.param(_call(id=-1), "id", id="negative-id"),
        pytest.param(_call(id=True), "id", id="bool-id"),
        pytest.param(_call(id="0"), "id", id="string-id"),
        pytest.param(_call(id=MAX_CALL_ID + 1), "id", id="id-beyond-exact-json"),
        pytest.param(_call(name=""), "name", id="empty-tool-name"),
        pytest.param(_call(arguments=[1]), "arguments", id="arguments-not-object"),
        pytest.param(_call(type="reply"), "", id="reply-from-child"),
        pytest.param(_call(type="run"), "", id="run-from-child"),
        pytest.param(b"[1,2]", "", id="not-an-object"),
        pytest.param(b"", "", id="empty-line"),
        pytest.param(b"\xff\xfe\x00garbage", "", id="binary"),
        pytest.param(b"[" * 100_000, "", id="deeply-nested"),
        pytest.param(b'{"type":"call","id":0,"id":1,"name":"a","arguments":{}}', "", id="dup-key"),
    ],
)
def test_malformed_child_frames_are_refused_with_a_reason(line: bytes, names: str) -> None:
    try:
        frame = decode_child_frame(line)
    except ProtocolViolation as exc:
        assert names in str(exc)
    else:
        # A duplicate key is the only one JSON lets through; the frame must then be the
        # strict model of what was parsed, never carrying more than the model's fields.
        assert line.count(b'"id"') == 2, f"accepted {line!r} as {frame!r}"
        assert isinstance(frame, CallFrame) and set(frame.model_fields_set) <= set(VALID_CALL)


def test_nonfinite_numbers_are_refused_anywhere_in_a_frame() -> None:
    bad = b'{"type":"call","id":0,"name":"a","arguments":{"x":NaN}}'
    with pytest.raises(ProtocolViolation):
        decode_child_frame(bad)


@pytest.mark.parametrize("padding", [0, 1, 2, 65_000, 65_480, 65_485, 131_000])
def test_an_infinite_literal_is_refused_wherever_it_sits_in_a_long_frame(padding: int) -> None:
    # The host looks for float literals a slice of the line at a time; one split across two
    # slices (a digit ending one, its exponent starting the next) is found all the same.
    head = b'{"type":"call","id":0,"name":"a","arguments":{"p":"' + b"x" * padding + b'","x":'
    for literal in (b"1e999", b"-9E400", b"1" + b"0" * 400 + b".5"):
        for shift in range(len(literal)):
            line = head + b" " * shift + literal + b"}}"
            with pytest.raises(ProtocolViolation, match="non-finite"):
                decode_child_frame(line)
    # A long frame whose strings hold digit-and-mark pairs but no float is accepted.
    fine = head + b'"1e5 and 2.5 in text"}}'
    assert isinstance(decode_child_frame(fine), CallFrame)


@pytest.mark.parametrize("padding", [0, 1, 65_000, 65_530, 131_000])
def test_nan_and_infinity_are_refused_wherever_they_sit_in_a_long_frame(padding: int) -> None:
    # Lines with no mark of a float are parsed and validated in one pass, which would take
    # these literals: the marks looked for include the first two letters of each.
    head = b'{"type":"call","id":0,"name":"a","arguments":{"p":"' + b"x" * padding + b'","x":'
    for literal in (b"NaN", b"Infinity", b"-Infinity"):
        for shift in range(4):
            line = head + b" " * shift + b"[" + literal + b"]}}"
            with pytest.raises(ProtocolViolation, match="malformed"):
                decode_child_frame(line)


_CHILD_FRAME_ADAPTER: TypeAdapter[Any] = TypeAdapter(ChildFrame)


def _parsed_then_validated(line: bytes) -> Any:
    """The frame the slower decoding (parse, walk, validate) makes of ``line``, or None."""
    try:
        parsed = from_json(line, allow_inf_nan=False, cache_strings=False)
        stack = [parsed]
        while stack:
            item = stack.pop()
            assert not isinstance(item, float) or item - item == 0, "non-finite"
            stack.extend(item.values() if isinstance(item, dict) else [])
            stack.extend(item if isinstance(item, list) else [])
        return _CHILD_FRAME_ADAPTER.validate_python(parsed, strict=True)
    except (ValueError, AssertionError):
        return None


@given(child_frames, st.data())
@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
def test_one_pass_decoding_agrees_with_parsing_then_validating(
    frame: Any, data: st.DataObject
) -> None:
    obj = json.loads(frame.model_dump_json())
    if data.draw(st.booleans()):
        obj[data.draw(st.sampled_from(sorted(obj)))] = data.draw(json_value)
    line = json.dumps(obj, separators=(",", ":")).encode()
    expected = _parsed_then_validated(line)
    try:
        decoded = decode_child_frame(line)
    except ProtocolViolation:
        assert expected is None
    else:
        assert decoded == expected


def test_codec_refuses_an_oversized_line_before_parsing() -> None:
    line = b'{"type":"call","id":0,"name":"a","arguments":{"x":"' + b"a" * MAX_CHILD_FRAME_BYTES
    with pytest.raises(ProtocolViolation, match="ceiling"):
        decode_child_frame(line + b'"}}')


def test_text_fields_are_bounded() -> None:
    error = {
        "type": "E",
        "message": "m" * (protocol_limits.MAX_TEXT_CHARS + 1),
        "traceback": "",
        "line": None,
        "column": None,
    }
    frame = {
        "type": "result",
        "outcome": "raised",
        "value_json": None,
        "error": error,
        "detail": None,
    }
    with pytest.raises(ProtocolViolation, match="message"):
        decode_child_frame(json.dumps(frame).encode())


def test_too_many_tools_cannot_be_sent() -> None:
    limits = ChildLimits(
        cpu_seconds=1, memory_bytes=None, file_size_bytes=None, processes=None, return_value_bytes=1
    )
    RunFrame(source="", tools=["t"] * protocol_limits.MAX_TOOLS, limits=limits)
    with pytest.raises(ValueError, match="tools"):
        RunFrame(source="", tools=["t"] * (protocol_limits.MAX_TOOLS + 1), limits=limits)


def test_largest_return_value_cap_fits_one_frame_even_fully_escaped() -> None:
    cap = protocol_limits.max_return_value_bytes()
    # The worst case: every byte of the value escapes to six bytes inside value_json.
    value_json = json.dumps("\x01" * (cap // 6))
    assert len(value_json.encode()) <= cap
    frame = ResultFrame(
        type="result", outcome="returned", value_json=value_json, error=None, detail=None
    )
    line = frame.model_dump_json().encode() + b"\n"
    assert len(line) <= MAX_CHILD_FRAME_BYTES
    assert decode_child_frame(line[:-1]) == frame


# ---------------------------------------------------------------- bounded reading


async def _flood(head: bytes, channel: FrameChannel, child_sock: socket.socket) -> tuple[str, int]:
    """Write ``head`` then endless bytes until the reader gives up; what it said, and how
    much was written."""
    child_sock.setblocking(False)
    chunk = b"a" * (1024 * 1024)
    sent = 0
    message = ""

    async def flood() -> None:
        nonlocal sent
        await anyio.wait_writable(child_sock)
        child_sock.sendall(head)
        # Keep writing past the ceiling until the host hangs up on us.
        while sent < 4 * MAX_CHILD_FRAME_BYTES:
            await anyio.wait_writable(child_sock)
            try:
                sent += child_sock.send(chunk)
            except (BrokenPipeError, ConnectionResetError):
                return

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(flood)
            with pytest.raises(ProtocolViolation) as raised:
                await channel.receive()
            message = str(raised.value)
            await channel.aclose()
    finally:
        child_sock.close()
    return message, sent


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("ceilings", "expected"),
    [
        (HANDSHAKE_CEILINGS, f"longer than its ceiling of {MAX_HELLO_FRAME_BYTES}"),
        (CHANNEL_CEILINGS, f"ceiling of {MAX_CHILD_FRAME_BYTES}"),
    ],
    ids=["kind-ceiling", "channel-ceiling"],
)
async def test_frame_channel_cuts_off_a_line_that_never_ends(
    ceilings: FrameCeilings, expected: str
) -> None:
    host_sock, child_sock = socket.socketpair()
    channel = FrameChannel(await SocketStream.from_socket(host_sock), ceilings)
    message, sent = await _flood(b'{"type":"hello","protocol":1,"x":"', channel, child_sock)
    assert expected in message
    # The reader stopped near the ceiling: what the flood pushed beyond it sits at most in
    # the socket buffers, not in the host.
    assert sent < 4 * MAX_CHILD_FRAME_BYTES


@pytest.mark.anyio
async def test_frame_channel_refuses_a_line_without_a_type_within_its_head() -> None:
    host_sock, child_sock = socket.socketpair()
    channel = FrameChannel(await SocketStream.from_socket(host_sock))
    message, sent = await _flood(b"", channel, child_sock)
    assert "must begin with its type" in message
    assert sent < 4 * MAX_CHILD_FRAME_BYTES


@pytest.mark.anyio
async def test_frame_channel_end_of_stream_and_torn_frame() -> None:
    host_sock, child_sock = socket.socketpair()
    channel = FrameChannel(await SocketStream.from_socket(host_sock))
    child_sock.sendall(_call() + b"\n" + b'{"type":"ca')
    child_sock.close()
    frame = await channel.receive()
    assert isinstance(frame, CallFrame) and frame.id == 0
    with pytest.raises(ProtocolViolation, match="middle of a frame"):
        await channel.receive()
    await channel.aclose()

    host_sock, child_sock = socket.socketpair()
    channel = FrameChannel(await SocketStream.from_socket(host_sock))
    child_sock.close()
    assert await channel.receive() is None
    await channel.aclose()


@pytest.mark.anyio
async def test_closing_the_channel_wakes_a_frame_waiting_for_room() -> None:
    # A program that never reads its replies fills the socket; when the conversation ends
    # (its violation), the reply being written must give up, not wait for the wall clock.
    host_sock, child_sock = socket.socketpair()
    channel = FrameChannel(host_sock)
    reply = ReplyFrame(id=0, carries="value", value_json='"' + "x" * (4 * 1024 * 1024) + '"')
    ended: list[type[BaseException]] = []

    async def write() -> None:
        try:
            await channel.send(reply)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            ended.append(type(exc))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(write)
        await anyio.wait_all_tasks_blocked()
        await channel.aclose()
    child_sock.close()
    assert ended == [anyio.ClosedResourceError]


# ---------------------------------------------------------------- shape before parsing

#: Strings that look like structure, or escape: the pre-scan must see through them.
tricky_text = st.text(alphabet='[]{},:"\\ab\u00e9\U0001f600\n', max_size=12)
shape_value = st.recursive(
    json_scalar | tricky_text,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(tricky_text, inner, max_size=5),
    max_leaves=40,
)
encodings = st.fixed_dictionaries(
    {
        "ensure_ascii": st.booleans(),
        "indent": st.none() | st.integers(0, 2),
        "separators": st.sampled_from([(",", ":"), (", ", ": "), (" ,\t", "\r: ")]),
    }
)


def reference_shape(value: Any) -> tuple[int, int]:
    """Depth and elements computed from the parsed value, as shape.py defines them."""
    if isinstance(value, (list, dict)):
        members = list(value.values()) if isinstance(value, dict) else value
        inner = [reference_shape(member) for member in members]
        depth = 1 + max((d for d, _ in inner), default=0)
        # "[" or "{", a "," between members, and a ":" in each object member.
        own = 1 + max(len(members) - 1, 0) + (len(members) if isinstance(value, dict) else 0)
        return depth, own + sum(e for _, e in inner)
    return 0, 0


@pytest.mark.parametrize("step", [3, 7, SCAN_CHUNK_BYTES], ids=lambda n: f"step={n}")
@given(value=shape_value, encoding=encodings)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_the_prescan_agrees_with_json_on_valid_text(
    step: int, value: Any, encoding: dict[str, Any]
) -> None:
    data = json.dumps(value, **encoding).encode()
    depth, elements = reference_shape(json.loads(data))
    # Small steps put step boundaries inside strings, escapes and runs of backslashes.
    with mock.patch.object(shape, "SCAN_CHUNK_BYTES", step):
        assert shape.measure(data) == shape.Shape(depth, elements)
        shape.check_shape(data, shape.ShapeLimits(depth, elements, "D", "E"), "it")
        if depth:
            with pytest.raises(ProtocolViolation, match=r"deeper than .* \(D spent\)"):
                shape.check_shape(data, shape.ShapeLimits(depth - 1, elements, "D", "E"), "it")
        if elements:
            with pytest.raises(ProtocolViolation, match=r"more than .* \(E spent\)"):
                shape.check_shape(data, shape.ShapeLimits(depth, elements - 1, "D", "E"), "it")


@pytest.mark.parametrize("step", [2, 5, SCAN_CHUNK_BYTES], ids=lambda n: f"step={n}")
@given(data=st.binary(max_size=512) | st.text('[]{},:"\\ a1').map(str.encode))
@settings(max_examples=300)
def test_the_prescan_never_fails_on_arbitrary_bytes(step: int, data: bytes) -> None:
    with mock.patch.object(shape, "SCAN_CHUNK_BYTES", step):
        measured = shape.measure(data)
        assert measured.depth >= 0 and measured.elements >= 0
        try:
            shape.check_shape(data, shape.ShapeLimits(3, 5, "D", "E"), "it")
        except ProtocolViolation:
            pass


@pytest.mark.parametrize(
    ("data", "names"),
    [
        pytest.param(b"[" * 10_000_000, "MAX_FRAME_DEPTH", id="deep"),
        pytest.param(b"[" + b"[]," * 5_000_000 + b"[]]", "MAX_FRAME_ELEMENTS", id="wide"),
        pytest.param(b"[" + b"1," * 5_000_000 + b"1]", "MAX_FRAME_ELEMENTS", id="numbers"),
        pytest.param(b'["' + b"[[[,,," * 2_000_000 + b'"]', None, id="structure-in-a-string"),
        pytest.param(b'["' + b'\\"[' * 2_000_000 + b'"]', None, id="escaped-quotes"),
        pytest.param(b"]" * 10_000_000, None, id="closing-only"),
    ],
)
def test_the_prescan_stops_early_and_sees_through_strings(data: bytes, names: str | None) -> None:
    if names is None:
        check_shape(data, FRAME_SHAPE, "a frame")
    else:
        with pytest.raises(ProtocolViolation, match=names):
            check_shape(data, FRAME_SHAPE, "a frame")


def test_a_frame_past_a_shape_limit_is_refused_before_the_parser_sees_it() -> None:
    head = b'{"type":"call","id":0,"name":"a","arguments":{"x":'
    # Past the parser's own recursion limit too: the message names ours, not the parser's.
    with pytest.raises(ProtocolViolation, match="MAX_FRAME_DEPTH"):
        decode_child_frame(head + b"[" * 300 + b"]" * 300 + b"}}")
    with pytest.raises(ProtocolViolation, match="MAX_FRAME_ELEMENTS"):
        decode_child_frame(head + b"[" + b"0," * protocol_limits.MAX_FRAME_ELEMENTS + b"0]}}")
    # Just within both: the deepest and widest arguments an honest child may send.
    deepest = head + b"[" * protocol_limits.MAX_JSON_DEPTH + b"]" * protocol_limits.MAX_JSON_DEPTH
    assert isinstance(decode_child_frame(deepest + b"}}"), CallFrame)
    widest = b"[" + b"0," * (protocol_limits.MAX_JSON_ELEMENTS - 2) + b"0]"
    assert isinstance(decode_child_frame(head + widest + b"}}"), CallFrame)


def test_a_value_past_a_shape_limit_is_refused_before_the_parser_sees_it() -> None:
    cap = 1 << 22
    deep = "[" * (protocol_limits.MAX_JSON_DEPTH + 1) + "]" * (protocol_limits.MAX_JSON_DEPTH + 1)
    with pytest.raises(ProtocolViolation, match="MAX_JSON_DEPTH"):
        decode_value_json(deep, cap)
    wide = "[" + "0," * protocol_limits.MAX_JSON_ELEMENTS + "0]"
    with pytest.raises(ProtocolViolation, match="MAX_JSON_ELEMENTS"):
        decode_value_json(wide, cap)
    assert decode_value_json("[" * 128 + "]" * 128, cap) is not None


# ---------------------------------------------------------------- a frame's kind and ceiling


@pytest.mark.parametrize(
    ("head", "complete", "kind"),
    [
        (b'{"type":"call",', False, "call"),
        (b'{"type":"result"}', True, "result"),
        (b'{ "type" : "artifact_skipped" ,', False, "artifact_skipped"),
        (b'{"type":"ca', False, None),
        (b"{", False, None),
        (b"", False, None),
    ],
)
def test_a_frame_kind_is_known_from_its_head(head: bytes, complete: bool, kind: str) -> None:
    assert frame_kind(head, complete=complete) == kind


@pytest.mark.parametrize(
    "head",
    [
        b'{"id":0,"type":"call"}',
        b'{"type":"reply","id":0}',
        b'{"type":"c\\u0061ll",',
        b'{"type":"call"',
        b"[1]",
        b'{"type"' + b" " * 64 + b':"call",',
        b"\xff" * 64,
    ],
)
def test_a_head_that_names_no_child_frame_is_refused(head: bytes) -> None:
    with pytest.raises(ProtocolViolation):
        frame_kind(head, complete=True)
    if len(head) >= protocol_limits.MAX_FRAME_HEAD_BYTES:
        with pytest.raises(ProtocolViolation):
            frame_kind(head, complete=False)


def test_each_kind_has_a_ceiling_and_a_call_follows_the_argument_budget() -> None:
    ceilings = FrameCeilings.for_execution(argument_bytes=1000, return_value_bytes=100)
    assert ceilings.of("call") == 1000 + protocol_limits.CALL_FRAME_ENVELOPE_BYTES
    assert ceilings.of("hello") == MAX_HELLO_FRAME_BYTES
    assert ceilings.of("artifact") == ceilings.of("artifact_skipped")
    assert ceilings.of("artifact") > protocol_limits.ARTIFACT_CHUNK_BASE64_CHARS
    # A result carries a value or a raised error's text, whichever is larger.
    assert ceilings.of("result") == (
        protocol_limits.RESULT_TEXT_BYTES + protocol_limits.RESULT_FRAME_OVERHEAD_BYTES
    )
    largest = FrameCeilings.for_execution(
        argument_bytes=MAX_ARGUMENT_BYTES_PER_CALL,
        return_value_bytes=protocol_limits.max_return_value_bytes(),
    )
    for kind in ("hello", "call", "result", "artifact"):
        assert largest.of(kind) < MAX_CHILD_FRAME_BYTES
    call = b'{"type":"call","id":0,"name":"a","arguments":{"x":"' + b"a" * 1000 + b'"}}'
    with pytest.raises(ProtocolViolation, match="call frame longer than its ceiling"):
        decode_child_frame(call + b" " * (ceilings.of("call") - len(call) + 1), ceilings)
    assert isinstance(decode_child_frame(call, ceilings), CallFrame)


def test_the_largest_honest_call_frame_fits_its_ceiling() -> None:
    # The envelope's worst case: the longest id and a name of characters that escape to 12
    # bytes each, as the bootstrap writes it (arguments are sent as UTF-8 text).
    name = "\U0001f600" * protocol_limits.MAX_TOOL_NAME_CHARS
    arguments = bootstrap.json_text({"x": "é" * 500})
    head = bootstrap.json_dumps({"type": "call", "id": MAX_CALL_ID, "name": name})[:-1]
    line = (head + ',"arguments":' + arguments + "}").encode()
    budget = len(arguments.encode())
    ceilings = FrameCeilings.for_execution(argument_bytes=budget, return_value_bytes=1)
    assert len(line) <= ceilings.of("call")
    frame = decode_child_frame(line, ceilings)
    assert isinstance(frame, CallFrame) and frame.arguments == {"x": "é" * 500}


# ---------------------------------------------------------------- call ids


@pytest.mark.anyio
async def test_host_answers_only_the_exact_successor() -> None:
    server = CallServer(FunctionBindings({"add": lambda a, b: a + b}), ["add"])
    first = CallFrame(type="call", id=0, name="add", arguments={"a": 1, "b": 2})
    reply = await server.answer(first)
    assert reply.id == 0 and reply.carries == "value" and reply.value_json == "3"
    for wrong in (0, 2, 5):
        with pytest.raises(ProtocolViolation, match="successor"):
            await server.answer(CallFrame(type="call", id=wrong, name="add", arguments={}))
    # The state retained is a single number; a refused id did not advance it.
    assert server.expected_id == 1
    reply = await server.answer(CallFrame(type="call", id=1, name="nope", arguments={}))
    assert reply.carries == "error" and reply.error_kind == "unknown_tool"


# ---------------------------------------------------------------- bootstrap agreement


def test_bootstrap_copies_of_protocol_constants_match() -> None:
    assert bootstrap.PROTOCOL_VERSION == protocol_limits.PROTOCOL_VERSION
    assert bootstrap.MAX_HOST_FRAME_BYTES == protocol_limits.MAX_HOST_FRAME_BYTES
    assert bootstrap.MAX_CHILD_FRAME_BYTES == protocol_limits.MAX_CHILD_FRAME_BYTES
    assert bootstrap.MAX_JSON_DEPTH == protocol_limits.MAX_JSON_DEPTH
    assert bootstrap.MAX_JSON_ELEMENTS == protocol_limits.MAX_JSON_ELEMENTS
    assert bootstrap.CALL_FRAME_ENVELOPE_BYTES == protocol_limits.CALL_FRAME_ENVELOPE_BYTES
    assert bootstrap.MAX_TOOL_NAME_CHARS == protocol_limits.MAX_TOOL_NAME_CHARS
    # The filename that marks the model's frames is not a path anything could also be named.
    assert bootstrap.PROGRAM_FILENAME.startswith("<") and bootstrap.PROGRAM_FILENAME.endswith(">")


def test_bootstrap_text_fields_fit_the_host_ceilings() -> None:
    # describe_exception truncates to the host's text ceiling, so a huge message is data,
    # not a protocol error.
    try:
        raise ValueError("x" * (protocol_limits.MAX_TEXT_CHARS * 2))
    except ValueError as exc:
        described = bootstrap.describe_exception(exc)
    error = ProgramError(**described)
    assert len(error.message) <= protocol_limits.MAX_TEXT_CHARS
    assert len(error.traceback) <= protocol_limits.MAX_TEXT_CHARS


def test_bootstrap_is_stdlib_only() -> None:
    import ast
    import sys

    from psych_sandbox_core.child.loader import bootstrap_source

    tree = ast.parse(bootstrap_source())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "the bootstrap runs with -c and has no package"
            imported.add((node.module or "").split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
