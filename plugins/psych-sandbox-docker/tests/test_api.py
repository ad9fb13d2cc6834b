"""The engine API client against a fake engine on a real Unix socket: the engine's bytes are
hostile input too, so every malformed, oversized or truncated answer is a clear error, never a
hang or an unbounded read."""

from __future__ import annotations

import struct
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from anyio.abc import SocketStream

from psych_sandbox_docker import api

pytestmark = pytest.mark.anyio

OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"


@asynccontextmanager
async def fake_engine(
    answer: bytes | Callable[[SocketStream], object], *, close: bool = True
) -> AsyncIterator[tuple[api.EngineClient, list[bytes]]]:
    """Serve ``answer`` to every connection (after reading its request head) on a Unix socket
    in a fresh directory; yields a client for it and the request heads it saw."""
    seen: list[bytes] = []
    with tempfile.TemporaryDirectory(prefix="psych-fake-engine-") as directory:
        path = str(Path(directory) / "engine.sock")
        listener = await anyio.create_unix_listener(path)

        async def serve(stream: SocketStream) -> None:
            async with stream:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += await stream.receive()
                seen.append(head)
                if callable(answer):
                    await answer(stream)  # type: ignore[misc]
                else:
                    await stream.send(answer)
                if not close:
                    await anyio.sleep_forever()

        # The body's exception is raised outside the task group, so a test sees it as is.
        failure: BaseException | None = None
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, serve)
            try:
                yield api.EngineClient(path), seen
            except Exception as exc:
                failure = exc
            finally:
                tg.cancel_scope.cancel()
        if failure is not None:
            raise failure


async def test_content_length_and_chunked_bodies_are_read() -> None:
    answer = OK_HEAD + b'Content-Length: 11\r\n\r\n{"Id": "x"}'
    async with fake_engine(answer) as (client, seen):
        response = await client.request(
            "POST", "/containers/create", query={"name": "a b"}, body={"Image": "i"}
        )
    assert response.json() == {"Id": "x"}
    head = seen[0]
    assert head.startswith(b"POST /v1.40/containers/create?name=a+b HTTP/1.1\r\n")
    assert b"Content-Length: 14\r\n" in head
    chunked = (
        OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n"
    )
    async with fake_engine(chunked) as (client, _):
        assert (await client.request("GET", "/x")).body == b"hello world"
    async with fake_engine(b"HTTP/1.1 204 No Content\r\n\r\n") as (client, _):
        assert (await client.request("POST", "/containers/c/start")).status == 204


async def test_error_status_carries_the_engines_message() -> None:
    body = b'{"message":"No such image: nope:1"}'
    answer = b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    async with fake_engine(answer) as (client, _):
        with pytest.raises(api.EngineStatusError, match="No such image") as caught:
            await client.request("POST", "/containers/create", body={})
    assert caught.value.status == 404


@pytest.mark.parametrize(
    ("answer", "complaint"),
    [
        # One header line longer than any real one.
        (OK_HEAD + b"X-Big: " + b"a" * (api.MAX_LINE_BYTES + 1) + b"\r\n\r\n", "longer than"),
        # Many short lines adding up past the header block's ceiling.
        (OK_HEAD + b"X-A: b\r\n" * (api.MAX_HEADERS + 1) + b"\r\n", "header lines"),
        (b"HTTP/1.1 200 OK\r\n" + (b"X-" + b"b" * 4000 + b": c\r\n") * 9 + b"\r\n", "header"),
        (b"HTTP/9.9 200 OK\r\n\r\n", "malformed status line"),
        (b"\x00\x01garbage\r\n\r\n", "malformed status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header"),
        (b"HTTP/1.1 200 OK\r\nX-Bad: a\x01b\r\n\r\n", "control byte"),
        (OK_HEAD + b"Content-Length: -1\r\n\r\n", "malformed Content-Length"),
        (OK_HEAD + b"Content-Length: %d\r\n\r\n" % (api.MAX_BODY_BYTES + 1), "exceeds"),
        (OK_HEAD + b"Transfer-Encoding: gzip\r\n\r\n", "unsupported transfer encoding"),
        # Malformed chunks: a size that is not hex, a chunk longer than its size says, one
        # over the body ceiling.
        (
            OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
            "malformed chunk size",
        ),
        (
            OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n",
            "not followed by CRLF",
        ),
        (
            OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % (api.MAX_BODY_BYTES + 1),
            "exceeds",
        ),
        # Cut short: inside the head, inside a Content-Length body, inside a chunk.
        (b"HTTP/1.1 200 OK\r\nContent-Le", "closed the connection inside a header line"),
        (OK_HEAD + b'Content-Length: 100\r\n\r\n{"short"', "closed the connection inside"),
        (OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n10\r\nabc", "closed the connection"),
        (OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", "closed the connection"),
        (b"", "closed the connection inside a status line"),
    ],
)
async def test_hostile_responses_are_clear_errors(answer: bytes, complaint: str) -> None:
    async with fake_engine(answer) as (client, _):
        with pytest.raises(api.EngineProtocolError, match=complaint):
            await client.request("GET", "/containers/c/json", timeout=10)


async def test_body_read_to_close_is_bounded() -> None:
    async def flood(stream: SocketStream) -> None:
        await stream.send(b"HTTP/1.1 200 OK\r\n\r\n")
        for _ in range(20):
            await stream.send(b"x" * 65536)

    async with fake_engine(flood) as (client, _):
        with pytest.raises(api.EngineProtocolError, match="exceeds 1000 bytes"):
            await client.request("GET", "/x", limit=1000)


async def test_a_silent_engine_times_out() -> None:
    async with fake_engine(b"HTTP/1.1 200 OK\r\n", close=False) as (client, _):
        with pytest.raises(api.EngineUnreachable, match="did not answer"):
            await client.request("GET", "/x", timeout=0.3)


async def test_no_engine_is_unreachable() -> None:
    with tempfile.TemporaryDirectory() as directory:
        client = api.EngineClient(str(Path(directory) / "absent.sock"))
        with pytest.raises(api.EngineUnreachable, match="cannot connect"):
            await client.request("GET", "/_ping")


def frame(kind: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxI", kind, len(payload)) + payload


UPGRADED = b"HTTP/1.1 101 UPGRADED\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n"


async def read_frames(answer: bytes) -> list[tuple[int, bytes]]:
    async with fake_engine(answer) as (client, seen):
        opened = await client.open("POST", "/containers/c/attach", upgrade=True)
        try:
            frames = []
            while (got := await opened.read_frame()) is not None:
                frames.append(got)
            return frames
        finally:
            await opened.aclose()
            assert b"Upgrade: tcp\r\n" in seen[0]


async def test_multiplexed_output_frames_are_split_by_stream() -> None:
    frames = await read_frames(UPGRADED + frame(1, b"out") + frame(2, b"err") + frame(1, b""))
    assert frames == [(1, b"out"), (2, b"err"), (1, b"")]


@pytest.mark.parametrize(
    ("stream_bytes", "complaint"),
    [
        (frame(3, b"x"), "unknown stream type 3"),
        (frame(0, b"x"), "unknown stream type 0"),
        (b"\x01\x00\x07\x00\x00\x00\x00\x01x", "malformed output frame header"),
        (struct.pack(">BxxxI", 1, api.MAX_FRAME_BYTES + 1), "exceeds"),
        (frame(1, b"ok") + b"\x01\x00\x00", "ended inside a frame header"),
        (struct.pack(">BxxxI", 2, 100) + b"short", "ended inside a frame"),
    ],
)
async def test_hostile_output_frames_are_clear_errors(stream_bytes: bytes, complaint: str) -> None:
    with pytest.raises(api.EngineProtocolError, match=complaint):
        await read_frames(UPGRADED + stream_bytes)


async def test_attach_refused_is_a_status_error() -> None:
    body = b'{"message":"No such container: c"}'
    answer = b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    async with fake_engine(answer) as (client, _):
        with pytest.raises(api.EngineStatusError, match="No such container"):
            await client.open("POST", "/containers/c/attach", upgrade=True)


async def test_a_cancelled_wait_loses_nothing() -> None:
    """The exit report arrives in pieces; a reader cancelled between them is followed by one
    that still gets the whole answer."""
    first_sent = anyio.Event()
    go_on = anyio.Event()

    async def slow(stream: SocketStream) -> None:
        await stream.send(OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
        await stream.send(b'1d\r\n{"Error":null,')
        first_sent.set()
        await go_on.wait()
        await stream.send(b'"StatusCode":0}\r\n0\r\n\r\n')

    async with fake_engine(slow) as (client, _):
        opened = await client.open("POST", "/containers/c/wait")
        with anyio.move_on_after(0.2):
            await opened.read_body()
        assert first_sent.is_set()
        go_on.set()
        assert await opened.read_body(timeout=10) == b'{"Error":null,"StatusCode":0}'
        await opened.aclose()


def test_engine_socket_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///somewhere/engine.sock")
    assert api.engine_socket("docker") == "/somewhere/engine.sock"
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.1:2375")
    assert api.engine_socket("docker") is None
