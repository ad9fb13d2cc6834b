"""What the ``psych-sandbox`` command tells a person when bubblewrap runs the program: no
warning at the isolated level, a warning naming bubblewrap when it is missing, and a timeout
that interrupted the collection of files reported once, as a timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bwrap_support import requires_bwrap

pytestmark = [requires_bwrap]

MARK = "\u25c6"


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "psych_sandbox_core.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env=env,
    )


def test_an_isolated_default_run_carries_no_warning(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text("print('hi')\n1\n")
    completed = _cli("run", "--json", str(program))
    assert completed.returncode == 0, completed
    result = json.loads(completed.stdout)
    assert result["backend"]["id"] == "bwrap" and result["level"] == "isolated"
    assert result["notes"] == [] and completed.stderr == ""
    doctor = _cli("doctor")
    assert doctor.stdout.splitlines()[0] == "Yes: the default profile runs bwrap at level isolated"


def test_without_bubblewrap_the_warning_says_how_to_install_it(tmp_path: Path) -> None:
    """bubblewrap missing: a PATH without it (nor a container engine)."""
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty)}
    program = tmp_path / "program.py"
    program.write_text("1\n")
    completed = _cli("run", str(program), env=env)
    assert completed.returncode == 0, completed
    (warning,) = completed.stderr.splitlines()
    assert warning.startswith(f"{MARK} warning: not isolated (level process): filesystem")
    assert "to fix: bwrap: bubblewrap ('bwrap') is not on PATH; install it " in warning
    assert "apt-get install bubblewrap" in warning
    doctor = _cli("doctor", env=env)
    assert "apt-get install bubblewrap" in doctor.stdout.splitlines()[0]


def test_a_timeout_that_interrupted_collection_is_reported_as_a_timeout(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text("open('f', 'w').write('x')\nwhile True:\n    pass\n")
    kept = tmp_path / "kept"
    completed = _cli(
        "run", "--profile", "bwrap", "--timeout", "1", "--artifacts", str(kept), str(program)
    )
    assert completed.returncode == 1, completed
    report = [line for line in completed.stdout.splitlines() if line.startswith(MARK)]
    assert report[0].startswith(f"{MARK} failed: timeout: ")
    assert len(report) == 2 and " · level isolated " in report[1], report
    # The collection was interrupted: said once, by --artifacts' own note, not as a file.
    assert "skipped" not in completed.stdout
    assert f"{MARK} psych-sandbox: no artifacts could be collected" in completed.stderr
    json_run = _cli("run", "--json", "--profile", "bwrap", "--timeout", "1", str(program))
    skipped = json.loads(json_run.stdout)["skipped_artifacts"]
    assert [entry["reason"] for entry in skipped] == ["interrupted"]
