"""A profile whose image is not there: ``doctor`` says it cannot run, with the words
``run`` fails with, instead of showing the profile as fine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ABSENT = "psych-sandbox-absent:never-built"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "psych_sandbox_core.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


@pytest.mark.usefixtures("engine")
def test_doctor_reports_a_profile_whose_image_is_missing(tmp_path: Path) -> None:
    config = tmp_path / "deploy.toml"
    config.write_text(f'[profiles.boxed]\nbackend = "docker"\noptions = {{ image = "{ABSENT}" }}\n')
    program = tmp_path / "program.py"
    program.write_text("print('never')\n")
    run = _cli("run", "--json", "--config", str(config), "--profile", "boxed", str(program))
    assert run.returncode == 1, run
    error = json.loads(run.stdout)["error"]
    assert error["kind"] == "backend_not_ready"
    doctor = _cli("doctor", "--json", "--config", str(config))
    assert doctor.returncode == 1, doctor
    report = json.loads(doctor.stdout)
    boxed = next(row for row in report["profiles"] if row["name"] == "boxed")
    assert boxed["works"] is False
    assert boxed["reason"] in error["message"]
    # The docker backend itself, with its default image, still works.
    docker = next(row for row in report["backends"] if row["id"] == "docker")
    assert docker["works"] is True, docker
    text = _cli("doctor", "--config", str(config)).stdout
    assert f"does not work here: {boxed['reason']}" in text
