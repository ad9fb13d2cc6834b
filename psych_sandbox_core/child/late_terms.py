"""The late terms: what the host made while this interpreter started (the probe's targets,
the cgroup's join descriptors), one message on a socket of their own."""

# Uses names the other modules define: they run as one namespace (loader.py).
# ruff: noqa: F821

import _socket
import sys


def _late_terms(fd):
    """What the host made while this interpreter started (see late_terms.py): the probe's
    targets, and the descriptors that move this process into the execution's cgroup. One
    message on the socket ``fd``, closed once read: no program ever holds it. Without the
    message (the host gave up on this start), nothing runs."""
    sock = _socket.socket(fileno=fd)
    try:
        data, ancillary, _flags, _address = sock.recvmsg(
            LATE_TERMS_BYTES, _socket.CMSG_SPACE(4 * LATE_TERMS_FDS)
        )
    except OSError as exc:
        message = f"psych-sandbox bootstrap: the host's terms did not come ({exc})"
        raise SystemExit(message) from None
    finally:
        sock.close()
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds.extend(
                int.from_bytes(payload[i : i + 4], sys.byteorder)
                for i in range(0, len(payload) - len(payload) % 4, 4)
            )
    terms = json_loads(data) if data else None
    if not isinstance(terms, dict) or not isinstance(terms.get("probe"), dict):
        raise SystemExit("psych-sandbox bootstrap: the host's terms did not come")
    return terms["probe"], fds


#: The late terms' bounds (copies of late_terms.py's).
LATE_TERMS_BYTES = 64 * 1024
LATE_TERMS_FDS = 16
