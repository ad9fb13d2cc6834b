"""`psych-sandbox doctor`: every installed backend tried for real, its level and grades, and
which profile uses which backend."""

from __future__ import annotations

import json
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
    config.write_text('[profiles.strict]\nbackend = "subprocess"\nrequired_level = "isolated"\n')
    assert main(["doctor", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "subprocess" in out and "works here" in out
    assert "filesystem" in out
    assert "strict" in out and "requires isolated" in out


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
    from psych_sandbox_core.profiles import ProfileConfig

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
