"""Containment that is bwrap's own, asserted from the host: its grades and usage, the host
configuration under /usr hidden, kernel settings not writable, the file-size cap. Host files
and sockets, writes outside the workspace, host processes, identity, the fork and memory
bombs, the tmpfs caps, the canary, the loopback listeners, the workspace's removal and the
detached daemon are the shared suite's (test_conformance.py)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from bwrap_support import requires_bwrap, run
from psych_sandbox_testing.cgroups_here import makes_cgroups
from psych_sandbox_testing.host import opens_of

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
    has_cgroups = makes_cgroups()
    assert result.usage.measured_by == ("host" if has_cgroups else "none")
    assert (result.usage.cpu_seconds is not None) == has_cgroups


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
