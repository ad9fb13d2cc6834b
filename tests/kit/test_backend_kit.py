"""The backend kit is the only part of the core a backend imports, and it holds what every
backend needs once: the rule checked over the source of every backend in this repository
(parsed, not imported), the version range each declares, and the kit's own helpers run for
real (leases from a one-uid range, a launcher that dies before its bootstrap speaks)."""

from __future__ import annotations

import ast
import importlib
import os
import random
import select
import signal
import sys
from collections.abc import AsyncIterator, Collection, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from psych_sandbox_testing.leftovers import own_uid

import psych_sandbox_core
from psych_sandbox_core import backend_kit as shim
from psych_sandbox_core import kit as backend_kit
from psych_sandbox_core.kit import (
    Backend,
    BackendOptions,
    BackendUnavailable,
    ExecutionLimits,
    ExitStatus,
    Launched,
    LaunchRequest,
    Level,
    Mechanisms,
    ProbeTargets,
    relay,
    wait_started,
)
from psych_sandbox_core.kit import posix as toolbox
from psych_sandbox_core.kit.posix import (
    ExecutionIdentity,
    LeasedIdentityBackend,
    LeasedIdentityOptions,
    ManagedProcess,
    retirement,
)
from psych_sandbox_core.kit.posix.identity import IdentityRange
from psych_sandbox_core.kit.posix.leased import leased_identity
from psych_sandbox_core.kit.posix.sweep import Swept

from ..import_rules import ROOT, core_imports

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

GUIDE = ROOT / "docs" / "writing-a-backend.md"
KIT = "psych_sandbox_core.kit"
#: The kit's three modules: the contract, the local toolbox, the relay.
KIT_MODULES = {KIT, f"{KIT}.posix", f"{KIT}.relay"}
#: What a plugin that also serves this host's profiles to others imports besides the kit.
SERVICE_KIT = "psych_sandbox_core.service_kit"
#: The core's own modules a backend shipped inside the core may import besides the kit: the
#: mechanisms that are that backend's alone.
BUILTIN_OWN = {
    "psych_sandbox_core.backends.subprocess": {"psych_sandbox_core.kit.posix.pid_namespace"}
}


def plugin_projects() -> list[Path]:
    """Every backend distribution in the repository: the plugins and the example."""
    found = [p.parent for p in ROOT.glob("plugins/*/pyproject.toml")]
    found += [p.parent for p in ROOT.glob("examples/*/pyproject.toml")]
    assert found
    return sorted(found)


def package_sources(project: Path) -> list[Path]:
    packages = tomllib.loads((project / "pyproject.toml").read_text())["tool"]["hatch"]["build"][
        "targets"
    ]["wheel"]["packages"]
    return sorted(p for package in packages for p in (project / package).rglob("*.py"))


def private_reads(path: Path) -> list[tuple[int, str]]:
    """Attributes named ``_x`` that ``path`` reads but never defines itself: another
    module's private state (the core's, for a backend)."""
    tree = ast.parse(path.read_text(), str(path))
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Attribute):
                        own.add(leaf.attr)
                    elif isinstance(leaf, ast.Name):
                        own.add(leaf.id)
    return [
        (node.lineno, node.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and node.attr not in own
    ]


def backend_modules() -> Iterator[tuple[str, Path]]:
    for project in plugin_projects():
        for path in package_sources(project):
            yield ".".join(path.relative_to(project).with_suffix("").parts), path
    for path in sorted((ROOT / "psych_sandbox_core" / "backends").glob("*.py")):
        yield f"psych_sandbox_core.backends.{path.stem}", path


def test_backends_import_nothing_of_the_core_but_the_kit() -> None:
    breaches = []
    for module, path in backend_modules():
        allowed = {*KIT_MODULES, SERVICE_KIT, *BUILTIN_OWN.get(module, ())}
        for line, name in core_imports(path, module):
            if name not in allowed:
                breaches.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert breaches == [], "\n".join(breaches)


def test_backends_read_no_private_attribute_of_the_core() -> None:
    reads = [
        f"{path.relative_to(ROOT)}:{line} reads {attr}"
        for _, path in backend_modules()
        for line, attr in private_reads(path)
    ]
    assert reads == [], "\n".join(reads)


def test_the_rule_catches_a_breach(tmp_path: Path) -> None:
    # The checks above cannot pass vacuously: each finds what it is there to find.
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from psych_sandbox_core._engine.host import child_environment\n"
        "from psych_sandbox_core import cgroups\n"
        "from psych_sandbox_core.kit import InheritedSocketChannel\n"
        "InheritedSocketChannel()._host\n"
    )
    assert core_imports(bad, "plugin.bad") == [
        (1, "psych_sandbox_core._engine.host"),
        (2, "psych_sandbox_core"),
        (3, KIT),
    ]
    assert private_reads(bad) == [(4, "_host")]
    relative = tmp_path / "relative.py"
    relative.write_text("from .._engine.host import child_environment\nfrom .. import cgroups\n")
    assert core_imports(relative, "psych_sandbox_core.backends.relative") == [
        (1, "psych_sandbox_core._engine.host"),
        (2, "psych_sandbox_core"),
    ]


def test_every_backend_declares_the_kits_minor_series() -> None:
    major, minor = (int(part) for part in backend_kit.KIT_VERSION.split("."))
    assert psych_sandbox_core.__version__.startswith(f"{major}.{minor}.")
    wanted = f"psych-sandbox-core>={major}.{minor},<{major}.{minor + 1}"
    for project in plugin_projects():
        dependencies = tomllib.loads((project / "pyproject.toml").read_text())["project"][
            "dependencies"
        ]
        core = [d for d in dependencies if d.startswith("psych-sandbox-core")]
        assert core == [wanted], (project.name, core)


def test_every_name_of_the_kit_resolves_and_is_documented() -> None:
    guide = GUIDE.read_text()
    for module in (backend_kit, toolbox, relay):
        for name in module.__all__:
            assert getattr(module, name) is not None
            assert f"`{name}`" in guide, f"{name} is exported by the kit but not in the guide"
    assert "Compatibility policy" in guide
    assert "Compatibility policy" in (backend_kit.__doc__ or "")


#: What the 0.1 kit (``psych_sandbox_core.backend_kit``) exported: the shim keeps every name
#: importable for the 0.2 series.
KIT_0_1 = [
    "AbortFrame",
    "Backend",
    "BackendOptions",
    "BackendRegistrar",
    "BackendUnavailable",
    "ChannelListener",
    "ChildInterpreter",
    "ConfigurationError",
    "DEFAULT_COUNT",
    "DEFAULT_FIRST_UID",
    "EXECUTION_CPU_SHARES",
    "EmptyCgroup",
    "ErrorKind",
    "ExecutionCgroup",
    "ExecutionIdentity",
    "ExecutionLimits",
    "ExitStatus",
    "Guarantee",
    "HANDSHAKE_CEILINGS",
    "HANDSHAKE_SECONDS",
    "HelloFrame",
    "Hierarchy",
    "IdentityRange",
    "InheritedSocketChannel",
    "InitReport",
    "InterpreterNotFoundError",
    "InterpreterOptions",
    "KIT_VERSION",
    "LateTerms",
    "LaunchRequest",
    "Launched",
    "LeasedIdentityBackend",
    "LeasedIdentityOptions",
    "Level",
    "LoopbackTokenChannel",
    "MAX_HELLO_FRAME_BYTES",
    "MAX_HOST_FRAME_BYTES",
    "ManagedProcess",
    "Mechanisms",
    "PROTOCOL_VERSION",
    "PassedFds",
    "ProbeHarness",
    "ProbeTargets",
    "ProcessLaunched",
    "RunFrame",
    "SYSTEM_CANDIDATES",
    "SocketByteStream",
    "SubprocessBackend",
    "SubprocessOptions",
    "UnixSocketChannel",
    "bootstrap_argv",
    "bootstrap_source",
    "cgroup_hierarchies",
    "child_environment",
    "create_workspace",
    "decode_child_frame",
    "decode_host_frame",
    "execution_cgroup",
    "grade",
    "hookimpl",
    "host_alive",
    "host_is_root",
    "interpreter_prefixes",
    "leased_identity",
    "level_at_least",
    "make_owned_directory",
    "mark",
    "owner_of",
    "owner_tag",
    "read_some",
    "reap_owned_directories",
    "remove_cgroup_tree",
    "remove_execution_cgroup",
    "remove_tree",
    "resolve_environment",
    "resolve_interpreter",
    "start_time",
    "wait_started",
]


def test_the_former_kit_still_provides_every_name_it_had() -> None:
    assert len(KIT_0_1) == 78
    assert sorted(shim.__all__) == sorted(KIT_0_1)
    for name in KIT_0_1:
        found = getattr(shim, name)
        # The same object as where it now lives, not a copy.
        homes = [m for m in (backend_kit, toolbox, relay) if name in m.__all__]
        for home in homes:
            assert getattr(home, name) is found, name


def test_the_contract_is_a_few_names_and_the_parts_do_not_overlap() -> None:
    contract, local, relaying = (set(m.__all__) for m in (backend_kit, toolbox, relay))
    assert len(contract) <= 30, sorted(contract)
    assert not (contract & local or contract & relaying or local & relaying)


# ---------------------------------------------------------------- declaring a backend


class _Options(BackendOptions):
    size: int = 1


class _Narrower(_Options):
    colour: str = "red"


class _Declared(Backend[_Options], id="declared", claims=Level.PROCESS, runs_commands=True):
    def unavailable_reason(self) -> str | None:
        return None

    def launch(self, request: LaunchRequest) -> Any:
        raise NotImplementedError


def test_a_backend_declares_itself_in_its_class_statement() -> None:
    assert (_Declared.id, _Declared.claims, _Declared.runs_commands) == (
        "declared",
        Level.PROCESS,
        True,
    )
    # The type argument is the settings model the core validates a profile's options with.
    assert _Declared.Options is _Options
    assert _Declared(_Options(size=3)).options.size == 3

    class Narrowed(_Declared, id="narrowed", options=_Narrower):
        pass

    assert (Narrowed.Options, Narrowed.claims, Narrowed.runs_commands) == (
        _Narrower,
        Level.PROCESS,
        True,
    )
    assert _Declared.Options is _Options and _Declared.id == "declared"


def test_a_subclass_cannot_swap_its_settings_for_unrelated_ones() -> None:
    # self.options is typed as the inherited model: only a narrower one keeps that true.
    with pytest.raises(TypeError, match="not a subclass of _Options"):

        class Swapped(_Declared, options=BackendOptions):
            pass


# ---------------------------------------------------------------- leased_identity


@pytest.fixture
def one_uid() -> Iterator[IdentityRange]:
    if os.geteuid() != 0:
        pytest.skip("identities are leased only on a root host")
    with own_uid(1_980_000_000 + random.randrange(1_000_000)) as options:
        yield IdentityRange(options["identity_first_uid"], options["identity_count"])


@pytest.fixture
def sweeps(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool]]:
    """Every sweep a retiring lease runs: (uid, whether it scanned for processes)."""
    done: list[tuple[int, bool]] = []
    real = retirement.sweep_together

    def recording(identities: Collection[Swept]) -> dict[int, OSError]:
        done.extend((one.uid, one.processes) for one in identities)
        return real(identities)

    monkeypatch.setattr(retirement, "sweep_together", recording)
    return done


@pytest.mark.anyio
async def test_a_lease_is_the_executions_alone_and_retired_on_the_way_out(
    one_uid: IdentityRange, sweeps: list[tuple[int, bool]]
) -> None:
    async with leased_identity(one_uid, lease=True) as held:
        assert held.ids == (one_uid.first, one_uid.first) and held.exclusive
        # The range has one uid, held: another execution cannot have it meanwhile.
        with pytest.raises(BackendUnavailable):
            async with leased_identity(one_uid, lease=True):
                pass
    assert sweeps == [(one_uid.first, True)]
    # Given back: the next execution gets it.
    async with leased_identity(one_uid, lease=True) as again:
        assert again.ids == held.ids


@pytest.mark.anyio
async def test_a_failed_execution_still_retires_its_lease(
    one_uid: IdentityRange, sweeps: list[tuple[int, bool]]
) -> None:
    with pytest.raises(RuntimeError):
        async with leased_identity(one_uid, lease=True):
            raise RuntimeError("the launch failed")
    assert sweeps == [(one_uid.first, True)]
    async with leased_identity(one_uid, lease=True) as again:
        assert again.exclusive


@pytest.mark.anyio
async def test_only_a_proof_spares_the_scan_for_processes(
    one_uid: IdentityRange, sweeps: list[tuple[int, bool]], tmp_path: Path
) -> None:
    cgroup = tmp_path / "cgroup"  # an empty directory stands for an emptied cgroup
    cgroup.mkdir()
    async with leased_identity(one_uid, lease=True) as held:
        held.proven_empty(None)  # no proof: nothing recorded
        held.proven_empty(toolbox.remove_execution_cgroup([cgroup]))
    assert sweeps == [(one_uid.first, False)]


@pytest.mark.anyio
async def test_a_fixed_identity_or_none_leases_nothing(
    sweeps: list[tuple[int, bool]],
) -> None:
    unused = IdentityRange(1_000_000_000, 1)
    async with leased_identity(unused, lease=True, fixed=(65534, 65534)) as fixed:
        assert fixed.ids == (65534, 65534) and not fixed.exclusive
    async with leased_identity(unused, lease=False) as none:
        assert none.ids is None and not none.exclusive
    assert sweeps == []


class _LeasingOptions(LeasedIdentityOptions):
    shared_uid: int | None = None
    shared_gid: int | None = None


class _Leasing(
    LeasedIdentityBackend[_LeasingOptions],
    id="leasing",
    claims=Level.PROCESS,
    shared_identity=("shared_uid", "shared_gid"),
):
    """Launches nothing: records the identity each launch ran as."""

    def unavailable_reason(self) -> str | None:
        return None

    @asynccontextmanager
    async def launch_as(
        self, request: LaunchRequest, identity: ExecutionIdentity
    ) -> AsyncIterator[Launched]:
        self.seen = identity
        yield None  # type: ignore[misc]  # nothing is launched: the lease is under test


def _no_targets() -> ProbeTargets:
    raise AssertionError("nothing is launched: no probe targets are made")


@pytest.mark.anyio
async def test_a_leasing_backend_launches_inside_a_lease_of_its_own(
    one_uid: IdentityRange, sweeps: list[tuple[int, bool]]
) -> None:
    range_options = {"identity_first_uid": one_uid.first, "identity_count": one_uid.count}
    backend = _Leasing(_LeasingOptions(**range_options))
    # The host is told the uid each child runs as (its probe's evidence is that uid's).
    told: list[int] = []
    request = LaunchRequest(
        bootstrap_source="", targets=ProbeTargets, limits=ExecutionLimits(), runs_as=told.append
    )
    async with backend.launch(request):
        assert backend.seen.ids == (one_uid.first, one_uid.first) and backend.seen.exclusive
        assert sweeps == []
        assert told == [one_uid.first]
    assert sweeps == [(one_uid.first, True)]
    # With the shared pair of settings set, every launch runs as that one identity, unleased.
    shared = _Leasing(_LeasingOptions(**range_options, shared_uid=65534, shared_gid=65534))
    async with shared.launch(request):
        assert shared.seen.ids == (65534, 65534) and not shared.seen.exclusive
        assert told == [one_uid.first, 65534]
    assert sweeps == [(one_uid.first, True)]


# ---------------------------------------------------------------- wait_started


class _Process(Launched):
    """A launcher as a backend wraps one: a real process, its streams and its teardown."""

    def __init__(self, process: ManagedProcess) -> None:
        self.process = process
        self.stdout = process.stdout
        self.stderr = process.stderr
        self.mechanisms = Mechanisms()

    async def wait_exited(self) -> None:
        await self.process.wait_exited()

    async def terminate(self, grace_seconds: float) -> None:
        await self.process.terminate(grace_seconds)

    async def finish(self) -> ExitStatus:
        return await self.process.kill_and_reap()


@pytest.mark.anyio
async def test_a_launcher_that_dies_first_is_unavailable_in_its_own_words() -> None:
    process = await ManagedProcess.spawn(
        ["sh", "-c", "echo 'no such mount' >&2; exit 3"], env={}, cwd="/"
    )
    try:
        with pytest.raises(BackendUnavailable) as raised:
            await wait_started(
                _Process(process),
                anyio.sleep_forever,
                lambda: False,
                seconds=30,
                failure=lambda status, said: f"launcher {status.describe()}: {said}",
            )
        assert str(raised.value) == "launcher exited with status 3: no such mount"
    finally:
        await process.aclose()


@pytest.mark.anyio
async def test_a_child_that_started_is_not_failed_by_its_launchers_exit() -> None:
    # The child speaks, then its launcher exits at once: both may be seen together, and the
    # launcher's exit must not turn a started child into a failed start.
    read, write = os.pipe()
    process = await ManagedProcess.spawn(
        [sys.executable, "-c", f"import os; os.write({write}, b'up')"],
        env={},
        cwd="/",
        pass_fds=(write,),
    )
    os.close(write)
    try:
        await wait_started(
            _Process(process),
            lambda: anyio.wait_readable(read),
            lambda: bool(select.select([read], [], [], 0)[0]),
            seconds=30,
            failure=lambda status, said: f"failed: {said}",
        )
        assert os.read(read, 16) == b"up"
    finally:
        os.close(read)
        await process.aclose()


ENDS_ON_USR1 = """
import os, signal, time
done = []
signal.signal(signal.SIGTERM, lambda *_: os.write(1, b"T"))
signal.signal(signal.SIGUSR1, lambda *_: done.append(os.write(1, b"U")))
os.write(1, b"R")
while not done:
    time.sleep(0.005)
os.write(1, b"E")
"""


@pytest.mark.anyio
async def test_a_process_is_asked_to_end_once() -> None:
    # The wall clock's thread asks at the deadline and the loop's terminate asks again: a
    # program handling SIGTERM must see one request. The second ask comes after the first
    # was handled; SIGUSR1 then ends the program, and a second SIGTERM sent before it would
    # have been handled first or in the same pass of the interpreter's signal handlers.
    process = await ManagedProcess.spawn([sys.executable, "-c", ENDS_ON_USR1], env={}, cwd="/")
    output = b""

    async def until(marker: bytes) -> None:
        nonlocal output
        with anyio.fail_after(30):
            while marker not in output:
                output += await process.stdout.receive()

    try:
        await until(b"R")
        process.ask_to_end()
        await until(b"T")
        process.ask_to_end()
        process.signal_group(signal.SIGUSR1)
        await until(b"E")
        assert output == b"RTUE"
    finally:
        await process.aclose()


# ---------------------------------------------------------------- plugins' tests

#: What a plugin's tests import besides the core's public API and the kit: the test kit, its
#: own distribution.
TEST_KITS = ("psych_sandbox_testing",)
#: The plugins that also serve this host's profiles to others, whose tests may import the
#: service kit as their sources do.
SERVING = {"psych-sandbox-remote"}


def plugin_test_files() -> Iterator[tuple[Path, Path]]:
    for project in plugin_projects():
        for path in sorted((project / "tests").glob("*.py")):
            yield project, path


def plugin_test_breaches(path: Path, serving: bool = False) -> list[tuple[int, str]]:
    """(line, what) of every import in ``path`` of the core that is neither the kit, the
    test kit, the service kit (where ``serving``) nor a name of the core's public API."""
    allowed = (*TEST_KITS, *((SERVICE_KIT,) if serving else ()))
    public = {*psych_sandbox_core.__all__, "__version__"}
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            modules = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, name in modules:
            if module.split(".")[0] not in ("psych_sandbox_core", "psych_sandbox_testing"):
                continue
            if module in KIT_MODULES:
                # The kit's three modules, by the names they export (not their insides).
                if name is None or name in importlib.import_module(module).__all__:
                    continue
            elif any(module == ok or module.startswith(f"{ok}.") for ok in allowed):
                continue
            if module == "psych_sandbox_core" and name is not None:
                if name in public or f"psych_sandbox_core.{name}" in (*KIT_MODULES, *allowed):
                    continue
                found.append((node.lineno, f"psych_sandbox_core.{name}"))
            else:
                found.append((node.lineno, module if name is None else f"{module}.{name}"))
    return sorted(found)


def test_plugin_tests_import_the_kit_the_test_kit_and_the_public_api_only() -> None:
    # What a test needs of the core's insides, the test kit (released with the core) gives.
    breaches = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for project, path in plugin_test_files()
        for line, name in plugin_test_breaches(path, serving=project.name in SERVING)
    ]
    assert breaches == [], "\n".join(breaches)


def test_the_plugin_test_rule_catches_a_breach(tmp_path: Path) -> None:
    planted = tmp_path / "test_planted.py"
    planted.write_text(
        "from psych_sandbox_core import Sandbox, backend_kit\n"
        "from psych_sandbox_core.kit import spawn\n"
        "from psych_sandbox_core.kit.posix import identity\n"
        "from psych_sandbox_core.kit import KIT_VERSION\n"
        "from psych_sandbox_testing import conformance\n"
        "from psych_sandbox_core.service_kit import availability\n"
        "def later():\n"
        "    from psych_sandbox_core._policy.registry import BackendRegistry\n"
        "    import psych_sandbox_core.result\n"
    )
    assert plugin_test_breaches(planted) == [
        (1, "psych_sandbox_core.backend_kit"),
        # The kit's modules by the names they export, not their insides.
        (3, "psych_sandbox_core.kit.posix.identity"),
        (6, "psych_sandbox_core.service_kit.availability"),
        (8, "psych_sandbox_core._policy.registry.BackendRegistry"),
        (9, "psych_sandbox_core.result"),
    ]
    # A serving plugin's tests may import the service kit, as its sources do.
    assert (6, "psych_sandbox_core.service_kit.availability") not in plugin_test_breaches(
        planted, serving=True
    )
