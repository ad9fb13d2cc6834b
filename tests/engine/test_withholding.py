"""A request that cannot be met stops the program before it runs; output produced under
weaker terms than claimed is withheld. Every assertion about containment is made from the
host side: a marker file the program would have written, a listener's count."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from psych_sandbox_core import DeploymentConfig, ErrorKind, Level, ProfileConfig, Sandbox
from psych_sandbox_core._bindings.bindings import FunctionBindings
from psych_sandbox_core._policy.narrowing import ExecutionRequest
from psych_sandbox_core._policy.registry import BackendRegistry
from psych_sandbox_core.backends.subprocess import SubprocessBackend
from psych_sandbox_core.errors import GUIDANCE
from psych_sandbox_core.grading import Mechanisms
from psych_sandbox_core.kit.backend import BackendOptions, ProbeTargets
from psych_sandbox_core.kit.hookspecs import hookimpl

pytestmark = pytest.mark.anyio


@pytest.fixture
def marker_dir() -> Iterator[Path]:
    """A host directory the program's unprivileged identity could write into."""
    root = Path(tempfile.mkdtemp(prefix="psych-withhold-"))
    os.chmod(root, 0o755)
    # The child may run as another uid: it writes into a file the host made (a file of its
    # own in a world-writable directory would be swept with its uid at teardown).
    (root / "ran").touch(mode=0o666)
    os.chmod(root / "ran", 0o666)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def ran(directory: Path) -> bool:
    """Whether the program wrote its marker."""
    return (directory / "ran").read_text() == "the program ran"


def writes_marker(directory: Path) -> str:
    path = directory / "ran"
    return f"open({str(path)!r}, 'w').write('the program ran')\nprint('done')\n"


class MisreportingBackend(SubprocessBackend):
    """The subprocess mechanism, claiming a filesystem boundary and the isolated level it
    does not have. The canary stays readable, so the evidence contradicts the claim."""

    id: ClassVar[str] = "misreporting"
    claims: ClassVar[Level] = Level.ISOLATED

    def mechanisms(self) -> Mechanisms:
        return Mechanisms(
            filesystem_boundary=True,
            network_namespace=True,
            ipc_namespace=True,
            process_tree_boundary=True,
            unprivileged_identity=True,
        )


class _MisreportingPlugin:
    @staticmethod
    @hookimpl
    def psych_sandbox_register_backends(registry: Any) -> None:
        registry.add(MisreportingBackend)


def _sandbox(
    profiles: dict[str, ProfileConfig], registry: BackendRegistry | None = None
) -> Sandbox:
    return Sandbox(DeploymentConfig(profiles=profiles), registry=registry)


async def test_required_isolated_on_subprocess_never_runs(marker_dir: Path) -> None:
    # The deployment's floor: every run below it is refused (a profile requiring more than
    # its own backend can reach is a configuration error instead: test_config.py).
    config = DeploymentConfig(
        profiles={"strict": ProfileConfig(backend="subprocess")}, required_level=Level.ISOLATED
    )
    async with Sandbox(config) as box:
        result = await box.run(writes_marker(marker_dir), profile="strict")
    assert result.error is not None
    assert result.error.kind is ErrorKind.ISOLATION_UNAVAILABLE
    assert "deployment" in result.error.message
    assert result.error.guidance == GUIDANCE[ErrorKind.ISOLATION_UNAVAILABLE]
    assert "not of your code" in result.error.guidance
    assert not ran(marker_dir)
    assert result.stdout == ""


async def test_the_same_program_runs_where_nothing_is_required(marker_dir: Path) -> None:
    # The control: the marker is how a run would show itself.
    async with _sandbox({"plain": ProfileConfig(backend="subprocess")}) as box:
        result = await box.run(writes_marker(marker_dir), profile="plain")
    assert result.error is None, result.error
    assert ran(marker_dir)


async def test_a_minimum_level_in_the_request_is_refused_before_running(marker_dir: Path) -> None:
    async with _sandbox({}) as box:
        result = await box.run(
            writes_marker(marker_dir),
            request=ExecutionRequest(profile="subprocess", minimum_level=Level.ISOLATED),
        )
    assert result.error is not None
    assert result.error.kind is ErrorKind.ISOLATION_UNAVAILABLE
    assert not ran(marker_dir)


async def test_network_request_on_a_profile_without_network_never_runs(marker_dir: Path) -> None:
    async with _sandbox({"offline": ProfileConfig(backend="subprocess")}) as box:
        result = await box.run(
            writes_marker(marker_dir), request=ExecutionRequest(profile="offline", network=True)
        )
    assert result.error is not None
    assert result.error.kind is ErrorKind.NETWORK_NOT_ALLOWED
    assert "profile 'offline'" in result.error.message
    assert "not of your code" in result.error.guidance
    assert not ran(marker_dir)
    # The child did report before it was refused: the abort came after the handshake.
    assert result.grades


async def test_a_backend_that_misreports_is_refused_before_running(marker_dir: Path) -> None:
    registry = BackendRegistry()
    registry.register_plugin(_MisreportingPlugin(), "misreporting-test")
    async with _sandbox({"liar": ProfileConfig(backend="misreporting")}, registry) as box:
        result = await box.run(writes_marker(marker_dir), profile="liar")
    assert result.error is not None
    assert result.error.kind is ErrorKind.ISOLATION_UNAVAILABLE
    assert "claimed the isolated level" in result.error.message
    # The canary was readable: the claimed boundary was contradicted by evidence.
    assert result.grades["filesystem"] == "unavailable"
    assert result.level != "isolated"
    assert not ran(marker_dir)
    assert result.stdout == ""


#: Connects to every IPv4 loopback listener it finds (the host's probe listener among them:
#: nothing tells the program which), as a program scanning its host would.
CONNECTS_DURING_RUN = """
import socket
for port in await own_listeners():
    try:
        # Closed at once: the host counts what reached its listener's queue.
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        pass
print("secret the program computed")
return 42
"""


def _own_listeners(made: list[ProbeTargets]) -> FunctionBindings:
    """A tool naming the loopback ports of the probe listeners this test's executions made."""

    async def own_listeners() -> list[int]:
        return sorted({t.port4 for t in made if t.port4 is not None})

    return FunctionBindings({"own_listeners": own_listeners})


def _no_namespaces() -> dict[str, ProfileConfig]:
    return {"open": ProfileConfig(backend="subprocess", options={"use_namespaces": False})}


async def test_a_connection_seen_during_the_run_withholds_the_output(
    probe_targets: list[ProbeTargets],
) -> None:
    async with _sandbox(_no_namespaces()) as box:
        result = await box.run(
            CONNECTS_DURING_RUN, profile="open", bindings=_own_listeners(probe_targets)
        )
    assert result.error is not None, result
    assert result.error.kind is ErrorKind.ISOLATION_UNAVAILABLE
    assert "withheld" in result.error.message
    assert result.stdout == ""
    assert result.stdout_info.total_bytes == 0
    assert result.return_value is None
    assert result.grades["network"] == "unavailable"


async def test_without_a_connection_the_same_backend_returns_its_output() -> None:
    # The control: the probe's own connections before the run are not held against it.
    async with _sandbox(_no_namespaces()) as box:
        result = await box.run("print('secret the program computed')\nreturn 42", profile="open")
    assert result.error is None, result.error
    assert result.return_value == 42
    assert result.grades["network"] == "unavailable"


async def test_options_model_of_the_test_backend_is_the_subprocess_one() -> None:
    # Guards the premise of the misreporting test: it is the real subprocess mechanism.
    assert MisreportingBackend.Options is SubprocessBackend.Options
    assert issubclass(MisreportingBackend.Options, BackendOptions)
