"""The containment probe: what this process is and can see or reach (its identity, the canary,
the network, its limits and capabilities, foreign processes), sent in the hello for the host
to grade."""

# Uses names the other modules define: they run as one namespace (loader.py).
# ruff: noqa: F821

import _socket
import os
import sys

RLIMIT_NAMES = ("CORE", "CPU", "AS", "FSIZE", "NPROC", "NOFILE")


def _probe_connect(family, address):
    if address is None:
        return "skipped"
    try:
        sock = _socket.socket(family, _socket.SOCK_STREAM)
    except OSError:
        return "unreachable"
    sock.settimeout(1.0)
    try:
        sock.connect(address)
        return "connected"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "unreachable"
    finally:
        sock.close()


def _interfaces_up():
    # Ask the kernel about this process's own network namespace (sysfs may be the host's).
    try:
        names = [name for _, name in _socket.if_nameindex()]
    except OSError:
        return []
    # Only a namespace with more than loopback is asked further (an isolated one has only
    # "lo"), so the usual child imports nothing for this probe.
    names = [name for name in names if name != "lo" and not name.startswith("lo0")]
    if not names:
        return []
    up = []
    probe_socket = None
    try:
        if sys.platform.startswith("linux"):
            import fcntl

            probe_socket = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)
        for name in names:
            flags = 0x1  # elsewhere, an interface that exists counts as up: the safe side
            if probe_socket is not None:
                try:
                    # struct ifreq: the name in 16 bytes, then the flags (a short), padded.
                    request = name.encode()[:15].ljust(16, b"\0") + bytes(16)
                    answer = fcntl.ioctl(probe_socket.fileno(), 0x8913, request)  # SIOCGIFFLAGS
                    flags = int.from_bytes(answer[16:18], sys.byteorder)
                except OSError:
                    flags = 0x1
            if flags & 0x1:  # IFF_UP
                up.append(name[:64])
    finally:
        if probe_socket is not None:
            probe_socket.close()
    return up[:256]


def _capabilities():
    status = _read_file("/proc/self/status", 64 * 1024)
    for line in (status or b"").split(b"\n"):
        if line.startswith(b"CapEff:"):
            return line.split()[1][:32].decode("ascii", "replace")
    return None


def _read_file(path, limit):
    """Up to ``limit`` bytes of ``path`` (None if it cannot be read): by descriptor, without
    the file objects open() builds, which cost a freshly forked child a few tenths of a
    millisecond each time (their pages copied on write)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        data = b""
        while len(data) < limit:
            chunk = os.read(fd, limit - len(data))
            if not chunk:
                break
            data += chunk
        return data
    except OSError:
        return None
    finally:
        os.close(fd)


def _limits():
    if resource is None:
        return []
    out = []
    for name in RLIMIT_NAMES:
        constant = getattr(resource, "RLIMIT_" + name, None)
        if constant is None:
            continue
        soft, hard = resource.getrlimit(constant)
        inf = resource.RLIM_INFINITY
        out.append(
            {"name": name, "soft": -1 if soft == inf else soft, "hard": -1 if hard == inf else hard}
        )
    return out


def probe(config):
    canary = config.get("canary")
    canary_readable = None
    if canary:
        canary_readable = _read_file(canary, 1) is not None
    port4 = config.get("port4")
    port6 = config.get("port6")
    host_pid = config.get("host_pid")
    return {
        # -1 where there are no POSIX ids (Windows): the host grades no identity there.
        "uid": os.getuid() if hasattr(os, "getuid") else -1,
        "euid": os.geteuid() if hasattr(os, "geteuid") else -1,
        "gid": os.getgid() if hasattr(os, "getgid") else -1,
        "pid": os.getpid(),
        "canary_readable": canary_readable,
        "network": {
            "ipv4": _probe_connect(_socket.AF_INET, ("127.0.0.1", port4) if port4 else None),
            "ipv6": _probe_connect(_socket.AF_INET6, ("::1", port6) if port6 else None),
            "interfaces_up": _interfaces_up(),
        },
        "limits": _limits(),
        "capabilities": _capabilities(),
        "sees_foreign_processes": (
            os.path.exists(f"/proc/{host_pid}") if host_pid and os.path.isdir("/proc") else None
        ),
        "python": sys.version.split()[0],
        "platform": sys.platform,
    }
