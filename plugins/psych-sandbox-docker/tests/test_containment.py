"""Containment in a container, asserted from the host: what the program could not read,
reach, write or leave behind, under runc and under gVisor's runsc. Loopback listeners, CPU and
wall-clock limits, the detached daemon and cancellation are the shared suite's
(test_conformance.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from docker_support import (
    RUNTIMES,
    leased,
    marker,
    opens_of,
    pids_with,
    run,
    wait_until,
)

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("engine")]

ISOLATING = ("filesystem", "network", "process_tree", "identity", "memory")


@pytest.fixture
def host_secret() -> Iterator[tuple[Path, str]]:
    """A world-readable file in a world-readable directory of the host's /tmp."""
    secret = uuid.uuid4().hex
    directory = Path(tempfile.mkdtemp(prefix="psych-docker-canary-"))
    os.chmod(directory, 0o755)
    path = directory / "canary"
    path.write_text(secret)
    os.chmod(path, 0o644)
    try:
        yield path, secret
    finally:
        path.unlink()
        directory.rmdir()


@RUNTIMES
async def test_level_isolated_grades_and_usage_from_the_cgroup(runtime: str) -> None:
    result = await run("print(2 + 2)\nimport os\n[os.getuid(), os.getpid()]", runtime)
    assert result.error is None, result.error
    assert result.stdout == "4\n"
    assert result.level == "isolated"
    for guarantee in ISOLATING:
        assert result.grades[guarantee] == "enforced", guarantee
    # The pids cgroup is the process limit only under runc (see the README).
    assert result.grades["process_count"] == ("enforced" if runtime == "runc" else "unverified")
    uid, pid = result.return_value
    # A uid leased for this execution (no user namespace: the host's uid too).
    assert leased(uid) if os.geteuid() == 0 else uid == 65534
    assert pid != 1, "the program must run below the container's init"
    assert result.backend.id == "docker"
    assert result.backend.distribution == "psych-sandbox-docker"
    assert result.usage.measured_by == "host"
    assert result.usage.cpu_seconds is not None and result.usage.cpu_seconds > 0
    assert result.usage.peak_memory_bytes is not None and result.usage.peak_memory_bytes > 0


async def test_canary_home_run_and_engine_socket_out_of_reach(
    host_secret: tuple[Path, str],
) -> None:
    path, secret = host_secret
    home = os.path.expanduser("~")
    planted = Path(home) / f".psych-docker-canary-{secret[:8]}"
    planted.write_text(secret)
    os.chmod(planted, 0o644)
    # A listener under the host's /run stands for any host service socket there.
    service = f"/run/psych-docker-{uuid.uuid4().hex[:12]}.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(service)
    os.chmod(service, 0o777)
    server.listen(8)
    server.setblocking(False)
    try:
        with opens_of(str(path), str(planted)) as opened:
            result = await run(
                "import os, socket\nseen = {}\n"
                f"for p in ({str(path)!r}, '/root', {home!r}, '/home', {str(planted)!r}):\n"
                "    try:\n"
                "        seen[p] = open(p).read() if os.path.isfile(p) else os.listdir(p)\n"
                "    except OSError as e:\n        seen[p] = type(e).__name__\n"
                f"for p in ({service!r}, '/var/run/docker.sock', '/run/docker.sock',\n"
                "          '/run/containerd/containerd.sock', '/run/podman/podman.sock'):\n"
                "    s = socket.socket(socket.AF_UNIX)\n"
                "    try:\n        s.connect(p); seen[p] = 'connected'\n"
                "    except OSError as e:\n        seen[p] = type(e).__name__\n"
                "    finally:\n        s.close()\n"
                "seen['/run'] = sorted(os.listdir('/run'))\n"
                "seen"
            )
        # The control: the watch does see an open from the host.
        with opens_of(str(planted)) as control:
            planted.read_text()
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()
        os.unlink(service)
        planted.unlink()
    assert result.error is None, result.error
    # From the host: neither the canary nor the planted file was opened (inotify watches
    # their inodes, whatever mount reached them); the service's listener accepted nothing.
    # (The engine's own socket has no such witness: a connect opens no file; its absence
    # inside is what the program reports.)
    assert opened == [] and control
    seen = result.return_value
    assert secret not in str(seen)
    assert seen.pop("/run") == ["psych"]
    assert all(v == "FileNotFoundError" for v in seen.values()), seen
    assert result.grades["filesystem"] == "enforced"


async def test_host_processes_invisible_and_identity_seen_from_the_host() -> None:
    mark = marker()
    # The marked process itself, not a shell around it: killing it leaves nothing behind.
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", mark])
    inner = marker()
    outcome: dict[str, object] = {}

    async def inspect() -> None:
        (pid,) = await wait_until(lambda: pids_with(inner))
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        )
        outcome["uid"] = [int(x) for x in status["Uid"].split()]
        outcome["capeff"] = int(status["CapEff"].strip(), 16)
        outcome["nnp"] = status["NoNewPrivs"].strip()
        outcome["namespaces"] = {
            ns: os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}")
            for ns in ("pid", "net", "mnt", "ipc", "uts")
        }
        os.kill(pid, signal.SIGTERM)

    try:
        await wait_until(lambda: pids_with(mark))
        async with anyio.create_task_group() as tg:
            tg.start_soon(inspect)
            result = await run(
                "import os, subprocess, sys\nlines = []\n"
                "for e in os.listdir('/proc'):\n"
                "    if e.isdigit():\n"
                "        try:\n"
                # The head of each command line is enough to recognise it (the bootstrap's
                # own is long: it carries its code).
                "            lines.append(open(f'/proc/{e}/cmdline', 'rb').read(400)"
                ".decode('latin-1'))\n"
                "        except OSError:\n            pass\n"
                f"rc = subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)', "
                f"{inner!r}]).returncode\n"
                "[lines, rc]"
            )
    finally:
        sleeper.kill()
        sleeper.wait()
    assert pids_with(mark) == []
    assert result.error is None, result.error
    cmdlines, rc = result.return_value
    assert cmdlines, "the program saw no process at all, not even itself"
    assert not any(mark in c for c in cmdlines)
    assert not any("pytest" in c for c in cmdlines)
    assert len(cmdlines) <= 3, cmdlines  # the engine's init and the program
    assert rc == -signal.SIGTERM
    (uid,) = set(outcome["uid"])  # type: ignore[call-overload]
    assert leased(uid) if os.geteuid() == 0 else uid == 65534
    assert outcome["capeff"] == 0
    assert outcome["nnp"] == "1"
    assert all(outcome["namespaces"].values()), outcome["namespaces"]  # type: ignore[union-attr]


async def test_writes_outside_the_workspace_impossible() -> None:
    drop = Path(tempfile.mkdtemp(prefix="psych-docker-drop-"))
    os.chmod(drop, 0o777)
    try:
        result = await run(
            "import os\nok = []\n"
            f"for p in ({str(drop / 'x')!r}, '/usr/x', '/x', '/etc/passwd', '/proc/x', "
            "'/dev/x', '/run/psych/x', '/workspace/../x', '/proc/sys/kernel/hostname'):\n"
            "    try:\n        open(p, 'w').write('x'); ok.append(p)\n"
            "    except OSError:\n        pass\n"
            "open('inside', 'w').write('fine')\nopen('/tmp/also', 'w').write('fine')\nok"
        )
        assert result.error is None, result.error
        assert list(drop.iterdir()) == []
        assert result.return_value == []
    finally:
        for child in drop.iterdir():
            child.unlink()
        drop.rmdir()


async def test_tmpfs_fill_stopped_at_its_cap() -> None:
    size = 4 * 1024 * 1024
    result = await run(
        "import errno\nwritten = 0\nerr = []\n"
        "for d in ('.', '/tmp', '/dev/shm'):\n"
        "    for i in range(1000):\n"
        "        try:\n            with open(f'{d}/f{i}', 'wb', buffering=0) as fh:\n"
        "                written += fh.write(b'x' * 262144)\n"
        "        except OSError as e:\n"
        "            err.append(errno.errorcode.get(e.errno))\n            break\n"
        "[written, err]",
        options={"workspace_bytes": size, "tmp_bytes": size, "shm_bytes": size},
        file_size_bytes=1024 * 1024,
    )
    assert result.error is None, result.error
    written, err = result.return_value
    assert err == ["ENOSPC"] * 3
    assert written <= 3 * size


@RUNTIMES
async def test_fork_bomb_bounded_with_host_responsive(runtime: str) -> None:
    result = await run(
        "import os, time\nmade = 0\n"
        "try:\n    for _ in range(500):\n        pid = os.fork()\n"
        "        if pid == 0:\n            time.sleep(60)\n            os._exit(0)\n"
        "        made += 1\nexcept OSError as e:\n    err = type(e).__name__\n"
        "else:\n    err = None\n"
        "[made, err]",
        runtime,
        processes=16,
    )
    assert subprocess.run(["true"], check=False).returncode == 0
    assert result.error is None, result.error
    made, err = result.return_value
    assert err == "BlockingIOError"
    assert made < 16


@RUNTIMES
async def test_multi_process_program_works(runtime: str) -> None:
    """Processes are not a gVisor sandbox killer: the program's limit applies, not the
    runtime's own task count."""
    result = await run(
        "import os, subprocess, sys\n"
        "runs = [subprocess.run([sys.executable, '-c', 'print(1)'], capture_output=True)"
        ".stdout for _ in range(20)]\n"
        "forks = []\n"
        "for _ in range(20):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n        os._exit(7)\n"
        "    forks.append(os.waitpid(pid, 0)[1] >> 8)\n"
        "procs = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(0.5)'])"
        " for _ in range(20)]\n"
        "codes = [p.wait() for p in procs]\n"
        "[runs.count(b'1\\n'), forks.count(7), codes.count(0)]",
        runtime,
    )
    assert result.error is None, result.error
    assert result.return_value == [20, 20, 20]


@RUNTIMES
async def test_memory_bomb_is_memory_limit(runtime: str) -> None:
    result = await run("x = bytearray(4 * 1024**3)\nlen(x)", runtime, memory_bytes=256 * 2**20)
    assert result.error is not None
    assert result.error.kind.value == "memory_limit"


@RUNTIMES
async def test_cgroup_oom_kill_is_memory_limit_not_a_crash(runtime: str) -> None:
    """Memory the address-space limit does not see (tmpfs pages) plus the heap exhausts the
    container's memory cgroup: the kernel's OOM killer ends the program, and that is reported
    as memory exhaustion."""
    result = await run(
        "for d in ('/workspace', '/tmp'):\n"
        "    with open(f'{d}/fill', 'wb') as fh:\n"
        "        for _ in range(100):\n            fh.write(b'x' * 2**20)\n"
        "x = bytearray(b'y') * (200 * 2**20)\n"
        "len(x)",
        runtime,
        options={"workspace_bytes": 128 * 2**20, "tmp_bytes": 128 * 2**20},
        memory_bytes=256 * 2**20,
        file_size_bytes=128 * 2**20,
    )
    assert result.error is not None
    assert result.error.kind.value == "memory_limit", result.error
    assert "out-of-memory" in result.error.message
