"""The probe's loopback listeners are evidence about one execution only: a connection from a
socket of another uid (another execution's program scanning the host's ports, any other
process of the host) is not counted against an execution that runs as a uid of its own. The
scanner here is a host tool the program calls, so it connects while the program runs, as the
host's own uid; the program's isolation stands and its output comes back."""

from __future__ import annotations

import os
import socket

import pytest

from psych_sandbox_core import Sandbox
from psych_sandbox_core.bindings import FunctionBindings

from .conftest import PROFILE, config

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        not hasattr(os, "geteuid") or os.geteuid() != 0,
        reason="only a root host runs each execution as a uid of its own",
    ),
]

#: /proc/net/tcp's listening state and the loopback addresses as it writes them.
LISTEN = "0A"
LOOPBACK = {
    "/proc/net/tcp": ("0100007F", "127.0.0.1"),
    "/proc/net/tcp6": ("0" * 24 + "01000000", "::1"),
}


def loopback_listeners() -> list[tuple[str, int]]:
    """Every listening socket on a loopback address of this network namespace."""
    found = []
    for table, (hex_address, address) in LOOPBACK.items():
        try:
            with open(table) as fh:
                lines = fh.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local_address, _, port = fields[1].partition(":")
            if fields[3] == LISTEN and local_address == hex_address:
                found.append((address, int(port, 16)))
    return found


async def test_another_uids_connections_to_the_probe_listeners_are_not_the_executions() -> None:
    held: list[socket.socket] = []

    async def scan() -> int:
        for address, port in loopback_listeners():
            try:
                held.append(socket.create_connection((address, port), timeout=2))
            except OSError:
                continue
        return len(held)

    try:
        async with Sandbox(config()) as sandbox:
            result = await sandbox.run(
                "reached = await scan()\nprint('scanned', reached >= 1)",
                profile=PROFILE,
                bindings=FunctionBindings({"scan": scan}),
            )
    finally:
        for sock in held:
            sock.close()
    # The control: the host's scan reached listeners (the execution's among them).
    assert len(held) >= 1
    assert result.error is None, result.error
    assert result.stdout == "scanned True\n"
