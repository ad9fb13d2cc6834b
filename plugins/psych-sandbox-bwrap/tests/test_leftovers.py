"""Nothing of a bwrap execution outlives it under its leased host uid, judged from the host.

What the program plants in its own IPC namespace, /tmp, /dev/shm and user namespace dies with
them (the shared suite's test). A process under the uid outside the execution's cgroup
(started here by the host, as one that escaped would run) is killed by the sweep before the
uid goes back, where no cgroup proves the tree gone."""

from __future__ import annotations

import random
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from bwrap_support import PROFILE, config, needs_root, requires_bwrap
from psych_sandbox_core import Sandbox
from psych_sandbox_core.kit.posix import EmptyCgroup
from psych_sandbox_testing.cgroups_here import CGROUP_PREFIX, makes_cgroups, without_cgroups
from psych_sandbox_testing.leases import retirement_proofs
from psych_sandbox_testing.leftovers import own_uid, process_under

pytestmark = [requires_bwrap, needs_root, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def one_uid() -> Iterator[dict[str, Any]]:
    """Options leasing one uid of this test's own to every execution."""
    with own_uid(1_990_000_000 + random.randrange(1_000_000)) as options:
        yield options


async def test_without_a_cgroup_the_sweep_kills_a_process_under_the_uid(
    one_uid: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No cgroup, no proof that nothing runs under the uid: the host's processes are scanned.
    without_cgroups(monkeypatch, "no cgroups in this test")
    with process_under(one_uid["identity_first_uid"]) as straggler:
        async with Sandbox(config(one_uid)) as sandbox:
            result = await sandbox.run("1 + 1", profile=PROFILE)
        assert result.error is None, result.error
        assert straggler.poll() == -signal.SIGKILL


async def test_the_removed_cgroup_is_the_proof_the_lease_is_retired_with(
    one_uid: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    if not makes_cgroups():
        pytest.skip("this host cannot create per-execution cgroups")
    proofs = retirement_proofs(monkeypatch)
    async with Sandbox(config(one_uid)) as sandbox:
        result = await sandbox.run("1 + 1", profile=PROFILE)
    assert result.error is None, result.error
    (proof,) = proofs
    assert isinstance(proof, EmptyCgroup)
    assert all(CGROUP_PREFIX in directory for directory in proof.directories)


def test_a_proof_cannot_be_made_by_hand() -> None:
    with pytest.raises(TypeError):
        EmptyCgroup(("/sys/fs/cgroup/anything",))
