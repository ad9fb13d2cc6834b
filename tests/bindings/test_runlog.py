"""The durable run log: atomic counting, durability across processes, ends recorded."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from psych_sandbox_core._bindings.runlog import SQLiteRunLog

pytestmark = pytest.mark.anyio


async def test_counts_until_the_limit_and_records_nothing_past_it() -> None:
    log = SQLiteRunLog()
    seqs = [await log.begin_call("r", "e1", i, "t", 3) for i in range(5)]
    assert [s is not None for s in seqs] == [True, True, True, False, False]
    assert await log.calls_in_run("r") == 3
    assert await log.calls_in_run("other") == 0
    first = seqs[0]
    assert first is not None
    await log.finish_call(first, "ok")
    assert [e.outcome for e in await log.entries("r")] == ["ok", None, None]
    assert [e.call_id for e in await log.dangling("r")] == [1, 2]
    await log.aclose()


async def test_the_count_survives_a_new_connection(tmp_path: Path) -> None:
    path = str(tmp_path / "log.sqlite")
    log = SQLiteRunLog(path)
    assert await log.begin_call("r", "e", 0, "t", 10) is not None
    await log.aclose()
    again = SQLiteRunLog(path)
    assert await again.calls_in_run("r") == 1
    await again.aclose()


RACER = textwrap.dedent(
    """
    import sys, anyio
    from psych_sandbox_core._bindings.runlog import SQLiteRunLog

    async def main():
        log = SQLiteRunLog(sys.argv[1])
        accepted = 0
        for i in range(200):
            if await log.begin_call("shared", sys.argv[2], i, "t", 250) is not None:
                accepted += 1
        print(accepted)
        await log.aclose()

    anyio.run(main)
    """
)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_hosts_racing_on_one_log_never_exceed_the_limit(tmp_path: Path) -> None:
    path = str(tmp_path / "log.sqlite")
    await SQLiteRunLog(path).aclose()  # create the schema once
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    totals: list[int] = []

    async def racer(name: str) -> None:
        done = await anyio.run_process([sys.executable, "-c", RACER, path, name], env=env)
        totals.append(int(done.stdout))

    async with anyio.create_task_group() as tg:
        for n in range(3):
            tg.start_soon(racer, f"e{n}")
    assert sum(totals) == 250
    log = SQLiteRunLog(path)
    assert await log.calls_in_run("shared") == 250
    assert len(await log.entries("shared")) == 250
    await log.aclose()
