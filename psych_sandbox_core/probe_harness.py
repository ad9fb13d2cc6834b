"""Host-side evidence for one execution: a canary file outside any workspace and loopback
listeners on both address families, counting every connection they see. What the child's
probe reaches here is judged by the host, never taken from the child's own report."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import anyio
from anyio.abc import Listener, SocketListener, SocketStream

from .backend import ProbeTargets
from .temp_dirs import CANARY_PREFIX, make_owned_directory


class ProbeHarness:
    """Host-side evidence for one execution: a canary outside any workspace and loopback
    listeners on both address families that count every connection they see."""

    def __init__(self) -> None:
        self.connections = 0
        self._listeners: list[SocketListener] = []
        self.targets: ProbeTargets | None = None

    @asynccontextmanager
    async def active(self) -> AsyncIterator[ProbeHarness]:
        directory = make_owned_directory(CANARY_PREFIX)
        try:
            os.chmod(directory, 0o755)
            canary = os.path.join(directory, "canary")
            with open(canary, "w") as fh:
                fh.write("psych-sandbox canary: reading this proves filesystem exposure\n")
            # World-readable on purpose: only a real filesystem boundary can hide it.
            os.chmod(canary, 0o644)
            ports: dict[str, int | None] = {"4": None, "6": None}
            async with anyio.create_task_group() as tg:
                for family, host in (("4", "127.0.0.1"), ("6", "::1")):
                    try:
                        listener, ports[family] = await _loopback_listener(family, host)
                    except OSError:
                        continue  # no such address family on this host: nothing to reach
                    self._listeners.append(listener)
                    tg.start_soon(self._count, listener)
                self.targets = ProbeTargets(
                    canary_path=canary, port4=ports["4"], port6=ports["6"], host_pid=os.getpid()
                )
                try:
                    yield self
                finally:
                    tg.cancel_scope.cancel()
        finally:
            # Shielded: on cancellation the listeners still close and the canary is removed,
            # in a worker thread: on a busy disk a directory's removal took milliseconds
            # (26 ms at worst, measured), and the event loop serves every other execution
            # meanwhile.
            with anyio.CancelScope(shield=True):
                for listener in self._listeners:
                    await listener.aclose()
                await anyio.to_thread.run_sync(
                    partial(shutil.rmtree, directory, ignore_errors=True)
                )

    async def _count(self, listener: Listener[SocketStream]) -> None:
        async def on_connection(stream: SocketStream) -> None:
            self.connections += 1
            await stream.aclose()

        try:
            await listener.serve(on_connection)
        except anyio.ClosedResourceError:
            return


async def _loopback_listener(family: str, host: str) -> tuple[SocketListener, int]:
    """A listener on ``host`` (a literal loopback address), any free port, and that port.
    Made directly: anyio's create_tcp_listener resolves even a literal address in a worker
    thread, a thread hop on the path of every execution; the port is the socket's own (the
    listener's attribute map builds every attribute, a failing peer lookup among them)."""
    sock = socket.socket(socket.AF_INET if family == "4" else socket.AF_INET6, socket.SOCK_STREAM)
    try:
        if family == "6":
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, 0))
        sock.listen()
        port: int = sock.getsockname()[1]
    except BaseException:
        sock.close()
        raise
    return await SocketListener.from_socket(sock), port
