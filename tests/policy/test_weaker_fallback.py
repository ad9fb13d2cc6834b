"""When no isolated backend works here, ``default`` falls back to a weaker one honestly, and
never silently: the CLI warns on stderr, the result carries a note, doctor answers "No",
and one setting turns the fallback into a refusal.

"No isolated backend works" is made real, not mocked: the CLI runs with a PATH that holds
no bubblewrap and no container engine, so their trials fail exactly as on such a host.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from psych_sandbox_core.cli.visible import SUMMARY_MARK

WARNING = f"{SUMMARY_MARK} warning: "


@pytest.fixture
def without_isolation(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has no bwrap, docker or podman."""
    empty = tmp_path / "bin"
    empty.mkdir()
    return {**os.environ, "PATH": str(empty)}


@pytest.fixture
def secret() -> Iterator[Path]:
    """A file of the host's that any user may read, outside every workspace, beside a file
    of the host's any uid may write, where a program leaves a mark that it ran. (The host
    owns it: what a leased uid leaves in world-writable places is swept with the uid.)"""
    directory = Path(tempfile.mkdtemp(prefix="psych-secret-"))
    directory.chmod(0o755)
    path = directory / "secret.txt"
    path.write_text("host secret 7f3a\n")
    path.chmod(0o644)
    _marker(path).touch()
    _marker(path).chmod(0o666)
    try:
        yield path
    finally:
        shutil.rmtree(directory)


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "psych_sandbox_core.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env=env,
    )


def _program(tmp_path: Path, secret: Path) -> Path:
    """A program that reads the secret and leaves a marker (``_ran``) beside it."""
    program = tmp_path / "reads.py"
    program.write_text(
        f"print(open({str(secret)!r}).read().strip())\n"
        f"open({str(_marker(secret))!r}, 'w').write('ran')\n"
        "'done'\n"
    )
    return program


def _marker(secret: Path) -> Path:
    return secret.parent / "ran"


def _ran(secret: Path) -> bool:
    """Whether the program left its mark; clears it for the next run."""
    marker = _marker(secret)
    found = marker.read_text() == "ran"
    marker.write_text("")
    return found


def test_a_fallback_below_isolated_is_said_on_stderr_and_in_the_result(
    tmp_path: Path, secret: Path, without_isolation: dict[str, str]
) -> None:
    program = _program(tmp_path, secret)
    completed = _cli(without_isolation, "run", str(program))
    assert completed.returncode == 0, completed
    # The program really ran below isolation: it read the host's file.
    assert "host secret 7f3a" in completed.stdout and _ran(secret)
    assert completed.stdout.splitlines()[-1].startswith(
        f"{SUMMARY_MARK} profile default · backend subprocess · level process"
    )
    warnings = [line for line in completed.stderr.splitlines() if line.startswith(WARNING)]
    assert len(warnings) == 1, completed.stderr
    (warning,) = warnings
    assert warning.startswith(f"{WARNING}not isolated (level process): filesystem")
    assert "to fix: " in warning
    assert 'required_level = "isolated"' in warning
    assert WARNING not in completed.stdout

    as_json = _cli(without_isolation, "run", "--json", str(program))
    assert as_json.returncode == 0, as_json
    result = json.loads(as_json.stdout)
    (note,) = result["notes"]
    assert note["code"] == "below_isolated"
    assert "filesystem" in note["not_enforced"]
    assert note["fix"] and note["fix"] in note["message"]
    # The same words on stderr, for a person watching a --json run too.
    assert as_json.stderr == f"{WARNING}{note['message']}\n"
    assert warning == f"{WARNING}{note['message']}"


def test_a_profile_that_names_the_weaker_backend_asked_for_it(
    tmp_path: Path, secret: Path, without_isolation: dict[str, str]
) -> None:
    program = _program(tmp_path, secret)
    completed = _cli(without_isolation, "run", "--json", "--profile", "subprocess", str(program))
    assert completed.returncode == 0, completed
    assert json.loads(completed.stdout)["notes"] == []
    assert completed.stderr == "" and _ran(secret)
    config = tmp_path / "deploy.toml"
    config.write_text('[profiles.default]\nbackend = "subprocess"\n')
    named = _cli(without_isolation, "run", "--config", str(config), str(program))
    assert named.returncode == 0, named
    assert "level process" in named.stdout and named.stderr == "" and _ran(secret)


def test_one_setting_makes_every_run_below_isolated_a_refusal(
    tmp_path: Path, secret: Path, without_isolation: dict[str, str]
) -> None:
    program = _program(tmp_path, secret)
    config = tmp_path / "deploy.toml"
    config.write_text('required_level = "isolated"\n')
    for profile in ("default", "subprocess"):
        completed = _cli(
            without_isolation,
            "run",
            "--json",
            "--config",
            str(config),
            "--profile",
            profile,
            str(program),
        )
        assert completed.returncode == 1, completed
        result = json.loads(completed.stdout)
        assert result["error"]["kind"] == "isolation_unavailable"
        assert "the program was not run" in result["error"]["message"]
        assert result["stdout"] == "" and result["notes"] == []
        assert not _ran(secret), "the program ran although it was refused"
        if profile == "default":
            # default fell back: its refusal says how this host could reach the level.
            assert "; to fix: " in result["error"]["message"]
    doctor = _cli(without_isolation, "doctor", "--config", str(config))
    assert doctor.returncode == 1, doctor
    assert doctor.stdout.splitlines()[0].startswith(
        "No isolated backend works here, so the default profile refuses every run"
    )


def test_a_default_profile_requiring_isolated_is_a_configuration_error_here(
    tmp_path: Path, secret: Path, without_isolation: dict[str, str]
) -> None:
    program = _program(tmp_path, secret)
    config = tmp_path / "deploy.toml"
    config.write_text('[profiles.default]\nrequired_level = "isolated"\n')
    completed = _cli(without_isolation, "run", "--config", str(config), str(program))
    assert completed.returncode == 2, completed
    assert completed.stdout == ""
    assert completed.stderr.startswith(
        "psych-sandbox: configuration error: profiles.default.required_level: isolated can "
        "never be reached on this host: the strongest backend that works here is subprocess"
    )
    message = completed.stderr.removeprefix("psych-sandbox: configuration error: ").strip()
    assert not _ran(secret)
    doctor = _cli(without_isolation, "doctor", "--json", "--config", str(config))
    assert doctor.returncode == 2, doctor
    assert message in json.loads(doctor.stdout)["errors"]


def test_doctor_answers_no_with_the_same_words_as_the_warning(
    tmp_path: Path, secret: Path, without_isolation: dict[str, str]
) -> None:
    program = _program(tmp_path, secret)
    warning = _cli(without_isolation, "run", str(program)).stderr.strip()
    assert warning.startswith(WARNING)
    doctor = _cli(without_isolation, "doctor")
    assert doctor.returncode == 0, doctor
    first = doctor.stdout.splitlines()[0]
    assert first == ("No: the default profile runs subprocess, " + warning.removeprefix(WARNING))
    report = json.loads(_cli(without_isolation, "doctor", "--json").stdout)
    assert report["verdict"]["safe"] is False
    assert report["verdict"]["level"] == "process"
