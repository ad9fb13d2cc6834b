"""Uids retiring at the same time are swept together (one pass over the host's tables for
them all), each as thoroughly as alone: what each left is gone, judged from the host, and one
uid that cannot be swept keeps only itself leased."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
from collections.abc import Collection
from pathlib import Path

import anyio
import pytest
from psych_sandbox_testing.leftovers import (
    host_leftovers,
    host_targets,
    own_uid,
    plant_as,
    process_under,
)

from psych_sandbox_core.kit.posix import identity, retirement
from psych_sandbox_core.kit.posix.sweep import Swept, sweep_together

from ...conftest import marker

pytestmark = pytest.mark.anyio
ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="only a root host runs programs as uids")


def two_uids() -> tuple[int, int]:
    first = 1_960_000_000 + random.randrange(1_000_000)
    return first, first + 1


@ROOT
def test_uids_swept_together_each_lose_everything_they_left() -> None:
    first, second = two_uids()
    marks = {first: marker("psych-together"), second: marker("psych-together")}
    with (
        own_uid(first),
        own_uid(second),
        host_targets(marks[first]) as (target, target_dir),
        process_under(first) as one,
        process_under(second) as other,
    ):
        for uid, mark in marks.items():
            plant_as(uid, mark, target, target_dir)
            assert host_leftovers(mark, uid) != []
        failures = sweep_together([Swept(first, first), Swept(second, second)])
        assert failures == {}
        for uid, mark in marks.items():
            assert [item for item in host_leftovers(mark, uid) if item != "keys"] == []
        assert one.wait() == -signal.SIGKILL
        assert other.wait() == -signal.SIGKILL
        assert os.path.exists(target) and os.listdir(target_dir) == ["inside"]


@ROOT
def test_a_uid_that_cannot_be_swept_fails_alone() -> None:
    first, second = two_uids()
    base = f"/tmp/{marker('psych-unsweepable')}"
    kept = f"/tmp/{marker('psych-swept')}"
    with own_uid(first), own_uid(second):
        # The first uid's directory holds a mount point: it cannot be removed (EBUSY).
        os.makedirs(f"{base}/mounted")
        subprocess.run(["mount", "-t", "tmpfs", "none", f"{base}/mounted"], check=True)
        try:
            os.chown(base, first, first)
            with open(kept, "w"):
                pass
            os.chown(kept, second, second)
            failures = sweep_together([Swept(first, first), Swept(second, second)])
            assert set(failures) == {first}
            assert not os.path.exists(kept)  # the other uid was swept all the same
        finally:
            subprocess.run(["umount", f"{base}/mounted"], check=True)
            os.rmdir(f"{base}/mounted")
            os.rmdir(base)


async def test_uids_retiring_while_a_sweep_runs_are_swept_together_in_the_next(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The first sweep is held until the others have come to be retired; each learns its own
    # outcome, none is swept twice, and only those swept are given back (their lock files
    # emptied and removed). The sweeps are stand-ins: nothing on the host is touched.
    release = threading.Event()
    batches: list[list[int]] = []
    first, second, third = (1_970_000_000 + random.randrange(1_000_000) + n for n in range(3))

    def swept_together(identities: Collection[Swept]) -> dict[int, OSError]:
        batches.append([one.uid for one in identities])
        if len(batches) == 1:
            release.wait(30)
        failing = [one.uid for one in identities if one.uid == third]
        return {uid: OSError("could not") for uid in failing}

    monkeypatch.setattr(retirement, "sweep_together", swept_together)
    sweeps = retirement._Sweeps()
    outcomes: dict[int, str] = {}

    def held(uid: int) -> identity.IdentityLease:
        path = str(tmp_path / str(uid))
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.write(fd, b"held\n")
        return identity.IdentityLease(uid, uid, fd, path)

    leases = {uid: held(uid) for uid in (first, second, third)}

    async def retire(uid: int) -> None:
        try:
            await sweeps.retire(leases[uid], processes=True)
        except OSError:
            outcomes[uid] = "kept"
        else:
            outcomes[uid] = "swept"

    async with anyio.create_task_group() as tg:
        for uid in (first, second, third):
            tg.start_soon(retire, uid)
            await anyio.wait_all_tasks_blocked()
        release.set()
    assert batches == [[first], [second, third]]
    assert outcomes == {first: "swept", second: "swept", third: "kept"}
    assert sorted(os.listdir(tmp_path)) == [str(third)]
    assert (tmp_path / str(third)).read_bytes() == b"held\n"
    leases[third].release()
