"""Several services: executions are spread over them, and one going away mid-run fails only
its own executions (as their own kind); new ones go to the others."""

from __future__ import annotations

import re
from contextlib import ExitStack
from pathlib import Path

import anyio
import httpx
import pytest
from psych_sandbox_core import ErrorKind, ExecutionResult, FunctionBindings, Sandbox
from remote_support import (
    PROFILE,
    TOKEN_ENV,
    client_config,
    new_token,
    requires_bwrap,
    serving,
)

pytestmark = [pytest.mark.anyio, requires_bwrap]


async def in_flight(url: str) -> int:
    async with httpx.AsyncClient(base_url=url) as client:
        text = (await client.get("/metrics")).text
    found = re.search(r"^psych_sandbox_executions_in_flight (\d+)$", text, re.MULTILINE)
    assert found, text
    return int(found.group(1))


async def test_three_services_and_one_dies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = new_token()
    monkeypatch.setenv(TOKEN_ENV, token)
    with ExitStack() as stack:
        services = [
            stack.enter_context(serving(tmp_path / f"s{i}", {"fleet": token}, name=f"s{i}"))
            for i in range(3)
        ]
        config = client_config([s.url for s in services], options={"stall_seconds": 3.0})
        held = 0
        all_held = anyio.Event()
        release = anyio.Event()

        async def hold() -> str:
            nonlocal held
            held += 1
            if held == 3:
                all_held.set()
            await release.wait()
            return "released"

        results: list[ExecutionResult] = []
        with anyio.fail_after(120):
            async with Sandbox(config) as sandbox, anyio.create_task_group() as tg:

                async def one() -> None:
                    results.append(
                        await sandbox.run(
                            "await hold()",
                            profile=PROFILE,
                            bindings=FunctionBindings({"hold": hold}),
                        )
                    )

                for _ in range(3):
                    tg.start_soon(one)
                await all_held.wait()
                # Spread: one execution on each service, seen from the services themselves.
                assert [await in_flight(s.url) for s in services] == [1, 1, 1]
                services[1].kill()
                release.set()
        kinds = sorted("ok" if r.error is None else r.error.kind.value for r in results)
        assert kinds == ["ok", "ok", ErrorKind.REMOTE_DISCONNECTED.value], [
            r.error for r in results
        ]
        # New executions go to the two that remain, and all succeed.
        with anyio.fail_after(120):
            async with Sandbox(config) as sandbox:
                later = [await sandbox.run("6 * 7", profile=PROFILE) for _ in range(4)]
        assert [r.error for r in later] == [None] * 4
        assert [r.return_value for r in later] == [42] * 4
