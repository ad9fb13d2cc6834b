"""Every distribution as a user receives it: built once per session from its source tree (the
wheel from the sdist, as an installer would), its metadata and contents checked, then
installed into a fresh environment outside the repository and used there."""

from __future__ import annotations

import email.parser
import email.policy
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import psych_sandbox_core

ROOT = Path(__file__).resolve().parent.parent
LICENSE = (ROOT / "LICENSE").read_text()


@dataclass(frozen=True)
class Source:
    name: str
    directory: Path
    package: str
    readme: str
    #: Besides the package, README, license and tests (and what every sdist carries).
    extra_sdist: frozenset[str] = frozenset()
    #: The platform it serves (it installs everywhere, and says it is unavailable elsewhere).
    operating_system: str = "Operating System :: POSIX :: Linux"


SOURCES = [
    # The core's docs ship with it (its package page cannot link to the repository).
    Source("psych-sandbox-core", ROOT, "psych_sandbox_core", "PACKAGE.md", frozenset({"docs"})),
    # The test kit, in lockstep with the core.
    Source(
        "psych-sandbox-testing",
        ROOT / "testing" / "psych-sandbox-testing",
        "psych_sandbox_testing",
        "README.md",
    ),
    Source(
        "psych-sandbox-bwrap",
        ROOT / "plugins" / "psych-sandbox-bwrap",
        "psych_sandbox_bwrap",
        "README.md",
    ),
    Source(
        "psych-sandbox-docker",
        ROOT / "plugins" / "psych-sandbox-docker",
        "psych_sandbox_docker",
        "README.md",
    ),
    Source(
        "psych-sandbox-macos",
        ROOT / "plugins" / "psych-sandbox-macos",
        "psych_sandbox_macos",
        "README.md",
        operating_system="Operating System :: MacOS",
    ),
    Source(
        "psych-sandbox-windows",
        ROOT / "plugins" / "psych-sandbox-windows",
        "psych_sandbox_windows",
        "README.md",
        operating_system="Operating System :: Microsoft :: Windows",
    ),
    Source(
        "psych-sandbox-remote",
        ROOT / "plugins" / "psych-sandbox-remote",
        "psych_sandbox_remote",
        "README.md",
    ),
    Source(
        "psych-sandbox-mcp",
        ROOT / "integrations" / "psych-sandbox-mcp",
        "psych_sandbox_mcp",
        "README.md",
    ),
    Source(
        "psych-sandbox-pydantic-ai",
        ROOT / "integrations" / "psych-sandbox-pydantic-ai",
        "psych_sandbox_pydantic_ai",
        "README.md",
    ),
    Source(
        "psych-sandbox-smolagents",
        ROOT / "integrations" / "psych-sandbox-smolagents",
        "psych_sandbox_smolagents",
        "README.md",
    ),
]

#: What every sdist carries whatever the project says: its build configuration, the metadata
#: and the ignore file the build backend writes.
SDIST_ALWAYS = {"pyproject.toml", "PKG-INFO", ".gitignore"}


@dataclass(frozen=True)
class Built:
    source: Source
    sdist: Path
    wheel: Path


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    completed = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=500)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed.stdout


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Built]:
    out = tmp_path_factory.mktemp("dist")
    result: dict[str, Built] = {}
    for source in SOURCES:
        target = out / source.name
        # No build isolation: the build backend is a test dependency, so this works offline.
        _run(
            [
                sys.executable,
                "-m",
                "build",
                "--no-isolation",
                "--outdir",
                str(target),
                str(source.directory),
            ],
            out,
        )
        (sdist,) = target.glob("*.tar.gz")
        (wheel,) = target.glob("*.whl")
        result[source.name] = Built(source, sdist, wheel)
    return result


def _sdist_members(sdist: Path) -> dict[str, bytes]:
    with tarfile.open(sdist) as archive:
        members: dict[str, bytes] = {}
        for member in archive.getmembers():
            if member.isfile():
                handle = archive.extractfile(member)
                assert handle is not None
                # Below the archive's one top-level directory (name-version/).
                members[member.name.split("/", 1)[1]] = handle.read()
        return members


def _metadata(wheel: Path) -> email.message.EmailMessage:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(name).decode()
    message = email.parser.Parser(policy=email.policy.default).parsestr(text)
    assert isinstance(message, email.message.EmailMessage)
    return message


def test_the_license_is_the_full_apache_2_text_everywhere(built: dict[str, Built]) -> None:
    assert LICENSE.lstrip().startswith("Apache License\n                           Version 2.0")
    assert "END OF TERMS AND CONDITIONS" in LICENSE
    assert "APPENDIX: How to apply the Apache License to your work." in LICENSE
    for item in built.values():
        assert (item.source.directory / "LICENSE").read_text() == LICENSE
        assert _sdist_members(item.sdist)["LICENSE"].decode() == LICENSE
        with zipfile.ZipFile(item.wheel) as archive:
            (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
            assert archive.read(name).decode() == LICENSE
        metadata = _metadata(item.wheel)
        assert metadata["License-Expression"] == "Apache-2.0"
        assert metadata.get_all("License-File") == ["LICENSE"]


def test_each_sdist_holds_only_its_own_package_readme_license_and_tests(
    built: dict[str, Built],
) -> None:
    for item in built.values():
        source = item.source
        tops = {name.split("/", 1)[0] for name in _sdist_members(item.sdist)}
        allowed = {source.package, "tests", source.readme, "LICENSE"} | SDIST_ALWAYS
        assert tops == allowed | source.extra_sdist, source.name
        # The tests are the distribution's own: every one of them (and their golden files),
        # nothing else's.
        shipped = {n for n in _sdist_members(item.sdist) if n.startswith("tests/")}
        assert shipped == {
            p.relative_to(source.directory).as_posix()
            for p in (source.directory / "tests").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }


def test_each_wheel_holds_its_package_and_metadata_only(built: dict[str, Built]) -> None:
    for item in built.values():
        with zipfile.ZipFile(item.wheel) as archive:
            tops = {name.split("/", 1)[0] for name in archive.namelist()}
        assert tops == {item.source.package, f"{item.source.package}-0.2.0.dist-info"}


def test_metadata_and_contents_pass_the_packaging_checkers(built: dict[str, Built]) -> None:
    files = [str(p) for item in built.values() for p in (item.sdist, item.wheel)]
    _run([sys.executable, "-m", "twine", "check", "--strict", *files], ROOT)
    _run(
        [
            sys.executable,
            "-m",
            "check_wheel_contents",
            *[str(item.wheel) for item in built.values()],
        ],
        ROOT,
    )


def test_package_pages_open_with_pip_install_and_link_only_absolute_urls(
    built: dict[str, Built],
) -> None:
    for item in built.values():
        metadata = _metadata(item.wheel)
        assert metadata["Description-Content-Type"] == "text/markdown"
        page = metadata.get_payload()
        assert isinstance(page, str)
        lines = page.lstrip().splitlines()
        assert lines[0] == f"# {item.source.name}"
        # The first thing after the title is how to install this distribution.
        first = next(line for line in lines[1:] if line.strip())
        assert first == "```sh", item.source.name
        install = next(line for line in lines[1:] if line.strip() and not line.startswith("`"))
        assert install.startswith("pip install ") and item.source.name in install.split()
        # A relative link on a package page points nowhere.
        for target in re.findall(r"\]\(([^)]*)\)", page):
            assert re.match(r"https://", target), (item.source.name, target)


def test_classifiers_and_a_compatible_range_of_the_core(built: dict[str, Built]) -> None:
    core_version = psych_sandbox_core.__version__
    for item in built.values():
        metadata = _metadata(item.wheel)
        classifiers = metadata.get_all("Classifier") or []
        assert "Typing :: Typed" in classifiers
        assert item.source.operating_system in classifiers
        if item.source.name == "psych-sandbox-core":
            assert metadata["Version"] == core_version
            continue
        (core,) = [
            Requirement(r)
            for r in metadata.get_all("Requires-Dist") or []
            if Requirement(r).name == "psych-sandbox-core"
        ]
        if item.source.name == "psych-sandbox-testing":
            # The test kit drives the core's internals: released with it, for it alone.
            assert str(core.specifier) == f"=={core_version}"
            continue
        # A plugin imports the core's internals: it accepts this minor version, not the next.
        assert core.specifier.contains(core_version)
        major, minor, *_ = (int(part) for part in core_version.split("."))
        assert not core.specifier.contains(f"{major}.{minor + 1}.0")


def test_the_core_wheel_ships_the_docs(built: dict[str, Built]) -> None:
    with zipfile.ZipFile(built["psych-sandbox-core"].wheel) as archive:
        shipped = {n for n in archive.namelist() if n.startswith("psych_sandbox_core/docs/")}
    assert shipped == {f"psych_sandbox_core/docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}


@pytest.fixture
def fresh_environment(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """An empty virtual environment outside the repository, and an environment for commands
    run there that carries nothing pointing back into the repository."""
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PSYCH_SANDBOX_CONFIG"}
    }
    env["PSYCH_SANDBOX_RUN_LOG"] = str(tmp_path / "run-log.sqlite")
    yield venv, env


@pytest.mark.timeout(600)
def test_the_wheels_install_into_a_fresh_environment_and_run_a_program(
    built: dict[str, Built],
    fresh_environment: tuple[Path, dict[str, str]],
    tmp_path: Path,
) -> None:
    venv, env = fresh_environment
    python = str(venv / "bin" / "python")
    # Dependencies come from the package index, as for a user: the metadata must name them.
    _run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            *[str(item.wheel) for item in built.values()],
        ],
        tmp_path,
        env,
    )

    where = _run(
        [python, "-c", "import psych_sandbox_core; print(psych_sandbox_core.__file__)"],
        tmp_path,
        env,
    )
    assert Path(where.strip()).is_relative_to(venv), where
    # Every distribution's package imports with what its metadata made the installer bring.
    packages = sorted(item.source.package for item in built.values())
    _run([python, "-c", f"import {', '.join(packages)}"], tmp_path, env)

    program = tmp_path / "hello.py"
    program.write_text("import sys\nprint('hello from', sys.implementation.name)\n{'answer': 42}\n")
    result = json.loads(
        _run([str(venv / "bin" / "psych-sandbox"), "run", str(program), "--json"], tmp_path, env)
    )
    assert result["error"] is None, result
    assert result["stdout"] == "hello from cpython\n"
    assert result["return_value"] == {"answer": 42}
    assert result["profile"] == "default"
    # Served by a backend from the wheels just installed, at the level its grades earned.
    assert result["backend"]["distribution"] in {item.source.name for item in built.values()}
    assert result["backend"]["version"] == "0.2.0"
    assert result["level"] in {"isolated", "process"}

    version = _run([str(venv / "bin" / "psych-sandbox"), "--version"], tmp_path, env)
    assert version.splitlines()[0] == f"psych-sandbox-core {psych_sandbox_core.__version__}"
    rows = {tuple(line.split()) for line in version.splitlines()[2:]}
    assert rows == {
        ("bwrap", "psych-sandbox-bwrap", "0.2.0"),
        ("docker", "psych-sandbox-docker", "0.2.0"),
        ("gvisor", "psych-sandbox-docker", "0.2.0"),
        ("macos", "psych-sandbox-macos", "0.2.0"),
        ("remote", "psych-sandbox-remote", "0.2.0"),
        ("subprocess", "psych-sandbox-core", "0.2.0"),
        ("windows", "psych-sandbox-windows", "0.2.0"),
    }
    assert _run([python, "-m", "psych_sandbox_core", "--version"], tmp_path, env) == version

    # The test kit's pytest plugin is registered by its entry point: its marker is known.
    markers = _run([python, "-m", "pytest", "--markers", "-p", "no:cacheprovider"], tmp_path, env)
    assert "@pytest.mark.psych_missing(requirement, reason)" in markers, markers

    # The package page's way to the installed documentation works.
    page = (ROOT / "PACKAGE.md").read_text()
    (command,) = re.findall(r"^python -c \"(.*)\"$", page, flags=re.M)
    docs = Path(_run([python, "-c", command], tmp_path, env).strip())
    assert (docs / "writing-a-backend.md").read_text() == (
        ROOT / "docs" / "writing-a-backend.md"
    ).read_text()
