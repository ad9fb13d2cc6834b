"""The wire protocol without processes: frames round-trip, hostile bytes only ever raise
ProtocolViolation, every limit has its countermeasure, and the bootstrap agrees with the host."""

from __future__ import annotations

import json
import socket
from typing import Any

import anyio
import pytest
from anyio.abc import SocketStream
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from psych_sandbox_core import bootstrap
from psych_sandbox_core.bindings import CallServer, FunctionBindings
from psych_sandbox_core.channel import FrameChannel
from psych_sandbox_core.errors import ProtocolViolation
from psych_sandbox_core.protocol import (
    AbortFrame,
    CallFrame,
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
)
from psych_sandbox_core.protocol import limits as protocol_limits
from psych_sandbox_core.protocol.framing import (
    CHANNEL_CEILINGS,
    HANDSHAKE_CEILINGS,
    FrameCeilings,
)
from psych_sandbox_core.protocol.limits import (
    MAX_CALL_ID,
    MAX_CHILD_FRAME_BYTES,
    MAX_HELLO_FRAME_BYTES,
)

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
        ["type", "id", "name", "arguments", "protocol", "report", "outcome", "value_json",
         "error", "detail", "carries", "source", "extra"]
    ),
    json_value | st.sampled_from(["hello", "call", "result", "reply", "run"]),
    max_size=6,
)


@given(frame_like)
@settings(max_examples=500)
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


def test_codec_refuses_an_oversized_line_before_parsing() -> None:
    line = b'{"type":"call","id":0,"name":"a","arguments":{"x":"' + b"a" * MAX_CHILD_FRAME_BYTES
    with pytest.raises(ProtocolViolation, match="ceiling"):
        decode_child_frame(line + b'"}}')


def test_text_fields_are_bounded() -> None:
    error = {
        "type": "E", "message": "m" * (protocol_limits.MAX_TEXT_CHARS + 1), "traceback": "",
        "line": None, "column": None,
    }
    frame = {"type": "result", "outcome": "raised", "value_json": None, "error": error,
             "detail": None}
    with pytest.raises(ProtocolViolation, match="message"):
        decode_child_frame(json.dumps(frame).encode())


def test_too_many_tools_cannot_be_sent() -> None:
    limits = ChildLimits(cpu_seconds=1, memory_bytes=None, file_size_bytes=None, processes=None,
                         return_value_bytes=1)
    RunFrame(source="", tools=["t"] * protocol_limits.MAX_TOOLS, limits=limits)
    with pytest.raises(ValueError, match="tools"):
        RunFrame(source="", tools=["t"] * (protocol_limits.MAX_TOOLS + 1), limits=limits)


def test_largest_return_value_cap_fits_one_frame_even_fully_escaped() -> None:
    cap = protocol_limits.max_return_value_bytes()
    # The worst case: every byte of the value escapes to six bytes inside value_json.
    value_json = json.dumps("\x01" * (cap // 6))
    assert len(value_json.encode()) <= cap
    frame = ResultFrame(type="result", outcome="returned", value_json=value_json, error=None,
                        detail=None)
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

    from psych_sandbox_core.host import bootstrap_source

    tree = ast.parse(bootstrap_source())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "the bootstrap runs with -c and has no package"
            imported.add((node.module or "").split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported

