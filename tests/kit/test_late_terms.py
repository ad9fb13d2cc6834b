"""What the host hands a child once it is spawned (late_terms.py): made while the child's
interpreter starts, delivered once, held by no program, and nothing runs without it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from psych_sandbox_core import Guarantee, Sandbox
from psych_sandbox_core.child.loader import bootstrap_module, bootstrap_source
from psych_sandbox_core.grading import Grade
from psych_sandbox_core.kit.backend import LaunchRequest, ProbeTargets
from psych_sandbox_core.kit.channel import InheritedSocketChannel
from psych_sandbox_core.kit.late_terms import LATE_TERMS_BYTES, LATE_TERMS_FDS, LateTerms
from psych_sandbox_core.kit.phases import recording
from psych_sandbox_core.kit.starting import bootstrap_argv
from psych_sandbox_core.terms import ExecutionLimits

from ..backends.test_subprocess_backend import EXEC_SLEEPER, run_and_inspect
from ..conftest import PROFILE, config, marker, sleeper_argv_source

#: The child's functions and constants, from the source the child runs.
bootstrap = bootstrap_module()

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_the_bootstraps_bounds_are_the_hosts() -> None:
    assert bootstrap.LATE_TERMS_BYTES == LATE_TERMS_BYTES
    assert bootstrap.LATE_TERMS_FDS == LATE_TERMS_FDS


async def test_the_host_makes_the_probe_targets_and_cgroup_while_the_child_starts() -> None:
    async with Sandbox(config(warm=0)) as sandbox:
        with recording() as marks:
            result = await sandbox.run("print(2+2)", profile=PROFILE)
    assert result.error is None and result.stdout == "4\n", result.error
    points = [point for point, _ in marks]
    # Made after the spawn, before the child reported: on the path the caller waits for
    # only as long as the child's own start takes.
    later = ["probe targets", *(["cgroup made"] if "cgroup made" in points else [])]
    for point in later:
        assert points.index("spawned") < points.index(point) < points.index("connected"), points
    # The child probed what the host made: the listeners were tried and never reached.
    assert result.grades[Guarantee.NETWORK] is Grade.ENFORCED


async def test_no_program_holds_the_terms_socket() -> None:
    # The program execs a process that keeps every descriptor it was given without
    # close-on-exec (the late terms' end is passed inheritable): the host counts its sockets.
    mark = marker()

    def sockets(pid: int) -> list[str]:
        links = []
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                pass
        return [link for link in links if link.startswith("socket:")]

    program = EXEC_SLEEPER.format(argv=sleeper_argv_source(mark))
    _, held = await run_and_inspect(program, mark, sockets)
    # Its stdout and stderr, nothing else (the channel is close-on-exec).
    assert len(held) == 2, held


def test_a_child_given_no_terms_exits_unstarted() -> None:
    request = LaunchRequest(
        bootstrap_source=bootstrap_source(),
        targets=lambda: ProbeTargets(None, None, None, os.getpid()),
        limits=ExecutionLimits(),
    )
    channel = InheritedSocketChannel()
    late = LateTerms()
    argv = bootstrap_argv(sys.executable, request, channel.child_spec, late=late)
    process = subprocess.Popen(
        argv,
        pass_fds=(*channel.inherited_fds, late.child_fd),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={},
    )
    late.after_spawn()
    channel.after_spawn()
    late.close()  # the host gave up on this start: nothing delivered
    _, stderr = process.communicate(timeout=60)
    assert process.returncode != 0
    assert b"the host's terms did not come" in stderr
    host = channel._host
    host.settimeout(60)
    assert host.recv(1) == b"", "the child spoke without its terms"
    host.close()


def test_terms_reach_the_child_with_their_descriptors() -> None:
    # The message and descriptors as the bootstrap reads them, in a real child process.
    late = LateTerms()
    read, write = os.pipe()
    reader = (
        "import sys\n"
        + "exec(compile(sys.argv[1], 'b', 'exec'), g := {'__name__': 'x'})\n"
        + "probe, fds = g['_late_terms'](int(sys.argv[2]))\n"
        + "import os\n"
        + "os.write(fds[0], repr(probe).encode()); print(len(fds))\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-I", "-c", reader, bootstrap_source(), str(late.child_fd)],
        pass_fds=(late.child_fd,),
        stdout=subprocess.PIPE,
    )
    late.after_spawn()
    late.deliver(ProbeTargets("/nowhere/canary", 1, None, 7), [write])
    os.close(write)
    out, _ = child.communicate(timeout=60)
    written = os.read(read, 4096)
    os.close(read)
    assert child.returncode == 0 and out.strip() == b"1"
    assert (
        written
        == repr({"canary": "/nowhere/canary", "port4": 1, "port6": None, "host_pid": 7}).encode()
    )


def test_too_many_descriptors_are_refused_before_anything_is_sent() -> None:
    late = LateTerms()
    try:
        with pytest.raises(ValueError, match="descriptors"):
            late.deliver(ProbeTargets(None, None, None, 1), [0] * (LATE_TERMS_FDS + 1))
        assert isinstance(late.child_fd, int)
        peer = socket.socket(fileno=os.dup(late.child_fd))
        peer.setblocking(False)
        with pytest.raises(BlockingIOError):
            peer.recv(1)  # nothing was sent
        peer.close()
    finally:
        late.close()
