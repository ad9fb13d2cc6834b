"""A small, strict HTTP/1.1 client for the container engine's API on its Unix socket.

Spawning the engine's CLI costs tens of milliseconds per command (a Go binary starts, reads
its configuration and negotiates the API version); the hot path of an execution speaks to
the engine directly instead. Only what this plugin needs is implemented: one request per
connection, ``Content-Length``, chunked and read-to-close bodies, connection upgrade (the
attach stream), and the engine's multiplexed output frames.

The engine is trusted to run containers, but its bytes are still parsed as hostile input:
every line, header block, chunk and body has a ceiling, every request a deadline, and any
malformed byte ends the exchange with :class:`EngineProtocolError` naming what was wrong.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass
from urllib.parse import quote, urlencode

import anyio
from anyio.abc import ByteReceiveStream, ByteStream
from anyio.streams.buffered import BufferedByteReceiveStream
from psych_sandbox_core.kit.posix import (
    SocketByteStream,
)

#: API version spoken. 1.40 (Docker 19.03) has every field this plugin sends; newer Docker
#: engines accept it, and Podman's compatible API serves every version prefix.
API_VERSION = "v1.40"
#: One status line or header line. Real ones are under 200 bytes.
MAX_LINE_BYTES = 8 * 1024
#: The whole header block of a response. The engine sends fewer than ten short headers.
MAX_HEADER_BYTES = 32 * 1024
MAX_HEADERS = 64
#: Any response body. The largest read here is a container's inspection, which repeats the
#: bootstrap's command line (tens of KiB); the rest are a few hundred bytes.
MAX_BODY_BYTES = 4 * 1024 * 1024
#: One frame of the multiplexed output stream. The engine copies output in 32 KiB pieces.
MAX_FRAME_BYTES = 1024 * 1024
#: Deadline of one request/response exchange (not of a long-lived stream).
REQUEST_SECONDS = 20.0

_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-5][0-9][0-9])(?: ([\x20-\x7e\t]*))?")
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_FIELD_VALUE = re.compile(rb"[\x20-\x7e\t\x80-\xff]*")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,8})(?:;[\x20-\x7e\t]*)?")
#: Multiplexed stream types: 1 is the container's stdout, 2 its stderr (0, stdin, is never
#: sent back; anything else is not in the format).
STDOUT, STDERR = 1, 2
_FRAME_HEADER = struct.Struct(">BxxxI")


class EngineError(Exception):
    """The engine could not be reached or answered with an error."""


class EngineUnreachable(EngineError):
    """No connection to the engine's socket, or it did not answer in time."""


class EngineProtocolError(EngineError):
    """The engine's bytes broke HTTP/1.1 or the stream format: hostile or broken input."""


class EngineStatusError(EngineError):
    """The engine answered a request with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Response:
    status: int
    reason: str
    #: Header names lower-cased; a repeated header keeps its last value.
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise EngineProtocolError(f"the engine's response is not JSON: {exc}") from None


def engine_socket(engine: str) -> str | None:
    """The Unix socket of the engine's API, or None if there is none to use here.

    ``DOCKER_HOST`` (or ``CONTAINER_HOST`` for Podman) wins when it names a ``unix://`` path;
    a TCP or SSH endpoint is not spoken to directly.
    """
    variables = ("DOCKER_HOST",) if engine == "docker" else ("CONTAINER_HOST", "DOCKER_HOST")
    for variable in variables:
        value = os.environ.get(variable)
        if value:
            return value[len("unix://") :] if value.startswith("unix://") else None
    if engine == "docker":
        candidates = ["/var/run/docker.sock", "/run/docker.sock"]
    else:
        runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
        candidates = [f"{runtime_dir}/podman/podman.sock"] if runtime_dir else []
        candidates += ["/run/podman/podman.sock", "/var/run/docker.sock"]
    for candidate in candidates:
        if os.path.exists(candidate):
            return candidate
    return None


def _request_bytes(method: str, target: str, body: bytes | None, upgrade: bool) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: engine"]
    if upgrade:
        lines += ["Connection: Upgrade", "Upgrade: tcp"]
    else:
        lines.append("Connection: close")
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    elif method in ("POST", "PUT"):
        lines.append("Content-Length: 0")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
    return head + (body or b"")


class _Reader:
    """Reads one HTTP/1.1 response from a buffered stream, bounding everything."""

    def __init__(self, stream: BufferedByteReceiveStream) -> None:
        self.stream = stream

    async def _line(self, limit: int, what: str) -> bytes:
        try:
            line = await self.stream.receive_until(b"\r\n", limit)
        except anyio.DelimiterNotFound:
            raise EngineProtocolError(
                f"the engine sent a {what} longer than {limit} bytes"
            ) from None
        except (anyio.IncompleteRead, anyio.EndOfStream):
            raise EngineProtocolError(f"the engine closed the connection inside a {what}") from None
        # The delimiter may arrive in the same read as an overlong line.
        if len(line) > limit:
            raise EngineProtocolError(f"the engine sent a {what} longer than {limit} bytes")
        return line

    async def _exactly(self, size: int, what: str) -> bytes:
        try:
            return await self.stream.receive_exactly(size)
        except (anyio.IncompleteRead, anyio.EndOfStream):
            raise EngineProtocolError(f"the engine closed the connection inside a {what}") from None

    async def head(self) -> tuple[int, str, dict[str, str]]:
        line = await self._line(MAX_LINE_BYTES, "status line")
        match = _STATUS_LINE.fullmatch(line)
        if match is None:
            raise EngineProtocolError(f"the engine sent a malformed status line: {line[:80]!r}")
        status = int(match.group(1))
        reason = (match.group(2) or b"").decode("latin-1")
        headers: dict[str, str] = {}
        total = len(line)
        count = 0
        while True:
            line = await self._line(MAX_LINE_BYTES, "header line")
            if not line:
                break
            total += len(line) + 2
            count += 1
            if total > MAX_HEADER_BYTES or count > MAX_HEADERS:
                raise EngineProtocolError(
                    f"the engine sent more than {MAX_HEADER_BYTES} bytes or {MAX_HEADERS} "
                    "header lines"
                )
            name, sep, value = line.partition(b":")
            if not sep or not _TOKEN.fullmatch(name):
                raise EngineProtocolError(f"the engine sent a malformed header: {line[:80]!r}")
            value = value.strip(b" \t")
            if not _FIELD_VALUE.fullmatch(value):
                raise EngineProtocolError(f"the engine sent a control byte in header {name!r}")
            headers[name.decode("ascii").lower()] = value.decode("latin-1")
        return status, reason, headers

    async def body(self, headers: dict[str, str], limit: int) -> bytes:
        encoding = headers.get("transfer-encoding")
        if encoding is not None:
            if encoding.lower() != "chunked":
                raise EngineProtocolError(f"unsupported transfer encoding {encoding!r}")
            return await self._chunked(limit)
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit() or len(length) > 12:
                raise EngineProtocolError(f"malformed Content-Length {length[:40]!r}")
            size = int(length)
            if size > limit:
                raise EngineProtocolError(
                    f"the engine's response body of {size} bytes exceeds {limit}"
                )
            return await self._exactly(size, "response body")
        # Neither: the body runs to the end of the connection (we asked for it to close).
        data = bytearray()
        while True:
            try:
                data += await self.stream.receive(limit + 1 - len(data))
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return bytes(data)
            if len(data) > limit:
                raise EngineProtocolError(f"the engine's response body exceeds {limit} bytes")

    async def _chunked(self, limit: int) -> bytes:
        data = bytearray()
        while True:
            line = await self._line(MAX_LINE_BYTES, "chunk size line")
            match = _CHUNK_SIZE.fullmatch(line)
            if match is None:
                raise EngineProtocolError(f"the engine sent a malformed chunk size {line[:40]!r}")
            size = int(match.group(1), 16)
            if size == 0:
                break
            if len(data) + size > limit:
                raise EngineProtocolError(f"the engine's chunked body exceeds {limit} bytes")
            data += await self._exactly(size, "chunk")
            if await self._exactly(2, "chunk terminator") != b"\r\n":
                raise EngineProtocolError(
                    "a chunk of the engine's response is not followed by CRLF (its size line lied)"
                )
        trailers = 0
        while await self._line(MAX_LINE_BYTES, "trailer line"):
            trailers += 1
            if trailers > MAX_HEADERS:
                raise EngineProtocolError("the engine sent too many trailer lines")
        return bytes(data)


class EngineClient:
    """Requests to one engine's API socket: one connection per request, each bounded."""

    def __init__(self, socket_path: str, *, version: str = API_VERSION) -> None:
        self.socket_path = socket_path
        self.version = version

    def target(self, path: str, query: dict[str, str] | None = None) -> str:
        target = f"/{self.version}{path}"
        if query:
            target += "?" + urlencode(query)
        return target

    async def _connect(self) -> ByteStream:
        try:
            return await SocketByteStream.connect_unix(self.socket_path)
        except OSError as exc:
            raise EngineUnreachable(
                f"cannot connect to the engine at {self.socket_path}: {exc}"
            ) from exc

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: object = None,
        timeout: float = REQUEST_SECONDS,
        limit: int = MAX_BODY_BYTES,
    ) -> Response:
        """One request, its whole response read (bounded); raises EngineStatusError for a
        status of 400 or above."""
        payload = None if body is None else json.dumps(body).encode()
        try:
            with anyio.fail_after(timeout):
                stream = await self._connect()
                async with stream:
                    await stream.send(
                        _request_bytes(method, self.target(path, query), payload, upgrade=False)
                    )
                    reader = _Reader(BufferedByteReceiveStream(stream))
                    status, reason, headers = await reader.head()
                    if 100 <= status < 200:
                        raise EngineProtocolError(f"unexpected interim status {status}")
                    data = b"" if status in (204, 304) else await reader.body(headers, limit)
        except TimeoutError:
            raise EngineUnreachable(
                f"the engine did not answer {method} {path} within {timeout:g} s"
            ) from None
        except (anyio.BrokenResourceError, anyio.EndOfStream, OSError) as exc:
            raise EngineUnreachable(
                f"the engine's connection broke during {method} {path}: {exc or type(exc).__name__}"
            ) from exc
        response = Response(status, reason, headers, data)
        if status >= 400:
            raise EngineStatusError(status, _error_message(response))
        return response

    async def open(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        upgrade: bool = False,
        timeout: float = REQUEST_SECONDS,
    ) -> OpenResponse:
        """Send a request whose response outlives the call (a wait, an attach): return once
        its head has arrived. The caller reads the rest and closes it."""
        try:
            with anyio.fail_after(timeout):
                stream = await self._connect()
                try:
                    await stream.send(
                        _request_bytes(method, self.target(path, query), None, upgrade=upgrade)
                    )
                    buffered = BufferedByteReceiveStream(stream)
                    reader = _Reader(buffered)
                    status, reason, headers = await reader.head()
                except BaseException:
                    await anyio.aclose_forcefully(stream)
                    raise
        except TimeoutError:
            raise EngineUnreachable(
                f"the engine did not answer {method} {path} within {timeout:g} s"
            ) from None
        except (anyio.BrokenResourceError, anyio.EndOfStream, OSError) as exc:
            raise EngineUnreachable(
                f"the engine's connection broke during {method} {path}: {exc or type(exc).__name__}"
            ) from exc
        opened = OpenResponse(stream, reader, status, reason, headers)
        if status >= 400 or (upgrade and status not in (101, 200)):
            try:
                body = await opened.read_body(timeout=timeout)
            except EngineError:
                body = b""
            finally:
                await opened.aclose()
            raise EngineStatusError(status, _error_message(Response(status, reason, headers, body)))
        return opened


class _BytesStream(ByteReceiveStream):
    """Bytes already received, as a stream (to parse a body read in full beforehand)."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self._data:
            raise anyio.EndOfStream
        chunk, self._data = self._data[:max_bytes], self._data[max_bytes:]
        return chunk

    async def aclose(self) -> None:
        self._data = b""


class OpenResponse:
    """A response whose head was read; its body or upgraded stream follows.

    Its reads are safe to cancel and resume (several tasks may wait on one container's exit,
    and any of them may be cancelled): nothing received is lost between calls.
    """

    def __init__(
        self,
        stream: ByteStream,
        reader: _Reader,
        status: int,
        reason: str,
        headers: dict[str, str],
    ) -> None:
        self._stream = stream
        self._reader = reader
        self.status = status
        self.reason = reason
        self.headers = headers
        self._received = bytearray()
        self._frame_header: tuple[int, int] | None = None

    async def read_body(
        self, *, timeout: float | None = None, limit: int = MAX_BODY_BYTES
    ) -> bytes:
        """The whole body. The engine closes the connection after it (we asked it to), so
        the bytes are gathered to the end first, then parsed: a cancelled call loses
        nothing, and the next one carries on."""
        stream = self._reader.stream
        # Framing (chunk size lines, CRLFs) is small next to the body it frames.
        ceiling = limit + MAX_HEADER_BYTES
        try:
            with anyio.fail_after(timeout):
                while True:
                    try:
                        data = await stream.receive(ceiling + 1 - len(self._received))
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        break
                    self._received += data
                    if len(self._received) > ceiling:
                        raise EngineProtocolError(
                            f"the engine's response body exceeds {limit} bytes"
                        )
        except TimeoutError:
            raise EngineUnreachable("the engine's response did not complete in time") from None
        except (anyio.ClosedResourceError, OSError) as exc:
            raise EngineUnreachable(f"the engine's connection broke: {exc!r}") from exc
        reader = _Reader(BufferedByteReceiveStream(_BytesStream(bytes(self._received))))
        return await reader.body(self.headers, limit)

    async def read_frame(self) -> tuple[int, bytes] | None:
        """The next frame of an upgraded multiplexed output stream: (stream type, payload),
        or None at its clean end."""
        stream = self._reader.stream
        if self._frame_header is None:
            try:
                header = await stream.receive_exactly(_FRAME_HEADER.size)
            except anyio.IncompleteRead:
                if stream.buffer:
                    raise EngineProtocolError(
                        "the engine's output stream ended inside a frame header"
                    ) from None
                return None
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                return None
            if header[1:4] != b"\0\0\0":
                raise EngineProtocolError(f"malformed output frame header {header!r}")
            kind, size = _FRAME_HEADER.unpack(header)
            if kind not in (STDOUT, STDERR):
                raise EngineProtocolError(f"output frame of unknown stream type {kind}")
            if size > MAX_FRAME_BYTES:
                raise EngineProtocolError(f"output frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
            # Kept until the payload is in: a cancelled read resumes at the payload.
            self._frame_header = (kind, size)
        kind, size = self._frame_header
        try:
            payload = await stream.receive_exactly(size) if size else b""
        except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError):
            raise EngineProtocolError("the engine's output stream ended inside a frame") from None
        self._frame_header = None
        return kind, payload

    async def aclose(self) -> None:
        await anyio.aclose_forcefully(self._stream)


def _error_message(response: Response) -> str:
    try:
        parsed = json.loads(response.body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
        return str(parsed["message"])[:2000]
    text = response.body.decode("utf-8", "replace").strip()[:2000]
    return text or response.reason or "no reason given"


def path_segment(value: str) -> str:
    """A container id or name as one path segment."""
    return quote(value, safe="")
