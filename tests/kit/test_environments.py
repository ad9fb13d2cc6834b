"""Programs that need libraries: a profile names a Python environment the deployment built,
and the program imports from it; nothing is installed implicitly, the environment is used
as-is and left unchanged, and `doctor` lists what each profile's programs can import.

Environments are built by the tests from this host (a virtual environment of a system
interpreter of this Python version, with a tiny distribution written into it, or matplotlib
copied from the environment running the tests), so no network is used."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from psych_sandbox_testing.environments import (
    IMPORT_TINY,
    MATPLOTLIB_CHART,
    TAMPER_WITH,
    TINY_ANSWER,
    TINY_DISTRIBUTION,
    TINY_MODULE,
    TINY_VERSION,
    base_interpreter,
    chart_bytes,
    copy_distributions,
    readable_by_all,
    site_packages,
    tree_state,
    virtual_environment,
    write_distribution,
)

from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core._output.capture import OutputPolicy
from psych_sandbox_core.cli import main
from psych_sandbox_core.cli.libraries import MAX_LISTED, SHOWN, _checked, format_libraries
from psych_sandbox_core.errors import ConfigurationError, ErrorKind, InterpreterNotFoundError

from ..conftest import FAST_LIMITS, PROFILE, config

BASE = base_interpreter()
needs_base = pytest.mark.skipif(
    BASE is None,
    reason="no system interpreter of this host's Python version that any uid can run, to "
    "build an environment from",
)
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="the program runs as another uid only on root")


@pytest.fixture(scope="module")
def tiny_environment() -> Iterator[Path]:
    assert BASE is not None
    with virtual_environment(BASE) as environment:
        write_distribution(site_packages(environment))
        yield environment


@pytest.fixture(scope="module")
def matplotlib_environment() -> Iterator[Path]:
    assert BASE is not None
    with virtual_environment(BASE) as environment:
        copied = copy_distributions(site_packages(environment), ["matplotlib"])
        assert "numpy" in copied and "pillow" in copied
        yield environment


def in_environment(environment: Path) -> DeploymentConfig:
    # Artifacts kept whole (there is no blob store here), so the chart's bytes can be read.
    profile = ProfileConfig(
        backend="subprocess",
        options={"environment": str(environment)},
        limits=ExecutionLimits(**FAST_LIMITS),
        output=OutputPolicy(inline_bytes=4 << 20),
    )
    return DeploymentConfig(profiles={PROFILE: profile})


pytestmark = [pytest.mark.anyio, needs_base]


async def test_a_program_imports_from_the_profiles_environment(tiny_environment: Path) -> None:
    async with Sandbox(in_environment(tiny_environment)) as sandbox:
        result = await sandbox.run(IMPORT_TINY, profile=PROFILE)
    assert result.error is None, result.error
    assert result.return_value == [TINY_ANSWER, TINY_VERSION]


async def test_nothing_is_installed_implicitly(tiny_environment: Path) -> None:
    # The same program under a profile without the environment: the library is not there,
    # and running it beside one that has it changes nothing.
    async with Sandbox(config()) as sandbox:
        result = await sandbox.run(IMPORT_TINY, profile=PROFILE)
    error = result.error
    assert error is not None and error.kind is ErrorKind.EXCEPTION
    assert error.exception_type == "ModuleNotFoundError"


async def test_isolated_mode_holds_inside_the_environment(
    tiny_environment: Path, private_tmp: Path
) -> None:
    # -I still applies: PYTHONPATH (were it passed) and the user's site are ignored, and
    # the path holds the environment's site-packages, none of the host's.
    source = "import sys, site\n[sys.flags.isolated, site.ENABLE_USER_SITE, sys.prefix, sys.path]"
    async with Sandbox(in_environment(tiny_environment)) as sandbox:
        result = await sandbox.run(source, profile=PROFILE)
    assert result.error is None, result.error
    isolated, user_site, prefix, path = result.return_value
    assert isolated == 1 and user_site is False
    assert prefix == str(tiny_environment)
    assert str(site_packages(tiny_environment)) in path
    assert not any("dist-packages" in entry for entry in path), path


async def test_the_child_adds_what_site_adds_and_runs_no_pth_code(tiny_environment: Path) -> None:
    # The child starts without the site module and does its part itself: the path, the
    # prefixes and the builtins are what the environment's own python gets from site; a .pth
    # file's directories are added, its import lines are not run.
    packages = site_packages(tiny_environment)
    extra = packages / "extra-directory"
    pth = packages / "extra.pth"
    extra.mkdir()
    (extra / "extra_module.py").write_text("NAME = 'extra'\n")
    pth.write_text("# a comment\nextra-directory\nimport sys; sys.pth_code_ran = True\n")
    readable_by_all(extra)
    pth.chmod(0o644)
    query = "import json, sys\nprint(json.dumps([sys.path, sys.prefix, sys.exec_prefix]))"
    try:
        bare = subprocess.run(
            [str(tiny_environment / "bin" / "python3"), "-I", "-c", query],
            capture_output=True,
            check=True,
            env={},
        )
        async with Sandbox(in_environment(tiny_environment)) as sandbox:
            results = [
                await sandbox.run(
                    "import extra_module, site, sys\n"
                    "[sys.path, sys.prefix, sys.exec_prefix, hasattr(sys, 'pth_code_ran'),"
                    " extra_module.NAME, site.ENABLE_USER_SITE,"
                    " [type(getattr(__builtins__, name, None)).__name__"
                    "  for name in ('exit', 'quit', 'help', 'license')]]",
                    profile=PROFILE,
                )
                # The first start in a process and the later, precompiled ones alike.
                for _ in range(2)
            ]
    finally:
        pth.unlink()
        shutil.rmtree(extra)
    path, prefix, exec_prefix = json.loads(bare.stdout)
    assert str(extra) in path  # the bare interpreter, with site, adds it too
    for result in results:
        assert result.error is None, result.error
        assert result.return_value == [
            path,
            prefix,
            exec_prefix,
            False,
            "extra",
            False,
            ["Quitter", "Quitter", "_Helper", "_Printer"],
        ]


@needs_root
async def test_the_environment_is_left_unchanged(tiny_environment: Path) -> None:
    # On a root host the program runs as a leased uid that cannot write the environment.
    # Judged from the host: every entry, its mode and content are as they were.
    before = tree_state(tiny_environment)
    async with Sandbox(in_environment(tiny_environment)) as sandbox:
        result = await sandbox.run(TAMPER_WITH, profile=PROFILE)
    assert result.error is None, result.error
    assert result.return_value == ["EACCES"] * 4, result.return_value
    assert tree_state(tiny_environment) == before


async def test_a_matplotlib_chart_comes_back_as_an_artifact(
    matplotlib_environment: Path,
) -> None:
    async with Sandbox(in_environment(matplotlib_environment)) as sandbox:
        result = await sandbox.run(MATPLOTLIB_CHART, profile=PROFILE)
        await chart_bytes(sandbox, result)


# ---------------------------------------------------------------- configuration


def test_an_environment_that_does_not_exist_names_the_key() -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"profiles\.test\.options\.environment.*"
        r"does not exist",
    ):
        Sandbox(config(options={"environment": "/nonexistent/envs/science"}))


def test_a_relative_environment_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"environment.*not an absolute path"):
        Sandbox(config(options={"environment": "envs/science"}))


def test_a_directory_without_python_is_no_environment(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"environment.*holds no Python environment"):
        Sandbox(config(options={"environment": str(tmp_path)}))


def test_interpreter_and_environment_exclude_each_other(tiny_environment: Path) -> None:
    options = {"environment": str(tiny_environment), "interpreter": "/usr/bin/python3"}
    with pytest.raises(ConfigurationError, match="either 'interpreter' or 'environment'"):
        Sandbox(config(options=options))


async def test_a_virtual_environments_python_as_interpreter_points_to_environment(
    tiny_environment: Path,
) -> None:
    # Resolving it would silently run the base interpreter without the packages.
    options = {"interpreter": str(tiny_environment / "bin" / "python")}
    async with Sandbox(config(options=options)) as sandbox:
        with pytest.raises(InterpreterNotFoundError, match="environment = "):
            await sandbox.run("1", profile=PROFILE)


@needs_root
async def test_an_environment_the_program_cannot_read_fails_configuration() -> None:
    assert BASE is not None
    with virtual_environment(BASE) as environment:
        site = site_packages(environment)
        write_distribution(site)
        hidden = site / TINY_MODULE / "__init__.py"
        hidden.chmod(0o600)
        async with Sandbox(in_environment(environment)) as sandbox:
            with pytest.raises(ConfigurationError, match="not readable by") as info:
                await sandbox.run(IMPORT_TINY, profile=PROFILE)
    assert str(hidden) in str(info.value)


@needs_root
@pytest.mark.parametrize("where", ["package file", "site-packages", "holder above"])
async def test_an_environment_any_uid_could_change_fails_configuration(where: str) -> None:
    # One program could plant code every later program imports: refused at load, however
    # the write would be reached (a file, a directory in it, a directory above it).
    assert BASE is not None
    with virtual_environment(BASE) as environment:
        site = site_packages(environment)
        write_distribution(site)
        writable = {
            "package file": site / TINY_MODULE / "__init__.py",
            "site-packages": site,
            "holder above": environment.parent,
        }[where]
        writable.chmod(0o777 if writable.is_dir() else 0o666)
        async with Sandbox(in_environment(environment)) as sandbox:
            with pytest.raises(ConfigurationError, match="writable by") as info:
                await sandbox.run(IMPORT_TINY, profile=PROFILE)
    assert str(writable) in str(info.value)


# ---------------------------------------------------------------- doctor


def test_doctor_lists_what_each_profile_can_import(
    tiny_environment: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deployment = tmp_path / "deploy.toml"
    deployment.write_text(
        '[profiles.science]\nbackend = "subprocess"\n'
        f"[profiles.science.options]\nenvironment = {json.dumps(str(tiny_environment))}\n"
    )
    assert main(["doctor", "--json", "--config", str(deployment)]) == 0
    libraries = json.loads(capsys.readouterr().out)["libraries"]
    science = libraries["science"]
    assert [TINY_DISTRIBUTION, TINY_VERSION] in science["distributions"]
    assert TINY_MODULE in science["modules"]
    assert [TINY_DISTRIBUTION, TINY_VERSION] not in libraries["subprocess"]["distributions"]
    assert main(["doctor", "--config", str(deployment)]) == 0
    text = capsys.readouterr().out
    assert f"{TINY_DISTRIBUTION} {TINY_VERSION}" in text.split("Libraries", 1)[1]


def test_the_listing_is_bounded_and_printable() -> None:
    listing = _checked(
        {
            "python": "3.11.2\x1b[2J",
            "distributions": [[f"dist{i}\x07", "1.0"] for i in range(MAX_LISTED * 3)],
            "distribution_count": MAX_LISTED * 3,
            "modules": ["a" * 10_000],
            "module_count": 1,
        }
    )
    assert len(listing["distributions"]) == MAX_LISTED
    assert all(c.isprintable() for name, _ in listing["distributions"] for c in name)
    assert len(listing["modules"][0]) <= 100
    lines = format_libraries({"p": listing})
    assert len(lines) == 3
    assert f"and {MAX_LISTED * 3 - SHOWN} more" in lines[1]
    assert "\x1b" not in "".join(lines)
