"""The bootstrap reaches a container precompiled: the host writes the code it compiled (and
the source) into the read-only run directory, and the container's interpreter runs the code
only when it has the host's bytecode magic. Compiling the bootstrap's source costs every
container tens of milliseconds of its start."""

from __future__ import annotations

import importlib.util
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from docker_support import RUNTIMES, run
from psych_sandbox_core.kit.relay import bootstrap_source
from psych_sandbox_testing.bootstrap_files import CODE_FILE, SOURCE_FILE, directory_arguments

import psych_sandbox_docker.backend as docker_backend

#: Says which form of itself the interpreter ran: code compiled by the host is named
#: <bootstrap>, source the child compiled itself <string>.
WHICH = "import sys\nprint(sys._getframe().f_code.co_filename, sys.argv[1:])\n"


def _start(arguments: list[str]) -> str:
    return subprocess.run(
        [sys.executable, "-I", "-S", *arguments, "channel=x"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.strip()


def test_the_child_runs_the_hosts_code_only_under_the_same_magic(tmp_path: Path) -> None:
    arguments = directory_arguments(WHICH, str(tmp_path), str(tmp_path))
    code, source = tmp_path / CODE_FILE, tmp_path / SOURCE_FILE
    # Nobody but the host's owner may change them (and the container sees them read-only).
    for path in (code, source):
        assert stat.S_IMODE(path.stat().st_mode) == 0o444
    assert _start(arguments) == "<bootstrap> ['channel=x']"
    # An interpreter of another bytecode magic (an image's other Python) runs the source.
    data = code.read_bytes()
    code.chmod(0o644)
    code.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    assert _start(arguments) == "<string> ['channel=x']"
    # The files are made, never reused: one planted first is refused.
    with pytest.raises(FileExistsError):
        directory_arguments(WHICH, str(tmp_path), str(tmp_path))


@pytest.mark.anyio
@pytest.mark.usefixtures("engine")
@RUNTIMES
async def test_the_container_runs_the_precompiled_bootstrap_and_cannot_write_it(
    runtime: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the run directory holds when the host removes it, read on the host.
    seen: dict[str, bytes] = {}
    remove = docker_backend._remove_tree

    def record(directory: Path) -> None:
        seen.update((p.name, p.read_bytes()) for p in directory.iterdir() if p.is_file())
        remove(directory)

    monkeypatch.setattr(docker_backend, "_remove_tree", record)
    result = await run(
        "import os, sys\n"
        "def attempt(how):\n"
        "    try:\n        how()\n    except OSError:\n        return False\n"
        "    return True\n"
        "wrote = [attempt(lambda: open('/run/psych/bootstrap.code', 'r+b')),\n"
        "         attempt(lambda: os.unlink('/run/psych/bootstrap.py')),\n"
        "         attempt(lambda: open('/run/psych/planted', 'wb'))]\n"
        "[sys.modules['__main__'].main.__code__.co_filename, wrote]",
        runtime,
    )
    assert result.error is None, result.error
    assert result.return_value == ["<bootstrap>", [False, False, False]]
    assert sorted(seen) == sorted([CODE_FILE, SOURCE_FILE])
    assert seen[SOURCE_FILE] == bootstrap_source().encode()
    assert seen[CODE_FILE].startswith(importlib.util.MAGIC_NUMBER)
