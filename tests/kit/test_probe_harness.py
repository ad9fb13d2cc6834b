"""The probe harness counts what reached its loopback listeners from their queues, with no
task of its own: every kind of connection counts, whenever the count is read."""

from __future__ import annotations

import os
import socket
import struct

import pytest

from psych_sandbox_core.kit.probe_harness import ProbeHarness

pytestmark = pytest.mark.anyio


def _connect(port: int, how: str) -> socket.socket | None:
    sock = socket.create_connection(("127.0.0.1", port))
    if how == "reset":
        # Closed with a reset: the connection is aborted before the host could take it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        return None
    if how == "closed":
        sock.close()
        return None
    return sock


async def test_every_connection_is_counted_as_it_is_read_and_none_is_left_open() -> None:
    async with ProbeHarness().active() as harness:
        targets = harness.made()
        assert targets.port4 is not None
        port = targets.port4
        assert harness.connections == 0
        held = [_connect(port, how) for how in ("open", "closed", "reset")]
        assert harness.connections == 3
        assert harness.connections == 3  # read again: nothing counted twice
        held.append(_connect(port, "open"))
        assert harness.connections == 4
        canary = targets.canary_path
        assert canary is not None and os.path.exists(canary)
    # Closed with the harness: nothing listens on its port any more, the canary is gone, and
    # the connections it took were closed by the host (the peer reads their end).
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port)).close()
    assert not os.path.exists(os.path.dirname(canary))
    for sock in held:
        if sock is not None:
            sock.settimeout(5)
            assert sock.recv(1) == b""
            sock.close()


async def test_the_ipv6_listener_counts_too() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")
    async with ProbeHarness().active() as harness:
        targets = harness.made()
        if targets.port6 is None:
            pytest.skip("no ::1 on this host")
        socket.create_connection(("::1", targets.port6)).close()
        assert harness.connections == 1


async def test_told_the_childs_uid_a_connection_held_open_by_another_uid_does_not_count() -> None:
    """Once told the uid the child runs as, a connection held open from a socket of another
    uid (this process's, here) is not counted; one of that uid is, and so is one whose owner
    the kernel no longer keeps (closed by its process: the child's own may look so)."""
    async with ProbeHarness().active() as harness:
        port = harness.made().port4
        assert port is not None
        harness.attribute_to(os.getuid() + 1)
        held = [_connect(port, "open")]
        assert harness.connections == 0
        assert harness.foreign == 1
        _connect(port, "closed")
        assert harness.connections == 1
        harness.attribute_to(os.getuid())
        held.append(_connect(port, "open"))
        assert harness.connections == 2
        assert harness.foreign == 1
        for sock in held:
            if sock is not None:
                sock.close()
