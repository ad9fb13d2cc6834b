"""Containment under bwrap, asserted from the host: what the program could not read, reach,
write or leave behind. The canary, the loopback listeners, the workspace's removal and the
detached daemon are the shared suite's (test_conformance.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import anyio
import pytest
from bwrap_support import (
    marker,
    opens_of,
    pids_with,
    requires_bwrap,
    run,
    wait_for_pids,
)
from psych_sandbox_core import cgroups
from psych_sandbox_core.identity import DEFAULT_COUNT, DEFAULT_FIRST_UID

pytestmark = [requires_bwrap, pytest.mark.anyio]

ISOLATING = ("filesystem", "network", "process_tree", "identity")


async def test_level_isolated_with_isolating_grades_enforced() -> None:
    result = await run("print(2 + 2)")
    assert result.error is None, result.error
    assert result.stdout == "4\n"
    assert result.level == "isolated"
    for guarantee in ISOLATING:
        assert result.grades[guarantee] == "enforced", guarantee
    assert result.backend.id == "bwrap"
    assert result.backend.distribution == "psych-sandbox-bwrap"
    # Honest about usage: bwrap never hands the tree's accounting to the host, so it is
    # measured only where the execution gets a cgroup of its own.
    has_cgroups = isinstance(cgroups.detect(), cgroups.CgroupHost)
    assert result.usage.measured_by == ("host" if has_cgroups else "none")
    assert (result.usage.cpu_seconds is not None) == has_cgroups


async def test_root_and_home_absent() -> None:
    home = os.path.expanduser("~")
    secret = uuid.uuid4().hex
    planted = Path(home) / f".psych-bwrap-canary-{secret[:8]}"
    planted.write_text(secret)
    os.chmod(planted, 0o644)
    try:
        with opens_of(str(planted)) as opened:
            result = await run(
                "import os\nseen = {}\n"
                f"for p in ('/root', {home!r}, '/home', {str(planted)!r}):\n"
                "    try:\n"
                "        seen[p] = open(p).read() if os.path.isfile(p) else os.listdir(p)\n"
                "    except OSError as e:\n        seen[p] = type(e).__name__\n"
                "seen"
            )
        with opens_of(str(planted)) as control:
            planted.read_text()
    finally:
        planted.unlink()
    assert result.error is None, result.error
    # From the host: the planted file was never opened (a watch on the home directory
    # itself would also see whatever else on the host opens files there).
    assert opened == [] and control
    assert secret not in str(result.return_value)
    assert all(v == "FileNotFoundError" for v in result.return_value.values()), result.return_value


@pytest.mark.skipif(os.geteuid() != 0, reason="planting a file in /usr/local/etc needs root")
async def test_host_configuration_under_usr_is_hidden() -> None:
    # /usr is bound for the interpreter; the host's own settings in /usr/local/etc are not.
    secret = uuid.uuid4().hex
    planted = Path("/usr/local/etc") / f"psych-bwrap-canary-{secret[:8]}"
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_text(secret)
    os.chmod(planted, 0o644)
    try:
        with opens_of(str(planted)) as opened:
            result = await run(
                "import os\n"
                f"try:\n    seen = open({str(planted)!r}).read()\n"
                "except OSError as e:\n    seen = type(e).__name__\n"
                "[seen, os.listdir('/usr/local/etc')]"
            )
    finally:
        planted.unlink()
    assert result.error is None, result.error
    assert opened == []
    assert result.return_value == ["FileNotFoundError", []]


async def test_host_processes_invisible() -> None:
    mark = marker()
    # The marked process itself, not a shell around it: killing it leaves nothing behind.
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", mark])
    try:
        await wait_for_pids(mark)
        result = await run(
            "import os\nlines = []\n"
            "for e in os.listdir('/proc'):\n"
            "    if e.isdigit():\n"
            "        try:\n"
            # The head of each command line is enough to recognise it (the bootstrap's own is
            # long: it carries its code).
            "            head = open(f'/proc/{e}/cmdline', 'rb').read(400)\n"
            "            lines.append(head.decode('latin-1'))\n"
            "        except OSError:\n            pass\n"
            "lines"
        )
    finally:
        sleeper.kill()
        sleeper.wait()
    assert pids_with(mark) == []
    assert result.error is None, result.error
    cmdlines = result.return_value
    assert cmdlines, "the program saw no process at all, not even itself"
    assert not any(mark in c for c in cmdlines)
    assert not any("pytest" in c for c in cmdlines)
    # bwrap's init and the program itself: nothing else.
    assert len(cmdlines) <= 3, cmdlines


async def test_run_dir_and_docker_socket_absent() -> None:
    # A listener under the host's /run stands for any host service socket there.
    path = f"/run/psych-bwrap-{uuid.uuid4().hex[:12]}.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    os.chmod(path, 0o777)
    server.listen(8)
    server.setblocking(False)
    try:
        result = await run(
            "import socket, os\nout = {}\n"
            f"for p in ({path!r}, '/var/run/docker.sock', '/run/docker.sock'):\n"
            "    s = socket.socket(socket.AF_UNIX)\n"
            "    try:\n        s.connect(p); out[p] = 'connected'\n"
            "    except OSError as e:\n        out[p] = type(e).__name__\n"
            "    finally:\n        s.close()\n"
            "out['/var/run exists'] = os.path.exists('/var/run')\nout"
        )
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()
        os.unlink(path)
    assert result.error is None, result.error
    assert result.return_value[path] == "FileNotFoundError"
    assert result.return_value["/var/run/docker.sock"] == "FileNotFoundError"
    assert result.return_value["/var/run exists"] is False


async def test_identity_seen_from_the_host() -> None:
    """The program's process, inspected from the host: unprivileged, no capabilities, no new
    privileges, in namespaces of its own."""
    mark = marker()
    outcome: dict[str, object] = {}

    async def inspect() -> None:
        (pid,) = await wait_for_pids(mark)
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        )
        outcome["uid"] = [int(x) for x in status["Uid"].split()]
        outcome["capeff"] = int(status["CapEff"].strip(), 16)
        outcome["capprm"] = int(status["CapPrm"].strip(), 16)
        outcome["nnp"] = status["NoNewPrivs"].strip()
        outcome["namespaces"] = {
            ns: os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}")
            for ns in ("user", "pid", "net", "mnt", "ipc", "uts")
        }
        os.kill(pid, signal.SIGTERM)

    async with anyio.create_task_group() as tg:
        tg.start_soon(inspect)
        result = await run(
            "import subprocess, sys\n"
            f"subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)', {mark!r}])"
            ".returncode"
        )
    assert result.error is None, result.error
    assert result.return_value == -signal.SIGTERM
    if os.getuid() == 0:
        # A uid leased for this execution, the same in all four slots.
        (uid,) = set(outcome["uid"])  # type: ignore[call-overload]
        assert DEFAULT_FIRST_UID <= uid < DEFAULT_FIRST_UID + DEFAULT_COUNT
    else:
        assert outcome["uid"] == [os.getuid()] * 4
    assert outcome["capeff"] == 0
    assert outcome["capprm"] == 0
    assert outcome["nnp"] == "1"
    assert all(outcome["namespaces"].values()), outcome["namespaces"]  # type: ignore[union-attr]


async def test_kernel_settings_not_writable() -> None:
    setting = "/proc/sys/fs/aio-max-nr"
    before = Path(setting).read_text()
    result = await run(
        "import os\nwrote = []\n"
        "for root, dirs, files in os.walk('/proc/sys'):\n"
        "    for f in files:\n        p = os.path.join(root, f)\n"
        "        try:\n            fd = os.open(p, os.O_WRONLY)\n"
        "        except OSError:\n            continue\n"
        "        wrote.append(p); os.close(fd)\n"
        f"try:\n    open({setting!r}, 'w').write('4242')\nexcept OSError as e:\n"
        "    pass\nwrote"
    )
    assert result.error is None, result.error
    assert Path(setting).read_text() == before
    assert result.return_value == []


async def test_writes_outside_the_workspace_impossible() -> None:
    drop = Path(tempfile.mkdtemp(prefix="psych-bwrap-drop-"))
    os.chmod(drop, 0o777)
    try:
        result = await run(
            "import os\nok = []\n"
            f"for p in ({str(drop / 'x')!r}, '/usr/x', '/x', '/proc/x', '/dev/x', '/bin/x', "
            "'/tmpx', '/workspace/../x'):\n"
            "    try:\n        open(p, 'w').write('x'); ok.append(p)\n"
            "    except OSError:\n        pass\n"
            "open('inside', 'w').write('fine')\nok"
        )
        assert result.error is None, result.error
        assert list(drop.iterdir()) == []
        assert not Path("/usr/x").exists() and not Path("/x").exists()
        assert result.return_value == []
    finally:
        for child in drop.iterdir():
            child.unlink()
        drop.rmdir()


async def test_fork_bomb_bounded_by_process_count_with_host_responsive() -> None:
    result = await run(
        "import os, time\nmade = 0\n"
        "try:\n    for _ in range(500):\n        pid = os.fork()\n"
        "        if pid == 0:\n            time.sleep(60)\n            os._exit(0)\n"
        "        made += 1\nexcept OSError as e:\n    err = type(e).__name__\n"
        "else:\n    err = None\n"
        "[made, err]",
        processes=16,
    )
    # The host still starts processes while, and after, the bomb went off.
    assert subprocess.run(["true"], check=False).returncode == 0
    assert result.error is None, result.error
    made, err = result.return_value
    assert err == "BlockingIOError"
    assert made < 16


async def test_memory_bomb_stopped() -> None:
    result = await run("x = bytearray(4 * 1024**3)\nlen(x)", memory_bytes=256 * 1024 * 1024)
    assert result.error is not None
    assert result.error.kind.value == "memory_limit"


async def test_disk_fill_stopped_at_the_file_size_cap() -> None:
    cap = 1024 * 1024
    result = await run(
        "written = 0\n"
        "with open('big', 'wb', buffering=0) as fh:\n"
        "    try:\n        for _ in range(64):\n            written += fh.write(b'x' * 65536)\n"
        "    except OSError as e:\n        err = e.errno\n"
        "import errno\n[written, errno.errorcode.get(err)]",
        file_size_bytes=cap,
    )
    assert result.error is None, result.error
    written, err = result.return_value
    assert err == "EFBIG"
    assert written == cap


async def test_tmpfs_fill_stopped_at_the_tmpfs_cap() -> None:
    size = 4 * 1024 * 1024
    result = await run(
        "import errno\nwritten = 0\nerr = None\n"
        "for d in ('.', '/tmp', '/dev/shm'):\n"
        "    for i in range(1000):\n"
        "        try:\n            with open(f'{d}/f{i}', 'wb', buffering=0) as fh:\n"
        "                written += fh.write(b'x' * 262144)\n"
        "        except OSError as e:\n"
        "            err = errno.errorcode.get(e.errno)\n            break\n"
        "[written, err]",
        options={"workspace_bytes": size, "tmp_bytes": size, "shm_bytes": size},
        file_size_bytes=1024 * 1024,
    )
    assert result.error is None, result.error
    written, err = result.return_value
    assert err == "ENOSPC"
    # Three filesystems, each stopped at its cap, although no single file reached the
    # file-size limit.
    assert written <= 3 * size
    assert written >= 3 * (size - 2 * 262144)
