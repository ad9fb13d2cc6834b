"""`psych-sandbox doctor`: every installed backend tried for real, its level and grades, and
which profile uses which backend."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from psych_sandbox_core.cli import main
from psych_sandbox_core.grading import Grade, Guarantee, level_of


def test_doctor_json_reports_each_backend_from_a_trial(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    backends = {row["id"]: row for row in report["backends"]}
    sub = backends["subprocess"]
    assert sub["works"] is True and sub["reason"] is None
    assert set(sub["grades"]) == {g.value for g in Guarantee}
    # The level shown is the one the grades earn, not the backend's claim.
    grades = {Guarantee(k): Grade(v) for k, v in sub["grades"].items()}
    assert sub["level"] == level_of(grades).value
    for row in report["backends"]:
        if not row["works"]:
            assert row["reason"], row
    profiles = {row["name"]: row for row in report["profiles"]}
    assert profiles["subprocess"]["backend"] == "subprocess"
    assert profiles["default"]["backend"] in backends
    assert backends[profiles["default"]["backend"]]["works"]


def test_doctor_text_and_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "deploy.toml"
    config.write_text('[profiles.strict]\nbackend = "subprocess"\nrequired_level = "process"\n')
    assert main(["doctor", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    # The answer first: can untrusted code be run safely here?
    assert out.splitlines()[0].startswith(("Yes: ", "No: "))
    assert "subprocess" in out and "works here" in out
    assert "filesystem" in out
    assert "strict" in out and "requires process" in out
    assert "chosen because: the first backend that works here in the default order" in out


def test_doctor_with_invalid_config_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "deploy.toml"
    config.write_text("[profiles.x]\nbackend = 3\n")
    assert main(["doctor", "--config", str(config)]) == 2
    assert "profiles.x.backend" in capsys.readouterr().err


def test_profiles_json_shows_every_setting_of_a_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from psych_sandbox_core._policy.profiles import ProfileConfig

    config = tmp_path / "deploy.toml"
    config.write_text(
        '[profiles.agents]\nbackend = "subprocess"\nwarm = 2\n'
        "[profiles.agents.budgets]\ncalls_per_execution = 500\n"
        "[profiles.agents.output]\nmax_artifacts = 3\n"
    )
    assert main(["profiles", "--json", "--config", str(config)]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)["profiles"]}
    agents = rows["agents"]
    assert agents["warm"] == 2
    assert agents["budgets"]["calls_per_execution"] == 500
    assert agents["output"]["max_artifacts"] == 3
    # Every setting a profile has is shown (a new one must be added to the table too).
    for row in rows.values():
        assert set(ProfileConfig.model_fields) <= set(row), row


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "psych_sandbox_core.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


PREFIX = "psych-sandbox: configuration error: "


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ('[profiles.agents]\nbackend = "subprocss"\n', "did you mean 'subprocess'?"),
        (
            '[profiles.agents]\nbackend = "subprocess"\n[profiles.agents.options]\n'
            "use_namespace = false\n",
            "profiles.agents.options.use_namespace: unknown key (did you mean 'use_namespaces'?)",
        ),
        (
            '[profiles.agents]\nbackend = "subprocess"\n[profiles.agents.limits]\ncpu_secs = 5\n',
            "profiles.agents.limits.cpu_secs: unknown key (did you mean 'cpu_seconds'?)",
        ),
        (
            '[profiles.agents]\nbackend = "subprocess"\nrequird_level = "process"\n',
            "profiles.agents.requird_level: unknown key (did you mean 'required_level'?)",
        ),
        (
            '[profile.agents]\nbackend = "subprocess"\n',
            "profile: unknown key (did you mean 'profiles'?)",
        ),
        (
            '[profiles.agents]\nbackend = "subprocess"\nrequired_level = "isolated"\n',
            "profiles.agents.required_level: isolated can never be reached: the backend "
            "'subprocess' reaches at most process",
        ),
        ('backend_preference = ["nope"]\n', "backend_preference: no installed plugin provides"),
    ],
    ids=["backend", "option", "limit", "profile-key", "top-level-key", "level", "preference"],
)
def test_run_doctor_and_profiles_refuse_the_same_configuration_with_the_same_message(
    tmp_path: Path, text: str, hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # In this process, through the CLI's own entry point: what doctor learns by trial runs is
    # remembered across the cases, as it is for one long-lived process.
    config = tmp_path / "deploy.toml"
    config.write_text(text)
    program = tmp_path / "program.py"
    program.write_text("print('ran')\n")
    capsys.readouterr()
    assert main(["run", "--config", str(config), "--profile", "subprocess", str(program)]) == 2
    run = capsys.readouterr()
    assert run.out == ""
    (line,) = run.err.splitlines()
    assert line.startswith(PREFIX) and hint in line, line
    message = line[len(PREFIX) :]
    for command in (["doctor"], ["profiles"], ["profiles", "--json"]):
        code = main([*command, "--config", str(config)])
        shown = capsys.readouterr()
        assert code == 2, (command, shown)
        if shown.out.startswith("{"):
            # Found at load (the file itself is wrong): said exactly as run says it.
            assert message in json.loads(shown.out)["errors"], (command, shown.out)
        else:
            assert message in shown.out + shown.err, (command, shown)


def test_doctor_leads_with_whether_untrusted_code_is_safe_here() -> None:
    report = _cli("doctor", "--json")
    assert report.returncode == 0, report
    data = json.loads(report.stdout)
    assert next(iter(data)) == "verdict"
    verdict = data["verdict"]
    default = next(row for row in data["profiles"] if row["name"] == "default")
    assert verdict["backend"] == default["backend"]
    assert verdict["level"] == default["level"]
    # Safe exactly when the default profile's trial reached the isolated level.
    assert verdict["safe"] is (default["level"] == "isolated")
    assert verdict["message"].startswith("Yes: " if verdict["safe"] else "No: ")
    text = _cli("doctor")
    assert text.stdout.splitlines()[0] == verdict["message"]
