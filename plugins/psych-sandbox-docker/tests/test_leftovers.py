"""Nothing of a container's execution outlives it under its leased uid, judged from the host.

The container has its own IPC namespace and /tmp, and the engine's seccomp profile refuses
the keyring calls: what the program plants dies with the container, and the sweep before the
uid goes back finds nothing on the host. A process under the uid outside the container
(started here by the host, as one that escaped would run) is killed by that sweep where no
removed cgroup proves the container's processes gone."""

from __future__ import annotations

import json
import os
import random
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from docker_support import PROFILE, RUNTIMES, config, skip_unless_required
from psych_sandbox_core import Sandbox
from psych_sandbox_core.sweep import has_keys
from psych_sandbox_core.testing.host import marker
from psych_sandbox_core.testing.leftovers import (
    finding_program,
    host_leftovers,
    host_targets,
    own_uid,
    planting_program,
    process_under,
)

from psych_sandbox_docker import engine as eng

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("engine")]


@pytest.fixture(autouse=True)
def _root_host() -> None:
    if os.geteuid() != 0:
        skip_unless_required("docker", "identities are leased only on a root host")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def one_uid() -> Iterator[dict[str, Any]]:
    """Options leasing one uid of this test's own to every execution."""
    with own_uid(1_995_000_000 + random.randrange(1_000_000)) as options:
        yield options


@RUNTIMES
async def test_state_planted_in_the_container_is_gone_from_the_host(
    runtime: str, one_uid: dict[str, Any]
) -> None:
    uid, mark = one_uid["identity_first_uid"], marker("psych-left")
    with host_targets(mark) as (target, target_dir):
        async with Sandbox(config(runtime, one_uid)) as sandbox:
            planted = await sandbox.run(planting_program(mark, target, target_dir), profile=PROFILE)
            assert planted.error is None, planted.error
            done = json.loads(planted.return_value)
            # Planted in the container's own IPC namespace and /tmp...
            assert all(done[kind] for kind in ("shm", "msg", "sem", "/tmp")), done
            # ...never in the uid's keyrings (the engine's seccomp profile refuses keyctl).
            assert not any(done[kind] for kind in done if kind.startswith("key_")), done
            # ...and none of it is on the host once the execution is over.
            assert host_leftovers(mark, uid) == []
            assert not has_keys(uid)
            found = await sandbox.run(finding_program(mark), profile=PROFILE)
    assert found.error is None, found.error
    assert json.loads(found.return_value) == []


async def test_without_a_cgroup_the_sweep_kills_a_process_under_the_uid(
    one_uid: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No measuring cgroup parent, no proof that nothing runs under the uid: the host's
    # processes are scanned.
    monkeypatch.setattr(eng, "cgroup_controllers", lambda: [])
    with process_under(one_uid["identity_first_uid"]) as straggler:
        async with Sandbox(config("runc", one_uid)) as sandbox:
            result = await sandbox.run("1 + 1", profile=PROFILE)
        assert result.error is None, result.error
        assert straggler.poll() == -signal.SIGKILL
