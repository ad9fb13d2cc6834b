"""The command run by a test: in this process through its entry point (:func:`cli_main`), or
a real ``psych-sandbox run`` process caught mid-program, the command line as a user runs it,
its program blocked after it printed, for tests that signal or watch it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.abc
from psych_sandbox_core import DeploymentConfig

#: The tools file of a CLI run: ``ready()`` tells the test, over a pipe it inherited, that
#: the program has printed and is about to block (the CLI itself shows nothing until the end).
READY_TOOLS = """
import os

def ready():
    os.write(int(os.environ["PSYCH_TEST_READY_FD"]), b"ready\\n")
"""


def cli_main(argv: Sequence[str]) -> int:
    """Run the command with ``argv`` in this process, as ``psych-sandbox`` would, and return
    its exit status: what it prints goes to this process's stdout and stderr, and what it
    remembers (the trials doctor runs) stays remembered here."""
    from psych_sandbox_core.cli import main

    return main(argv)


async def cli_at_ready(
    source: str,
    config: DeploymentConfig,
    profile: str,
    files: Path,
    tmpdir: Path,
    *options: str,
    stdout: int = subprocess.PIPE,
) -> subprocess.Popen[str]:
    """A real ``psych-sandbox run`` process whose program ran ``source``, called ``ready()``
    and now blocks; its inputs are written under ``files``, its temporary directory is
    ``tmpdir``. The caller ends the process."""
    program = files / "program.py"
    program.write_text(source + "await ready()\nimport time\nwhile True:\n    time.sleep(1)\n")
    tools = files / "tools.py"
    tools.write_text(READY_TOOLS)
    settings = files / "config.toml"
    settings.write_text(config_toml(config))
    ready_read, ready_write = os.pipe()
    env = {**os.environ, "TMPDIR": str(tmpdir), "PSYCH_TEST_READY_FD": str(ready_write)}
    env.pop("PSYCH_SANDBOX_CONFIG", None)
    try:
        cli = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "psych_sandbox_core.cli",
                "run",
                str(program),
                "--profile",
                profile,
                "--config",
                str(settings),
                "--tools",
                str(tools),
                *options,
            ],
            env=env,
            pass_fds=(ready_write,),
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(ready_write)
    with os.fdopen(ready_read, "rb") as ready:
        # EOF instead means the CLI ended before the program got this far.
        said = await anyio.to_thread.run_sync(ready.readline)
    if said != b"ready\n":
        cli.kill()
        out, err = cli.communicate()
        raise AssertionError(f"the program never got going: {out}{err}")
    return cli


def config_toml(config: DeploymentConfig) -> str:
    """``config`` as the TOML file the CLI reads (scalar settings and lists of them)."""
    lines: list[str] = []
    for name, profile in config.profiles.items():
        lines.append(f"[profiles.{json.dumps(name)}]")
        if profile.backend is not None:
            lines.append(f"backend = {json.dumps(profile.backend)}")
        for table, values in (
            ("options", profile.options),
            ("limits", profile.limits.model_dump(exclude_unset=True)),
        ):
            lines.append(f"[profiles.{json.dumps(name)}.{table}]")
            lines.extend(f"{key} = {json.dumps(value)}" for key, value in values.items())
    return "\n".join(lines) + "\n"
