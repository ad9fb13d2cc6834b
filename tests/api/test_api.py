"""The public API on asyncio and trio: what raises (misuse, configuration) and what does not."""

from __future__ import annotations

from typing import ClassVar

import anyio
import pytest
from pydantic import ValidationError

from psych_sandbox_core import (
    ConfigurationError,
    DeploymentConfig,
    ErrorKind,
    ExecutionLimits,
    InterpreterNotFoundError,
    ProfileConfig,
    Sandbox,
    SandboxClosedError,
    UnknownBackendError,
    UnknownProfileError,
)
from psych_sandbox_core._policy.registry import BackendRegistry
from psych_sandbox_core.backends.subprocess import SubprocessBackend
from psych_sandbox_core.kit import hookspecs
from psych_sandbox_core.protocol.limits import max_return_value_bytes

from ..conftest import PROFILE, config, run

pytestmark = pytest.mark.anyio


async def test_run_after_aclose_raises() -> None:
    sandbox = Sandbox(config())
    assert (await sandbox.run("1", profile=PROFILE)).return_value == 1
    await sandbox.aclose()
    with pytest.raises(SandboxClosedError):
        await sandbox.run("1", profile=PROFILE)


async def test_unknown_profile_names_the_known_ones() -> None:
    async with Sandbox(config()) as sandbox:
        with pytest.raises(UnknownProfileError) as info:
            await sandbox.run("1", profile="no-such-profile")
    message = str(info.value)
    assert "no-such-profile" in message
    for known in ("default", PROFILE, "subprocess"):
        assert known in message


@pytest.mark.parametrize("interpreter", ["/nonexistent/bin/python3", "no-such-python-xyz"])
async def test_unresolvable_interpreter_raises(interpreter: str) -> None:
    async with Sandbox(config(options={"interpreter": interpreter})) as sandbox:
        with pytest.raises(InterpreterNotFoundError, match="cannot be resolved"):
            await sandbox.run("1", profile=PROFILE)


async def test_unknown_backend_is_a_configuration_error_naming_it() -> None:
    # Found when the configuration is built or first used, never as a program failure.
    with pytest.raises(ConfigurationError, match="bwrapx"):
        cfg = DeploymentConfig(profiles={"p": ProfileConfig(backend="bwrapx")})
        async with Sandbox(cfg) as sandbox:
            await sandbox.run("1", profile="p")


def test_unknown_backend_error_names_the_distribution_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from psych_sandbox_core._policy import registry as registry_module
    from psych_sandbox_core._policy.registry import KNOWN_DISTRIBUTIONS

    # A host with no plugin installed: entry points looked up in a group nobody provides.
    monkeypatch.setattr(registry_module, "ENTRY_POINT_GROUP", "psych_sandbox_nothing_here")
    registry = BackendRegistry()
    assert not set(KNOWN_DISTRIBUTIONS) & set(registry.ids())
    for backend_id, distribution in KNOWN_DISTRIBUTIONS.items():
        with pytest.raises(UnknownBackendError, match=f"pip install {distribution}"):
            registry.get(backend_id)


async def test_invalid_backend_options_are_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="no_such_option"):
        async with Sandbox(config(options={"no_such_option": 1})) as sandbox:
            await sandbox.run("1", profile=PROFILE)


def test_a_return_value_cap_no_frame_can_carry_is_rejected_at_construction() -> None:
    ceiling = max_return_value_bytes()
    assert ExecutionLimits(return_value_bytes=ceiling).return_value_bytes == ceiling
    with pytest.raises(ValidationError, match="cannot be carried by one protocol frame"):
        ExecutionLimits(return_value_bytes=ceiling + 1)
    with pytest.raises(ValidationError):
        ProfileConfig(backend="subprocess", limits={"return_value_bytes": 10**12})  # type: ignore[arg-type]


def test_limits_are_strict() -> None:
    with pytest.raises(ValidationError):
        ExecutionLimits(cpu_seconds="5")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        ExecutionLimits(wall_seconds=float("inf"))
    with pytest.raises(ValidationError):
        ExecutionLimits(cpu_seconds=0)


async def test_program_failures_never_raise() -> None:
    for source in ("1/0", "def (", "import os\nos._exit(9)", "{1}", "raise KeyboardInterrupt"):
        result = await run(source)
        assert result.error is not None and result.error.guidance


async def test_bad_timeout_argument_is_misuse() -> None:
    async with Sandbox(config()) as sandbox:
        with pytest.raises(ValueError, match="timeout"):
            await sandbox.run("1", profile=PROFILE, timeout=0)


async def test_concurrent_runs_are_independent() -> None:
    results: dict[int, object] = {}
    async with Sandbox(config()) as sandbox:

        async def one(n: int) -> None:
            result = await sandbox.run(f"import os\n[{n}, os.getpid()]", profile=PROFILE)
            assert result.error is None
            results[n] = result.return_value[0]

        async with anyio.create_task_group() as tg:
            for n in range(4):
                tg.start_soon(one, n)
    assert results == {n: n for n in range(4)}


async def test_default_profile_smoke() -> None:
    # The only use of the default profile here: it runs a trial to pick a backend.
    async with Sandbox() as sandbox:
        result = await sandbox.run("print(2 + 2)")
    assert result.error is None and result.stdout == "4\n"
    assert result.profile == "default"
    assert result.level in ("process", "isolated")


async def test_subprocess_backend_comes_through_the_entry_point() -> None:
    result = await run("1")
    assert result.backend.id == "subprocess"
    assert result.backend.distribution == "psych-sandbox-core"


class RenamedBackend(SubprocessBackend):
    id: ClassVar[str] = "thirdparty"


class ThirdPartyPlugin:
    @staticmethod
    @hookspecs.hookimpl
    def psych_sandbox_register_backends(registry: hookspecs.BackendRegistrar) -> None:
        registry.add(RenamedBackend)


async def test_a_third_party_backend_plugs_in_through_the_same_hook() -> None:
    registry = BackendRegistry()
    registry.register_plugin(ThirdPartyPlugin(), "thirdparty", "example-dist", "9.9")
    cfg = DeploymentConfig(profiles={"tp": ProfileConfig(backend="thirdparty")})
    async with Sandbox(cfg, registry=registry) as sandbox:
        result = await sandbox.run("'via plugin'", profile="tp")
    assert result.error is None and result.return_value == "via plugin"
    assert (result.backend.id, result.backend.distribution) == ("thirdparty", "example-dist")


async def test_result_serialises_with_the_documented_fields() -> None:
    result = await run("import sys\nprint('o')\nprint('e', file=sys.stderr)\n1/0")
    data = result.to_json_object()
    for key in ("stdout", "stderr", "return_value", "error", "level", "grades", "usage"):
        assert key in data
    assert data["error"]["kind"] == ErrorKind.EXCEPTION.value
    assert set(data["usage"]) >= {"wall_seconds", "cpu_seconds", "peak_memory_bytes"}
