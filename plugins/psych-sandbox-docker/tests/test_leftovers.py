"""Nothing of a container's execution outlives it under its leased uid, judged from the host.

What the program plants in the container's own IPC namespace and /tmp dies with it (the
shared suite's test), and the engine's seccomp profile refuses the keyring calls. A process
under the uid outside the container (started here by the host, as one that escaped would run)
is killed by the sweep before the uid goes back, where no removed cgroup proves the
container's processes gone."""

from __future__ import annotations

import json
import os
import random
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from docker_support import PROFILE, RUNTIMES, config
from psych_sandbox_core import Sandbox
from psych_sandbox_testing.host import marker
from psych_sandbox_testing.leftovers import (
    has_keys,
    host_targets,
    own_uid,
    planting_program,
    process_under,
)
from psych_sandbox_testing.requirements import skip_unless_required

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
async def test_the_uids_keyrings_are_out_of_a_containers_reach(
    runtime: str, one_uid: dict[str, Any]
) -> None:
    # What the program plants in its IPC namespace and /tmp, gone from the host afterwards,
    # is the shared suite's; a container cannot even plant keys (the engine's seccomp
    # profile refuses keyctl), so the uid's keyrings stay empty.
    uid, mark = one_uid["identity_first_uid"], marker("psych-left")
    with host_targets(mark) as (target, target_dir):
        async with Sandbox(config(runtime, one_uid)) as sandbox:
            planted = await sandbox.run(planting_program(mark, target, target_dir), profile=PROFILE)
    assert planted.error is None, planted.error
    done = json.loads(planted.return_value)
    assert not any(done[kind] for kind in done if kind.startswith("key_")), done
    assert not has_keys(uid)


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
