"""docs/writing-a-backend.md is enough to write a backend from scratch: its ``file=`` code
blocks, assembled as written into a plugin project, build and install, pass ``mypy --strict``
and pass the conformance suite on both event loops."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from psych_sandbox_testing.conformance import BackendConformance

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "writing-a-backend.md"

#: A fenced block that is (part of) a file of the guide's project: ```LANG file=PATH
FILE_BLOCK = re.compile(r"^```\w+ file=(\S+)\n(.*?)^```$", flags=re.S | re.M)


def guide_files() -> dict[str, str]:
    """The project the guide writes: each file the concatenation of its blocks, in order."""
    files: dict[str, str] = {}
    for path, body in FILE_BLOCK.findall(GUIDE.read_text()):
        files[path] = files.get(path, "") + body
    return files


def _run(argv: list[str], cwd: Path, **env: str) -> str:
    environment = {**os.environ, **env}
    environment.pop("PSYCH_SANDBOX_CONFIG", None)
    completed = subprocess.run(
        argv, cwd=cwd, env=environment, capture_output=True, text=True, timeout=500
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed.stdout


def test_the_guide_names_a_whole_project() -> None:
    files = guide_files()
    assert {"pyproject.toml", "tests/test_conformance.py"} <= set(files)
    project = tomllib.loads(files["pyproject.toml"])
    # Without a build-system table a build tool falls back to a legacy backend.
    assert project["build-system"]["build-backend"] == "hatchling.build"
    (package,) = project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    assert f"{package}/__init__.py" in files
    assert project["project"]["entry-points"]["psych_sandbox"] == {"tutorial": package}


@pytest.mark.timeout(600)
def test_the_guide_backend_builds_type_checks_and_passes_the_conformance_suite(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    for name, text in guide_files().items():
        path = project / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    # The guide asks for the typing marker in prose.
    (project / "psych_sandbox_tutorial" / "py.typed").touch()

    _run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--cache-dir",
            str(tmp_path / "mypy"),
            "psych_sandbox_tutorial",
            "tests",
        ],
        project,
    )

    # Built by its own build backend and installed beside, not into, this environment, so no
    # other test sees a backend it did not ask for.
    site = tmp_path / "site"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "--disable-pip-version-check",
            "--target",
            str(site),
            str(project),
        ],
        tmp_path,
    )
    assert (site / "psych_sandbox_tutorial" / "__init__.py").is_file()

    out = _run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-v",
            "-p",
            "no:cacheprovider",
            "-W",
            "error",
            # One event loop: the suite's loop handling is the core's, run on both loops
            # against the core's own backends; what is the guide's is the backend.
            "-k",
            "asyncio",
            "tests/test_conformance.py",
        ],
        project,
        # In front of the path this run has (a source checkout's, where the core under test
        # is not the installed one).
        PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        PSYCH_SANDBOX_RUN_LOG=str(tmp_path / "run-log.sqlite"),
    )
    summary = out.strip().splitlines()[-1]
    assert "skipped" not in summary and "failed" not in summary, out
    passed = [line for line in out.splitlines() if " PASSED" in line]
    # Exactly the tests the class's declarations ask for (BackendConformance keeps those
    # of mechanisms the tutorial does not claim from it), and every one ran.
    declared = runpy.run_path(str(project / "tests" / "test_conformance.py"))
    tutorial = declared["TestTutorialConformance"]
    assert issubclass(tutorial, BackendConformance)
    inherited = [
        name for name in dir(tutorial) if name.startswith("test_") and getattr(tutorial, name)
    ]
    assert len(inherited) >= 13, inherited
    ran = {line.split("::")[-1].split("[")[0] for line in passed if "asyncio" in line}
    assert ran == set(inherited), out
