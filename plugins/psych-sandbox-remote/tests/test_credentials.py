"""The token is resolved per request and written nowhere: a whole session through the CLI and
a real serve, its failures included, and every output, log and file is searched for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from remote_support import TOKEN_ENV, new_token, requires_bwrap, serving

pytestmark = requires_bwrap

PROGRAM = """
import os
print("hello from far away")
await ping()
dict(os.environ)
"""

TOOLS = """
def ping():
    return "pong"
"""


def cli(tmp: Path, token: str | None, profile: str = "far") -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != TOKEN_ENV}
    env["TMPDIR"] = str(tmp / "client-tmp")
    if token is not None:
        env[TOKEN_ENV] = token
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "psych_sandbox_core.cli",
            "run",
            str(tmp / "program.py"),
            "--profile",
            profile,
            "--config",
            str(tmp / "client.toml"),
            "--tools",
            str(tmp / "tools.py"),
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_token_is_never_written_anywhere(tmp_path: Path) -> None:
    token, other = new_token(), new_token()
    (tmp_path / "client-tmp").mkdir()
    (tmp_path / "program.py").write_text(PROGRAM)
    (tmp_path / "tools.py").write_text(TOOLS)
    outputs: list[str] = []
    with serving(tmp_path / "serve", {"alice": token, "bob": other}) as served:
        (tmp_path / "client.toml").write_text(
            f'[profiles.far]\nbackend = "remote"\n[profiles.far.options]\n'
            f'url = "{served.url}"\ntoken_env = "{TOKEN_ENV}"\n'
            # A service that is gone, so a failing transport is part of the session too.
            f'[profiles.gone]\nbackend = "remote"\n[profiles.gone.options]\n'
            f'url = "http://127.0.0.1:9"\ntoken_env = "{TOKEN_ENV}"\n'
        )
        good = cli(tmp_path, token)
        assert good.returncode == 0, good.stdout + good.stderr
        result = json.loads(good.stdout)
        assert result["stdout"] == "hello from far away\n"
        assert result["calls"] and result["level"] == "isolated"
        # The program's environment is built from nothing: no token there either.
        assert TOKEN_ENV not in result["return_value"]
        wrong = cli(tmp_path, new_token())
        assert json.loads(wrong.stdout)["error"]["kind"] == "remote_error"
        unset = cli(tmp_path, None)
        assert TOKEN_ENV in unset.stdout + unset.stderr
        gone = cli(tmp_path, token, profile="gone")
        assert json.loads(gone.stdout)["error"]["kind"] == "backend_not_ready"
        outputs += [run.stdout + run.stderr for run in (good, wrong, unset, gone)]
        # Neither the service's command line nor its environment's name for it leaks into
        # what it prints; its command line never held a token.
        cmdline = Path(f"/proc/{served.process.pid}/cmdline").read_bytes()
        assert token.encode() not in cmdline
    outputs.append(served.output())
    for text in outputs:
        assert token not in text and other not in text
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path
            assert other.encode() not in path.read_bytes(), path


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_failure_messages_never_carry_the_token(
    monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    from remote_support import client_config, run

    token = new_token()
    monkeypatch.setenv(TOKEN_ENV, token)
    result = await run(client_config("http://127.0.0.1:9"), "print(1)")
    assert result.error is not None
    assert token not in result.model_dump_json()
