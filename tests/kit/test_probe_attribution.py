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
from psych_sandbox_core._bindings.bindings import FunctionBindings
from psych_sandbox_core.kit.backend import ProbeTargets

from ..conftest import PROFILE, config

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        not hasattr(os, "geteuid") or os.geteuid() != 0,
        reason="only a root host runs each execution as a uid of its own",
    ),
]


async def test_another_uids_connections_to_the_probe_listeners_are_not_the_executions(
    probe_targets: list[ProbeTargets],
) -> None:
    held: list[socket.socket] = []

    async def scan() -> int:
        for targets in probe_targets:
            for address, port in (("127.0.0.1", targets.port4), ("::1", targets.port6)):
                if port is not None:
                    held.append(socket.create_connection((address, port), timeout=2))
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
    # The control: the host's connections reached the execution's listeners.
    assert len(held) >= 1
    assert result.error is None, result.error
    assert result.stdout == "scanned True\n"
