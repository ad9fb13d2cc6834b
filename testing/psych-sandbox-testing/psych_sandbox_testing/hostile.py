"""Hostile input for the protocol's fuzzing harnesses: JSON too deep, too wide or too large,
frames of every kind with forged and reordered call ids, truncated and oversized lines, and
the small execution they are aimed at. Needs hypothesis (the ``fuzz`` extra)."""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import strategies as st
from psych_sandbox_core import ExecutionLimits
from psych_sandbox_core._output.artifacts import CollectionLimits
from psych_sandbox_core.protocol import PROTOCOL_VERSION
from psych_sandbox_core.protocol.framing import FrameCeilings
from psych_sandbox_core.protocol.limits import MAX_CALL_ID

from .fake_backend import honest_report

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


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def wide(count: int) -> str:
    return "[" + ",".join(["0"] * count) + "]"


#: JSON values a hostile child can write: ordinary ones, and ones made to be expensive or
#: out of range (deep, wide, huge or non-finite numbers, lone surrogates, long strings).
hostile_values = st.one_of(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=12,
    ).map(json.dumps),
    st.integers(1, 400).map(deep),
    st.sampled_from([2**16 - 1, 2**16 + 8, 2**17]).map(wide),
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


def frame_line(fields: dict[str, Any], raw: dict[str, str] | None = None) -> bytes:
    """A frame line with its type first, as the bootstrap writes it; ``raw`` members are
    spliced in as JSON text as they are (hostile values need not be valid JSON)."""
    text = json.dumps(fields, separators=(",", ":"))
    for name, value in (raw or {}).items():
        text = text[:-1] + ("," if len(text) > 2 else "") + f'"{name}":{value}' + "}"
    return text.encode("utf-8", errors="surrogatepass")


def hello_line(protocol: int) -> bytes:
    report = json.loads(honest_report().model_dump_json())
    return frame_line({"type": "hello", "protocol": protocol, "report": report})


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
    fields = {"type": "call", "id": draw(call_ids), "name": name}
    return frame_line(fields, {"arguments": arguments})


@st.composite
def result_lines(draw: st.DrawFn) -> bytes:
    outcome = draw(st.sampled_from(["returned", "raised", "invalid_output", "output_limit", "x"]))
    value = draw(st.none() | hostile_values)
    error = draw(
        st.none()
        | st.just({"type": "E", "message": "m", "traceback": "t", "line": None, "column": None})
    )
    return frame_line(
        {"type": "result", "outcome": outcome, "value_json": value, "error": error, "detail": None}
    )


@st.composite
def artifact_lines(draw: st.DrawFn) -> bytes:
    path = draw(
        st.sampled_from(["out/a.txt", "out/b.txt", "out/../x", "/etc/passwd", "out", "a.txt"])
        | st.text(min_size=1, max_size=20).map(lambda t: "out/" + t)
    )
    if draw(st.booleans()):
        return frame_line(
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
    return frame_line(
        {
            "type": "artifact",
            "path": path,
            "offset": offset,
            "data": data,
            "last": draw(st.booleans()),
        }
    )


def oversized(kind: str, ceilings: FrameCeilings) -> bytes:
    """A ``kind`` frame one byte longer than its ceiling."""
    head = b'{"type":"' + kind.encode() + b'","pad":"'
    return head + b"a" * (ceilings.of(kind) + 1 - len(head) - 2) + b'"}'


def mutations(line: bytes) -> st.SearchStrategy[bytes]:
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
        st.sampled_from([PROTOCOL_VERSION, PROTOCOL_VERSION + 1, 0]).map(hello_line),
        call_lines(),
        result_lines(),
        artifact_lines(),
        st.binary(max_size=128).filter(lambda b: b"\n" not in b),
    )
    .flatmap(mutations)
    .map(lambda line: line.replace(b"\n", b" "))
)
