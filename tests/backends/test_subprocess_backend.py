"""The subprocess backend, asserted from the host: working directory, output floods, CPU
limits, inherited limits, every failure kind provoked for real, and nothing leaked afterwards.
What every backend must do (the environment allow-list, teardown of a detached process tree,
wall-clock limits, cancellation) is in the shared suite, run by test_conformance.py."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

from psych_sandbox_core import ErrorKind, Level, Sandbox
from psych_sandbox_core.errors import DEPLOYMENT_KINDS
from psych_sandbox_core.kit.posix import cgroups, temp_dirs

from ..conftest import (
    PROFILE,
    config,
    host_rss,
    host_rss_peak,
    host_rss_peak_reset,
    marker,
    open_fds,
    pids_with,
    run,
    sleeper_argv_source,
    wait_for_pids,
)

pytestmark = pytest.mark.anyio
BOTH = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])


@pytest.fixture
def anyio_backend() -> str:
    # Heavy tests run once; the ones about teardown run on both loops (marked BOTH).
    return "asyncio"


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def kill_all(mark: str) -> None:
    for pid in pids_with(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


async def run_and_inspect(source: str, mark: str, inspect: Any, **limits: Any) -> Any:
    """Run ``source``, which must exec a process carrying ``mark``; call ``inspect(pid)`` while
    it lives, then kill it from the host so the execution ends."""
    result: Any = None
    seen: Any = None

    async def execution() -> None:
        nonlocal result
        result = await run(source, **limits)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(execution)
            (pid,) = await wait_for_pids(mark, present=True)
            seen = inspect(pid)
            os.kill(pid, signal.SIGKILL)
    finally:
        kill_all(mark)
    return result, seen


EXEC_SLEEPER = "import os, sys\nos.execv(sys.executable, {argv})\n"


# ---------------------------------------------------------------- working directory


async def test_working_directory_is_private_and_removed(private_tmp: Path) -> None:
    outside = private_tmp / "outside"
    outside.mkdir()
    target = outside / "keep-me"
    target.write_text("host data")
    os.chmod(outside, 0o777)
    mark = marker()
    source = src(f"""
        import os
        open("made-by-program", "w").write("x")
        os.symlink({str(outside)!r}, "link-to-outside")
        os.symlink({str(target)!r}, "link-to-file")
        os.makedirs("locked/inner")
        open("locked/inner/f", "w").write("x")
        os.chmod("locked/inner", 0)
        os.chmod("locked", 0o500)
    """) + EXEC_SLEEPER.format(argv=sleeper_argv_source(mark))

    def workspace(pid: int) -> tuple[str, os.stat_result, list[str]]:
        path = os.readlink(f"/proc/{pid}/cwd")
        return path, os.stat(path), sorted(os.listdir(path))

    result, (path, info, listing) = await run_and_inspect(source, mark, workspace)
    assert result.error is not None and result.error.kind is ErrorKind.WORKER_EXIT
    assert Path(path).parent == private_tmp and path != os.getcwd()
    assert stat.S_IMODE(info.st_mode) == 0o700
    if os.geteuid() == 0:
        assert info.st_uid != 0, "the workspace belongs to the program's unprivileged uid"
    assert listing == ["link-to-file", "link-to-outside", "locked", "made-by-program"]
    # Removed afterwards, without following the links out of it.
    assert not os.path.lexists(path)
    assert target.read_text() == "host data"
    assert sorted(p.name for p in private_tmp.iterdir()) == ["outside"]


async def test_each_run_gets_a_fresh_directory(private_tmp: Path) -> None:
    async with Sandbox(config()) as sandbox:
        first = await sandbox.run("import os\nopen('f','w').close()\nos.getcwd()", profile=PROFILE)
        second = await sandbox.run("import os\n[os.getcwd(), os.listdir()]", profile=PROFILE)
    assert first.error is None and second.error is None
    assert first.return_value != second.return_value[0]
    assert second.return_value[1] == []
    assert list(private_tmp.iterdir()) == []


# ---------------------------------------------------------------- output floods


async def test_printing_500_mb_is_capped_and_host_memory_stays_bounded() -> None:
    source = src("""
        import sys
        chunk = "x" * (1 << 20)
        for _ in range(500):
            sys.stdout.write(chunk)
        for _ in range(50):
            sys.stderr.write(chunk)
        "done"
    """)
    baseline = host_rss()
    reset = host_rss_peak_reset()
    result = await run(source, cpu_seconds=60, wall_seconds=110.0)
    assert result.error is None, result.error
    assert result.return_value == "done"
    assert result.stdout_info.total_bytes == 500 << 20
    assert result.stdout_info.captured_bytes == 64 * 1024
    assert result.stderr_info.total_bytes == 50 << 20
    assert result.stderr_info.captured_bytes == 64 * 1024
    growth = (host_rss_peak() if reset else host_rss()) - baseline
    print(f"host peak RSS growth while draining 550 MB: {growth / 2**20:.1f} MiB")
    assert growth < 64 << 20, f"the host grew by {growth} bytes while draining the flood"


# ---------------------------------------------------------------- CPU and wall clock


@pytest.mark.parametrize("with_cgroup", [True, False])
async def test_cpu_loop_trapping_sigxcpu_is_killed_and_classified_timeout(
    with_cgroup: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The plain CPU loop is the shared suite's (test_conformance.py). Without a cgroup the
    # hard limit's SIGKILL is still told apart, by wait4's lower bound on the CPU spent.
    if not with_cgroup:
        monkeypatch.setattr(cgroups, "detect", lambda: "no cgroups (made so by the test)")
    source = "import signal\n"
    source += "signal.signal(signal.SIGXCPU, lambda *a: None)\n"
    source += "while True:\n    pass\n"
    result = await run(source, cpu_seconds=1, wall_seconds=100.0)
    error = result.error
    assert error is not None and error.kind is ErrorKind.TIMEOUT
    assert "CPU limit" in error.message
    if result.usage.measured_by == "host":
        assert result.usage.cpu_seconds is not None and result.usage.cpu_seconds > 0
    else:
        assert result.usage.cpu_seconds is None


async def test_run_timeout_argument_narrows_the_wall_clock() -> None:
    async with Sandbox(config(wall_seconds=100.0)) as sandbox:
        result = await sandbox.run("import time\ntime.sleep(600)", profile=PROFILE, timeout=1)
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT


async def test_a_program_that_handles_sigterm_gets_its_grace_window() -> None:
    # The timeout's SIGTERM reaches the program's own handler, which ends it within the grace
    # window: what it wrote then is in the (timed-out) result.
    source = (
        "import os, signal, time\n"
        "def finish(*_):\n    print('cleaned up', flush=True)\n    os._exit(3)\n"
        "signal.signal(signal.SIGTERM, finish)\n"
        "time.sleep(60)\n"
    )
    result = await run(source, wall_seconds=0.5, grace_seconds=10.0)
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT
    assert result.stdout == "cleaned up\n"


# ---------------------------------------------------------------- inherited limits

INNER_HOST = """
import json, sys, anyio
from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
limits = ExecutionLimits(**json.loads(sys.argv[1]))
cfg = DeploymentConfig(profiles={"t": ProfileConfig(backend="subprocess", limits=limits)})
async def main():
    async with Sandbox(cfg) as sandbox:
        # Hex, so the marker in the program is not on this host's own command line.
        result = await sandbox.run(bytes.fromhex(sys.argv[2]).decode(), profile="t")
    print(json.dumps(result.to_json_object()))
anyio.run(main)
"""

MiB = 1 << 20


def _lower_inherited_limits() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CPU, (20, 40))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 * MiB, resource.RLIM_INFINITY))
    resource.setrlimit(resource.RLIMIT_NPROC, (100, 100))


def _read_limits(pid: int) -> dict[str, tuple[int | None, int | None]]:
    out: dict[str, tuple[int | None, int | None]] = {}
    names = {
        "Max cpu time": "cpu",
        "Max file size": "fsize",
        "Max processes": "nproc",
        "Max address space": "as",
        "Max core file size": "core",
    }
    with open(f"/proc/{pid}/limits") as fh:
        for line in fh:
            for label, key in names.items():
                if line.startswith(label):
                    soft, hard = line[len(label) :].split()[:2]
                    out[key] = tuple(  # type: ignore[assignment]
                        None if v == "unlimited" else int(v) for v in (soft, hard)
                    )
    return out


async def test_limits_are_clamped_against_inherited_never_raised() -> None:
    mark = marker()
    requested = {
        "cpu_seconds": 30,  # soft above inherited 20, hard 31 below inherited 40
        "file_size_bytes": 64 * MiB,  # above inherited soft 1 MiB, below unlimited hard
        "processes": 1000,  # above inherited 100/100
        "memory_bytes": 512 * MiB,  # below inherited unlimited
        "wall_seconds": 60.0,
    }
    program = EXEC_SLEEPER.format(argv=sleeper_argv_source(mark))
    inner = subprocess.Popen(
        [sys.executable, "-c", INNER_HOST, json.dumps(requested), program.encode().hex()],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        preexec_fn=_lower_inherited_limits,
    )
    try:
        (pid,) = await wait_for_pids(mark, present=True, deadline=60)
        observed = _read_limits(pid)
        os.kill(pid, signal.SIGKILL)
        out, _ = await anyio.to_thread.run_sync(inner.communicate)
    finally:
        kill_all(mark)
        if inner.poll() is None:
            inner.kill()
            inner.wait()
    assert observed["cpu"] == (20, 31)
    assert observed["fsize"] == (1 * MiB, 64 * MiB)
    assert observed["nproc"] == (100, 100)
    assert observed["as"] == (512 * MiB, 512 * MiB)
    assert observed["core"] == (0, 0)
    assert json.loads(out)["error"]["kind"] == "worker_exit"


async def test_file_size_limit_stops_a_disk_filler() -> None:
    result = await run(
        "f = open('big', 'wb')\nf.write(b'x' * (3 << 20))\nf.flush()", file_size_bytes=1 << 20
    )
    # RLIMIT_FSIZE: the write fails (SIGXFSZ is ignored by Python) instead of filling the disk.
    assert result.error is not None and result.error.kind is ErrorKind.EXCEPTION
    assert "File too large" in result.error.message


# ---------------------------------------------------------------- every kind, provoked


def _bad_interpreter(directory: Path) -> str:
    path = directory / "not-an-interpreter"
    path.write_bytes(b"\x00\x01garbage, not an executable format")
    os.chmod(path, 0o755)
    return str(path)


KIND_CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("exception", "raise ValueError('bad')", {}),
    ("timeout", "while True: pass", {"cpu_seconds": 1}),
    ("timeout", "import time\ntime.sleep(60)", {"wall_seconds": 1.0}),
    ("worker_exit", "import os\nos._exit(3)", {}),
    ("worker_exit", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", {}),
    ("worker_exit", "import ctypes\nctypes.string_at(0)", {}),
    ("invalid_output", "{1}", {}),
    ("output_limit", "'x' * 100", {"return_value_bytes": 10}),
    ("memory_limit", "bytearray(1 << 31)", {"memory_bytes": 256 * MiB}),
    (
        "protocol_error",
        "import os, sys\n"
        "fd = int(next(a for a in sys.argv if a.startswith('channel=fd:'))[11:])\n"
        "os.write(fd, b'garbage\\n')\nimport time\ntime.sleep(60)",
        {},
    ),
]


@pytest.mark.parametrize(("kind", "source", "limits"), KIND_CASES)
async def test_every_program_side_kind(kind: str, source: str, limits: dict[str, Any]) -> None:
    result = await run(source, **limits)
    assert result.error is not None and result.error.kind.value == kind, result.error
    assert result.error.guidance and result.error.message


async def test_backend_not_ready_when_the_interpreter_cannot_start(private_tmp: Path) -> None:
    options = {"interpreter": _bad_interpreter(private_tmp)}
    async with Sandbox(config(options=options)) as sandbox:
        result = await sandbox.run("1", profile=PROFILE)
    error = result.error
    assert error is not None and error.kind is ErrorKind.BACKEND_NOT_READY
    assert "never the problem" in error.guidance
    assert error.kind in DEPLOYMENT_KINDS


async def test_worker_exit_before_the_handshake() -> None:
    async with Sandbox(config(options={"interpreter": "false"})) as sandbox:
        result = await sandbox.run("1", profile=PROFILE)
    error = result.error
    assert error is not None and error.kind is ErrorKind.WORKER_EXIT
    assert "before the handshake" in error.message


async def test_refused_terms_abort_before_anything_is_compiled(private_tmp: Path) -> None:
    # The host's file, writable by the program's uid: one the program made itself in a
    # world-writable directory would be swept with its uid at teardown.
    witness = private_tmp / "ran"
    witness.touch()
    os.chmod(witness, 0o666)
    source = f"open({str(witness)!r}, 'w').write('ran')"
    # Control: under acceptable terms the program does write the witness file.
    assert (await run(source)).error is None and witness.read_text() == "ran"
    witness.write_text("")
    refusing = config().model_copy(update={"required_level": Level.ISOLATED})
    async with Sandbox(refusing) as sandbox:
        result = await sandbox.run(source + "\nprint('ran')", profile=PROFILE)
    error = result.error
    assert error is not None and error.kind is ErrorKind.ISOLATION_UNAVAILABLE
    assert "never the problem" in error.guidance
    assert witness.read_text() == "", "the program ran although the terms were refused"
    assert result.stdout == ""


# ---------------------------------------------------------------- leaks


@BOTH
async def test_no_fd_or_temp_dir_leak_on_any_path(private_tmp: Path) -> None:
    bad = _bad_interpreter(private_tmp)
    before_tmp = sorted(p.name for p in private_tmp.iterdir())
    ok_box = Sandbox(config(wall_seconds=2.0))
    bad_box = Sandbox(config(options={"interpreter": bad}))
    # Warm up: load plugins, resolve interpreters, probe namespaces once.
    assert (await ok_box.run("1", profile=PROFILE)).error is None
    await bad_box.run("1", profile=PROFILE)
    fds = open_fds()
    outcomes = [
        (await ok_box.run("print('hi')\n1", profile=PROFILE)).error,
        (await ok_box.run("1/0", profile=PROFILE)).error,
        (await ok_box.run("import time\ntime.sleep(60)", profile=PROFILE)).error,
        (await ok_box.run("import os\nos._exit(1)", profile=PROFILE)).error,
        (await bad_box.run("1", profile=PROFILE)).error,
    ]
    kinds = [None if e is None else e.kind.value for e in outcomes]
    assert kinds == [None, "exception", "timeout", "worker_exit", "backend_not_ready"]
    await ok_box.aclose()
    await bad_box.aclose()
    assert open_fds() == fds
    assert sorted(p.name for p in private_tmp.iterdir()) == before_tmp


DYING_HOST = """
import sys, anyio
from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox

async def main():
    config = DeploymentConfig(profiles={"p": ProfileConfig(
        backend="subprocess", limits=ExecutionLimits(wall_seconds=300.0))})
    async with Sandbox(config) as sandbox:
        await sandbox.run(sys.argv[1], profile="p")

anyio.run(main)
"""


async def test_everything_dies_with_a_host_killed_outright(tmp_path: Path) -> None:
    # No channel traffic and no wall clock can save this one: only the sandbox being tied to
    # the host's life (parent-death signal, pid namespace) ends the program.
    mark = marker()
    # The mark is assembled inside the sandbox, so the host's own command line (which carries
    # the program text) never matches it: only the sandboxed sleeper does.
    program = src(
        f"""
        import subprocess, sys
        mark = {mark[:12]!r} + {mark[12:]!r}
        argv = [sys.executable, "-c", "import time\\nwhile True: time.sleep(1)", mark]
        subprocess.Popen(argv, start_new_session=True).wait()
        """
    )
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "TMPDIR": str(temp),
    }
    host = subprocess.Popen(
        [sys.executable, "-c", DYING_HOST, program], env=env, stdout=subprocess.DEVNULL
    )
    try:
        await wait_for_pids(mark, present=True)
    finally:
        host.kill()
        host.wait()
    try:
        assert await wait_for_pids(mark, present=False) == []
    finally:
        kill_all(mark)
    # What only files are left of: the killed host's workspace and canary directories, named
    # for it. The next host to make one in the same temporary directory removes them.
    left = sorted(p.name for p in temp.iterdir())
    assert {name.split("-")[1] for name in left} == {"ws", "canary"}, left
    dead_tag = left[0].split("-")[2]
    assert dead_tag.startswith(f"{host.pid}."), left
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not the sandbox's")
    (temp / f"psych-ws-{dead_tag}-planted").symlink_to(outside)
    alive = temp / f"psych-ws-{temp_dirs.owner_tag()}-alive"
    alive.mkdir()
    subprocess.run(
        [sys.executable, "-c", DYING_HOST, "print(1)"],
        env=env,
        check=True,
        timeout=60,
        stdout=subprocess.DEVNULL,
    )
    assert sorted(p.name for p in temp.iterdir()) == [alive.name]
    assert (outside / "keep").read_text() == "not the sandbox's"


def test_the_bootstrap_reaches_the_child_precompiled() -> None:
    # Compiling the bootstrap at every start costs milliseconds per execution; one grown past
    # what a command-line argument may hold would silently go back to that.
    from psych_sandbox_core.backends.subprocess import SubprocessBackend, SubprocessOptions
    from psych_sandbox_core.child.loader import (
        _FILE_STUB,
        _STUB,
        bootstrap_arguments,
        bootstrap_source,
    )

    interpreter = SubprocessBackend(SubprocessOptions()).interpreter
    assert bootstrap_arguments(interpreter, bootstrap_source())[:2] == ["-c", _STUB]
    # Where the child is given descriptors, in a memory file: a long argument costs the
    # child's start-up milliseconds of decoding.
    passed: list[int] = []
    arguments = bootstrap_arguments(interpreter, bootstrap_source(), passed)
    try:
        assert arguments[:3] == ["-c", _FILE_STUB, str(passed[0])]
        assert os.readlink(f"/proc/self/fd/{passed[0]}").startswith("/memfd:")
    finally:
        for fd in passed:
            os.close(fd)


async def test_a_child_starts_with_no_ctypes_and_no_descriptor_of_its_compiled_bootstrap() -> None:
    # From the second start on, the compiled bootstrap comes in a memory file, which the
    # child closes before its program exists; containing itself imports no ctypes package.
    program = src(
        """
        import os, sys
        links = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                links.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass  # the listing's own descriptor, closed by now
        ["ctypes" in sys.modules, [link for link in links if "memfd:" in link]]
        """
    )
    async with Sandbox(config()) as sandbox:
        first = await sandbox.run(program, profile=PROFILE)
        second = await sandbox.run(program, profile=PROFILE)
    assert first.error is None and second.error is None, (first.error, second.error)
    assert first.return_value == second.return_value == [False, []]
