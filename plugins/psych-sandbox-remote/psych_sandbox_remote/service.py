"""``psych-sandbox serve``'s ASGI application: one local profile exposed as a remote service.

For each execution the service launches a child under its profile's backend, with its own
bootstrap and its own probe targets (a canary and loopback listeners on this machine, where
the evidence is), and relays the child's bytes to the client as NDJSON events (see wire.py).
It never reads a program, answers a binding or counts anything: the client's host does, over
the relayed channel. What it decides is who may start a child (a tenant's token), on what
terms (the profile's caps narrowed by the tenant's policy, refused with an error before
anything starts), and whether it has room (refused, never queued without bound).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import ByteReceiveStream, ByteStream
from anyio.streams.memory import MemoryObjectSendStream
from psych_sandbox_core.kit import (
    Backend,
    BackendUnavailable,
    ExecutionLimits,
    ExitStatus,
    Launched,
    LaunchRequest,
    Level,
)
from psych_sandbox_core.kit.posix import (
    SocketByteStream,
)
from psych_sandbox_core.kit.relay import (
    HANDSHAKE_SECONDS,
    MAX_HOST_FRAME_BYTES,
    PROTOCOL_VERSION,
    AbortFrame,
    ProbeHarness,
    RunFrame,
    bootstrap_source,
    decode_host_frame,
)
from pydantic import ValidationError

from .tenants import Tenant, Tenants
from .wire import (
    HEARTBEAT_SECONDS,
    MAX_CHANNEL_REQUEST_BYTES,
    MAX_COUNT,
    MAX_MESSAGE_CHARS,
    MAX_REQUEST_BYTES,
    NDJSON,
    RELAY_CHUNK_BYTES,
    REMOTE_PROTOCOL_VERSION,
    Description,
    End,
    Ended,
    ErrorBody,
    Failed,
    Started,
    StartRequest,
    Status,
    data_event,
    encode_event,
    unmet_limits,
)

_log = logging.getLogger("psych_sandbox_remote.service")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: Events buffered for a slow client before the relay waits (and so the child with it).
EVENT_BUFFER = 64
#: After the child was finished, how long its streams may take to reach their ends.
DRAIN_SECONDS = 2.0
#: Beyond the execution's own wall clock (which covers its handshake) and grace: the
#: service ends a child whose client never finishes it (the client's clock is the client's,
#: and a client can be hostile; this one is ours).
OVERDUE_SLACK_SECONDS = 5.0


@dataclass(frozen=True)
class ServedProfile:
    """What the service runs and what it can promise, established at start-up."""

    name: str
    backend: Backend
    backend_label: str
    caps: ExecutionLimits
    allow_network: bool
    level: Level
    grades: dict[str, str]


@dataclass
class Load:
    """What an autoscaler reads: executions running, the most it runs, refusals by reason."""

    capacity: int
    in_flight: int = 0
    started_total: int = 0
    refusals: dict[str, int] = field(default_factory=dict)

    def refuse(self, reason: str) -> None:
        self.refusals[reason] = self.refusals.get(reason, 0) + 1

    def prometheus(self) -> str:
        lines = [
            "# HELP psych_sandbox_executions_in_flight Executions running now.",
            "# TYPE psych_sandbox_executions_in_flight gauge",
            f"psych_sandbox_executions_in_flight {self.in_flight}",
            "# HELP psych_sandbox_executions_capacity Executions this server runs at once.",
            "# TYPE psych_sandbox_executions_capacity gauge",
            f"psych_sandbox_executions_capacity {self.capacity}",
            "# HELP psych_sandbox_executions_queued Executions waiting (none: refused instead).",
            "# TYPE psych_sandbox_executions_queued gauge",
            "psych_sandbox_executions_queued 0",
            "# HELP psych_sandbox_executions_started_total Executions started.",
            "# TYPE psych_sandbox_executions_started_total counter",
            f"psych_sandbox_executions_started_total {self.started_total}",
            "# HELP psych_sandbox_refusals_total Requests refused, by reason.",
            "# TYPE psych_sandbox_refusals_total counter",
        ]
        for reason in ("full", "terms", "unauthorized"):
            lines.append(
                f'psych_sandbox_refusals_total{{reason="{reason}"}} {self.refusals.get(reason, 0)}'
            )
        return "\n".join(lines) + "\n"


class _Execution:
    """One child on this service, driven by its stream's request and its control requests."""

    def __init__(
        self,
        tenant: str,
        limits: ExecutionLimits,
        emit: MemoryObjectSendStream[bytes],
        handshake_seconds: float = HANDSHAKE_SECONDS,
    ):
        self.id = secrets.token_hex(16)
        self.handshake_seconds = handshake_seconds
        self.tenant = tenant
        self.limits = limits
        self._emit = emit
        self._launched: Launched | None = None
        self._channel: ByteStream | None = None
        self._accepted = anyio.Event()
        self._channel_lock = anyio.Lock()
        self._finish_requested = anyio.Event()
        #: The host's first frame, until it is whole and checked.
        self._first_frame: bytearray | None = bytearray()
        self._done = anyio.Event()
        self.status: Status | None = None

    async def run(self, backend: Backend) -> None:
        try:
            await self._run(backend)
        finally:
            # A finish request waiting must not wait for ever, whatever went wrong.
            self._done.set()

    async def _run(self, backend: Backend) -> None:
        status: ExitStatus | None = None
        failure: str | None = None
        async with ProbeHarness().active() as harness:
            request = LaunchRequest(
                bootstrap_source=bootstrap_source(),
                targets=harness.made,
                limits=self.limits,
                runs_as=harness.attribute_to,
            )
            try:
                async with backend.launch(request) as launched:
                    self._launched = launched
                    await self._emit.send(
                        encode_event(
                            Started(
                                type="started",
                                execution=self.id,
                                mechanisms=launched.mechanisms,
                                host_uid=os.getuid(),
                            )
                        )
                    )
                    status = await self._relay(launched)
            except BackendUnavailable as exc:
                failure = str(exc)[:MAX_MESSAGE_CHARS]
            finally:
                self._launched = None
            connections = harness.connections
        if failure is not None:
            await self._emit.send(
                encode_event(Failed(type="failed", execution=self.id, message=failure))
            )
            # A client waiting to finish learns how it ended: it never started.
            status = ExitStatus(code=None, signal=None, cpu_seconds=None, peak_memory_bytes=None)
        assert status is not None
        hint = status.failure_hint
        self.status = Status(
            type="status",
            execution=self.id,
            code=status.code,
            signal=status.signal,
            cpu_seconds=status.cpu_seconds,
            peak_memory_bytes=status.peak_memory_bytes,
            hint_kind=None if hint is None else hint[0].value,
            hint_message=None if hint is None else hint[1][:MAX_MESSAGE_CHARS],
            connections=connections,
        )
        self._done.set()
        await self._emit.send(encode_event(End(type="end", execution=self.id)))

    async def _relay(self, launched: Launched) -> ExitStatus:
        ends = [anyio.Event(), anyio.Event()]
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._relay_output, launched.stdout, "stdout", ends[0])
            tg.start_soon(self._relay_output, launched.stderr, "stderr", ends[1])
            tg.start_soon(self._relay_channel, launched)
            tg.start_soon(self._watch_exit, launched)
            tg.start_soon(self._heartbeat)
            overdue = False
            try:
                with anyio.move_on_after(self._deadline_seconds()) as clock:
                    await self._finish_requested.wait()
                overdue = clock.cancelled_caught
            finally:
                with anyio.CancelScope(shield=True):
                    if overdue:
                        await launched.terminate(self.limits.grace_seconds)
                    status = await launched.finish()
                    with anyio.move_on_after(DRAIN_SECONDS):
                        for end in ends:
                            await end.wait()
                    tg.cancel_scope.cancel()
        return status

    def _deadline_seconds(self) -> float:
        limits = self.limits
        return (
            self.handshake_seconds
            + limits.wall_seconds
            + limits.grace_seconds
            + OVERDUE_SLACK_SECONDS
        )

    async def _relay_output(self, stream: ByteReceiveStream, kind: Any, end: anyio.Event) -> None:
        """Relay a stream's head whole and then only its tail: the client keeps no more than
        the cap of each (its head and tail halves), so the rest need not cross the wire."""
        cap = self.limits.stdout_bytes if kind == "stdout" else self.limits.stderr_bytes
        sent = 0
        tail = bytearray()
        skipped_bytes = skipped_newlines = 0
        try:
            while True:
                try:
                    chunk = await stream.receive(RELAY_CHUNK_BYTES)
                except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    break
                if sent < cap:
                    head, chunk = chunk[: cap - sent], chunk[cap - sent :]
                    sent += len(head)
                    await self._emit.send(data_event(kind, self.id, head))
                if chunk:
                    tail += chunk
                    excess = len(tail) - cap
                    if excess > 0:
                        # Counted, so the client's totals are the stream's, not the relay's.
                        skipped_bytes += excess
                        skipped_newlines += tail.count(b"\n", 0, excess)
                        del tail[:excess]
            for start in range(0, len(tail), RELAY_CHUNK_BYTES):
                piece = bytes(tail[start : start + RELAY_CHUNK_BYTES])
                await self._emit.send(data_event(kind, self.id, piece))
            ended: Any = f"{kind}_end"
            await self._emit.send(
                encode_event(
                    Ended(
                        type=ended,
                        execution=self.id,
                        skipped_bytes=min(skipped_bytes, MAX_COUNT),
                        skipped_newlines=min(skipped_newlines, MAX_COUNT),
                    )
                )
            )
        finally:
            end.set()

    async def _relay_channel(self, launched: Launched) -> None:
        accepted: ByteStream | socket.socket | None = None
        with anyio.move_on_after(self.handshake_seconds):
            accepted = await launched.channel.accept()
        if accepted is not None:
            self._channel = (
                # The backend's channel socket, read and written in place: the backend owns
                # and closes it (no transport of the event loop may adopt its descriptor).
                SocketByteStream(accepted, owned=False)
                if isinstance(accepted, socket.socket)
                else accepted
            )
        self._accepted.set()
        channel = self._channel
        try:
            while channel is not None:
                data = await channel.receive(RELAY_CHUNK_BYTES)
                await self._emit.send(data_event("channel", self.id, data))
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        finally:
            if channel is not None:
                with anyio.CancelScope(shield=True):
                    # An accepted stream is ours to close (a socket stays the backend's).
                    await channel.aclose()
        await self._emit.send(encode_event(Ended(type="channel_end", execution=self.id)))

    async def _watch_exit(self, launched: Launched) -> None:
        try:
            await launched.wait_exited()
        except OSError:
            # Reaped by a finish request meanwhile: the status says how it ended.
            return
        await self._emit.send(encode_event(Ended(type="exited", execution=self.id)))

    async def _heartbeat(self) -> None:
        beat = encode_event(Ended(type="heartbeat", execution=self.id))
        while True:
            await anyio.sleep(HEARTBEAT_SECONDS)
            await self._emit.send(beat)

    # ---------------------------------------------------------------- control requests

    async def write_channel(self, data: bytes) -> str | None:
        """Pass the host's bytes to the child; why not, if they were refused."""
        with anyio.move_on_after(self.handshake_seconds):
            await self._accepted.wait()
        async with self._channel_lock:
            if self._channel is None or self._done.is_set():
                return "the execution has ended"
            if self._first_frame is not None:
                # Held until the first frame is whole: the run frame's limits are checked
                # against this execution's terms before the child sees any of it.
                self._first_frame += data
                end = self._first_frame.find(b"\n")
                if end < 0:
                    if len(self._first_frame) > MAX_HOST_FRAME_BYTES:
                        self._finish_requested.set()
                        return "the first frame is longer than any host frame"
                    return None
                data, self._first_frame = bytes(self._first_frame), None
                problem = _first_frame_problem(data[:end], self.limits)
                if problem is not None:
                    self._finish_requested.set()
                    return problem
            try:
                await self._channel.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                return "the child's channel is closed"
        return None

    async def terminate(self, grace_seconds: float) -> None:
        launched = self._launched
        if launched is not None and not self._finish_requested.is_set():
            await launched.terminate(min(grace_seconds, self.limits.grace_seconds))

    async def finish(self) -> Status | None:
        """How the child ended, once everything of it is torn down; None if the execution
        failed on this side (the client reports its stream's ending)."""
        self._finish_requested.set()
        await self._done.wait()
        return self.status


class Service:
    """The ASGI application."""

    def __init__(
        self,
        profile: ServedProfile,
        tenants: Tenants,
        capacity: int,
        handshake_seconds: float = HANDSHAKE_SECONDS,
    ) -> None:
        self.profile = profile
        self.handshake_seconds = handshake_seconds
        self.tenants = tenants
        self.load = Load(capacity=capacity)
        self._executions: dict[str, _Execution] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        tenant = self.tenants.authenticate(_header(scope, b"authorization"))
        if path == "/v1/description" and method == "GET":
            await _json(send, 200, self.description(tenant).model_dump(mode="json"))
        elif path == "/metrics" and method == "GET":
            await _respond(send, 200, self.load.prometheus().encode(), b"text/plain; version=0.0.4")
        elif path == "/v1/executions" and method == "POST":
            if tenant is None:
                self.load.refuse("unauthorized")
                await _error(send, 401, "unauthorized", "a valid bearer token is required")
                return
            await self._start(tenant, receive, send)
        elif path.startswith("/v1/executions/") and method == "POST":
            if tenant is None:
                self.load.refuse("unauthorized")
                await _error(send, 401, "unauthorized", "a valid bearer token is required")
                return
            await self._control(tenant, path, receive, send)
        else:
            await _error(send, 404, "not_found", "no such endpoint")

    def description(self, tenant: Tenant | None) -> Description:
        profile = self.profile
        return Description(
            protocol=REMOTE_PROTOCOL_VERSION,
            child_protocol=PROTOCOL_VERSION,
            backend=profile.backend_label,
            level=profile.level,
            grades=profile.grades,
            limits=profile.caps if tenant is None else tenant.limits,
            network=profile.allow_network if tenant is None else tenant.allow_network,
            runs_commands=type(profile.backend).runs_commands,
            capacity=self.load.capacity,
            in_flight=self.load.in_flight,
        )

    async def _start(self, tenant: Tenant, receive: Receive, send: Send) -> None:
        body = await _body(receive, MAX_REQUEST_BYTES)
        if body is None:
            await _error(send, 413, "bad_request", "the request body is too large")
            return
        try:
            start = StartRequest.model_validate_json(body)
        except ValidationError:
            await _error(send, 400, "bad_request", "the request is not a valid start request")
            return
        if start.protocol != REMOTE_PROTOCOL_VERSION:
            await _error(
                send,
                400,
                "protocol",
                f"this service speaks remote protocol {REMOTE_PROTOCOL_VERSION}",
            )
            return
        # Terms that cannot be met are refused here, before anything starts.
        problems = unmet_limits(start.limits, tenant.limits)
        if start.network and not tenant.allow_network:
            problems.append("network access is not allowed")
        if problems:
            self.load.refuse("terms")
            await _error(send, 422, "terms", "; ".join(problems)[:MAX_MESSAGE_CHARS])
            return
        if self.load.in_flight >= self.load.capacity:
            self.load.refuse("full")
            await _error(
                send,
                503,
                "full",
                f"this server runs at most {self.load.capacity} executions at once",
                headers=[(b"retry-after", b"1")],
            )
            return
        self.load.in_flight += 1
        self.load.started_total += 1
        emit, events = anyio.create_memory_object_stream[bytes](EVENT_BUFFER)
        execution = _Execution(tenant.name, start.limits, emit, self.handshake_seconds)
        self._executions[execution.id] = execution
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", NDJSON.encode()),
                        (b"cache-control", b"no-store"),
                    ],
                }
            )
            async with anyio.create_task_group() as tg:

                async def disconnected() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    # The client has gone: nobody can finish the child, so it is torn down.
                    tg.cancel_scope.cancel()

                async def produce() -> None:
                    async with emit:
                        try:
                            await execution.run(self.profile.backend)
                        except Exception as exc:
                            # Our failure, not the client's: said here, and the client sees
                            # its stream end without an end event (remote_disconnected).
                            _log.exception(
                                "execution %s failed on this side: %s",
                                execution.id,
                                type(exc).__name__,
                            )

                tg.start_soon(disconnected)
                tg.start_soon(produce)
                async with events:
                    async for event in events:
                        await send({"type": "http.response.body", "body": event, "more_body": True})
                tg.cancel_scope.cancel()
        finally:
            # The child is torn down: its slot is free before the stream's end says so, so
            # a client that read to the end finds the slot free.
            self._executions.pop(execution.id, None)
            self.load.in_flight -= 1
        with anyio.CancelScope(shield=True):
            try:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except OSError:
                pass

    async def _control(self, tenant: Tenant, path: str, receive: Receive, send: Send) -> None:
        parts = path.split("/")
        # ["", "v1", "executions", ID, ACTION]
        execution = self._executions.get(parts[3]) if len(parts) == 5 else None
        if execution is None or execution.tenant != tenant.name:
            # Another tenant's execution is not even said to exist.
            await _error(send, 404, "not_found", "no such execution")
            return
        action = parts[4]
        limit = MAX_CHANNEL_REQUEST_BYTES if action == "channel" else MAX_REQUEST_BYTES
        body = await _body(receive, limit)
        if body is None:
            await _error(send, 413, "bad_request", "the request body is too large")
            return
        if action == "channel":
            problem = await execution.write_channel(body)
            if problem is None:
                await _respond(send, 204, b"", None)
            else:
                await _error(send, 409, "terms", problem)
        elif action == "terminate":
            try:
                grace = float(json.loads(body).get("grace_seconds", 0.0))
            except (ValueError, AttributeError, TypeError):
                await _error(send, 400, "bad_request", 'terminate takes {"grace_seconds": N}')
                return
            if not 0 <= grace <= 60:
                await _error(send, 400, "bad_request", "grace_seconds must be within 0..60")
                return
            await execution.terminate(grace)
            await _respond(send, 204, b"", None)
        elif action == "finish":
            status = await execution.finish()
            if status is None:
                await _error(send, 410, "not_found", "the execution ended without a status")
                return
            await _respond(send, 200, status.model_dump_json().encode(), b"application/json")
        else:
            await _error(send, 404, "not_found", "no such action")


def _first_frame_problem(line: bytes, limits: ExecutionLimits) -> str | None:
    """Why the host's first frame may not reach the child: it must be a run frame whose
    limits (which the child applies to itself) are within this execution's terms, or an
    abort."""
    try:
        frame = decode_host_frame(line)
    except Exception:
        return "the first frame is not a valid host frame"
    if isinstance(frame, AbortFrame):
        return None
    if not isinstance(frame, RunFrame):
        return f"the first frame is a {frame.type!r} frame, not a run frame"
    asked = frame.limits
    terms = {
        "cpu_seconds": limits.cpu_seconds,
        "memory_bytes": limits.memory_bytes,
        "file_size_bytes": limits.file_size_bytes,
        "processes": limits.processes,
        "return_value_bytes": limits.return_value_bytes,
    }
    for name, cap in terms.items():
        value = getattr(asked, name)
        if cap is not None and (value is None or value > cap):
            return f"the run frame asks for {name}={value}, beyond this execution's {cap}"
    return None


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


async def _body(receive: Receive, limit: int) -> bytes | None:
    """The request body, or None as soon as it passes ``limit``."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return bytes(body)
        body += message.get("body", b"")
        if len(body) > limit:
            return None
        if not message.get("more_body", False):
            return bytes(body)


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes | None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    all_headers = list(headers or [])
    if content_type is not None:
        all_headers.append((b"content-type", content_type))
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body})


async def _json(send: Send, status: int, data: object) -> None:
    await _respond(send, status, json.dumps(data).encode(), b"application/json")


async def _error(
    send: Send,
    status: int,
    code: Any,
    message: str,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = ErrorBody(error=code, message=message).model_dump_json().encode()
    await _respond(send, status, body, b"application/json", headers)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
