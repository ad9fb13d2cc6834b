"""A program that forges frames on the control channel: every malformed or out-of-place frame
ends the execution as protocol_error, without being interpreted, and the host stays healthy."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from psych_sandbox_core import ErrorKind, Sandbox
from psych_sandbox_core._bindings.bindings import FunctionBindings
from psych_sandbox_core.protocol import ContainmentReport, HelloFrame, NetworkObservation
from psych_sandbox_core.protocol import limits as protocol_limits

from ..conftest import (
    PROFILE,
    config,
    host_rss,
    host_rss_peak,
    host_rss_peak_reset,
    open_fds,
    run,
)

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
    frame = {
        "type": "result",
        "outcome": "returned",
        "value_json": "1",
        "error": None,
        "detail": None,
        **fields,
    }
    return json.dumps(frame).encode() + b"\n"


HELLO = (
    HelloFrame(
        type="hello",
        protocol=1,
        report=ContainmentReport(
            uid=0,
            euid=0,
            gid=0,
            pid=1,
            canary_readable=False,
            network=NetworkObservation(ipv4="refused", ipv6="refused", interfaces_up=[]),
            limits=[],
            capabilities=None,
            sees_foreign_processes=False,
            python="3",
            platform="x",
        ),
    )
    .model_dump_json()
    .encode()
    + b"\n"
)

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
    # Cold executions: prepared children would hold descriptors of their own.
    async with Sandbox(config(wall_seconds=30.0, warm=0)) as sandbox:
        await sandbox.run("1", profile=PROFILE)  # warm-up, so descriptors are comparable
    # Taken once that Sandbox has closed: a result may come back before its teardown.
    fds = open_fds()
    async with Sandbox(config(wall_seconds=30.0, warm=0)) as sandbox:
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


# ---------------------------------------------------------------- frames that cost the host
#
# Each limit on what a frame may cost the host has its own countermeasure test: a program
# first keeps the host busy with the heaviest frames it accepts (calls whose arguments sit
# just under the element limit, each parsed and answered), then sends one frame past the
# limit. Judged from the host: the execution ends as protocol_error naming the limit, the
# host's peak RSS grows by less than RSS_BOUND, and an honest execution running beside it in
# the same Sandbox, which sleeps past its wall clock, is reported as a timeout.

#: What the host may grow by while a hostile program does its worst.
RSS_BOUND = 64 << 20
HONEST_WALL = 1.0
#: Sleeps past its wall clock: if reported as anything but a timeout, it overran unnoticed.
HONEST = f"import time\ntime.sleep({HONEST_WALL * 1.5})\n'finished'"

#: Heavy frames the host accepts and answers, for as long as the honest program's wall clock
#: runs; then the case's own frame. ``call(arguments)`` sends a call with the next id and
#: waits for its reply.
PRESSURE = (
    PRELUDE
    + f"""
import time
buffered = b""
def answered():
    global buffered
    while b"\\n" not in buffered:
        chunk = channel.recv(65536)
        if not chunk:
            raise SystemExit(0)
        buffered += chunk
    buffered = buffered[buffered.index(b"\\n") + 1:]
call_id = 0
def head(kind="call"):
    return b'{{"type":"%s","id":%d,"name":"tool","arguments":' % (kind.encode(), call_id)
def call(arguments):
    global call_id
    send(head() + arguments + b"}}\\n")
    call_id += 1
    answered()
heaviest = b'{{"x":[' + b"[]," * {2**15 - 600} + b'[]]}}'
until = time.monotonic() + {HONEST_WALL * 1.5}
while time.monotonic() < until:
    call(heaviest)
"""
)

HOSTILE_CASES: dict[str, tuple[str, str]] = {
    # A complete call frame one byte past the argument budget plus its envelope, ending in
    # something that would not parse: refused for its length, never parsed.
    "call-over-the-argument-budget": (
        "send(head() + b'{\"x\":\"' + b'a' * ((1 << 20) + 4096) + b'\",\"y\":NaN}}\\n')",
        "call frame longer than its ceiling",
    ),
    # A call that never ends: cut off at the call ceiling, not the channel's.
    "call-line-that-never-ends": (
        "send(head() + b'{\"x\":\"')\nfor _ in range(100):\n    send(b'a' * (1 << 20))",
        f"call frame longer than its ceiling of {1024 * 1024 + 4096}",
    ),
    "call-nested-too-deep": (
        "send(head() + b'{\"x\":' + b'[' * 200 + b']' * 200 + b'}}\\n')",
        "MAX_FRAME_DEPTH",
    ),
    "call-with-too-many-lists": (
        "send(head() + b'{\"x\":[' + b'[],' * 70_000 + b'[]]}}\\n')",
        "MAX_FRAME_ELEMENTS",
    ),
    "call-with-too-many-keys": (
        "send(head() + b'{' + b','.join(b'\"%x\":0' % i for i in range(70_000)) + b'}}\\n')",
        "MAX_FRAME_ELEMENTS",
    ),
    "result-value-nested-too-deep": (
        "import json\nsend(json.dumps({'type': 'result', 'outcome': 'returned', "
        "'value_json': '[' * 150 + ']' * 150, 'error': None, 'detail': None}).encode() + b'\\n')",
        "MAX_JSON_DEPTH",
    ),
    "result-value-with-too-many-elements": (
        "import json\nsend(json.dumps({'type': 'result', 'outcome': 'returned', "
        "'value_json': '[' + '0,' * 140_000 + '0]', 'error': None, 'detail': None}).encode()"
        " + b'\\n')",
        "MAX_JSON_ELEMENTS",
    ),
    "result-over-its-ceiling": (
        'send(b\'{"type":"result","outcome":"output_limit","detail":"\' '
        "+ b'a' * (8 << 20) + b'\"}\\n')",
        "result frame longer than its ceiling",
    ),
    "artifact-over-its-ceiling": (
        'send(b\'{"type":"artifact","path":"a","data":"\' + b\'A\' * (2 << 20) + b\'"}\\n\')',
        "artifact frame longer than its ceiling",
    ),
    "hello-over-its-ceiling": (
        'send(b\'{"type":"hello","report":"\' + b\'a\' * (1 << 20) + b\'"}\\n\')',
        "hello frame longer than its ceiling",
    ),
    "type-not-first": (
        'send(b\'{"id":\' + str(call_id).encode() + b\',"type":"call"}\\n\')',
        "must begin with its type",
    ),
    "type-said-twice": (
        'send(b\'{"type":"call","outcome":"returned","value_json":"1",\''
        'b\'"error":null,"detail":null,"type":"result"}\\n\')',
        "begins as 'call' but parses as 'result'",
    ),
}


async def beside_honest(source: str, **limits: Any) -> tuple[Any, Any, int]:
    """Run ``source`` and an honest program at once in one Sandbox: both results, and the
    host's peak RSS growth meanwhile."""
    async with Sandbox(config(wall_seconds=30.0, **limits)) as sandbox:
        await sandbox.run("1", profile=PROFILE)  # warm-up: imports and caches are not growth
        baseline = host_rss()
        reset = host_rss_peak_reset()
        results: dict[str, Any] = {}

        async def run(name: str, program: str, timeout: float | None) -> None:
            results[name] = await sandbox.run(program, profile=PROFILE, timeout=timeout)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "hostile", source, None)
            tg.start_soon(run, "honest", HONEST, HONEST_WALL)
        growth = (host_rss_peak() if reset else host_rss()) - baseline
    return results["hostile"], results["honest"], growth


def assert_contained(honest: Any, growth: int) -> None:
    print(f"host peak RSS growth: {growth / 2**20:.1f} MiB")
    assert growth < RSS_BOUND
    assert honest.error is not None, f"the honest program overran unnoticed: {honest!r}"
    assert honest.error.kind is ErrorKind.TIMEOUT, honest.error
    assert honest.grades["wall_clock"] == "enforced"


@pytest.mark.parametrize(("frame", "names"), list(HOSTILE_CASES.values()), ids=list(HOSTILE_CASES))
async def test_a_frame_past_a_limit_ends_the_execution_and_costs_the_host_little(
    frame: str, names: str
) -> None:
    source = PRESSURE + frame + "\nimport time\ntime.sleep(60)\n"
    hostile, honest, growth = await beside_honest(source, return_value_bytes=512 * 1024)
    error = hostile.error
    assert error is not None and error.kind is ErrorKind.PROTOCOL_ERROR, error
    assert names in error.message
    assert hostile.calls, "the pressure's calls were answered before the frame past the limit"
    assert_contained(honest, growth)


async def test_the_heaviest_frames_within_the_limits_are_answered() -> None:
    # Just under every limit at once: as deep as a call's arguments may nest, and as wide.
    deepest = "b'{\"x\":' + b'[' * 128 + b']' * 128 + b'}'"
    source = PRESSURE + f"call({deepest})\nfor _ in range(5):\n    call(heaviest)\ncall_id\n"
    hostile, honest, growth = await beside_honest(source)
    assert hostile.error is None, hostile.error
    assert hostile.return_value == len(hostile.calls) >= 6
    assert {call.outcome for call in hostile.calls} == {"unknown_tool"}
    assert_contained(honest, growth)


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


# ---------------------------------------------------------------- the honest side of the limits


async def test_an_honest_program_meets_the_element_limit_as_data() -> None:
    # The bootstrap refuses what the host would refuse, so an honest program sees a
    # TypeError or invalid_output, never a protocol error.
    elements = protocol_limits.MAX_JSON_ELEMENTS
    source = f"""
try:
    await call_tool("anything", {{"x": [0] * {elements}}})
except TypeError as exc:
    refused = str(exc)
return [refused, [0] * ({elements} - 2)]
"""
    result = await run(source, return_value_bytes=1 << 20)
    assert result.error is None, result.error
    refused, widest = result.return_value
    assert f"more than {elements} elements" in refused
    assert len(widest) == elements - 2  # with the list around it, exactly the limit
    result = await run(f"[0] * {elements + 1}", return_value_bytes=1 << 20)
    assert result.error is not None and result.error.kind is ErrorKind.INVALID_OUTPUT
    assert f"more than {elements} elements" in result.error.message


async def test_an_end_seen_only_after_the_deadline_is_a_timeout() -> None:
    # The host is busy (here: a callback that holds the event loop, as a decode on it once
    # did) from before the deadline until after the program has returned and exited. When
    # the loop turns again, the program's result and its deadline are both due: whichever
    # is read first, the program ran past its wall clock and the result must say so.
    started = anyio.Event()

    async def started_tool() -> None:
        started.set()

    async def busy_host() -> None:
        await started.wait()
        time.sleep(2 * HONEST_WALL)  # the host's work, not a wait for a condition

    async with Sandbox(config()) as sandbox, anyio.create_task_group() as tg:
        tg.start_soon(busy_host)
        result = await sandbox.run(
            f"await started()\nimport time\ntime.sleep({HONEST_WALL * 1.2})\n'returned'",
            profile=PROFILE,
            timeout=HONEST_WALL,
            bindings=FunctionBindings({"started": started_tool}),
        )
    assert result.error is not None, f"overran its wall clock unnoticed: {result!r}"
    assert result.error.kind is ErrorKind.TIMEOUT
    assert result.return_value is None
