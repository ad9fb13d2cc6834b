"""A test double of the launch contract: a backend whose child is a coroutine.

:class:`FakeBackend` launches :class:`FakeLaunched`, a :class:`~psych_sandbox_core.kit.backend.
Launched` whose "child" is a script (``async def script(child: ScriptedChild)``) running in
the launch's own task group. The script speaks frames over an in-memory channel (the host
reads it through the same :class:`~psych_sandbox_core.kit.channel.FrameChannel` and ceilings as a
real child's), writes to in-memory stdout and stderr, and "exits" when it returns, with the
status it set; ``terminate`` and ``finish`` cancel it, as a signal would end a process.

No process is spawned and nothing is contained: this is for testing the core's conversation,
driver, warm hand-off and outcome, fast and deterministically, never a backend's
containment (the conformance suite does that, against real processes). Like any backend,
leaving the launch context leaves nothing running: :attr:`FakeBackend.live` counts launches
not yet torn down.
"""

from __future__ import annotations

import json
import math
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import anyio
from anyio.abc import ByteStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from psych_sandbox_core.grading import Level, Mechanisms
from psych_sandbox_core.kit.backend import (
    Backend,
    BackendOptions,
    BackendUnavailable,
    Launched,
    LaunchRequest,
)
from psych_sandbox_core.kit.channel import ChannelListener
from psych_sandbox_core.kit.exit_status import ExitStatus
from psych_sandbox_core.protocol import (
    PROTOCOL_VERSION,
    ContainmentReport,
    HelloFrame,
    HostFrame,
    NetworkObservation,
    decode_host_frame,
)
from psych_sandbox_core.protocol.frames import Frame

__all__ = ["FakeBackend", "FakeLaunched", "Relayed", "Script", "ScriptedChild", "honest_report"]


class _Pipe(ByteStream):
    """One end of an in-memory byte stream (either direction may be absent)."""

    def __init__(
        self,
        send: MemoryObjectSendStream[bytes] | None,
        receive: MemoryObjectReceiveStream[bytes] | None,
    ) -> None:
        self._send = send
        self._receive = receive
        self._pending = b""

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self._pending:
            if self._receive is None:
                raise anyio.EndOfStream
            self._pending = await self._receive.receive()
        data, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return data

    async def send(self, item: bytes) -> None:
        if self._send is None:
            raise anyio.ClosedResourceError
        await self._send.send(bytes(item))

    async def send_eof(self) -> None:
        if self._send is not None:
            self._send.close()

    def close(self) -> None:
        if self._send is not None:
            self._send.close()
        if self._receive is not None:
            self._receive.close()

    async def aclose(self) -> None:
        self.close()


def _pipe() -> tuple[_Pipe, _Pipe]:
    """Two connected ends: what one sends, the other receives."""
    a_send, b_receive = anyio.create_memory_object_stream[bytes](math.inf)
    b_send, a_receive = anyio.create_memory_object_stream[bytes](math.inf)
    return _Pipe(a_send, a_receive), _Pipe(b_send, b_receive)


def honest_report(**changes: Any) -> ContainmentReport:
    """A child's report of a process that is not contained at all (what the host's own
    process would see), with ``changes`` applied."""
    fields: dict[str, Any] = {
        "uid": os.getuid(),
        "euid": os.geteuid(),
        "gid": os.getgid(),
        "pid": os.getpid(),
        "canary_readable": True,
        "network": NetworkObservation(ipv4="refused", ipv6="refused", interfaces_up=[]),
        "limits": [],
        "capabilities": None,
        "sees_foreign_processes": True,
        "python": "3",
        "platform": "fake",
    }
    fields.update(changes)
    return ContainmentReport(**fields)


class ScriptedChild:
    """The child's side, for a script: frames out, host frames in, output, exit status."""

    def __init__(self, channel: _Pipe, stdout: _Pipe, stderr: _Pipe, request: LaunchRequest):
        self._channel = channel
        self._stdout = stdout
        self._stderr = stderr
        self._buffer = b""
        #: What the host asked the backend to launch.
        self.request = request
        #: The status the child exits with when the script returns.
        self.exit_code = 0

    async def send(self, frame: Frame | dict[str, Any] | bytes) -> None:
        """One frame (a model or a dict, sent as one JSON line), or raw bytes as they are."""
        if isinstance(frame, Frame):
            data = frame.model_dump_json().encode() + b"\n"
        elif isinstance(frame, dict):
            data = json.dumps(frame).encode() + b"\n"
        else:
            data = frame
        await self._channel.send(data)

    async def hello(self, report: ContainmentReport | None = None) -> None:
        await self.send(
            HelloFrame(type="hello", protocol=PROTOCOL_VERSION, report=report or honest_report())
        )

    async def receive(self) -> HostFrame | None:
        """The host's next frame; None once the host closed the channel."""
        while b"\n" not in self._buffer:
            try:
                self._buffer += await self._channel.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                return None
        line, _, self._buffer = self._buffer.partition(b"\n")
        return decode_host_frame(line)

    async def call(self, call_id: int, name: str, arguments: dict[str, Any]) -> HostFrame | None:
        """A binding call, and the host's reply."""
        await self.send({"type": "call", "id": call_id, "name": name, "arguments": arguments})
        return await self.receive()

    async def returned(self, value: Any) -> None:
        """The result frame of a program that returned ``value``."""
        await self.send(
            {
                "type": "result",
                "outcome": "returned",
                "value_json": None if value is None else json.dumps(value),
                "error": None,
                "detail": None,
            }
        )

    async def stdout(self, data: bytes) -> None:
        await self._stdout.send(data)

    async def stderr(self, data: bytes) -> None:
        await self._stderr.send(data)

    def close_channel(self) -> None:
        self._channel.close()

    async def sleep_forever(self) -> None:
        await anyio.sleep_forever()


#: What a fake child does: the whole life of its process.
Script = Callable[[ScriptedChild], Awaitable[None]]


class _FakeListener(ChannelListener):
    def __init__(self, host_end: _Pipe, connect: anyio.Event) -> None:
        self.child_spec = "fake:"
        self._host_end = host_end
        self._connected = connect

    async def accept(self) -> ByteStream:
        await self._connected.wait()
        return self._host_end

    async def aclose(self) -> None:
        self._host_end.close()


@dataclass(frozen=True)
class Relayed:
    """What a backend relaying a child that runs elsewhere reports of the far side (see
    :class:`Launched`): connections its probe listeners saw, and per stream the bytes and
    newlines it did not hand over."""

    connections_elsewhere: int = 0
    unrelayed: dict[str, tuple[int, int]] = field(default_factory=dict)


class FakeLaunched(Launched):
    """A launched fake child (see the module's docstring)."""

    def __init__(self, backend: FakeBackend, request: LaunchRequest) -> None:
        self.mechanisms = backend.mechanisms
        self.early_result_ok = backend.early_result_ok
        self.workspace_path = backend.workspace_path
        self.host_uid = backend.far_host_uid
        self._relayed = backend.relayed
        host_channel, child_channel = _pipe()
        out_host, out_child = _pipe()
        err_host, err_child = _pipe()
        self.stdout, self.stderr = out_host, err_host
        self._connect = anyio.Event()
        self.channel = _FakeListener(host_channel, self._connect)
        self.child = ScriptedChild(child_channel, out_child, err_child, request)
        self._ends = (child_channel, out_child, err_child, host_channel, out_host, err_host)
        self._usage = backend.usage
        self._scope = anyio.CancelScope()
        self._exited = anyio.Event()
        self._killed_by: int | None = None
        self.status: ExitStatus | None = None

    async def live(self, script: Script) -> None:
        """The child's whole life: connect, run the script, exit."""
        child = self.child
        try:
            with self._scope:
                self._connect.set()
                await script(child)
        finally:
            # The process is gone: everything it held is closed, as the kernel would.
            for end in self._ends[:3]:
                end.close()
            code = None if self._killed_by is not None else child.exit_code
            cpu, peak = self._usage if self._usage is not None else (None, None)
            self.status = ExitStatus(
                code=code, signal=self._killed_by, cpu_seconds=cpu, peak_memory_bytes=peak
            )
            self._exited.set()

    def usage_so_far(self) -> tuple[float | None, int | None] | None:
        return self._usage

    def connections_elsewhere(self) -> int:
        return self._relayed.connections_elsewhere

    def unrelayed(self, stream: str) -> tuple[int, int]:
        return self._relayed.unrelayed.get(stream, (0, 0))

    async def wait_exited(self) -> None:
        await self._exited.wait()

    def _kill(self, signum: int) -> None:
        if not self._exited.is_set() and self._killed_by is None:
            self._killed_by = signum
            self._scope.cancel()

    async def terminate(self, grace_seconds: float) -> None:
        self._kill(signal.SIGTERM)
        await self._exited.wait()

    async def finish(self) -> ExitStatus:
        self._kill(signal.SIGKILL)
        await self._exited.wait()
        assert self.status is not None
        return self.status

    def close(self) -> None:
        for end in self._ends:
            end.close()


class FakeBackend(Backend):
    """A backend whose children are scripts (see the module's docstring)."""

    id: ClassVar[str] = "fake"
    claims: ClassVar[Level] = Level.NONE

    def __init__(
        self,
        script: Script,
        *,
        mechanisms: Mechanisms | None = None,
        early_result_ok: bool = False,
        workspace_path: str | None = None,
        usage: tuple[float | None, int | None] | None = None,
        unavailable: str | None = None,
        far_host_uid: int | None = None,
        relayed: Relayed | None = None,
    ) -> None:
        super().__init__(BackendOptions())
        #: As a relaying backend would report them: the far host's uid and what it saw.
        self.far_host_uid = far_host_uid
        self.relayed = relayed or Relayed()
        self.script = script
        self.mechanisms = mechanisms or Mechanisms()
        self.early_result_ok = early_result_ok
        self.workspace_path = workspace_path
        self.usage = usage
        self.unavailable = unavailable
        #: Every launch so far, torn down or not, and the number not yet torn down.
        self.launched: list[FakeLaunched] = []
        self.live = 0

    def unavailable_reason(self) -> str | None:
        return self.unavailable

    @asynccontextmanager
    async def _launch(self, request: LaunchRequest) -> AsyncIterator[Launched]:
        if self.unavailable is not None:
            raise BackendUnavailable(self.unavailable)
        launched = FakeLaunched(self, request)
        self.launched.append(launched)
        self.live += 1
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(launched.live, self.script)
                try:
                    yield launched
                finally:
                    with anyio.CancelScope(shield=True):
                        await launched.finish()
        finally:
            launched.close()
            self.live -= 1

    def launch(self, request: LaunchRequest) -> AbstractAsyncContextManager[Launched]:
        return self._launch(request)
