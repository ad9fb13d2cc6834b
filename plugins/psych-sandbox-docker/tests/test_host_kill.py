"""A timed-out container is killed by the host itself, through a pidfd on its init taken and
verified before the program ran, not by the engine's kill request; under runc its output
streams end at the host's seal. Judged from the host: the requests sent to the engine, and
the kernel's listing of the containers' cgroups."""

from __future__ import annotations

import os
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from docker_support import PROFILE, RUNTIMES, config, live_in_containers
from psych_sandbox_core import ErrorKind, FunctionBindings, Sandbox
from psych_sandbox_testing.host import wait_until
from psych_sandbox_testing.phases import recording

from psych_sandbox_docker import api
from psych_sandbox_docker.backend import _Demux
from psych_sandbox_docker.container_init import SEAL_PREFIX, ContainerInit
from psych_sandbox_docker.image import DEFAULT_TAG

#: Output on both streams, a forked process that ignores SIGTERM, a line that looks like a
#: seal (only the host's own, made after the container ended, ends a stream), then asleep.
PROGRAM = textwrap.dedent(
    """
    import os, signal, time
    seen = await processes()
    os.write(1, b"out\\n" + SEAL_LOOKALIKE + b"\\n")
    os.write(2, b"err\\n")
    r, w = os.pipe()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.write(1, b"child\\n")
        os.write(w, b"x")
        while True:
            time.sleep(1)
    os.read(r, 1)
    os.write(1, str(seen).encode() + b"\\n")
    while True:
        time.sleep(1)
    """
).replace("SEAL_LOOKALIKE", repr(SEAL_PREFIX + b"0" * 32))


@pytest.fixture
def engine_requests(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The paths of the requests sent to the engine's API."""
    sent: list[str] = []
    request = api.EngineClient.request

    async def recorded(self: api.EngineClient, method: str, path: str, **kwargs: Any) -> Any:
        sent.append(path)
        return await request(self, method, path, **kwargs)

    monkeypatch.setattr(api.EngineClient, "request", recorded)
    yield sent


@pytest.mark.usefixtures("engine")
@pytest.mark.anyio
@RUNTIMES
async def test_a_timed_out_container_is_killed_by_the_host(
    runtime: str, engine_requests: list[str]
) -> None:
    async def processes() -> int:
        return len(live_in_containers())

    bindings = FunctionBindings({"processes": processes})
    # Room for the program's writes before its deadline on a loaded host.
    limits = {"wall_seconds": 2.0, "grace_seconds": 0.2}
    with recording() as reached:
        async with Sandbox(config(runtime, **limits)) as sandbox:
            result = await sandbox.run(PROGRAM, profile=PROFILE, bindings=bindings)
            # The kernel's word the moment the result is back (the engine may not yet have
            # noticed the container's end; its removal follows).
            left = live_in_containers()
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT, result.error
    seen = int(result.stdout.splitlines()[-1])
    assert seen > 0  # the listing sees a running container's processes
    lookalike = (SEAL_PREFIX + b"0" * 32).decode()
    assert result.stdout == f"out\n{lookalike}\nchild\n{seen}\n"
    assert result.stderr == "err\n"
    assert not any(path.endswith("/kill") for path in engine_requests), engine_requests
    points = [point for point, _ in reached]
    assert points.index("result handed back") < points.index("launch left"), points
    if runtime == "runc":
        # Under gVisor the Sentry's helper processes die just after it (their parent-death
        # signal): nothing of them can act, but the kernel may still list them a moment.
        assert left == []


@pytest.mark.usefixtures("engine")
@pytest.mark.anyio
async def test_only_the_containers_own_init_is_taken() -> None:
    started = subprocess.run(
        [
            "docker",
            "run",
            "-d",
            "--rm",
            "--init",
            "--network",
            "none",
            DEFAULT_TAG,
            "/usr/bin/python3.11",
            "-c",
            "import time; time.sleep(60)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    container = started.stdout.strip()
    try:
        pid = int(
            subprocess.run(
                ["docker", "inspect", "-f", "{{.State.Pid}}", container],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout
        )
        children_of = Path(f"/proc/{pid}/task/{pid}/children")
        children = await wait_until(lambda: children_of.read_text().split())
        other = "0" * 64
        # Not in the container's cgroup; in it but not its pid namespace's init; its init
        # named with another container's id.
        assert ContainerInit.take(os.getpid(), container, namespace_init=True) is None
        assert ContainerInit.take(int(children[0]), container, namespace_init=True) is None
        assert ContainerInit.take(pid, other, namespace_init=True) is None
        taken = ContainerInit.take(pid, container, namespace_init=True)
        assert taken is not None and taken.can_seal
        taken.close()
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, timeout=60)


class _Frames:
    """An attached stream replaying frames, then its end."""

    def __init__(self, frames: list[tuple[int, bytes]]) -> None:
        self.frames = frames

    async def read_frame(self) -> tuple[int, bytes] | None:
        return self.frames.pop(0) if self.frames else None


@pytest.mark.anyio
async def test_a_stream_ends_at_its_seal_split_across_frames() -> None:
    token = SEAL_PREFIX + b"f" * 32
    demux = _Demux()
    later = [(api.STDOUT, b"never read")] * 3
    demux.attached = _Frames(  # type: ignore[assignment]
        [(api.STDOUT, b"abc" + token[:5]), (api.STDERR, b"e"), (api.STDOUT, token[5:]), *later]
    )
    demux.seal([SEAL_PREFIX + b"e" * 32, token])
    received = b""
    with anyio.fail_after(5):
        while True:
            try:
                received += await demux.receive(api.STDOUT, 4)
            except anyio.EndOfStream:
                break
    assert received == b"abc"
    # The stream ended at the seal, the frames after it unread.
    assert len(demux.attached.frames) == 3  # type: ignore[attr-defined]
    assert await demux.receive(api.STDERR, 100) == b"e"
