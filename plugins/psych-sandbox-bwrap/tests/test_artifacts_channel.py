"""What the CLI writes of artifacts from a workspace the host cannot reach: bwrap's workspace is
a tmpfs inside its own mount namespace, so the child sends its files over the control channel
(the bytes, digests, types, skips and caps that come back are the shared suite's)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from bwrap_support import requires_bwrap
from psych_sandbox_testing.cli_run import cli_main
from psych_sandbox_testing.programs import PLANTED_ARTIFACTS, PLANTED_EXPECTED

pytestmark = [requires_bwrap]


def test_cli_writes_the_files_under_bwrap(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text(PLANTED_ARTIFACTS)
    target = tmp_path / "artifacts"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = cli_main(["run", "--profile", "bwrap", "--artifacts", str(target), str(program)])
    assert status == 0, err.getvalue()
    for path, (data, _) in PLANTED_EXPECTED.items():
        assert (target / path).read_bytes() == data
    written = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert written == sorted(PLANTED_EXPECTED)
    assert f"wrote {len(PLANTED_EXPECTED)} artifact(s)" in err.getvalue()


def test_cli_says_why_nothing_was_collected(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text("open('x', 'w').write('x')\nimport time\ntime.sleep(60)\n")
    target = tmp_path / "artifacts"
    err = io.StringIO()
    argv = ["run", "--profile", "bwrap", "--timeout", "1", "--artifacts", str(target)]
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = cli_main([*argv, str(program)])
    assert status == 1
    assert "no artifacts could be collected: the execution ended before" in err.getvalue()
    assert "wrote 0" not in err.getvalue()
    assert not any(target.rglob("*"))
