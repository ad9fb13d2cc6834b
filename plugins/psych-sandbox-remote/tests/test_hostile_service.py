"""Everything a service sends is hostile: each ceiling, each transport failure, its own kind.

Every test runs a deliberately malicious service on loopback (raw HTTP written by hand, so it
can break every rule) and asserts what the client made of it, and that the execution was
asked for exactly once: nothing but the description is ever retried.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from psych_sandbox_core import ErrorKind, ExecutionResult, Level
from remote_support import (
    TOKEN_ENV,
    Hostile,
    channel,
    client_config,
    description,
    heartbeat,
    hello,
    hostile_service,
    new_token,
    run,
    started,
)

pytestmark = pytest.mark.anyio

Send = Callable[[bytes], Awaitable[None]]


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, new_token())


async def against(
    stream: Callable[[Send], Awaitable[None]],
    *,
    options: dict[str, Any] | None = None,
    hostile: Hostile | None = None,
    **limits: Any,
) -> tuple[ExecutionResult, Hostile]:
    hostile = hostile or Hostile(stream)
    async with hostile_service(hostile) as service:
        config = client_config(
            service.url, options={"stall_seconds": 2.0, **(options or {})}, **limits
        )
        with anyio.fail_after(60):
            result = await run(config, "print('never')")
    return result, hostile


def failed(result: ExecutionResult, kind: ErrorKind) -> str:
    assert result.error is not None, result
    assert result.error.kind is kind, result.error
    assert result.return_value is None
    assert result.stdout == ""
    return result.error.message


def started_once(hostile: Hostile) -> None:
    assert hostile.requests.get("POST /v1/executions") == 1, hostile.requests


async def test_a_line_that_never_ends_is_cut_off_while_it_arrives() -> None:
    async def endless(send: Send) -> None:
        await send(started())
        await send(b'{"type":"channel","execution":"' + b"a" * 32 + b'","data":"')
        while True:
            await send(b"A" * 65536)

    result, hostile = await against(endless)
    message = failed(result, ErrorKind.REMOTE_MALFORMED)
    assert "per-event ceiling" in message
    started_once(hostile)
    # Cut off near the ceiling: what the service got to write is the ceiling plus what the
    # sockets buffer, nowhere near what it would have sent.
    assert hostile.written < 16 * 1024 * 1024, hostile.written


async def test_an_oversized_event_is_refused() -> None:
    async def oversized(send: Send) -> None:
        await send(started())
        await send(
            b'{"type":"heartbeat","execution":"'
            + b"a" * 32
            + b'","x":"'
            + b"B" * (200 * 1024)
            + b'"}\n'
        )
        await anyio.sleep_forever()

    result, hostile = await against(oversized)
    assert "per-event ceiling" in failed(result, ErrorKind.REMOTE_MALFORMED)
    started_once(hostile)


async def test_the_whole_stream_has_a_byte_ceiling() -> None:
    async def flood(send: Send) -> None:
        await send(started())
        while True:
            await send(heartbeat() * 100)

    result, hostile = await against(flood, options={"max_stream_bytes": 200_000})
    assert "byte ceiling" in failed(result, ErrorKind.REMOTE_MALFORMED)
    started_once(hostile)


async def test_lines_are_counted() -> None:
    async def many(send: Send) -> None:
        await send(started())
        while True:
            await send(heartbeat() * 100)

    result, _ = await against(many, options={"max_lines": 1000})
    assert "line ceiling (1000)" in failed(result, ErrorKind.REMOTE_MALFORMED)


async def test_blank_lines_are_counted_on_their_own() -> None:
    async def blanks(send: Send) -> None:
        await send(started())
        while True:
            await send(b"\n" * 4096)

    result, _ = await against(blanks, options={"max_blank_lines": 100})
    assert "blank-line ceiling (100)" in failed(result, ErrorKind.REMOTE_MALFORMED)


async def test_a_stalled_service_is_a_remote_timeout() -> None:
    async def stall(send: Send) -> None:
        await send(started())
        await anyio.sleep_forever()

    result, hostile = await against(stall, options={"stall_seconds": 1.0})
    assert "sent nothing for 1 s" in failed(result, ErrorKind.REMOTE_TIMEOUT)
    started_once(hostile)


async def test_a_byte_a_second_drip_is_ended_by_the_wall_clock() -> None:
    async def drip(send: Send) -> None:
        await send(started())
        while True:
            for byte in heartbeat():
                await send(bytes([byte]))
                await anyio.sleep(1)

    result, hostile = await against(drip, wall_seconds=2.0)
    assert "wall-clock" in failed(result, ErrorKind.TIMEOUT)
    started_once(hostile)


async def test_an_event_for_another_execution_is_refused() -> None:
    result_frame = (
        json.dumps({"type": "result", "outcome": "returned", "value_json": "42"}).encode() + b"\n"
    )

    async def other(send: Send) -> None:
        import base64

        await send(started("a" * 32))
        await send(
            json.dumps(
                {
                    "type": "channel",
                    "execution": "b" * 32,
                    "data": base64.b64encode(result_frame).decode(),
                }
            ).encode()
            + b"\n"
        )
        await anyio.sleep_forever()

    result, hostile = await against(other)
    assert "another execution" in failed(result, ErrorKind.REMOTE_MALFORMED)
    started_once(hostile)


async def test_a_malformed_event_is_refused() -> None:
    async def garbage(send: Send) -> None:
        await send(started())
        await send(b'{"type":"stdout","execution":"' + b"a" * 32 + b'","data":"%%%"}\n')
        await anyio.sleep_forever()

    result, _ = await against(garbage)
    assert "not base64" in failed(result, ErrorKind.REMOTE_MALFORMED)


async def test_a_disconnect_mid_stream_is_its_own_kind() -> None:
    async def hang_up(send: Send) -> None:
        await send(started())
        await send(heartbeat())

    result, hostile = await against(hang_up)
    assert "closed the stream" in failed(result, ErrorKind.REMOTE_DISCONNECTED)
    started_once(hostile)


@pytest.mark.parametrize(
    ("status", "body", "kind", "words"),
    [
        (503, b'{"error":"full","message":"at most 1"}', ErrorKind.REMOTE_ERROR, "at capacity"),
        (500, b"<html>oops</html>", ErrorKind.REMOTE_ERROR, "answered 500"),
        (422, b'{"error":"terms","message":"cpu"}', ErrorKind.POLICY_REFUSED, "cannot meet"),
        (401, b'{"error":"unauthorized","message":"no"}', ErrorKind.REMOTE_ERROR, "401"),
    ],
)
async def test_an_error_status_is_never_retried(
    status: int, body: bytes, kind: ErrorKind, words: str
) -> None:
    async def unused(send: Send) -> None:
        raise AssertionError("no stream for a refused start")

    hostile = Hostile(unused, start_status=status, start_body=body)
    result, _ = await against(unused, hostile=hostile)
    assert words in failed(result, kind)
    started_once(hostile)


async def test_only_the_description_is_retried() -> None:
    def flaky(attempt: int) -> tuple[int, bytes]:
        return (500, b"") if attempt < 3 else (200, description())

    async def hang_up(send: Send) -> None:
        await send(started())

    hostile = Hostile(hang_up, describe=flaky)
    result, _ = await against(hang_up, hostile=hostile)
    failed(result, ErrorKind.REMOTE_DISCONNECTED)
    assert hostile.requests["GET /v1/description"] == 3
    started_once(hostile)


async def test_a_description_that_is_not_enough_refuses_locally() -> None:
    async def unused(send: Send) -> None:
        raise AssertionError("nothing may be started")

    weak = Hostile(unused, describe=lambda _: (200, description(level=Level.PROCESS)))
    result, _ = await against(unused, hostile=weak)
    assert "nothing was sent" in failed(result, ErrorKind.ISOLATION_UNAVAILABLE)
    assert "POST /v1/executions" not in weak.requests

    from psych_sandbox_core import ExecutionLimits

    small = Hostile(
        unused, describe=lambda _: (200, description(limits=ExecutionLimits(cpu_seconds=5)))
    )
    result, _ = await against(unused, hostile=small)
    message = failed(result, ErrorKind.POLICY_REFUSED)
    assert "cpu_seconds: 10 asked, at most 5 offered" in message
    assert "POST /v1/executions" not in small.requests


async def test_an_unreachable_service_sends_nothing() -> None:
    # A port nothing listens on: the description cannot be read, so nothing is started.
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    await listener.aclose()
    config = client_config(f"http://127.0.0.1:{port}", options={"stall_seconds": 2.0})
    result = await run(config, "print('never')")
    assert result.error is not None
    assert result.error.kind is ErrorKind.BACKEND_NOT_READY, result.error
    assert "nothing was sent" in result.error.message


async def test_a_service_whose_child_reports_less_is_refused_before_the_program() -> None:
    # The description says isolated; the child's own report (a readable canary, the network
    # reachable) says otherwise: the core refuses, and the program is never sent.
    async def weak(send: Send) -> None:
        await send(started(filesystem_boundary=True, network_namespace=True))
        await send(channel(hello(65534, canary_readable=True)))
        await anyio.sleep_forever()

    hostile = Hostile(weak)
    result, _ = await against(weak, hostile=hostile)
    message = failed(result, ErrorKind.ISOLATION_UNAVAILABLE)
    assert "isolated" in message
    assert result.grades["filesystem"] == "unavailable"
    # What reached the child's channel was an abort, never the program.
    assert [json.loads(body)["type"] for body in hostile.channel_bodies] == ["abort"]
    started_once(hostile)
