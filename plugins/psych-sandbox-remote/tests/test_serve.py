"""The remote backend against a real ``psych-sandbox serve`` (bwrap) on loopback: bindings on
the client's side, tenants, terms refused before anything starts, a full server, load."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from psych_sandbox_core import (
    BindingBudgets,
    DeploymentConfig,
    ErrorKind,
    ExecutionLimits,
    FunctionBindings,
    ProfileConfig,
)
from psych_sandbox_testing.ceilings import MAX_INPUT_BYTES
from remote_support import (
    FAST_LIMITS,
    PROFILE,
    TOKEN_ENV,
    Served,
    client_config,
    new_token,
    requires_bwrap,
    run,
    serving,
)

pytestmark = [pytest.mark.anyio, requires_bwrap]

ALICE, BOB = new_token(), new_token()

# A bwrap child reaches its channel in well under a second; a client that never finishes
# is then ended after this plus the wall clock and grace, not after a container's 30 s.
SERVE_TABLE = """capacity = 2
handshake_seconds = 5.0
[serve.tenants.bob]
limits = { cpu_seconds = 5, wall_seconds = 30.0 }
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(
        tmp_path_factory.mktemp("serve"), {"alice": ALICE, "bob": BOB}, serve_table=SERVE_TABLE
    ) as service:
        yield service


@pytest.fixture(autouse=True)
def _alice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, ALICE)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def start_body(**limits: Any) -> str:
    return json.dumps(
        {"protocol": 1, "limits": ExecutionLimits(**{**FAST_LIMITS, **limits}).model_dump()}
    )


@asynccontextmanager
async def raw_start(
    client: httpx.AsyncClient, token: str, **limits: Any
) -> AsyncIterator[tuple[httpx.Response, str | None]]:
    """A start request by hand; the execution's id once its first event arrived. The rest
    of the stream's lines are ``LINES[response]``.

    An execution whose lines the test left unread is terminated, finished and read to its end
    here. The service frees its slot before that end, so the next test never finds the server
    full because this one's disconnect had not reached the service yet."""
    async with client.stream(
        "POST", "/v1/executions", content=start_body(**limits), headers=auth(token)
    ) as response:
        execution = None
        if response.status_code == 200:
            lines = response.aiter_lines()
            LINES[id(response)] = lines
            first = json.loads(await lines.__anext__())
            assert first["type"] == "started"
            execution = first["execution"]
        else:
            await response.aread()
        try:
            yield response, execution
        finally:
            unread = LINES.pop(id(response), None)
            if unread is not None:
                with anyio.fail_after(30), anyio.CancelScope(shield=True):
                    for action, body in (("terminate", b'{"grace_seconds": 0}'), ("finish", b"{}")):
                        await client.post(
                            f"/v1/executions/{execution}/{action}",
                            content=body,
                            headers=auth(token),
                        )
                    async for _ in unread:
                        pass


LINES: dict[int, AsyncIterator[str]] = {}


async def metrics(client: httpx.AsyncClient) -> dict[str, float]:
    text = (await client.get("/metrics")).text
    return {
        name: float(value)
        for name, value in re.findall(r"^(psych_sandbox_\S+) (\S+)$", text, re.MULTILINE)
    }


async def test_a_program_runs_at_the_service_level(served: Served) -> None:
    result = await run(client_config(served.url), "print('hello')\nimport os\n6 * 7")
    assert result.error is None, result.error
    assert result.stdout == "hello\n"
    assert result.return_value == 42
    assert result.level == "isolated"
    assert result.backend.id == "remote"


async def test_bindings_run_on_the_client_with_its_budgets_and_record(served: Served) -> None:
    seen: list[tuple[int, int]] = []

    async def add(a: int, b: int) -> int:
        seen.append((a, b))
        await anyio.sleep(0.01)
        return a + b

    config = client_config(served.url)
    source = "import asyncio\nawait asyncio.gather(*(add(a=i, b=1) for i in range(5)))"
    result = await run(config, source, bindings=FunctionBindings({"add": add}))
    assert result.error is None, result.error
    assert result.return_value == [1, 2, 3, 4, 5]
    assert sorted(seen) == [(i, 1) for i in range(5)]
    assert len(result.calls) == 5
    # The client's budget, not the service's: the service has none.
    profile = client_config(served.url).profiles[PROFILE]
    limited = DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(
                backend="remote",
                options=profile.options,
                limits=profile.limits,
                budgets=BindingBudgets(calls_per_execution=2),
            )
        }
    )
    result = await run(
        limited,
        "n = 0\nfor i in range(3):\n    try:\n        await add(a=i, b=0)\n        n += 1\n"
        "    except ToolError as e:\n        kind = e.kind\n[n, kind]",
        bindings=FunctionBindings({"add": add}),
    )
    assert result.error is None, result.error
    assert result.return_value[0] == 2


async def test_calls_in_flight_together_and_a_cancel_cross_the_wire(served: Served) -> None:
    events: list[str] = []
    together = anyio.Event()

    async def gathered(n: int) -> int:
        # Returns only once all four run at once on this side: one at a time, it would hang.
        events.append("start")
        if events.count("start") == 4:
            together.set()
        await together.wait()
        events.append("end")
        return n

    async def block() -> None:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            events.append("cancelled")
            raise

    source = """
import asyncio
try:
    await asyncio.wait_for(block(), 0.05)
except TimeoutError:
    pass
return await asyncio.gather(*(gathered(n) for n in range(4)))
"""
    result = await run(
        client_config(served.url),
        source,
        bindings=FunctionBindings({"gathered": gathered, "block": block}),
    )
    assert result.error is None, result.error
    assert result.return_value == [0, 1, 2, 3]
    # The program's cancel frame reached this side and cancelled the tool here.
    assert events.count("cancelled") == 1
    assert [e for e in events if e != "cancelled"] == ["start"] * 4 + ["end"] * 4
    assert [c.outcome for c in result.calls] == ["cancelled"] + ["ok"] * 4


async def test_artifacts_cross_the_wire(served: Served) -> None:
    # The workspace is on the service: the files come over the relayed channel.
    result = await run(
        client_config(served.url), "open('out.txt', 'w').write('made remotely')\n'ok'"
    )
    assert result.error is None, result.error
    assert [a.path for a in result.artifacts] == ["out.txt"], result.artifacts
    assert result.artifacts[0].size_bytes == len("made remotely")


async def test_inputs_at_their_ceiling_cross_the_wire(served: Served) -> None:
    # Inputs travel in the run frame over the relayed channel: the largest a run takes
    # (base64, about 8 MiB) fits one channel request, and the child writes them on the service.
    data = os.urandom(MAX_INPUT_BYTES - 1) + b"\n"
    result = await run(
        client_config(served.url),
        "import hashlib\nhashlib.sha256(open('big.bin', 'rb').read()).hexdigest()",
        inputs={"big.bin": data},
    )
    assert result.error is None, result.error
    assert result.return_value == hashlib.sha256(data).hexdigest()


async def test_the_description_is_narrowed_for_the_tenant(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        anonymous = (await client.get("/v1/description")).json()
        bob = (await client.get("/v1/description", headers=auth(BOB))).json()
    assert anonymous["level"] == "isolated"
    assert anonymous["grades"]["filesystem"] == "enforced"
    assert anonymous["limits"]["cpu_seconds"] == 30
    assert bob["limits"]["cpu_seconds"] == 5
    assert anonymous["runs_commands"] is True  # its bwrap children run commands
    assert anonymous["artifacts"] is True


async def test_terms_beyond_the_tenant_are_refused_before_anything_starts(
    served: Served,
) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        before = await metrics(client)
        async with raw_start(client, BOB, cpu_seconds=10) as (response, execution):
            assert response.status_code == 422
            assert response.json()["error"] == "terms"
            assert "cpu_seconds: 10 asked, at most 5" in response.json()["message"]
            assert execution is None
        after = await metrics(client)
    assert (
        after["psych_sandbox_executions_started_total"]
        == (before["psych_sandbox_executions_started_total"])
    )
    # Through the backend, the client reads bob's description and refuses locally.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TOKEN_ENV, BOB)
        result = await run(client_config(served.url), "print('never')")
    assert result.error is not None
    assert result.error.kind is ErrorKind.POLICY_REFUSED, result.error


async def test_tenants_never_reach_each_others_executions(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        async with raw_start(client, ALICE) as (response, execution):
            assert response.status_code == 200 and execution is not None
            for action in ("channel", "terminate", "finish"):
                other = await client.post(
                    f"/v1/executions/{execution}/{action}", content=b"{}", headers=auth(BOB)
                )
                assert other.status_code == 404, (action, other.text)
                assert other.json()["message"] == "no such execution"
            anonymous = await client.post(f"/v1/executions/{execution}/finish", content=b"{}")
            assert anonymous.status_code == 401
            own = await client.post(
                f"/v1/executions/{execution}/finish", content=b"{}", headers=auth(ALICE)
            )
            assert own.status_code == 200
            assert own.json()["execution"] == execution
        wrong = await client.post("/v1/executions", content=start_body(), headers=auth(new_token()))
        assert wrong.status_code == 401


async def test_a_full_server_refuses_and_says_so(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        before = await metrics(client)
        async with (
            raw_start(client, ALICE) as (first, _),
            raw_start(client, ALICE) as (second, _),
        ):
            assert first.status_code == second.status_code == 200
            load = await metrics(client)
            assert load["psych_sandbox_executions_in_flight"] == 2
            assert load["psych_sandbox_executions_capacity"] == 2
            async with raw_start(client, ALICE) as (third, _):
                assert third.status_code == 503
                assert third.json()["error"] == "full"
            result = await run(client_config(served.url), "print('never')")
            assert result.error is not None
            assert result.error.kind is ErrorKind.REMOTE_ERROR, result.error
            assert "at capacity" in result.error.message
            after = await metrics(client)
        full = 'psych_sandbox_refusals_total{reason="full"}'
        assert after[full] - before[full] == 2


async def test_plaintext_credentials_only_on_loopback_or_when_trusted(tmp_path: Path) -> None:
    from psych_sandbox_core import ConfigurationError
    from psych_sandbox_core.service_kit import BackendRegistry

    registry = BackendRegistry()
    with pytest.raises(ConfigurationError, match="plaintext"):
        registry.create("remote", {"url": "http://sandbox.example:8000", "token_env": "T"})
    for fine in (
        {"url": "https://sandbox.example", "token_env": "T"},
        {"url": "http://127.0.0.1:1", "token_env": "T"},
        {"url": "http://[::1]:1", "token_env": "T"},
        {"url": "http://sandbox.internal:8000", "token_env": "T", "trusted_plaintext": True},
    ):
        registry.create("remote", fine)
    with pytest.raises(ConfigurationError, match="user or password"):
        registry.create("remote", {"url": "https://me:secret@sandbox.example"})


async def test_a_run_frame_beyond_the_terms_never_reaches_the_child(served: Served) -> None:
    from psych_sandbox_core.kit.relay import ChildLimits, RunFrame, encode_host_frame

    greedy = RunFrame(
        source="print('never')",
        tools=[],
        limits=ChildLimits(
            cpu_seconds=10_000,
            memory_bytes=None,
            file_size_bytes=None,
            processes=None,
            return_value_bytes=1024,
        ),
    )
    async with (
        httpx.AsyncClient(base_url=served.url) as client,
        raw_start(client, ALICE) as (response, execution),
    ):
        assert execution is not None
        refused = await client.post(
            f"/v1/executions/{execution}/channel",
            content=encode_host_frame(greedy),
            headers=auth(ALICE),
        )
        assert refused.status_code == 409
        assert "cpu_seconds=10000" in refused.json()["message"]
        with anyio.fail_after(30):
            events = [json.loads(line) async for line in LINES.pop(id(response))]
    assert events[-1]["type"] == "end"
    assert not any(e["type"] == "stdout" for e in events), "the program ran"


async def test_a_client_that_never_finishes_is_ended_by_the_service(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        async with raw_start(client, ALICE, wall_seconds=1.0) as (response, execution):
            assert execution is not None
            with anyio.fail_after(60):
                events = [json.loads(line) async for line in LINES.pop(id(response))]
        assert events[-1]["type"] == "end"
        assert (
            await metrics(client)
            and (await metrics(client))["psych_sandbox_executions_in_flight"] == 0
        )


async def test_closing_a_sandbox_that_prepares_a_child_leaves_nothing_on_the_service(
    tmp_path: Path,
) -> None:
    from psych_sandbox_core import Sandbox
    from psych_sandbox_testing import census

    # A service that would wait this long for a child's channel, and so end a child nobody
    # finished only after it plus the wall clock: a close that left the child being prepared
    # to that deadline hangs (past the test's timeout) instead of merely being slow.
    with serving(tmp_path, {"alice": ALICE}, serve_table="handshake_seconds = 600.0\n") as service:
        async with Sandbox(client_config(service.url, warm=1)) as sandbox:
            await sandbox.warmed(PROFILE)
            result = await sandbox.run("6 * 7", profile=PROFILE)
            # Closed at once: the child that replaces the one just served is on its way.
        async with httpx.AsyncClient(base_url=service.url) as client:
            load = await metrics(client)
        pid = service.process.pid
        # Judged from the service's side, as the close returned: both children reached it,
        # and nothing of either is left there.
        assert result.error is None, result.error
        assert result.return_value == 42
        assert load["psych_sandbox_executions_started_total"] == 2, (
            "the replacement never reached the service: the close did not meet it on its way"
        )
        assert load["psych_sandbox_executions_in_flight"] == 0
        assert census.processes_of(pid) == []
        assert census.lease_files(pid) == {}
        assert sorted(os.listdir(service.tmpdir)) == []
