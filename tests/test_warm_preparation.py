"""A warm child's preparation for an awaiting program: what it imports while it waits idle for
its program, and when it does not (a program already there; a machine with no processor to
spare). Judged from the host side, by the shared objects mapped into the child's process (the
event loop's C accelerator is mapped only once asyncio is imported), never by timing."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from psych_sandbox_core.bootstrap_loader import bootstrap_source

#: Runs the bootstrap's preparation on the descriptor it is given, with what each look at the
#: machine finds (LOOKS, the last repeated), telling the test of each look and of its return,
#: then holds still until the test has examined it.
_CHILD = """
import sys, _socket
namespace = {"__name__": "bootstrap"}
exec(compile(SOURCE, "<bootstrap>", "exec"), namespace)
looks = []

def cpu_to_spare():
    spare = LOOKS[min(len(looks), len(LOOKS) - 1)]
    looks.append(spare)
    print("spare" if spare else "busy", flush=True)
    return spare

namespace["_cpu_to_spare"] = cpu_to_spare
namespace["BUSY_RECHECK_SECONDS"] = (0.001,)
channel = _socket.socket(fileno=int(sys.argv[1]))
namespace["_prepare_while_idle"](channel)
try:
    waiting = channel.recv(64, _socket.MSG_PEEK | _socket.MSG_DONTWAIT)
except BlockingIOError:
    waiting = b""
print("returned", waiting, flush=True)
sys.stdin.read()
"""

RUN_FRAME = b'{"type":"run"}\n'


@contextmanager
def child(tmp_path: Path, looks: list[bool]) -> Iterator[tuple[subprocess.Popen[str], Any]]:
    script = tmp_path / "child.py"
    script.write_text(f"SOURCE = {bootstrap_source()!r}\nLOOKS = {looks!r}\n" + _CHILD)
    host, theirs = socket.socketpair()
    with host:
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", str(script), str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        finally:
            theirs.close()
        with process:
            try:
                yield process, host
            finally:
                process.kill()


def lines_until(process: subprocess.Popen[str], last: str) -> list[str]:
    assert process.stdout is not None
    lines = []
    while not lines or not lines[-1].startswith(last):
        line = process.stdout.readline()
        assert line, f"the child ended early after {lines}"
        lines.append(line.strip())
    return lines


def asyncio_mapped(pid: int) -> bool:
    """Whether the event loop's C accelerator is mapped into ``pid`` (asyncio imported)."""
    return "/_asyncio." in Path(f"/proc/{pid}/maps").read_text()


def _accelerator_is_a_shared_object() -> bool:
    import _asyncio

    return bool(getattr(_asyncio, "__file__", None))


#: Where the test can see, from outside, whether a process imported asyncio.
seen_in_maps = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not _accelerator_is_a_shared_object(),
    reason="reads /proc/PID/maps for asyncio's accelerator, a shared object",
)


@seen_in_maps
@pytest.mark.parametrize("looks", [[True], [False, False, True]])
def test_an_idle_child_prepares_once_a_processor_is_free(tmp_path: Path, looks: list[bool]) -> None:
    with child(tmp_path, looks) as (process, _):
        lines = lines_until(process, "returned")
        assert asyncio_mapped(process.pid)
    # Busy looks came first, each waited out; then one step per module, each after a look.
    busy = looks.count(False)
    assert lines[:busy] == ["busy"] * busy
    assert set(lines[busy:-1]) == {"spare"}


@seen_in_maps
def test_a_child_on_a_busy_machine_prepares_nothing_and_its_program_finds_it_waiting(
    tmp_path: Path,
) -> None:
    with child(tmp_path, [False]) as (process, host):
        assert lines_until(process, "busy") == ["busy"]
        assert lines_until(process, "busy") == ["busy"]  # looked again, still busy
        assert not asyncio_mapped(process.pid)
        host.sendall(RUN_FRAME)
        returned = lines_until(process, "returned")[-1]
        assert not asyncio_mapped(process.pid)
    assert returned == f"returned {RUN_FRAME!r}"  # the frame left for the bootstrap to read


@seen_in_maps
def test_a_cold_child_whose_program_is_there_prepares_nothing(tmp_path: Path) -> None:
    with child(tmp_path, [True]) as (process, host):
        host.sendall(RUN_FRAME)
        assert lines_until(process, "returned") == [f"returned {RUN_FRAME!r}"]
        assert not asyncio_mapped(process.pid)


@pytest.mark.parametrize(
    ("loadavg", "cpus", "spare"),
    [
        (b"0.10 0.20 0.30 1/180 4242\n", 2, True),  # the reader alone
        (b"1.50 1.20 1.00 2/180 4242\n", 2, True),  # one other: a processor is free
        (b"3.50 3.20 3.00 3/180 4242\n", 2, False),  # two others on two processors
        (b"9.00 8.00 7.00 12/190 4242\n", 2, False),
        (b"0.00 0.00 0.00 0/0 0\n", 1, True),  # an emulated /proc that counts nothing
        (b"garbled", 2, True),  # unreadable: prepare, as before this check existed
    ],
)
def test_a_processor_is_spare_while_fewer_others_are_ready_to_run_than_processors(
    bootstrap: dict[str, Any], loadavg: bytes, cpus: int, spare: bool
) -> None:
    assert bootstrap["spare_cpu"](loadavg, cpus) is spare


@pytest.fixture(scope="module")
def bootstrap() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "bootstrap"}
    exec(compile(bootstrap_source(), "<bootstrap>", "exec"), namespace)
    return namespace
