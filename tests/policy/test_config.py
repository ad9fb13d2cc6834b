"""Deployment configuration: loaded from TOML by path, by the environment or by the CLI, and
rejected at load with the key at fault."""

from __future__ import annotations

from pathlib import Path

import pytest

from psych_sandbox_core import ConfigurationError, Level, Sandbox, UnknownProfileError
from psych_sandbox_core._api.sandbox import Sandbox as _Sandbox
from psych_sandbox_core._policy.config import ENV_VAR, load_config, parse_config
from psych_sandbox_core._policy.mcp_settings import McpSettings
from psych_sandbox_core._policy.profiles import DeploymentConfig, ProfileConfig
from psych_sandbox_core._policy.registry import BackendRegistry
from psych_sandbox_core.cli import main

GOOD = """
[profiles.fast]
backend = "subprocess"
required_level = "process"
[profiles.fast.limits]
cpu_seconds = 5
wall_seconds = 7
[profiles.fast.options]
use_namespaces = true
"""


def test_a_valid_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "deploy.toml"
    path.write_text(GOOD)
    config = load_config(path)
    fast = config.profiles["fast"]
    assert fast.backend == "subprocess"
    assert fast.required_level is Level.PROCESS
    assert fast.limits.cpu_seconds == 5
    assert fast.limits.wall_seconds == 7.0


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[profiles.x]\nbackend = "subprocess"\ncpu = 1', "profiles.x.cpu"),
        (
            '[profiles.x]\nbackend = "subprocess"\n[profiles.x.limits]\ncpu_seconds = 0',
            "profiles.x.limits.cpu_seconds",
        ),
        (
            '[profiles.x]\nbackend = "subprocess"\n[profiles.x.limits]\ncpu_seconds = "5"',
            "profiles.x.limits.cpu_seconds",
        ),
        (
            '[profiles.x]\nbackend = "subprocess"\nrequired_level = "super"',
            "profiles.x.required_level",
        ),
        (
            '[profiles.x]\nbackend = "subprocess"\n[profiles.x.limits]\nreturn_value_bytes = '
            "1000000000",
            "return_value_bytes",
        ),
        ("[profiles.x]\nrequired_level = 'none'", "profile 'x' names no backend"),
        ("profile = 1", "profile"),
        ("[profiles", "not valid TOML"),
    ],
)
def test_invalid_configuration_names_the_key(text: str, named: str) -> None:
    with pytest.raises(ConfigurationError, match=named.replace(".", r"\.")):
        parse_config(text)


def test_backend_settings_are_checked_at_construction() -> None:
    bad_options = DeploymentConfig(
        profiles={"x": ProfileConfig(backend="subprocess", options={"no_such_option": 1})}
    )
    with pytest.raises(ConfigurationError, match=r"profiles\.x\.options\.no_such_option"):
        Sandbox(bad_options)
    unknown = DeploymentConfig(profiles={"x": ProfileConfig(backend="bwrap-nope")})
    with pytest.raises(ConfigurationError, match=r"profiles\.x\.backend"):
        Sandbox(unknown)


def test_missing_or_unreadable_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read"):
        load_config(tmp_path / "absent.toml")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigurationError, match="UTF-8"):
        load_config(binary)


@pytest.mark.anyio
async def test_the_environment_variable_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "deploy.toml"
    path.write_text(GOOD)
    monkeypatch.setenv(ENV_VAR, str(path))
    async with Sandbox() as box:
        assert "fast" in box.profile_names()
        result = await box.run("return 1", profile="fast")
    assert result.error is None
    assert result.profile == "fast"


@pytest.mark.anyio
async def test_a_path_is_accepted_and_installed_backends_are_profiles(tmp_path: Path) -> None:
    path = tmp_path / "deploy.toml"
    path.write_text(GOOD)
    async with Sandbox(path) as box:
        names = box.profile_names()
        assert {"fast", "default", "subprocess"} <= set(names)
        with pytest.raises(UnknownProfileError, match="no profile named 'nope'"):
            await box.run("return 1", profile="nope")
        result = await box.run("return 1", profile="subprocess")
        assert result.backend.id == "subprocess"


def test_the_file_can_override_a_backend_named_profile(tmp_path: Path) -> None:
    path = tmp_path / "deploy.toml"
    path.write_text('[profiles.subprocess]\nbackend = "subprocess"\nrequired_level = "isolated"')
    assert load_config(path).profiles["subprocess"].required_level is Level.ISOLATED


def test_cli_config_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[profiles.x]\nbackend = 'subprocess'\nbogus = 1\n")
    program = tmp_path / "p.py"
    program.write_text("return 1\n")
    assert main(["run", "--config", str(bad), str(program)]) == 2
    assert "profiles.x.bogus" in capsys.readouterr().err
    good = tmp_path / "good.toml"
    good.write_text(GOOD)
    assert main(["run", "--config", str(good), "--profile", "fast", "--json", str(program)]) == 0
    assert main(["profiles", "--config", str(good)]) == 0
    out = capsys.readouterr().out
    assert "fast" in out and "subprocess" in out


@pytest.mark.anyio
async def test_default_picks_the_strongest_backend_that_works_and_remembers() -> None:
    from psych_sandbox_core._policy import trials as trials_module
    from psych_sandbox_core.grading import level_at_least
    from psych_sandbox_core.kit.hookspecs import hookimpl
    from tests.engine.test_withholding import MisreportingBackend

    class Plugin:
        @staticmethod
        @hookimpl
        def psych_sandbox_register_backends(registry: BackendRegistry) -> None:
            registry.add(MisreportingBackend)

    registry = BackendRegistry()
    registry.register_plugin(Plugin(), "misreporting-selection")
    chosen = await _Sandbox(registry=registry).strongest_working_backend()
    # The misreporting backend claims isolated, but its trial is refused: never chosen.
    assert chosen != "misreporting"
    assert (await trials_module.availability(registry, "misreporting")).available is False
    found = await trials_module.availability(registry, chosen)
    assert found.available and found.level is not None
    for other in registry.ids():
        other_found = await trials_module.availability(registry, other)
        if other_found.available and other_found.level is not None:
            assert level_at_least(found.level, other_found.level), other
    trials = dict(trials_module._TRIALS)
    # Asked again in the same process, no new trial runs.
    assert await _Sandbox(registry=registry).strongest_working_backend() == chosen
    assert trials == trials_module._TRIALS


@pytest.mark.anyio
async def test_a_backend_not_ready_is_asked_again_once_it_is() -> None:
    """An image built, an engine started: what a quick check refused is not remembered, so
    the same process finds the backend once it is ready."""
    from typing import ClassVar

    from psych_sandbox_core._policy import trials as trials_module
    from psych_sandbox_core.backends.subprocess import SubprocessBackend
    from psych_sandbox_core.kit.hookspecs import hookimpl

    class LateBackend(SubprocessBackend):
        id: ClassVar[str] = "late"
        ready: ClassVar[bool] = False

        def unavailable_reason(self) -> str | None:
            return None if LateBackend.ready else "not built yet"

    class Plugin:
        @staticmethod
        @hookimpl
        def psych_sandbox_register_backends(registry: BackendRegistry) -> None:
            registry.add(LateBackend)

    registry = BackendRegistry()
    registry.register_plugin(Plugin(), "late-backend")
    first = await trials_module.availability(registry, "late")
    assert not first.available and first.reason == "not built yet"
    LateBackend.ready = True
    second = await trials_module.availability(registry, "late")
    assert second.available, second.reason
    # A trial that ran is remembered.
    assert await trials_module.availability(registry, "late") is second


# The [mcp] section is the core's schema (psych-sandbox-mcp reads it): validated at load
# whether or not that integration is installed.


def test_the_mcp_section_is_validated_strictly() -> None:
    good = McpSettings.model_validate({"upstreams": {"a": {"transport": "stdio", "command": "x"}}})
    assert good.profile == "default"
    for bad, words in [
        ("[mcp]\nprofle = 'x'", "mcp.profle: unknown key (did you mean 'profile'?)"),
        ("[mcp.upstreams.a]\ntransport = 'tcp'", "does not match any of the expected tags"),
        (
            "[mcp.upstreams.a]\ntransport = 'streamable-http'\nurl = 'file:///etc/passwd'",
            "is not an http:// or https:// URL",
        ),
        ("[mcp.upstreams.'a/b']\ntransport = 'stdio'\ncommand = 'x'", "not a valid upstream"),
        ("[mcp.upstreams.a]\ntransport = 'stdio'\ncommand = ''", "at least 1 character"),
        (
            "[mcp.upstreams.a]\ntransport = 'stdio'\ncommand = 'x'\ntimeout_seconds = '5'",
            "timeout_seconds: Input should be a valid number",
        ),
    ]:
        with pytest.raises(ConfigurationError, match=None) as caught:
            parse_config(bad)
        assert words in str(caught.value), (bad, str(caught.value))


def test_the_mcp_profile_must_exist() -> None:
    with pytest.raises(ConfigurationError, match=r"mcp\.profile: no profile named 'nope'"):
        Sandbox(parse_config("[mcp]\nprofile = 'nope'"))
    Sandbox(parse_config("[mcp]\nprofile = 'subprocess'"))  # an installed backend's id
