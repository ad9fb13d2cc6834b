"""A program that forges frames on the control channel: every malformed or out-of-place frame
ends the execution as protocol_error, without being interpreted, and the host stays healthy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from psych_sandbox_core import ErrorKind, Sandbox
from psych_sandbox_core.protocol import ContainmentReport, HelloFrame, NetworkObservation

from .conftest import PROFILE, config, host_rss, host_rss_peak, host_rss_peak_reset, open_fds

pytestmark = pytest.mark.anyio

#: The program finds the channel the way any hostile program would: from its own argv.
PRELUDE = """
import os, socket, sys
FD = int(next(a for a in sys.argv if a.startswith("channel=fd:"))[len("channel=fd:"):])
channel = socket.socket(fileno=os.dup(FD))
def send(data):
    channel.sendall(data)
"""


def forge(payload: bytes, then: str = "import time\ntime.sleep(60)\n") -> str:
    return PRELUDE + f"send({payload!r})\n" + then


def call(**fields: Any) -> bytes:
    frame = {"type": "call", "id": 0, "name": "tool", "arguments": {}, **fields}
    return json.dumps(frame).encode() + b"\n"


def result_frame(**fields: Any) -> bytes:
    frame = {"type": "result", "outcome": "returned", "value_json": "1", "error": None,
             "detail": None, **fields}
    return json.dumps(frame).encode() + b"\n"


HELLO = HelloFrame(
    type="hello",
    protocol=1,
    report=ContainmentReport(
        uid=0, euid=0, gid=0, pid=1, canary_readable=False,
        network=NetworkObservation(ipv4="refused", ipv6="refused", interfaces_up=[]),
        limits=[], capabilities=None, sees_foreign_processes=False, python="3", platform="x",
    ),
).model_dump_json().encode() + b"\n"

CASES = {
    "junk-field": forge(call(evil="payload")),
    "missing-field": forge(b'{"type":"call","id":0}\n'),
    "nan-call-id": forge(b'{"type":"call","id":NaN,"name":"tool","arguments":{}}\n'),
    "infinite-call-id": forge(b'{"type":"call","id":1e999,"name":"tool","arguments":{}}\n'),
    "float-call-id": forge(call(id=0.0)),
    "negative-call-id": forge(call(id=-1)),
    "out-of-order-call-id": forge(call(id=1)),
    "nan-in-arguments": forge(b'{"type":"call","id":0,"name":"t","arguments":{"x":NaN}}\n'),
    "binary-garbage": forge(bytes(range(256)) * 16 + b"\n"),
    "empty-line": forge(b"\n"),
    "reply-from-child": forge(b'{"type":"reply","id":0,"carries":"value","value_json":"1"}\n'),
    "run-from-child": forge(b'{"type":"run","source":"1","tools":[],"limits":{}}\n'),
    "second-hello": forge(HELLO),
    "torn-frame-then-exit": forge(b'{"type":"call","id"', then="import os\nos._exit(0)\n"),
    "result-with-unparseable-value": forge(result_frame(value_json="{not json")),
    "result-with-nonfinite-value": forge(result_frame(value_json="NaN")),
    "result-raised-without-error": forge(result_frame(outcome="raised", value_json=None)),
}


@pytest.mark.parametrize("source", list(CASES.values()), ids=list(CASES))
async def test_forged_frame_is_a_protocol_error_and_the_host_stays_healthy(
    source: str, private_tmp: Path
) -> None:
    async with Sandbox(config(wall_seconds=30.0)) as sandbox:
        await sandbox.run("1", profile=PROFILE)  # warm-up, so descriptors are comparable
        fds = open_fds()
        result = await sandbox.run(source, profile=PROFILE)
        error = result.error
        assert error is not None, f"forged frame accepted; returned {result.return_value!r}"
        assert error.kind is ErrorKind.PROTOCOL_ERROR, error
        assert error.message
        assert result.return_value is None
        healthy = await sandbox.run("print('fine')\n21 * 2", profile=PROFILE)
        assert healthy.error is None and healthy.return_value == 42
        assert open_fds() == fds
    assert list(private_tmp.iterdir()) == []


async def test_a_100_mb_line_without_newline_is_cut_off_at_the_ceiling() -> None:
    source = PRELUDE + (
        "chunk = b'a' * (1 << 20)\n"
        "for _ in range(100):\n"
        "    send(chunk)\n"
        "import time\ntime.sleep(60)\n"
    )
    baseline = host_rss()
    reset = host_rss_peak_reset()
    async with Sandbox(config(wall_seconds=60.0)) as sandbox:
        result = await sandbox.run(source, profile=PROFILE)
        error = result.error
        assert error is not None and error.kind is ErrorKind.PROTOCOL_ERROR
        assert "without a newline" in error.message
        growth = (host_rss_peak() if reset else host_rss()) - baseline
        print(f"host peak RSS growth for a 100 MB line: {growth / 2**20:.1f} MiB")
        # The reader may hold one ceiling's worth (16 MiB) and its copies, never the line.
        assert growth < 64 << 20
        healthy = await sandbox.run("'ok'", profile=PROFILE)
        assert healthy.error is None and healthy.return_value == "ok"


async def test_a_forged_result_over_the_cap_is_not_returned() -> None:
    # The child-side cap can be bypassed by writing the frame directly; the host must not
    # hand back a value larger than the configured cap.
    big = json.dumps("x" * 10_000)
    source = forge(result_frame(value_json=big))
    async with Sandbox(config(return_value_bytes=1000)) as sandbox:
        result = await sandbox.run(source, profile=PROFILE)
    assert result.error is not None
    assert result.error.kind in (ErrorKind.PROTOCOL_ERROR, ErrorKind.OUTPUT_LIMIT)
    assert result.return_value is None


async def test_unknown_tool_call_is_answered_not_fatal() -> None:
    # A well-formed call for a tool that was not offered gets an error reply, not a crash.
    source = "await call_tool('nope', {})"
    result = await Sandbox(config()).run(source, profile=PROFILE)
    assert result.error is not None and result.error.kind is ErrorKind.EXCEPTION
    assert "unknown_tool" in result.error.message
