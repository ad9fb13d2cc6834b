"""What the host hands a child after spawning it, while its interpreter starts.

A cold child spends most of its start in its own interpreter (about a bare interpreter's
start-up) before it needs anything of the host's. What only the host can make for it and
the child needs only later, the probe's targets (a canary file, loopback listeners) and the
cgroup it joins, is made then, on the host's other core, instead of before the spawn where
the caller waits for it. It travels as one message on a socket pair of its own (not the
protocol channel: nothing of the program's exists yet, and no frame of the conversation is
sent before the hello), with the cgroup's join files as descriptors; the bootstrap reads it
first thing and closes its end (see the bootstrap's _late_terms), so no program ever holds
it. A host that gives up before delivering closes its end: the child then exits unstarted.
"""

from __future__ import annotations

import array
import json
import socket
from collections.abc import Sequence

from .backend import ProbeTargets

__all__ = ["LATE_TERMS_BYTES", "LATE_TERMS_FDS", "LateTerms"]

#: The message's bounds, which the bootstrap's copies must match.
LATE_TERMS_BYTES = 64 * 1024
LATE_TERMS_FDS = 16


class LateTerms:
    """One child's late terms: its end to pass at spawn (:attr:`child_fd`), then
    :meth:`deliver` once, then :meth:`close` (idempotent; also when never delivered)."""

    def __init__(self) -> None:
        # One datagram, whole or not at all: the child reads it with a single call.
        self._host: socket.socket | None
        self._child: socket.socket | None
        self._host, self._child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

    @property
    def child_fd(self) -> int:
        assert self._child is not None, "the child's end is passed before the spawn"
        return self._child.fileno()

    def argument(self) -> str:
        """The bootstrap argument naming the child's end."""
        return f"late={self.child_fd}"

    def after_spawn(self) -> None:
        """The child holds its end now (or was never started): the host's copy goes."""
        if self._child is not None:
            self._child.close()
            self._child = None

    def deliver(self, probe: ProbeTargets, fds: Sequence[int] = ()) -> None:
        """Send the probe's targets and ``fds`` (the cgroup's join files, still the caller's
        to close), then close the host's end. A child already gone gets nothing: how it
        ended is what the launch reports, as for any child that exits before its hello."""
        if len(fds) > LATE_TERMS_FDS:
            raise ValueError(f"at most {LATE_TERMS_FDS} descriptors travel with the terms")
        data = json.dumps({"probe": probe.as_json_object()}).encode()
        if len(data) > LATE_TERMS_BYTES:
            raise ValueError(f"the late terms exceed {LATE_TERMS_BYTES} bytes")
        assert self._host is not None, "late terms are delivered once"
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        try:
            self._host.sendmsg([data], ancillary)
        except OSError:
            pass  # gone (its end closed): nothing is waiting for these
        finally:
            self.close()

    def close(self) -> None:
        for end in (self._host, self._child):
            if end is not None:
                end.close()
        self._host = self._child = None
