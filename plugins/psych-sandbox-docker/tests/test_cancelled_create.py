"""An execution cancelled while its create request is in flight: the request is not cut short
(the engine may complete a create whose caller went away), so the container's id comes back
and the teardown removes it. Asserted against a real engine, from the host side."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from docker_support import PROFILE, config, leftover_containers
from psych_sandbox_core import Sandbox

from psych_sandbox_docker import api

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("engine")]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_run_cancelled_as_its_container_is_created_leaves_no_container(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    created = anyio.Event()
    request = api.EngineClient.request

    async def answered_then_held(self: api.EngineClient, method: str, path: str, **kw: Any) -> Any:
        answer = await request(self, method, path, **kw)
        if path == "/containers/create":
            # The engine made the container; the caller is cancelled before reading its id.
            created.set()
            await anyio.sleep(0.5)
        return answer

    monkeypatch.setattr(api.EngineClient, "request", answered_then_held)
    cold = config()
    cold = cold.model_copy(
        update={"profiles": {PROFILE: cold.profiles[PROFILE].model_copy(update={"warm": 0})}}
    )
    async with Sandbox(cold) as sandbox, anyio.create_task_group() as tg:
        tg.start_soon(lambda: sandbox.run("1", profile=PROFILE))
        await created.wait()
        assert len(leftover_containers()) == 1  # it does exist on the engine
        tg.cancel_scope.cancel()
    assert leftover_containers() == []
