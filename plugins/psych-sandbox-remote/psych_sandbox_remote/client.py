"""The client's transport for one remote execution: a :class:`Launched` over HTTP.

Everything the service sends is hostile (see stream.py): its events are parsed by the strict
models of wire.py, each must name this execution, and any failure of the transport ends the
execution with a failure kind of its own (remote_timeout, remote_disconnected,
remote_malformed, remote_error). Nothing here ever repeats a request that could run a
program. The credential is read from its environment variable at each request, put in the
Authorization header and nowhere else (not in a URL, a message or a record).
"""

from __future__ import annotations

import json
import math
import os
import ssl
from collections.abc import AsyncIterator, Generator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from functools import lru_cache

import anyio
import httpx
from anyio.abc import ByteReceiveStream, ByteStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from psych_sandbox_core.kit import (
    ChannelListener,
    ErrorKind,
    ExitStatus,
    Launched,
    LaunchRequest,
    Mechanisms,
    Relayed,
)
from pydantic import ValidationError

from .options import RemoteOptions
from .stream import LineSplitter, StreamCeilingSpent, lines_of
from .wire import (
    EVENT,
    MAX_REQUEST_BYTES,
    NDJSON,
    REMOTE_PROTOCOL_VERSION,
    Data,
    Description,
    Ended,
    ErrorBody,
    Failed,
    Started,
    StartRequest,
    Status,
    decode_data,
)

#: Connections the service's probe listeners saw that are replayed to this host's own
#: listeners, at most (one is enough to withhold the output).


@dataclass
class Endpoint:
    url: str
    #: When its description was read, and what it said.
    described: tuple[float, Description] | None = None
    #: Not chosen first before this time (monotonic): it failed lately.
    down_until: float = 0.0


class MissingCredential(Exception):
    """The token's environment variable is not set (its name only is said)."""


class _Bearer(httpx.Auth):
    """Reads the token at each request; it exists only in the request's header."""

    def __init__(self, variable: str | None) -> None:
        self._variable = variable

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        if self._variable is not None:
            token = os.environ.get(self._variable)
            if not token:
                raise MissingCredential(f"the environment variable {self._variable} is not set")
            request.headers["Authorization"] = f"Bearer {token}"
        yield request


@lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    """The system's trust store, loaded once: loading it costs more than a loopback
    execution's round trip."""
    return ssl.create_default_context()


def http_client(endpoint: Endpoint, options: RemoteOptions) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        verify=_tls_context(),
        base_url=endpoint.url.rstrip("/"),
        auth=_Bearer(options.token_env),
        # Nothing from this process's environment: no proxy, no .netrc credentials.
        trust_env=False,
        timeout=httpx.Timeout(options.stall_seconds, connect=options.connect_seconds),
        # The ceilings are on the bytes as sent: no decompression in between.
        headers={"Accept-Encoding": "identity"},
        follow_redirects=False,
    )


async def read_description(
    endpoint: Endpoint, options: RemoteOptions
) -> tuple[Description | None, str]:
    """The service's description, or None and why not (one attempt)."""
    try:
        async with (
            http_client(endpoint, options) as client,
            client.stream("GET", "/v1/description") as response,
        ):
            body = await _bounded_body(response, MAX_REQUEST_BYTES)
            if response.status_code != 200:
                return None, f"answered {response.status_code}"
            return Description.model_validate_json(body), ""
    except MissingCredential as exc:
        return None, str(exc)
    except (httpx.HTTPError, OSError) as exc:
        return None, _transport_problem(exc)
    except (ValidationError, _TooLarge):
        return None, "its description is malformed"


async def _bounded_body(response: httpx.Response, ceiling: int) -> bytes:
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > ceiling:
            raise _TooLarge()
    return bytes(body)


class _TooLarge(Exception):
    pass


def _transport_problem(exc: BaseException) -> str:
    # The class name and httpx's own wording: never a header, never the token.
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    if isinstance(exc, httpx.ConnectError):
        return "connection refused or unreachable"
    return f"transport error ({type(exc).__name__})"


class _Pipe(ByteReceiveStream):
    """Bytes the reader relays, received by the core like a local child's stream."""

    def __init__(self, receive: MemoryObjectReceiveStream[bytes]) -> None:
        self._receive = receive
        #: What a relayed chunk held beyond what the last receive asked for.
        self._rest = b""

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self._rest:
            try:
                self._rest = await self._receive.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                raise anyio.EndOfStream from None
        data, self._rest = self._rest[:max_bytes], self._rest[max_bytes:]
        return data

    async def aclose(self) -> None:
        self._receive.close()


def _pipe() -> tuple[MemoryObjectSendStream[bytes], _Pipe]:
    # Unbounded: what may be buffered is bounded by the whole-stream byte ceiling.
    send, receive = anyio.create_memory_object_stream[bytes](math.inf)
    return send, _Pipe(receive)


class _ChannelStream(ByteStream):
    """The child's control channel as the core's FrameChannel sees it."""

    def __init__(self, execution: RemoteExecution, pipe: _Pipe) -> None:
        self._execution = execution
        self._pipe = pipe

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self._pipe.receive(max_bytes)

    async def send(self, item: bytes) -> None:
        await self._execution.send_channel(item)

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        await self._pipe.aclose()


class _Channel(ChannelListener):
    child_spec = "remote"

    def __init__(self, execution: RemoteExecution, pipe: _Pipe) -> None:
        self._execution = execution
        self._stream = _ChannelStream(execution, pipe)

    async def accept(self) -> ByteStream:
        # The service has accepted the child's connection; its bytes come with the events.
        await self._execution.started.wait()
        return self._stream

    async def aclose(self) -> None:
        await self._stream.aclose()


class RemoteExecution(Launched, Relayed):
    """One child on a service, as the core's host drives it."""

    def __init__(self, endpoint: Endpoint, options: RemoteOptions, request: LaunchRequest):
        self.endpoint = endpoint
        self.options = options
        self.request = request
        self.mechanisms = Mechanisms()
        self.execution_id: str | None = None
        self.host_uid: int | None = None
        #: The first failure of the transport (kind, message); it decides the failure.
        self.failure: tuple[ErrorKind, str] | None = None
        self.started = anyio.Event()
        self.exited = anyio.Event()
        #: The reader has finished (the stream ended, or failed).
        self.ended = anyio.Event()
        self._end_seen = False
        self._stdout_send, self.stdout = _pipe()
        #: Per stream, the bytes and newlines the service counted but did not relay.
        self._unrelayed: dict[str, tuple[int, int]] = {}
        #: Connections the service's own probe listeners saw (its report after finish).
        self._connections = 0
        self._stderr_send, self.stderr = _pipe()
        self._channel_send, channel_pipe = _pipe()
        self.channel = _Channel(self, channel_pipe)
        self._client: httpx.AsyncClient | None = None
        self._send_lock = anyio.Lock()
        self._status: ExitStatus | None = None

    # ---------------------------------------------------------------- lifecycle

    def refuse(self, kind: ErrorKind, message: str) -> None:
        """End before anything was sent: the core reports ``kind`` as the failure."""
        self._fail(kind, message)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[RemoteExecution]:
        async with http_client(self.endpoint, self.options) as client:
            self._client = client
            # Shielded: the core's own cancellation must not cut the relay while it tears
            # the execution down; only leaving ``running`` cancels it. So nothing between
            # the reader's start and the ``finally`` below may wait: a cancellation there
            # (the Sandbox closing while a child is being prepared) would leave the reader
            # relaying an execution nobody finishes, until the service's overdue deadline.
            reader = anyio.CancelScope(shield=True)
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._read, reader)
                try:
                    yield self
                finally:
                    with anyio.CancelScope(shield=True):
                        # A run the core did not finish (it failed or left before) is
                        # finished here, also one the service had yet to report started.
                        with anyio.move_on_after(self.options.stall_seconds):
                            await self.started.wait()
                        await self.finish()
                        with anyio.move_on_after(self.options.stall_seconds):
                            await self.ended.wait()
                        reader.cancel()

    async def _read(self, scope: anyio.CancelScope) -> None:
        with scope:
            try:
                await self._stream()
            except StreamCeilingSpent as exc:
                self._fail(ErrorKind.REMOTE_MALFORMED, str(exc))
            except (ValidationError, ValueError) as exc:
                self._fail(ErrorKind.REMOTE_MALFORMED, _malformed(exc))
            except TimeoutError:
                self._fail(
                    ErrorKind.REMOTE_TIMEOUT,
                    f"the service sent nothing for {self.options.stall_seconds:g} s (not even "
                    "its heartbeat)",
                )
            except httpx.TimeoutException:
                self._fail(ErrorKind.REMOTE_TIMEOUT, "the service did not answer in time")
            except MissingCredential as exc:
                self._fail(ErrorKind.BACKEND_NOT_READY, str(exc))
            except (httpx.HTTPError, OSError) as exc:
                self._fail(
                    ErrorKind.REMOTE_DISCONNECTED,
                    f"the connection to the service was lost: {_transport_problem(exc)}",
                )
            finally:
                self._close_pipes()
                self.started.set()
                self.exited.set()
                self.ended.set()
        if scope.cancelled_caught and not self._end_seen:
            self._fail(ErrorKind.REMOTE_DISCONNECTED, "the stream was closed by this client")

    async def _stream(self) -> None:
        assert self._client is not None
        start = StartRequest(protocol=REMOTE_PROTOCOL_VERSION, limits=self.request.limits)
        async with self._client.stream(
            "POST",
            "/v1/executions",
            content=start.model_dump_json(),
            headers={"Content-Type": "application/json"},
            timeout=httpx.Timeout(self.options.stall_seconds, connect=self.options.connect_seconds),
        ) as response:
            if response.status_code != 200:
                self._fail(*await _refused(response))
                return
            if response.headers.get("content-type", "").split(";")[0].strip() != NDJSON:
                raise ValueError("the service's stream is not NDJSON")
            splitter = LineSplitter(self.options.ceilings)
            lines = lines_of(
                response.aiter_raw(), splitter, stall_seconds=self.options.stall_seconds
            )
            # Read to the stream's own end (the service closes it after its end event), so
            # nothing of the HTTP stack is left half-read.
            async with aclosing(lines):
                async for line in lines:
                    self._on_event(line)
            if not self._end_seen:
                self._fail(
                    ErrorKind.REMOTE_DISCONNECTED,
                    "the service closed the stream before the execution ended",
                )

    def _on_event(self, line: bytes) -> None:
        event = EVENT.validate_json(line)
        if self._end_seen:
            raise ValueError(f"a {event.type!r} event after the end of the execution")
        if self.execution_id is None:
            if not isinstance(event, Started):
                raise ValueError(f"the stream began with a {event.type!r} event, not 'started'")
            self.execution_id = event.execution
            self.host_uid = event.host_uid
            self.mechanisms = event.mechanisms
            self.started.set()
            return
        if event.execution != self.execution_id:
            raise ValueError(
                "the service sent an event for another execution than the one it started"
            )
        if isinstance(event, Data):
            data = decode_data(event)
            if not data:
                return  # nothing, and never an end of stream: that has events of its own
            if event.type == "channel":
                self._channel_send.send_nowait(data)
            elif event.type == "stdout":
                self._stdout_send.send_nowait(data)
            else:
                self._stderr_send.send_nowait(data)
        elif isinstance(event, Ended):
            if event.type == "channel_end":
                self._channel_send.close()
            elif event.type in ("stdout_end", "stderr_end"):
                stream = event.type[: -len("_end")]
                self._unrelayed[stream] = (event.skipped_bytes, event.skipped_newlines)
                (self._stdout_send if stream == "stdout" else self._stderr_send).close()
            elif event.type == "exited":
                self.exited.set()
        elif isinstance(event, Failed):
            self._fail(
                ErrorKind.BACKEND_NOT_READY,
                f"the service could not start a sandbox: {event.message}",
            )
        elif isinstance(event, Started):
            raise ValueError("a second 'started' event")
        elif isinstance(event, Status):
            raise ValueError("a status event in the stream (it answers a finish request)")
        else:
            self._end_seen = True

    def _fail(self, kind: ErrorKind, message: str) -> None:
        if self.failure is None:
            self.failure = (kind, message)
        self._close_pipes()
        self.started.set()
        self.exited.set()

    def _close_pipes(self) -> None:
        for send in (self._stdout_send, self._stderr_send, self._channel_send):
            send.close()

    async def close(self) -> None:
        """Both ends of every relay: nothing of this execution is held past its launch."""
        self._close_pipes()
        await self.stdout.aclose()
        await self.stderr.aclose()
        await self.channel.aclose()

    # ---------------------------------------------------------------- requests

    async def _post(self, path: str, body: bytes, timeout: float) -> httpx.Response | None:
        """One control request for this execution; None (and the failure recorded) when the
        transport failed."""
        if self._client is None or self.execution_id is None:
            return None
        try:
            # Not cut short by a cancellation: a request abandoned mid-send leaves its body's
            # iterator unclosed in httpx, and the service may act on it anyway. Its own
            # timeouts bound it.
            with anyio.CancelScope(shield=True):
                response = await self._client.post(
                    f"/v1/executions/{self.execution_id}/{path}",
                    content=body,
                    timeout=httpx.Timeout(timeout, connect=self.options.connect_seconds),
                )
        except MissingCredential as exc:
            self._fail(ErrorKind.BACKEND_NOT_READY, str(exc))
            return None
        except httpx.TimeoutException:
            self._fail(ErrorKind.REMOTE_TIMEOUT, f"the service did not answer its {path} request")
            return None
        except (httpx.HTTPError, OSError) as exc:
            self._fail(
                ErrorKind.REMOTE_DISCONNECTED,
                f"the {path} request failed: {_transport_problem(exc)}",
            )
            return None
        if response.status_code not in (200, 204):
            if self.failure is None and not self.ended.is_set():
                self._fail(*_refused_body(response.status_code, response.content))
            return None
        return response

    async def send_channel(self, data: bytes) -> None:
        async with self._send_lock:
            if self.failure is not None or self.ended.is_set():
                raise anyio.BrokenResourceError("the remote execution has ended")
            response = await self._post("channel", data, self.options.stall_seconds)
            if response is None:
                raise anyio.BrokenResourceError("the remote execution has ended")

    async def wait_exited(self) -> None:
        await self.exited.wait()

    def connections_elsewhere(self) -> int:
        return self._connections

    def unrelayed(self, stream: str) -> tuple[int, int]:
        return self._unrelayed.get(stream, (0, 0))

    async def terminate(self, grace_seconds: float) -> None:
        if self.failure is None and not self.ended.is_set():
            body = json.dumps({"grace_seconds": grace_seconds}).encode()
            await self._post("terminate", body, grace_seconds + self.options.stall_seconds)

    async def finish(self) -> ExitStatus:
        if self._status is not None:
            return self._status
        status: Status | None = None
        if self.failure is None and self.execution_id is not None and not self.ended.is_set():
            response = await self._post("finish", b"{}", self.options.stall_seconds * 3)
            if response is not None:
                try:
                    status = Status.model_validate_json(response.content)
                    if status.execution != self.execution_id:
                        raise ValueError("a status for another execution")
                except (ValidationError, ValueError) as exc:
                    self._fail(ErrorKind.REMOTE_MALFORMED, _malformed(exc))
                    status = None
        self._status = self._take_status(status)
        return self._status

    def _take_status(self, status: Status | None) -> ExitStatus:
        """How the child ended, from the service's status (None: it gave none); the
        connections its listeners saw are kept for the core (connections_elsewhere)."""
        if status is not None:
            self._connections = status.connections
        hint = self.failure
        if hint is None and status is not None and status.hint_kind is not None:
            try:
                hint = (ErrorKind(status.hint_kind), status.hint_message or status.hint_kind)
            except ValueError:
                hint = None
        if status is None:
            if hint is None:
                hint = (ErrorKind.REMOTE_DISCONNECTED, "the service never reported how it ended")
            return ExitStatus(
                code=None, signal=None, cpu_seconds=None, peak_memory_bytes=None, failure_hint=hint
            )
        return ExitStatus(
            code=status.code,
            signal=status.signal,
            cpu_seconds=status.cpu_seconds,
            peak_memory_bytes=status.peak_memory_bytes,
            failure_hint=hint,
        )


async def _refused(response: httpx.Response) -> tuple[ErrorKind, str]:
    try:
        body = await _bounded_body(response, MAX_REQUEST_BYTES)
    except _TooLarge:
        return ErrorKind.REMOTE_MALFORMED, (
            f"the service answered {response.status_code} with an oversized body"
        )
    return _refused_body(response.status_code, body)


def _refused_body(status: int, body: bytes) -> tuple[ErrorKind, str]:
    """The failure an error status stands for; the body's code decides, its message is
    quoted (bounded by its model)."""
    try:
        error = ErrorBody.model_validate_json(body[:MAX_REQUEST_BYTES])
    except ValidationError:
        return ErrorKind.REMOTE_ERROR, f"the service answered {status}; nothing was run"
    if error.error == "terms":
        return ErrorKind.POLICY_REFUSED, (
            f"the service cannot meet these terms: {error.message}; nothing was run"
        )
    if error.error == "full":
        return ErrorKind.REMOTE_ERROR, (
            f"the service is at capacity: {error.message}; nothing was run, try again later"
        )
    return ErrorKind.REMOTE_ERROR, f"the service refused ({status} {error.error}): {error.message}"


def _malformed(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False, include_input=False)[:1]
        where = ".".join(str(part) for part in first[0]["loc"]) if first else "?"
        return f"the service sent a malformed event (at {where or 'the top level'})"
    return f"the service broke the protocol: {exc}"
