"""The conformance tests of a boundary: the filesystem out of reach, limits that hold, and
artifacts sent over the channel where the workspace is not on the host."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from psych_sandbox_core import ErrorKind, OutputPolicy
from psych_sandbox_core.result import SkippedEntry

from ..host import marker, opens_of, wait_for_pids
from ..programs import PLANTED_ARTIFACTS, check_planted_artifacts
from .base import ConformanceBase
from .declarations import applies, claims


class BoundaryTests(ConformanceBase):
    """What a backend claiming a boundary is asked about it."""

    # ------------------------------------------------------------ a filesystem boundary

    @applies(claims("filesystem"))
    @pytest.mark.anyio
    async def test_host_files_and_service_sockets_out_of_reach(self) -> None:
        home = os.path.expanduser("~")
        secret = uuid.uuid4().hex
        planted = Path(home) / f".psych-conformance-canary-{secret[:8]}"
        planted.write_text(secret)
        os.chmod(planted, 0o644)
        # A listener under the host's /run stands for any host service socket there.
        service = f"/run/psych-conformance-{uuid.uuid4().hex[:12]}.sock"
        server = socket.socket(socket.AF_UNIX)
        server.bind(service)
        os.chmod(service, 0o777)
        server.listen(8)
        server.setblocking(False)
        try:
            with opens_of(str(planted)) as opened:
                result = await self.run(
                    "import os, socket\nseen = {}\n"
                    f"for p in ('/root', {home!r}, '/home', {str(planted)!r}):\n"
                    "    try:\n"
                    "        seen[p] = open(p).read() if os.path.isfile(p) else os.listdir(p)\n"
                    "    except OSError as e:\n        seen[p] = type(e).__name__\n"
                    f"for p in ({service!r}, '/var/run/docker.sock', '/run/docker.sock',\n"
                    "          '/run/containerd/containerd.sock', '/run/podman/podman.sock'):\n"
                    "    s = socket.socket(socket.AF_UNIX)\n"
                    "    try:\n        s.connect(p); seen[p] = 'connected'\n"
                    "    except OSError as e:\n        seen[p] = type(e).__name__\n"
                    "    finally:\n        s.close()\n"
                    "seen"
                )
            # The controls: the watch sees an open from the host; the listener was listening.
            with opens_of(str(planted)) as control:
                planted.read_text()
            with pytest.raises(BlockingIOError):
                server.accept()
        finally:
            server.close()
            os.unlink(service)
            planted.unlink()
        assert result.error is None, result.error
        # From the host: the planted file's inode was never opened (inotify watches it,
        # whatever mount reached it) and the service accepted nothing. (The engine's socket
        # has no such witness: a connect opens no file; its absence is what the program saw.)
        assert opened == [] and control
        assert secret not in str(result.return_value)
        assert set(result.return_value.values()) == {"FileNotFoundError"}, result.return_value

    @applies(claims("filesystem"))
    @pytest.mark.anyio
    async def test_writes_outside_the_workspace_impossible(self) -> None:
        drop = Path(tempfile.mkdtemp(prefix="psych-conformance-drop-"))
        os.chmod(drop, 0o777)
        outside = ("/usr/x", "/x", "/tmpx")
        try:
            result = await self.run(
                "import os\nok = []\n"
                f"for p in ({str(drop / 'x')!r}, *{outside!r}, '/etc/passwd', '/proc/x', "
                "'/dev/x', os.path.join(os.getcwd(), '..', 'x'), "
                "'/proc/sys/kernel/hostname'):\n"
                "    try:\n        open(p, 'w').write('x'); ok.append(p)\n"
                "    except OSError:\n        pass\n"
                "open('inside', 'w').write('fine')\nok"
            )
            assert result.error is None, result.error
            # Seen from the host: nothing arrived where the program tried to write.
            assert list(drop.iterdir()) == []
            assert not any(Path(path).exists() for path in outside)
            assert result.return_value == []
        finally:
            for child in drop.iterdir():
                child.unlink()
            drop.rmdir()

    @applies(lambda cls: claims("filesystem", "process_tree")(cls) and cls.processes_visible)
    @pytest.mark.anyio
    async def test_host_processes_invisible(self) -> None:
        mark = marker()
        # The marked process itself, not a shell around it: killing it leaves nothing behind.
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", mark])
        try:
            await wait_for_pids(mark)
            result = await self.run(
                "import os\nlines = []\n"
                "for e in os.listdir('/proc'):\n"
                "    if e.isdigit():\n"
                "        try:\n"
                # The head of a command line is enough to recognise it (the bootstrap's own
                # is long: it carries its code).
                "            head = open(f'/proc/{e}/cmdline', 'rb').read(400)\n"
                "            lines.append(head.decode('latin-1'))\n"
                "        except OSError:\n            pass\n"
                "lines"
            )
        finally:
            sleeper.kill()
            sleeper.wait()
        assert result.error is None, result.error
        cmdlines = result.return_value
        assert cmdlines, "the program saw no process at all, not even itself"
        assert not any(mark in line for line in cmdlines)
        # Not this host process (the bootstrap's own arguments may name pytest's temporary
        # directory, as its probe targets live there).
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as fh:
            host = fh.read(400).decode("latin-1")
        assert host not in cmdlines
        # The boundary's init and the program itself: nothing else.
        assert len(cmdlines) <= 3, cmdlines

    @applies(lambda cls: cls.capped_filesystems)
    @pytest.mark.anyio
    async def test_memory_backed_filesystems_stop_at_their_caps(self) -> None:
        size = 4 * 1024 * 1024
        chunk = 262144
        result = await self.run(
            "import errno\nwritten = 0\nerr = []\n"
            "for d in ('.', '/tmp', '/dev/shm'):\n"
            "    for i in range(1000):\n"
            "        try:\n            with open(f'{d}/f{i}', 'wb', buffering=0) as fh:\n"
            f"                written += fh.write(b'x' * {chunk})\n"
            "        except OSError as e:\n"
            "            err.append(errno.errorcode.get(e.errno))\n            break\n"
            "[written, err]",
            options={"workspace_bytes": size, "tmp_bytes": size, "shm_bytes": size},
            file_size_bytes=1024 * 1024,
        )
        assert result.error is None, result.error
        written, err = result.return_value
        # Three filesystems, each stopped at its cap, though no file reached the file-size
        # limit: many small files cannot fill the host's memory.
        assert err == ["ENOSPC"] * 3
        assert 3 * (size - 2 * chunk) <= written <= 3 * size

    # ------------------------------------------------------------ limits

    @applies(lambda cls: bool({"identity", "process_count"} & cls.enforced))
    @pytest.mark.anyio
    async def test_fork_bomb_bounded_with_the_host_responsive(self) -> None:
        result = await self.run(
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

    @pytest.mark.anyio
    async def test_memory_bomb_is_a_memory_limit(self) -> None:
        result = await self.run("x = bytearray(4 * 1024**3)\nlen(x)", memory_bytes=256 << 20)
        assert result.error is not None
        assert result.error.kind is ErrorKind.MEMORY_LIMIT, result.error

    # ------------------------------------------------------------ artifacts over the channel

    @applies(lambda cls: not cls.workspace_on_host)
    @pytest.mark.anyio
    async def test_files_come_back_over_the_channel_with_digest_and_type(self) -> None:
        async with self.sandbox(output=OutputPolicy(inline_bytes=4 << 20)) as box:
            result = await box.run(PLANTED_ARTIFACTS, profile=self.profile)
            assert result.backend.id == self.backend
            await check_planted_artifacts(box, result)

    @applies(lambda cls: not cls.workspace_on_host)
    @pytest.mark.anyio
    async def test_artifact_caps_and_folder_hold_over_the_channel(self) -> None:
        source = (
            "import os\nos.makedirs('out')\n"
            "open('elsewhere', 'w').write('not in the folder')\n"
            "for name, size in (('a', 10), ('b', 500), ('c', 10), ('d', 10), ('e', 1), "
            "('f', 1)):\n"
            "    open(f'out/{name}', 'w').write('x' * size)\n"
        )
        policy = OutputPolicy(
            artifacts_folder="out", artifact_bytes=100, artifacts_total_bytes=25, max_artifacts=3
        )
        async with self.sandbox(output=policy) as box:
            result = await box.run(source, profile=self.profile)
        assert result.error is None, result.error
        assert sorted(a.path for a in result.artifacts) == ["out/a", "out/c", "out/e"]
        assert {s.path: s.reason for s in result.skipped_artifacts} == {
            "out/b": "too_large",
            "out/d": "total_cap",
            "out/f": "too_many",
        }

    @applies(lambda cls: not cls.workspace_on_host)
    @pytest.mark.anyio
    async def test_a_run_killed_before_sending_says_nothing_was_collected(self) -> None:
        source = "open('kept', 'w').write('x')\nimport time\ntime.sleep(60)\n"
        async with self.sandbox() as box:
            result = await box.run(source, profile=self.profile, timeout=1.0)
        assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT
        assert result.artifacts == []
        assert result.skipped_artifacts == [SkippedEntry(path=".", reason="interrupted")]
