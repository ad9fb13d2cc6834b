"""The conformance tests every backend inherits: programs run, fail, time out and are
cancelled, prepared children, the grades checked against the host's own evidence, hostile
frames; and nothing of an execution left afterwards."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import anyio
import anyio.abc
import pytest
from psych_sandbox_core import ErrorKind, FunctionBindings, Guarantee, Sandbox
from psych_sandbox_core.kit.phases import recording

from ..cli_run import cli_at_ready
from ..host import environ_of, marker, opens_of, wait_for_pids
from ..programs import DAEMON, FORGE, HOSTILE_FRAMES, WARM_PROGRAM
from .base import ConformanceBase


class RunningTests(ConformanceBase):
    """What every backend must do with a program, whatever it claims."""

    @pytest.mark.anyio
    async def test_prints_and_returns_at_the_declared_level(self) -> None:
        # With names given (variables, then a preamble) and the program's handed back.
        result = await self.run(
            "print(greeting)\nx = 6 * seven()\nx",
            variables={"greeting": "hello"},
            preamble="import math\n\ndef seven():\n    return 7\n",
            keep_variables=True,
        )
        assert result.error is None, result.error
        assert result.stdout == "hello\n"
        assert result.return_value == 42
        assert result.variables == {"greeting": "hello", "x": 42}
        assert result.backend.id == self.backend
        assert result.level == self.level
        for guarantee in sorted(self.enforced):
            assert result.grades[Guarantee(guarantee)] == "enforced", (guarantee, result.grades)

    @pytest.mark.anyio
    async def test_exception_reports_the_program_lines(self) -> None:
        # A preamble ahead of the program moves none of its lines and shows no frame.
        result = await self.run(
            "def inner():\n    raise ValueError(boom)\n\nprint('before')\ninner()\n",
            preamble="def _unused():\n    pass\n\n\nboom = 'boom'\n",
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
                capture_output=True,
                text=True,
                check=False,
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
        result, seen = await self._watching(
            mark,
            self.run(
                DAEMON.format(mark=mark) + "while True:\n    time.sleep(1)\n",
                wall_seconds=1.0,
                grace_seconds=0.2,
            ),
        )
        assert result.error is not None
        assert result.error.kind is ErrorKind.TIMEOUT, result.error
        assert "wall-clock" in result.error.message
        if self.processes_visible:
            # The daemon did run (the host saw it), so its absence now means it was killed.
            assert seen, "the detached daemon was never seen running"
        self._nothing_left(mark)

    # Prepared children: the pool's hand-off is loop-specific code (the shared task group, the
    # early result), so on both loops.

    @pytest.mark.anyio
    async def test_a_prepared_child_gives_what_a_fresh_one_gives(self) -> None:
        with recording() as cold_reached:
            cold = await self.run(WARM_PROGRAM)
        async with self.sandbox(warm=1) as sandbox:
            # The child is prepared in a task started from here: its points are recorded
            # too, its teardown's included (finished once the sandbox is closed).
            with recording() as reached:
                await sandbox.warmed(self.profile)
                warm = await sandbox.run(WARM_PROGRAM, profile=self.profile)
        points = [point for point, _ in reached]
        assert cold.error is None and warm.error is None, (cold.error, warm.error)
        assert (warm.stdout, warm.stderr) == (cold.stdout, cold.stderr) == ("out 4\n", "err\n")
        assert warm.return_value == cold.return_value == {"answer": [1, 2, 3]}
        assert warm.level == cold.level == self.level
        assert warm.grades == cold.grades
        assert warm.stdout_info.after_end_bytes == warm.stderr_info.after_end_bytes == 0
        # Handed back before the child was even reaped, exactly where the backend says so.
        early = "result handed back" in points
        assert early is self.early_result, points
        if early:
            assert points.index("result handed back") < points.index("reaped"), points
        # A fresh child's result comes back early exactly where a prepared one's does.
        cold_points = [point for point, _ in cold_reached]
        assert ("result handed back" in cold_points) is self.early_result, cold_points

    @pytest.mark.anyio
    async def test_a_prepared_child_leaves_nothing_once_the_sandbox_closes(self) -> None:
        mark = marker()
        async with self.sandbox(warm=1) as sandbox:
            await sandbox.warmed(self.profile)
            result = await sandbox.run(DAEMON.format(mark=mark) + "'spawned'", profile=self.profile)
            # A second child was prepared meanwhile, and is torn down unused.
            await sandbox.warmed(self.profile)
        assert result.error is None, result.error
        assert result.return_value == "spawned"
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
            # The run holds something there (a local child's canary, the run's own
            # directories), which must go with it.
            during = sorted(p.name for p in private_tmp.iterdir())
            assert during, during
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
                    ("AF_INET", ("127.0.0.1", ports["4"])),
                    ("AF_INET6", ("::1", ports["6"])),
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
