"""The behaviour every backend must show, as a pytest base class.

A backend's test module subclasses :class:`BackendConformance`, names the backend and what it
claims, and inherits the tests::

    from psych_sandbox_core.testing.conformance import BackendConformance

    class TestMyBackendConformance(BackendConformance):
        backend = "mine"
        level = "isolated"
        enforced = frozenset({"filesystem", "network"})

The tests run real programs and assert from the host: processes looked up in /proc, opens of
a canary watched with inotify, connections counted by loopback listeners, the host's
temporary directory listed. They need pytest and anyio's pytest plugin (the core's ``test``
extra); pytest is not a run-time dependency of the core.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.abc

try:
    import pytest
except ImportError as exc:  # pragma: no cover - only without the test extra
    raise ImportError(
        "psych_sandbox_core.testing.conformance needs pytest: install psych-sandbox-core[test]"
    ) from exc

from ..bindings import BindingProvider, FunctionBindings
from ..errors import ErrorKind
from ..grading import Guarantee
from ..identity import LeasedIdentityOptions
from ..profiles import DeploymentConfig, ProfileConfig
from ..registry import BackendRegistry
from ..result import ExecutionResult
from ..sandbox import Sandbox
from ..terms import ExecutionLimits
from .host import (
    HostBaseline,
    environ_of,
    marker,
    opens_of,
    pids_with,
    private_tempdir,
    wait_for_pids,
)

#: A daemon that escapes the program's session and ignores SIGTERM: started, and known to be
#: running (it writes to a pipe), before the program goes on.
DAEMON = """
import os, sys, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
r, w = os.pipe()
os.set_inheritable(w, True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        code = "import os, sys, signal, time\\n" \\
               "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n" \\
               "os.write(int(sys.argv[1]), b'x')\\n" \\
               "while True: time.sleep(1)"
        os.execv(sys.executable, [sys.executable, "-c", code, str(w), {mark!r}])
    os._exit(0)
os.close(w)
assert os.read(r, 1) == b"x"
os.wait()
"""

#: The program reaches the control channel the way a hostile one would: the bootstrap's own
#: channel object is in its interpreter, whatever transport the backend chose.
FORGE = """
import gc
channel = next(o for o in gc.get_objects()
               if type(o).__name__ == "Channel" and hasattr(o, "sock"))
channel.sock.sendall({payload!r})
import time
time.sleep(60)
"""

HOSTILE_FRAMES = {
    "junk-field": b'{"type":"call","id":0,"name":"t","arguments":{},"evil":"payload"}\n',
    "binary-garbage": bytes(range(256)) * 16 + b"\n",
    "reply-from-child": b'{"type":"reply","id":0,"carries":"value","value_json":"1"}\n',
}


#: The tools file of a CLI run: ``ready()`` tells the test, over a pipe it inherited, that
#: the program has printed and is about to block (the CLI itself shows nothing until the end).
READY_TOOLS = """
import os

def ready():
    os.write(int(os.environ["PSYCH_TEST_READY_FD"]), b"ready\\n")
"""


async def cli_at_ready(
    source: str,
    config: DeploymentConfig,
    profile: str,
    files: Path,
    tmpdir: Path,
    *options: str,
    stdout: int = subprocess.PIPE,
) -> subprocess.Popen[str]:
    """A real ``psych-sandbox run`` process whose program ran ``source``, called ``ready()``
    and now blocks; its inputs are written under ``files``, its temporary directory is
    ``tmpdir``. The caller ends the process."""
    program = files / "program.py"
    program.write_text(source + "await ready()\nimport time\nwhile True:\n    time.sleep(1)\n")
    tools = files / "tools.py"
    tools.write_text(READY_TOOLS)
    settings = files / "config.toml"
    settings.write_text(config_toml(config))
    ready_read, ready_write = os.pipe()
    env = {**os.environ, "TMPDIR": str(tmpdir), "PSYCH_TEST_READY_FD": str(ready_write)}
    env.pop("PSYCH_SANDBOX_CONFIG", None)
    try:
        cli = subprocess.Popen(
            [sys.executable, "-m", "psych_sandbox_core.cli", "run", str(program),
             "--profile", profile, "--config", str(settings), "--tools", str(tools), *options],
            env=env, pass_fds=(ready_write,), stdout=stdout, stderr=subprocess.PIPE, text=True,
        )
    finally:
        os.close(ready_write)
    with os.fdopen(ready_read, "rb") as ready:
        # EOF instead means the CLI ended before the program got this far.
        said = await anyio.to_thread.run_sync(ready.readline)
    if said != b"ready\n":
        cli.kill()
        out, err = cli.communicate()
        raise AssertionError(f"the program never got going: {out}{err}")
    return cli


def config_toml(config: DeploymentConfig) -> str:
    """``config`` as the TOML file the CLI reads (scalar settings and lists of them)."""
    lines: list[str] = []
    for name, profile in config.profiles.items():
        lines.append(f"[profiles.{json.dumps(name)}]")
        if profile.backend is not None:
            lines.append(f"backend = {json.dumps(profile.backend)}")
        for table, values in (
            ("options", profile.options),
            ("limits", profile.limits.model_dump(exclude_unset=True)),
        ):
            lines.append(f"[profiles.{json.dumps(name)}.{table}]")
            lines.extend(f"{key} = {json.dumps(value)}" for key, value in values.items())
    return "\n".join(lines) + "\n"


class BackendConformance:
    """Tests every backend must pass. Subclasses set the class attributes below; the hooks
    (:meth:`leftovers`, :meth:`registry`, :meth:`identity_uids`) may be overridden.

    After every test, whatever the backend did, the suite looks from the host for what the
    test's executions left (see :class:`~psych_sandbox_core.testing.host.HostBaseline`):
    processes that are new and descend from the test process (a detached daemon included)
    or run under a uid of the backend's identity range that no lease holds, and cgroup
    directories new in any hierarchy. It kills those processes by pidfd, removes the empty
    cgroups, and fails the test naming each one."""

    #: The backend id the profile names.
    backend: ClassVar[str]
    #: The backend's options for the profile.
    options: ClassVar[dict[str, Any]] = {}
    #: The level the backend reaches on a host where its tests run.
    level: ClassVar[str]
    #: Guarantees the backend must have graded ``enforced`` on such a host.
    enforced: ClassVar[frozenset[str]] = frozenset()
    #: Limits for every run: small, so a timeout is reached quickly.
    limits: ClassVar[dict[str, Any]] = {
        "cpu_seconds": 10, "wall_seconds": 60.0, "grace_seconds": 0.5,
    }
    #: Whether the program's processes are host processes (found in the host's /proc); under a
    #: user-space kernel (gVisor) they are not, and :meth:`leftovers` is the evidence instead.
    processes_visible: ClassVar[bool] = True
    #: Whether the workspace is a directory below the host's temporary directory.
    workspace_on_host: ClassVar[bool] = True
    #: The program's working directory, where the backend fixes it.
    workspace_path: ClassVar[str | None] = None
    #: Environment names the program may see besides what the interpreter sets itself; None
    #: where the boundary adds its own (an image's PATH, say) and only the secret is checked.
    environment: ClassVar[frozenset[str] | None] = None
    #: Further addresses a backend with the network enforced must not reach.
    unreachable: ClassVar[tuple[tuple[str, int], ...]] = ()

    profile: ClassVar[str] = "conformance"

    # ------------------------------------------------------------ hooks

    def config(self, **limits: Any) -> DeploymentConfig:
        return DeploymentConfig(
            profiles={
                self.profile: ProfileConfig(
                    backend=self.backend,
                    options=dict(self.options),
                    limits=ExecutionLimits(**{**self.limits, **limits}),
                )
            }
        )

    def leftovers(self) -> list[str]:
        """What the backend left behind after its sandbox closed (containers, say): empty."""
        return []

    #: Whether an execution holds something outside the host's process tree and temporary
    #: directory (a container), which :meth:`resources_of` finds.
    holds_resources: ClassVar[bool] = False

    def resources_of(self, host_pid: int) -> list[str]:
        """What the backend holds for executions the host process ``host_pid`` runs, outside
        that process's tree and temporary directory (its containers, say)."""
        return []

    def registry(self) -> BackendRegistry | None:
        """Where the sandbox finds the backend: None for the installed plugins."""
        return None

    def identity_uids(self) -> range | None:
        """The uids the backend runs executions as, where it leases them: a process left
        under one nobody holds is the execution's. By default, its options' identity
        range."""
        registry = self.registry() or BackendRegistry()
        options = registry.get(self.backend).cls.Options.model_validate(dict(self.options))
        if isinstance(options, LeasedIdentityOptions):
            identities = options.identity_range()
            return range(identities.first, identities.first + identities.count)
        return None

    async def run(
        self, source: str, *, bindings: BindingProvider | None = None, **limits: Any
    ) -> ExecutionResult:
        """One program in a sandbox of its own, closed (and so torn down) on return."""
        async with Sandbox(self.config(**limits), registry=self.registry()) as sandbox:
            return await sandbox.run(source, profile=self.profile, bindings=bindings)

    # ------------------------------------------------------------ fixtures

    @pytest.fixture(params=["asyncio", "trio"])
    def anyio_backend(self, request: pytest.FixtureRequest) -> str:
        """Every test on both event loops anyio runs on: a backend's teardown and streams
        are loop-specific code, and an embedding application may use either."""
        return str(request.param)

    @pytest.fixture
    def private_tmp(self) -> Iterator[Path]:
        """The host's temporary directory, fresh and private to the test."""
        with private_tempdir("psych-conformance-") as root:
            yield Path(root)

    @pytest.fixture(autouse=True)
    def _execution_leaves_nothing(self) -> Iterator[None]:
        """Whatever the test and the backend did, nothing of its executions survives it: what
        did is killed or removed, and the test fails naming it."""
        with HostBaseline.watching(self.identity_uids()) as baseline:
            yield
            problem = baseline.check()
        if problem is not None:
            pytest.fail(f"the backend {self.backend!r} left this behind: {problem}")

    def _nothing_left(self, mark: str) -> None:
        if self.processes_visible:
            assert pids_with(mark) == [], "a process of the program outlived its sandbox"
        assert self.leftovers() == []

    # ------------------------------------------------------------ the tests

    @pytest.mark.anyio
    async def test_prints_and_returns_at_the_declared_level(self) -> None:
        result = await self.run("print('hello')\nx = 6 * 7\nx")
        assert result.error is None, result.error
        assert result.stdout == "hello\n"
        assert result.return_value == 42
        assert result.backend.id == self.backend
        assert result.level == self.level
        for guarantee in sorted(self.enforced):
            assert result.grades[Guarantee(guarantee)] == "enforced", (guarantee, result.grades)

    @pytest.mark.anyio
    async def test_exception_reports_the_program_lines(self) -> None:
        result = await self.run(
            "def inner():\n    raise ValueError('boom')\n\nprint('before')\ninner()\n"
        )
        error = result.error
        assert error is not None
        assert error.kind is ErrorKind.EXCEPTION, error
        assert error.exception_type == "ValueError"
        assert "boom" in error.message
        assert error.line == 2
        frames = re.findall(r'File "([^"]*)", line (\d+)', error.traceback or "")
        assert frames == [("<program>", "5"), ("<program>", "2")]
        assert result.stdout == "before\n"
        assert result.return_value is None

    @pytest.mark.anyio
    async def test_cpu_loop_is_a_timeout(self) -> None:
        result = await self.run("while True:\n    pass", cpu_seconds=1)
        assert result.error is not None
        assert result.error.kind is ErrorKind.TIMEOUT, result.error
        assert "CPU limit" in result.error.message
        if result.usage.measured_by != "none":
            assert result.usage.cpu_seconds is not None and result.usage.cpu_seconds > 0

    @pytest.mark.anyio
    async def test_worker_exit(self) -> None:
        result = await self.run("print('bye')\nimport os\nos._exit(3)")
        assert result.error is not None
        assert result.error.kind is ErrorKind.WORKER_EXIT, result.error
        assert result.return_value is None

    @pytest.mark.anyio
    async def test_host_environment_secret_not_visible(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        secret = f"hunter2-{uuid.uuid4().hex}"
        monkeypatch.setenv("PSYCH_SANDBOX_CONFORMANCE_SECRET", secret)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        mark = marker()
        seen: dict[str, str] = {}

        async def inspect() -> None:
            # Read by the host from the kernel, not from what the program says.
            if self.processes_visible:
                (pid,) = await wait_for_pids(mark)
                seen.update(environ_of(pid))

        result = await self.run(
            "import os, subprocess, sys\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()', "
            f"{mark!r}], stdin=subprocess.PIPE)\n"
            "await inspect()\nchild.stdin.close()\nchild.wait()\ndict(os.environ)",
            bindings=FunctionBindings({"inspect": inspect}),
        )
        assert result.error is None, result.error
        environments = [result.return_value]
        if self.processes_visible:
            assert seen, "the program's child was not seen from the host"
            environments.append(seen)
        for env in environments:
            assert secret not in json.dumps(env)
            assert "PSYCH_SANDBOX_CONFORMANCE_SECRET" not in env
            if self.environment is not None:
                # LC_CTYPE: set by CPython itself at start-up where the locale is C (PEP 538).
                assert set(env) - {"LC_CTYPE"} == self.environment, env

    @pytest.mark.anyio
    async def test_workspace_removed_after_the_run(self, private_tmp: Path) -> None:
        name = f"psych-left-{uuid.uuid4().hex}"
        during: list[str] = []

        def look() -> None:
            during.extend(os.listdir(private_tmp))

        # Where the file system is enforced, the program's own /tmp and /dev/shm must not be
        # the host's either.
        places = "('.', '/tmp', '/dev/shm')" if "filesystem" in self.enforced else "('.',)"
        result = await self.run(
            "import os\n"
            f"for d in {places}:\n"
            f"    open(os.path.join(d, {name!r}), 'w').write('x')\n"
            "os.makedirs('a/b')\nopen('a/b/f', 'w').write('x')\n"
            "await look()\nos.getcwd()",
            bindings=FunctionBindings({"look": look}),
        )
        assert result.error is None, result.error
        if self.workspace_on_host:
            assert during, "the workspace was not below the host's temporary directory"
        if self.workspace_path is not None:
            assert result.return_value == self.workspace_path
        assert list(private_tmp.iterdir()) == []
        if "filesystem" in self.enforced:
            found = subprocess.run(
                ["find", "/tmp", "/dev/shm", "/var/tmp", "/run", "-name", name],
                capture_output=True, text=True, check=False,
            ).stdout
            assert found == ""

    @pytest.mark.anyio
    async def test_nothing_left_after_a_detached_daemon(self) -> None:
        mark = marker()
        result = await self.run(DAEMON.format(mark=mark) + "'spawned'")
        assert result.error is None, result.error
        assert result.return_value == "spawned"
        self._nothing_left(mark)

    @pytest.mark.anyio
    async def test_wall_clock_timeout_and_nothing_left(self) -> None:
        mark = marker()
        seen: list[int] = []

        async def watch() -> None:
            if self.processes_visible:
                seen.extend(await wait_for_pids(mark))

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            result = await self.run(
                DAEMON.format(mark=mark) + "while True:\n    time.sleep(1)\n",
                wall_seconds=1.0, grace_seconds=0.2,
            )
            tg.cancel_scope.cancel()
        assert result.error is not None
        assert result.error.kind is ErrorKind.TIMEOUT, result.error
        assert "wall-clock" in result.error.message
        if self.processes_visible:
            # The daemon did run (the host saw it), so its absence now means it was killed.
            assert seen, "the detached daemon was never seen running"
        self._nothing_left(mark)

    @pytest.mark.anyio
    async def test_cancelling_a_run_leaves_nothing_behind(self, private_tmp: Path) -> None:
        mark = marker()
        started = anyio.Event()

        async def ready() -> None:
            started.set()

        with anyio.fail_after(60):
            async with (
                Sandbox(self.config(), registry=self.registry()) as sandbox,
                anyio.create_task_group() as tg,
            ):

                async def execution() -> None:
                    await sandbox.run(
                        DAEMON.format(mark=mark) + "await ready()\nwhile True:\n"
                        "    time.sleep(1)\n",
                        profile=self.profile,
                        bindings=FunctionBindings({"ready": ready}),
                    )
                    raise AssertionError("the run should have been cancelled")

                tg.start_soon(execution)
                await started.wait()
                if self.processes_visible:
                    await wait_for_pids(mark)
                tg.cancel_scope.cancel()
        # Teardown is part of the cancelled run: nothing may still be dying once it returned.
        self._nothing_left(mark)
        assert list(private_tmp.iterdir()) == []

    @pytest.mark.anyio
    @pytest.mark.parametrize(
        "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name
    )
    async def test_a_signal_to_the_cli_cancels_the_run_and_leaves_nothing(
        self, signum: int, tmp_path: Path, private_tmp: Path
    ) -> None:
        # tmp_path comes first, so it is not made inside the private temporary directory.
        mark = marker()
        source = DAEMON.format(mark=mark) + f"print('partial', {mark!r})\n"
        cli = await cli_at_ready(source, self.config(), self.profile, tmp_path, private_tmp)
        try:
            if self.processes_visible:
                assert await wait_for_pids(mark)
            during = sorted(p.name for p in private_tmp.iterdir())
            assert any(name.startswith("psych-canary-") for name in during), during
            held = self.resources_of(cli.pid)
            assert bool(held) == self.holds_resources, held
            cli.send_signal(signum)
            out, err = await anyio.to_thread.run_sync(cli.communicate)
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.communicate()
        assert cli.returncode == 128 + signum, (cli.returncode, out, err)
        assert f"  | partial {mark}\n" in out, out
        assert "\u25c6 failed: cancelled: " in out, out
        assert "Traceback" not in out + err, out + err
        # Everything the run created in the temporary directory went with it.
        left = sorted(p.name for p in private_tmp.iterdir())
        assert left == [], left
        self._nothing_left(mark)
        assert self.resources_of(cli.pid) == []

    @pytest.mark.anyio
    async def test_canary_and_listeners_agree_with_the_grades(self) -> None:
        secret = uuid.uuid4().hex
        directory = Path(tempfile.mkdtemp(prefix="psych-canary-"))
        os.chmod(directory, 0o755)
        canary = directory / "canary"
        canary.write_text(secret)
        os.chmod(canary, 0o644)
        accepted = {"4": 0, "6": 0}
        listeners: list[anyio.abc.Listener[anyio.abc.SocketStream]] = []
        try:
            async with anyio.create_task_group() as tg:
                ports = {}
                for family, host in (("4", "127.0.0.1"), ("6", "::1")):
                    listener = await anyio.create_tcp_listener(local_host=host, local_port=0)
                    listeners.append(listener)
                    ports[family] = listener.extra(anyio.abc.SocketAttribute.local_port)

                    async def count(stream: anyio.abc.SocketStream, family: str = family) -> None:
                        accepted[family] += 1
                        await stream.aclose()

                    tg.start_soon(listener.serve, count)
                addresses = [
                    ("AF_INET", ("127.0.0.1", ports["4"])), ("AF_INET6", ("::1", ports["6"])),
                    *(("AF_INET", address) for address in self.unreachable),
                ]
                with opens_of(str(canary)) as opened:
                    result = await self.run(
                        "import socket\nout = {}\n"
                        f"try:\n    out['canary'] = open({str(canary)!r}).read()\n"
                        "except OSError as e:\n    out['canary'] = type(e).__name__\n"
                        f"for fam, addr in {addresses!r}:\n"
                        "    s = socket.socket(getattr(socket, fam))\n    s.settimeout(2)\n"
                        "    try:\n        s.connect(addr); out[str(addr)] = 'connected'\n"
                        "    except OSError as e:\n        out[str(addr)] = type(e).__name__\n"
                        "    finally:\n        s.close()\nout"
                    )
                # Controls: the watch sees an open, the listeners count a connection.
                with opens_of(str(canary)) as control:
                    canary.read_text()
                with socket.create_connection(("127.0.0.1", ports["4"])):
                    pass
                with anyio.fail_after(10):
                    while accepted["4"] < 1:
                        await anyio.sleep(0.01)
                tg.cancel_scope.cancel()
        finally:
            for each in listeners:
                await each.aclose()
            canary.unlink()
            directory.rmdir()
        assert result.error is None, result.error
        assert control
        for guarantee in (Guarantee.FILESYSTEM, Guarantee.NETWORK):
            if guarantee.value in self.enforced:
                assert result.grades[guarantee] == "enforced", (guarantee, result.grades)
        if result.grades[Guarantee.FILESYSTEM] == "enforced":
            # Seen from the host: nothing opened the canary's inode.
            assert opened == []
            assert secret not in result.stdout + json.dumps(result.return_value)
        if result.grades[Guarantee.NETWORK] == "enforced":
            assert accepted == {"4": 1, "6": 0}
            assert "connected" not in result.return_value.values(), result.return_value

    @pytest.mark.anyio
    async def test_hostile_frames_are_protocol_errors_and_the_host_stays_healthy(self) -> None:
        async with Sandbox(self.config(), registry=self.registry()) as sandbox:
            for name, payload in HOSTILE_FRAMES.items():
                result = await sandbox.run(FORGE.format(payload=payload), profile=self.profile)
                error = result.error
                assert error is not None, f"{name} accepted; returned {result.return_value!r}"
                assert error.kind is ErrorKind.PROTOCOL_ERROR, (name, error)
                assert error.message
                assert result.return_value is None
            healthy = await sandbox.run("print('fine')\n21 * 2", profile=self.profile)
            assert healthy.error is None, healthy.error
            assert healthy.return_value == 42
