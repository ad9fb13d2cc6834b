"""Nothing an execution leaves on the host without a process reaches the next execution under
its uid: SysV IPC objects, POSIX message queues, files in the shared temp directories and the
uid's keyrings are gone when the execution is over, judged from the host, and a later
execution leased the same uid finds none of it. A symlink the program planted is removed as
a name; the host file it points at stays."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Iterator

import anyio
import pytest
from psych_sandbox_testing.host import open_fds
from psych_sandbox_testing.leftovers import (
    PLANT_DIRECTORIES,
    finding_program,
    host_leftovers,
    host_targets,
    own_uid,
    plant_as,
    planting_program,
)

from psych_sandbox_core import Sandbox
from psych_sandbox_core.kit.posix import ipc_sweep
from psych_sandbox_core.kit.posix import sweep as sweep_module
from psych_sandbox_core.kit.posix.sweep import clear_keyrings, has_keys, sweep

from ...conftest import PROFILE, config, marker

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(os.geteuid() != 0, reason="identities are leased only on a root host"),
]

#: How long the kernel may take to collect invalidated keys (its garbage collector runs in
#: the background, with no event to wait on).
KEY_COLLECTION_SECONDS = 10.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def one_uid() -> Iterator[int]:
    """A uid of its own for this test: a one-uid range, so every execution leases it."""
    uid = 1_950_000_000 + random.randrange(1_000_000)
    with own_uid(uid):
        yield uid


async def keys_collected(uid: int) -> bool:
    """Whether the kernel has dropped every key charged to ``uid`` (polled with a deadline)."""
    with anyio.move_on_after(KEY_COLLECTION_SECONDS):
        while has_keys(uid):
            await anyio.sleep(0.05)
    return not has_keys(uid)


async def test_state_without_processes_is_gone_and_the_next_holder_finds_none(
    one_uid: int,
) -> None:
    mark = marker("psych-left")
    options = {"identity_first_uid": one_uid, "identity_count": 1}
    with host_targets(mark) as (target, target_dir):
        async with Sandbox(config(options=options)) as sandbox:
            planted = await sandbox.run(planting_program(mark, target, target_dir), profile=PROFILE)
            assert planted.error is None, planted.error
            done = json.loads(planted.return_value)
            # Every kind was really planted (else the checks below could not fail).
            assert all(done.values()), done
            assert set(done) >= {
                "shm",
                "msg",
                "sem",
                "mqueue",
                "key_user",
                "key_user_session",
                "key_persistent",
                *PLANT_DIRECTORIES,
            }
            # The next execution under the same uid (the range holds only it) gets it once it
            # was swept and given back (the result may come back before that), and finds
            # nothing.
            found = await sandbox.run(finding_program(mark), profile=PROFILE)
            # Judged from the host: nothing of the first is left under the uid.
            left = host_leftovers(mark, one_uid)
            assert [item for item in left if item != "keys"] == []
            assert await keys_collected(one_uid)
            # The symlinks were removed as names: what they pointed at is the host's, intact.
            with open(target) as fh:
                assert fh.read() == "host data\n"
            assert os.listdir(target_dir) == ["inside"]
        assert found.error is None, found.error
        assert json.loads(found.return_value) == []
        assert [item for item in host_leftovers(mark, one_uid) if item != "keys"] == []


#: The one uid the keyring-locking test runs under: the kernel keeps a locked keyring for
#: good, so every run reuses this uid rather than leave one behind per run.
LOCKED_KEYRING_UID = 1_949_999_999


async def test_a_program_that_locks_its_own_keyring_cannot_stop_the_sweep() -> None:
    # Taking every permission off its user keyring hides it from the uid itself (and from
    # root): the sweep must still finish, and release the uid, rather than fail on it.
    uid = LOCKED_KEYRING_UID
    program = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
ring = libc.syscall(250, 0, ctypes.c_long(-4), 1)
libc.syscall(248, b"user", b"hidden", b"x", 1, ctypes.c_long(ring))
libc.syscall(250, 5, ctypes.c_long(ring), 0)
"""
    with own_uid(uid) as options:
        async with Sandbox(config(options=options)) as sandbox:
            first = await sandbox.run(program, profile=PROFILE)
            second = await sandbox.run("import os; os.getuid()", profile=PROFILE)
    assert first.error is None and second.error is None
    assert second.return_value == uid


def test_a_sweep_removes_what_a_process_of_the_uid_left(one_uid: int) -> None:
    # The sweep on its own, against state a host-started process under the uid planted.
    mark = marker("psych-left")
    with host_targets(mark) as (target, target_dir):
        plant_as(one_uid, mark, target, target_dir)
        assert host_leftovers(mark, one_uid) != []
        started = time.perf_counter()
        sweep(one_uid, one_uid)
        print(f"sweep with state to remove: {(time.perf_counter() - started) * 1e3:.1f} ms")
        assert [item for item in host_leftovers(mark, one_uid) if item != "keys"] == []
        assert os.path.exists(target) and os.listdir(target_dir) == ["inside"]


def test_queues_are_swept_through_a_mount_the_host_never_sees(
    one_uid: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One thread mounts the queue filesystem in a namespace of its own and sweeps while
    # sweeps come, then exits; the next sweep mounts again. Queues are swept either way, and
    # the host's mount table and descriptors never show the mount.
    monkeypatch.setattr(ipc_sweep, "QUEUE_SWEEPER_LINGER_SECONDS", 0.2)
    mounts_before = queue_mounts()
    fds_before = open_fds()
    mark = marker("psych-left")
    for _ in range(2):
        for _ in range(2):  # the second while the thread of the first still waits
            with host_targets(mark) as (target, target_dir):
                plant_as(one_uid, mark, target, target_dir)
                assert "mqueue" in host_leftovers(mark, one_uid)
                sweep(one_uid, one_uid)
                assert "mqueue" not in host_leftovers(mark, one_uid)
        thread = ipc_sweep._queue_sweeper._thread
        assert thread is not None
        thread.join(timeout=30)
        assert not thread.is_alive()
    assert queue_mounts() == mounts_before
    assert open_fds() == fds_before


def queue_mounts() -> list[str]:
    """The queue filesystems mounted in this process's mount namespace (other tests mount
    other filesystems meanwhile)."""
    with open("/proc/self/mountinfo") as fh:
        return [line for line in fh if " - mqueue " in line]


def test_a_queue_sweep_without_a_thread_keeps_the_uid_unswept(
    one_uid: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No thread to be had (the host at its thread limit): the uid is reported unswept, so it
    # stays leased, rather than the sweep raising something else or waiting for ever.
    monkeypatch.setattr(ipc_sweep, "_queue_sweeper", ipc_sweep._QueueSweeper())

    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patched:
        patched.setattr(threading.Thread, "start", refused)
        failures = sweep_module.sweep_together([sweep_module.Swept(one_uid, one_uid)])
    assert "no thread to sweep message queues" in str(failures[one_uid])
    # The next sweep, with threads to be had again, sweeps.
    assert sweep_module.sweep_together([sweep_module.Swept(one_uid, one_uid)]) == {}


def test_clearing_keyrings_of_a_uid_without_keys_does_nothing(one_uid: int) -> None:
    assert not has_keys(one_uid)
    assert clear_keyrings(one_uid) is False
    assert not has_keys(one_uid)
