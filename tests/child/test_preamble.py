"""preamble=, variables= and keep_variables=: what a caller gives a program, and what it gets
back, at the edges (every backend runs the ordinary case in the conformance suite)."""

from __future__ import annotations

import re

import pytest

from psych_sandbox_core import ErrorKind, Sandbox
from psych_sandbox_core.protocol.limits import MAX_SOURCE_BYTES

from ..conftest import PROFILE, config

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the bootstrap's and the host's code alike on either loop


async def test_the_edges_of_a_preamble_and_of_kept_variables() -> None:
    async with Sandbox(config(return_value_bytes=1000)) as sandbox:
        # A preamble's function that raises: the traceback shows the program's call, on its
        # own line, and none of the preamble's frames.
        raised = await sandbox.run(
            "x = 1\n\nboom()\n",
            profile=PROFILE,
            preamble="\n\ndef boom():\n    raise ValueError('x')\n",
        )
        assert raised.error is not None and raised.error.line == 3, raised.error
        frames = re.findall(r'File "([^"]*)", line (\d+)', raised.error.traceback or "")
        assert frames == [("<program>", "3")]
        # A preamble that raises: the program never runs.
        broken = await sandbox.run("print('ran')", profile=PROFILE, preamble="1 / 0")
        assert broken.error is not None and broken.error.kind is ErrorKind.EXCEPTION
        assert "the preamble raised, so the program did not run" in broken.error.message
        assert broken.stdout == ""
        # Variables share the return value's cap: past it, output_limit.
        large = await sandbox.run("big = 'x' * 2000\n1", profile=PROFILE, keep_variables=True)
        assert large.error is not None and large.error.kind is ErrorKind.OUTPUT_LIMIT
        assert large.variables is None
        # Only when asked for, and only the program's JSON data.
        kept = await sandbox.run(
            "import math\n_hidden = 1\nvalue = [math.pi > 3]\ndef f(): pass\n",
            profile=PROFILE,
            keep_variables=True,
        )
        assert kept.ok and kept.variables == {"value": [True]}
        plain = await sandbox.run("value = 1", profile=PROFILE)
        assert plain.ok and plain.variables is None


async def test_preamble_and_variables_count_toward_the_program_size() -> None:
    source = "x = 1\n" + "#" * (MAX_SOURCE_BYTES - 100)
    async with Sandbox(config()) as sandbox:
        refused = await sandbox.run(source, profile=PROFILE, preamble="y = 2\n" * 20)
        assert refused.error is not None and refused.error.kind is ErrorKind.PROGRAM_REJECTED
        assert "of preamble and variables" in refused.error.message
        # A name a program cannot be given, or a value that is not JSON data: the caller's
        # mistake, raised before anything runs.
        for bad in ({"_private": 1}, {"TOOLS": 1}, {"not an identifier": 1}, {"class": 1}):
            with pytest.raises(ValueError):
                await sandbox.run("1", profile=PROFILE, variables=bad)
        with pytest.raises(TypeError):
            await sandbox.run("1", profile=PROFILE, variables={"value": object()})
