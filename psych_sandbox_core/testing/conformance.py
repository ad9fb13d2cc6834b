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

Which tests a backend inherits follows from what its test class declares (``enforced``,
``workspace_on_host``, ``processes_visible`` and the rest): a backend that claims a
filesystem boundary gets the tests of one, a backend whose workspace the host cannot reach gets
the tests of artifacts sent over the channel, one that enforces identity on a root host the
tests of leased uids. What a backend does not claim is not asked of it, and is graded so.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import anyio
import anyio.abc

try:
    import pytest
except ImportError as exc:  # pragma: no cover - only without the test extra
    raise ImportError(
        "psych_sandbox_core.testing.conformance needs pytest: install psych-sandbox-core[test]"
    ) from exc

from .._api.sandbox import Sandbox
from .._bindings.bindings import BindingProvider, FunctionBindings
from .._output.capture import OutputPolicy
from .._policy.profiles import DeploymentConfig, ProfileConfig
from .._policy.registry import BackendRegistry
from ..errors import ErrorKind, InvalidRequestError
from ..grading import Guarantee
from ..kit.phases import recording
from ..kit.posix.identity import LeasedIdentityOptions
from ..kit.posix.sweep import has_keys
from ..result import ExecutionResult, SkippedEntry
from ..terms import ExecutionLimits
from .host import (
    HostBaseline,
    environ_of,
    host_processes,
    marker,
    opens_of,
    pids_with,
    private_tempdir,
    reap_children,
    uids_of,
    wait_for_pids,
)
from .leftovers import finding_program, host_leftovers, host_targets, own_uid, planting_program
from .programs import PLANTED_ARTIFACTS, SECRET_SPY, check_planted_artifacts, secret_holder

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

#: What a program leaves on both streams and returns, warm or cold.
WARM_PROGRAM = """
import sys
print("out", 2 + 2)
print("err", file=sys.stderr)
{"answer": [1, 2, 3]}
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
            [
                sys.executable,
                "-m",
                "psych_sandbox_core.cli",
                "run",
                str(program),
                "--profile",
                profile,
                "--config",
                str(settings),
                "--tools",
                str(tools),
                *options,
            ],
            env=env,
            pass_fds=(ready_write,),
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
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


Test = TypeVar("Test", bound=Callable[..., Any])


def applies(when: Callable[[Any], bool]) -> Callable[[Test], Test]:
    """Marks a test that only a backend declaring something asks for: ``when(cls)`` decides,
    from the test class's declarations, whether a subclass inherits it."""

    def mark(test: Test) -> Test:
        test.applies_when = when  # type: ignore[attr-defined]
        return test

    return mark


def _claims(*guarantees: str) -> Callable[[Any], bool]:
    return lambda cls: set(guarantees) <= cls.enforced


def _root_identity(cls: Any) -> bool:
    """Identity enforced, and the program's processes in the host's /proc to inspect."""
    return "identity" in cls.enforced and cls.processes_visible


def _needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("identities are leased per execution only on a root host")


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
        "cpu_seconds": 10,
        "wall_seconds": 60.0,
        "grace_seconds": 0.5,
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

    #: The options that make every execution share one identity (the weaker setting for a
    #: host that cannot spare a uid range), where the backend has them, and that (uid, gid):
    #: a program on the host under it then reaches a running execution, the control for the
    #: leased case.
    shared_identity: ClassVar[tuple[dict[str, Any], tuple[int, int]] | None] = None
    #: Whether the options ``workspace_bytes``, ``tmp_bytes`` and ``shm_bytes`` cap the
    #: memory-backed workspace, /tmp and /dev/shm.
    capped_filesystems: ClassVar[bool] = False
    #: Whether the backend's options take an identity range (``identity_first_uid``), so the
    #: suite can give it a uid of the test's own. A backend whose identities are leased
    #: elsewhere (a remote service's) declares False.
    identity_options: ClassVar[bool] = True

    #: Whether the backend runs commands (its ``runs_commands``): the suite then runs them
    #: on it (command mode: argv, exit status, output caps, inputs, a timeout killing the
    #: whole tree, the shell form only when asked).
    runs_commands: ClassVar[bool] = False
    #: An interpreter the command tests run as their command; None: the one that runs the
    #: bootstrap where the child runs, asked of a program (it may be one the host started as
    #: root and the child's own uid cannot run again: then name one it can).
    command_python: ClassVar[str | None] = None
    #: Whether ``/bin/sh`` exists where the child runs (a minimal image may have none: the
    #: shell form then exits 127, as a shell says "not found").
    has_shell: ClassVar[bool] = True

    #: Whether an execution's result, a prepared child's and a fresh one's alike, is handed
    #: back before its child's teardown on this host (the launch sets ``early_result_ok``;
    #: see docs/architecture.md).
    early_result: ClassVar[bool] = False

    profile: ClassVar[str] = "conformance"
    #: A second profile some tests add: the subprocess backend without a pid namespace, a
    #: program on the host among the host's processes.
    PLAIN: ClassVar[str] = "plain-host-program"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Each subclass inherits exactly the tests its declarations ask for (see applies).
        super().__init_subclass__(**kwargs)
        for name, test in vars(BackendConformance).items():
            when = getattr(test, "applies_when", None)
            if when is not None and name not in vars(cls):
                setattr(cls, name, test if when(cls) else None)

    # ------------------------------------------------------------ hooks

    def config(
        self,
        *,
        options: dict[str, Any] | None = None,
        output: OutputPolicy | None = None,
        plain: dict[str, Any] | None = None,
        warm: int | None = None,
        **limits: Any,
    ) -> DeploymentConfig:
        """The deployment of one test: the backend's profile (its options updated by
        ``options``, ``warm`` children kept prepared: unset is the default pool), and with
        ``plain`` the plain subprocess profile with those options."""
        terms = ExecutionLimits(**{**self.limits, **limits})
        profiles = {
            self.profile: ProfileConfig(
                backend=self.backend,
                options={**self.options, **(options or {})},
                limits=terms,
                output=output or OutputPolicy(),
                warm=warm,
            )
        }
        if plain is not None:
            profiles[self.PLAIN] = ProfileConfig(
                backend="subprocess",
                options={"use_namespaces": False, **plain},
                limits=terms,
            )
        return DeploymentConfig(profiles=profiles)

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
        self,
        source: str,
        *,
        bindings: BindingProvider | None = None,
        options: dict[str, Any] | None = None,
        preamble: str | None = None,
        variables: dict[str, Any] | None = None,
        keep_variables: bool = False,
        **limits: Any,
    ) -> ExecutionResult:
        """One program in a sandbox of its own, closed (and so torn down) on return."""
        config = self.config(options=options, **limits)
        async with Sandbox(config, registry=self.registry()) as sandbox:
            return await sandbox.run(
                source,
                profile=self.profile,
                bindings=bindings,
                preamble=preamble,
                variables=variables,
                keep_variables=keep_variables,
            )

    async def exec(
        self,
        command: str | list[str],
        *,
        shell: bool = False,
        inputs: dict[str, bytes] | None = None,
        **limits: Any,
    ) -> ExecutionResult:
        """One command in a sandbox of its own, closed (and so torn down) on return."""
        async with Sandbox(self.config(**limits), registry=self.registry()) as sandbox:
            return await sandbox.exec(command, shell=shell, profile=self.profile, inputs=inputs)

    async def child_python(self) -> str:
        """The interpreter that runs the bootstrap where the child runs (a command to run
        that surely exists there), asked of a program once per test class."""
        found = self.command_python or vars(type(self)).get("_child_python")
        if found is None:
            result = await self.run("import sys\nsys.executable")
            assert result.error is None, result.error
            found = str(result.return_value)
            type(self)._child_python = found  # type: ignore[attr-defined]
        return str(found)

    def sandbox(self, **kwargs: Any) -> Sandbox:
        """A sandbox of :meth:`config` (same arguments), for tests that run more than one
        program in it."""
        return Sandbox(self.config(**kwargs), registry=self.registry())

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

    async def _watching(
        self, mark: str, execution: Awaitable[ExecutionResult]
    ) -> tuple[ExecutionResult, list[int]]:
        """Run ``execution`` while the host watches for processes carrying ``mark`` (where
        this backend's are visible from the host); its result, and the pids seen meanwhile."""
        seen: list[int] = []

        async def watch() -> None:
            if self.processes_visible:
                seen.extend(await wait_for_pids(mark))

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            result = await execution
            tg.cancel_scope.cancel()
        return result, seen

    def _nothing_left(self, mark: str) -> None:
        if self.processes_visible:
            assert pids_with(mark) == [], "a process of the program outlived its sandbox"
        assert self.leftovers() == []

    # ------------------------------------------------------------ the tests

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

    # Commands go through the same child and teardown as programs, on every loop alike:
    # once, on asyncio.

    @pytest.mark.anyio
    async def test_declares_whether_it_runs_commands(self) -> None:
        registry = self.registry() or BackendRegistry()
        assert registry.get(self.backend).cls.runs_commands is self.runs_commands

    @applies(lambda cls: cls.runs_commands)
    @pytest.mark.parametrize("anyio_backend", ["asyncio"])
    @pytest.mark.anyio
    async def test_a_command_runs_where_a_program_runs(self) -> None:
        python = await self.child_python()
        code = (
            "import sys\n"
            "print(open('in.txt').read(), sys.argv[1:])\n"
            "print('to stderr', file=sys.stderr)\n"
            "sys.stdout.write('x' * 10000)\n"
            "sys.exit(3)\n"
        )
        # Not a shell: the argument's $, ; and backquotes reach the command as they are.
        result = await self.exec(
            [python, "-c", code, "$HOME; `id`"],
            inputs={"in.txt": b"given"},
            stdout_bytes=4096,
        )
        assert result.error is None, result.error
        assert result.exit_status == 3
        assert result.stdout.startswith("given ['$HOME; `id`']\n")
        assert result.stderr == "to stderr\n"
        # Held to the stream's cap, and the count of what was written exact (a relay that
        # carries only a capped head and tail across still counts the rest).
        info = result.stdout_info
        written = len("given ['$HOME; `id`']\n") + 10000
        assert info.captured_bytes <= 4096 < info.total_bytes == written, info
        assert info.dropped_bytes > 0
        assert result.return_value is None
        assert result.level == self.level
        for guarantee in sorted(self.enforced):
            assert result.grades[Guarantee(guarantee)] == "enforced", (guarantee, result.grades)

    @applies(lambda cls: cls.runs_commands)
    @pytest.mark.parametrize("anyio_backend", ["asyncio"])
    @pytest.mark.anyio
    async def test_a_command_past_its_wall_clock_is_killed_with_its_whole_tree(self) -> None:
        python = await self.child_python()
        mark = marker()
        result, seen = await self._watching(
            mark,
            self.exec(
                [python, "-c", DAEMON.format(mark=mark) + "while True:\n    time.sleep(1)\n"],
                wall_seconds=1.0,
                grace_seconds=0.2,
            ),
        )
        assert result.error is not None
        assert result.error.kind is ErrorKind.TIMEOUT, result.error
        assert result.exit_status is None
        if self.processes_visible:
            assert seen, "the command's detached daemon was never seen running"
        self._nothing_left(mark)

    @applies(lambda cls: cls.runs_commands)
    @pytest.mark.parametrize("anyio_backend", ["asyncio"])
    @pytest.mark.anyio
    async def test_a_string_is_run_by_a_shell_only_when_asked(self) -> None:
        async with Sandbox(self.config(), registry=self.registry()) as sandbox:
            with pytest.raises(InvalidRequestError):
                await sandbox.exec("echo $((6 * 7))", profile=self.profile)
            result = await sandbox.exec("echo $((6 * 7)); exit 4", shell=True, profile=self.profile)
        assert result.error is None, result.error
        if self.has_shell:
            assert (result.stdout, result.exit_status) == ("42\n", 4)
        else:
            assert result.exit_status == 127
            assert "not found" in result.stderr

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

    # ------------------------------------------------------------ a filesystem boundary

    @applies(_claims("filesystem"))
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

    @applies(_claims("filesystem"))
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

    @applies(lambda cls: _claims("filesystem", "process_tree")(cls) and cls.processes_visible)
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

    # ------------------------------------------------------------ identity on a root host

    def leased(self, uid: int) -> bool:
        """Whether ``uid`` is one of the backend's per-execution identities."""
        uids = self.identity_uids()
        return uids is not None and uid in uids

    @applies(_root_identity)
    @pytest.mark.anyio
    async def test_identity_seen_from_the_host(self) -> None:
        """The program's process, inspected from the host: an identity leased for it (on a
        root host), no capabilities, no new privileges, namespaces of its own."""
        mark = marker()
        seen: dict[str, Any] = {}
        separate = {"network": "net", "process_tree": "pid", "filesystem": "mnt"}
        namespaces = ["ipc", *(ns for g, ns in separate.items() if g in self.enforced)]

        async def inspect() -> None:
            (pid,) = await wait_for_pids(mark)
            status = dict(
                line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            )
            seen["uid"] = [int(x) for x in status["Uid"].split()]
            seen["capeff"] = int(status["CapEff"].strip(), 16)
            seen["capprm"] = int(status["CapPrm"].strip(), 16)
            seen["nnp"] = status["NoNewPrivs"].strip()
            seen["own"] = {
                ns: os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}")
                for ns in namespaces
            }
            os.kill(pid, signal.SIGTERM)

        async with anyio.create_task_group() as tg:
            tg.start_soon(inspect)
            result = await self.run(
                "import subprocess, sys\n"
                f"subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)', {mark!r}])"
                ".returncode"
            )
        assert result.error is None, result.error
        assert result.return_value == -signal.SIGTERM
        (uid,) = set(seen["uid"])  # the same in all four slots
        assert uid != 0
        if os.geteuid() == 0:
            assert self.leased(uid), uid
        assert seen["capeff"] == 0 and seen["capprm"] == 0
        assert seen["nnp"] == "1"
        assert all(seen["own"].values()), seen["own"]

    @applies(_root_identity)
    @pytest.mark.anyio
    async def test_two_running_executions_run_as_distinct_uids(self) -> None:
        _needs_root()
        marks = [marker(), marker()]
        async with self.sandbox() as sandbox, anyio.create_task_group() as tg:
            for mark in marks:
                tg.start_soon(partial(sandbox.run, secret_holder(mark, "x"), profile=self.profile))
            pids = [(await wait_for_pids(mark))[0] for mark in marks]
            uids = [uids_of(pid) for pid in pids]
            tg.cancel_scope.cancel()
        # Each process under one uid in all four slots, leased, and not the same for both.
        assert all(len(set(ids)) == 1 for ids in uids), uids
        first, second = uids[0][0], uids[1][0]
        assert first != second, f"both executions ran as host uid {first}"
        assert self.leased(first) and self.leased(second)
        assert pids_with(marks[0]) == [] and pids_with(marks[1]) == []

    async def spy_on_a_running_execution(
        self, options: dict[str, Any], plain: dict[str, Any]
    ) -> tuple[str, list[ExecutionResult], list[str]]:
        """Run a holder, then spies from this backend and from a program on the host (the
        plain profile) while it runs: the secret, the spies' results and the host's record
        of opens of the secret."""
        assert self.workspace_path is not None
        mark, secret = marker(), "SECRET-" + marker()
        async with (
            self.sandbox(options=options, plain=plain) as sandbox,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(partial(sandbox.run, secret_holder(mark, secret), profile=self.profile))
            (pid,) = await wait_for_pids(mark)
            # The host (root) reaches the secret's inode through the holder's own root, and
            # watches it: any spy that opens it is seen, whatever path it took.
            path = f"/proc/{pid}/root{self.workspace_path}/secret.txt"
            with opens_of(path) as opened:
                spies = [
                    await sandbox.run(SECRET_SPY, profile=self.profile),
                    await sandbox.run(SECRET_SPY, profile=self.PLAIN),
                ]
            # The control: the secret was there all along, and the watch sees an open.
            with opens_of(path) as control, open(path) as fh:
                assert fh.read() == secret
            assert control
            tg.cancel_scope.cancel()
        return secret, spies, opened

    @applies(lambda cls: _root_identity(cls) and cls.workspace_path is not None)
    @pytest.mark.anyio
    async def test_a_program_in_another_execution_cannot_read_a_running_workspace(self) -> None:
        _needs_root()
        secret, spies, opened = await self.spy_on_a_running_execution({}, {})
        for spy in spies:
            assert spy.error is None, spy.error
            assert "looked at" in spy.stdout
            assert spy.return_value == []
            assert secret not in spy.stdout + spy.stderr + repr(spy.return_value)
        # Seen from the host: nothing but the host itself opened the secret's inode.
        assert opened == []

    @applies(
        lambda cls: (
            _root_identity(cls)
            and cls.workspace_path is not None
            and cls.shared_identity is not None
        )
    )
    @pytest.mark.anyio
    async def test_with_one_shared_identity_a_host_program_does_read_it(self) -> None:
        """The control for the test above, and why the shared identity is the weaker setting:
        the same spy, with every execution under the one identity, reads the secret."""
        _needs_root()
        assert self.shared_identity is not None
        options, (uid, gid) = self.shared_identity
        secret, spies, opened = await self.spy_on_a_running_execution(
            options, {"drop_to_uid": uid, "drop_to_gid": gid}
        )
        inside, plain = spies
        # The boundary's pid namespace hides the holder from a program in another one...
        assert inside.return_value == []
        # ... but not from a program on the host under the same uid.
        assert plain.return_value and plain.return_value == [secret] * len(plain.return_value)
        assert opened

    @applies(lambda cls: "identity" in cls.enforced and cls.identity_options)
    @pytest.mark.anyio
    async def test_state_planted_under_the_uid_is_gone_from_the_host(self) -> None:
        _needs_root()
        with own_uid(1_970_000_000 + secrets.randbelow(1_000_000)) as options:
            uid, mark = options["identity_first_uid"], marker("psych-left")
            with host_targets(mark) as (target, target_dir):
                async with self.sandbox(options=options) as sandbox:
                    planted = await sandbox.run(
                        planting_program(mark, target, target_dir), profile=self.profile
                    )
                # The Sandbox closed: its execution is over, its teardown included (a result
                # may come back before its teardown has finished).
                assert planted.error is None, planted.error
                done = json.loads(planted.return_value)
                # Planted in the execution's own IPC namespace and temporary directory...
                assert all(done[kind] for kind in ("shm", "msg", "sem", "/tmp")), done
                # ...and none of it is on the host once the execution is over (keys are
                # collected by the kernel in the background).
                assert host_leftovers(mark, uid) in ([], ["keys"])
                # This process is a child subreaper during the test (see the fixture): an
                # orphan a backend leaves to the system's init (bwrap's namespace init) is
                # this process's to reap, and until then its zombie holds the uid's keys.
                me = os.getpid()
                reap_children(
                    {
                        p.pid
                        for p in host_processes().values()
                        if p.ppid == me and not p.alive and uid in p.uids
                    }
                )
                with anyio.move_on_after(10):
                    while has_keys(uid):
                        await anyio.sleep(0.05)
                assert not has_keys(uid)
                async with self.sandbox(options=options) as sandbox:
                    found = await sandbox.run(finding_program(mark), profile=self.profile)
        assert found.error is None, found.error
        assert json.loads(found.return_value) == []
