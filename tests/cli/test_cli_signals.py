"""A signal to ``psych-sandbox run`` cancels the execution through the same path an embedding
application uses; what every backend must show is in the conformance suite
(test_a_signal_to_the_cli_cancels_the_run_and_leaves_nothing). Here: the CLI's own edges."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import anyio
import pytest
from psych_sandbox_testing.cli_run import cli_at_ready

from psych_sandbox_core import DeploymentConfig, ProfileConfig
from psych_sandbox_core.cli import main

from ..conftest import PROFILE, config

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the CLI runs its own loop in its own process


async def _signalled(cli: subprocess.Popen[str], signum: int) -> tuple[str, str]:
    try:
        cli.send_signal(signum)
        out, err = await anyio.to_thread.run_sync(cli.communicate)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.communicate()
    return out or "", err


async def test_json_output_of_a_cancelled_run_is_its_partial_result(
    tmp_path: Path, private_tmp: Path
) -> None:
    cli = await cli_at_ready(
        "print('so far')\n", config(), PROFILE, tmp_path, private_tmp, "--json"
    )
    out, err = await _signalled(cli, signal.SIGTERM)
    assert cli.returncode == 143, err
    result = json.loads(out)
    assert result["error"]["kind"] == "cancelled"
    assert result["stdout"] == "so far\n"
    assert err == ""
    assert list(private_tmp.iterdir()) == []


async def test_a_reader_that_went_away_leaves_the_exit_status_and_no_traceback(
    tmp_path: Path, private_tmp: Path
) -> None:
    # A hung-up terminal: SIGHUP, and nobody left to read what the CLI prints.
    reader, writer = os.pipe()
    try:
        cli = await cli_at_ready(
            "print('so far')\n", config(), PROFILE, tmp_path, private_tmp, stdout=writer
        )
    finally:
        os.close(writer)
    os.close(reader)
    _, err = await _signalled(cli, signal.SIGHUP)
    assert cli.returncode == 129, err
    assert err == ""
    assert list(private_tmp.iterdir()) == []


async def test_a_warm_profile_is_cancelled_and_cleaned_up_too(
    tmp_path: Path, private_tmp: Path
) -> None:
    warm = DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(
                backend="subprocess", warm=1, limits=config().profiles[PROFILE].limits
            )
        }
    )
    cli = await cli_at_ready("print('so far')\n", warm, PROFILE, tmp_path, private_tmp)
    out, err = await _signalled(cli, signal.SIGINT)
    assert cli.returncode == 130, err
    assert "  | so far\n" in out and "\u25c6 failed: cancelled: " in out, out
    assert "Traceback" not in out + err
    assert list(private_tmp.iterdir()) == []


def test_an_error_during_the_run_is_reported_as_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Raised inside the signal watcher's task group, it still reaches the command's handler.
    program = tmp_path / "program.py"
    program.write_text("1\n")
    assert main(["run", "--profile", "no-such-profile", str(program)]) == 2
    assert "configuration error: no profile named 'no-such-profile'" in capsys.readouterr().err
