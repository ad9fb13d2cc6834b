"""docs/remote.md's complete example runs as written: its serve.toml served, its client.toml
used through the CLI (only the port is the test's)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from remote_support import new_token, requires_bwrap, serving

DOC = Path(__file__).resolve().parents[3] / "docs" / "remote.md"

pytestmark = [
    requires_bwrap,
    pytest.mark.skipif(not DOC.is_file(), reason="docs/ is the repository's"),
]


def block(name: str) -> str:
    for found in re.findall(r"```toml\n(.*?)```", DOC.read_text(), re.DOTALL):
        if found.startswith(f"# {name}\n"):
            return str(found)
    raise AssertionError(f"docs/remote.md has no {name} block")


def test_the_documented_configurations_run(tmp_path: Path) -> None:
    research, interns = new_token(), new_token()
    with serving(
        tmp_path / "serve",
        {"research": research, "interns": interns},
        config_text=block("serve.toml"),
    ) as served:
        client = block("client.toml").replace("http://127.0.0.1:8000", served.url)
        assert client != block("client.toml")
        (tmp_path / "client.toml").write_text(client)

        def run(token: str) -> dict[str, object]:
            env = {**os.environ, "PSYCH_SANDBOX_TOKEN": token}
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "psych_sandbox_core.cli",
                    "run",
                    "-",
                    "--profile",
                    "far",
                    "--config",
                    str(tmp_path / "client.toml"),
                    "--json",
                ],
                input="print(2 + 2)\n",
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            return dict(json.loads(done.stdout))

        result = run(research)
        assert result["error"] is None, result["error"]
        assert result["stdout"] == "4\n"
        assert result["level"] == "isolated"
        # The interns' caps (5 s of CPU) are below what the profile asks (10 s): refused
        # before anything was sent.
        refused = run(interns)
        error = refused["error"]
        assert isinstance(error, dict) and error["kind"] == "policy_refused", error
        assert "cpu_seconds: 10 asked, at most 5 offered" in error["message"]
