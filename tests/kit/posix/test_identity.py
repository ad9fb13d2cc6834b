"""Each execution on a root host runs as a uid of its own: concurrent programs cannot reach
each other, and nothing of an execution survives under its uid. Asserted from the host."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import textwrap
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import anyio
import pytest
from psych_sandbox_testing.leftovers import own_uid, process_under
from psych_sandbox_testing.programs import SECRET_SPY, secret_holder

from psych_sandbox_core import ConfigurationError, Sandbox
from psych_sandbox_core.kit.posix.identity import IdentityExhausted, IdentityRange

from ...conftest import PROFILE, config, marker, pids_with, wait_for_pids

#: An interpreter any uid can run (the test's own may live below a private directory).
SYSTEM_PYTHON = "/usr/bin/python3"

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(os.geteuid() != 0, reason="identities are leased only on a root host"),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def uids_of(pid: int) -> list[int]:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("Uid:"):
                return [int(value) for value in line.split()[1:]]
    raise AssertionError(f"no Uid line for {pid}")


def holder(mark: str) -> str:
    """A program that keeps a secret (derived from ``mark``) in its workspace."""
    return secret_holder(mark, "SECRET-" + mark[::-1])


async def test_concurrent_executions_get_distinct_uids_and_cannot_reach_each_other() -> None:
    mark = marker()
    async with Sandbox(config(wall_seconds=5.0)) as sandbox, anyio.create_task_group() as tg:
        tg.start_soon(partial(sandbox.run, holder(mark), profile=PROFILE))
        (victim,) = await wait_for_pids(mark, present=True)
        # The victim's workspace is where its secret is; the host can see it, the other
        # execution must not.
        victim_uid = uids_of(victim)[0]
        spy = await sandbox.run(SECRET_SPY, profile=PROFILE)
        tg.cancel_scope.cancel()
    assert spy.error is None, spy.error
    assert victim_uid >= 1000
    assert spy.return_value == [], "one execution read another's workspace"
    assert ("SECRET-" + mark[::-1]) not in (spy.stdout + spy.stderr)


async def test_two_running_executions_never_share_a_uid() -> None:
    marks = [marker(), marker()]
    async with Sandbox(config(wall_seconds=5.0)) as sandbox, anyio.create_task_group() as tg:
        for mark in marks:
            tg.start_soon(partial(sandbox.run, holder(mark), profile=PROFILE))
        pids = [(await wait_for_pids(mark, present=True))[0] for mark in marks]
        uids = [uids_of(pid) for pid in pids]
        tg.cancel_scope.cancel()
    assert uids[0][0] != uids[1][0]
    # Real, effective and saved uids all dropped, none of them root.
    assert all(0 not in ids for ids in uids)


async def test_a_process_that_escaped_the_tree_dies_with_its_execution() -> None:
    # Without a pid namespace, a double-forked setsid'd daemon leaves the process group; it
    # still runs as the execution's uid, and teardown kills everything under that uid.
    mark = marker()
    program = src(
        f"""
        import os, sys
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)",
                                          {mark[:10]!r} + {mark[10:]!r}])
            os._exit(0)
        os.wait()
        import time
        while not any({mark[:10]!r} + {mark[10:]!r} in open(f"/proc/{{p}}/cmdline").read()
                      for p in os.listdir("/proc") if p.isdigit()
                      and os.path.exists(f"/proc/{{p}}/cmdline")):
            time.sleep(0.01)
        """
    )
    async with Sandbox(config(options={"use_namespaces": False})) as sandbox:
        result = await sandbox.run(program, profile=PROFILE)
    assert result.error is None, result.error
    assert result.grades["process_tree"] == "unverified"
    assert pids_with(mark) == []


def test_a_range_that_holds_an_account_is_a_configuration_error() -> None:
    account = max(pwd.getpwall(), key=lambda entry: entry.pw_uid)
    assert account.pw_uid >= 1000, "no account with a uid in the allowed range to collide with"
    with pytest.raises(ConfigurationError, match=account.pw_name):
        IdentityRange(first=account.pw_uid, count=1).check()


async def test_a_profile_whose_range_holds_an_account_fails_at_load() -> None:
    account = max(pwd.getpwall(), key=lambda entry: entry.pw_uid)
    options = {"identity_first_uid": max(1000, account.pw_uid), "identity_count": 1}
    with pytest.raises(ConfigurationError, match="identity range"):
        async with Sandbox(config(options=options)) as sandbox:
            await sandbox.run("1", profile=PROFILE)


async def test_a_uid_a_crashed_host_never_handed_back_is_cleared_before_reuse() -> None:
    import random
    import subprocess

    from psych_sandbox_core.kit.posix.identity import _lock_directory

    uid = 1_900_000_000 + random.randrange(1_000_000)
    mark = marker()
    # What a host that died mid-execution leaves: a process still running under the uid, and
    # a lock file that was never emptied (nobody holds its lock any more).
    straggler = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            SYSTEM_PYTHON,
            "-c",
            "import time; time.sleep(60)",
            mark,
        ],
        cwd="/",
    )
    lock_file = os.path.join(_lock_directory(), str(uid))
    try:
        (pid,) = await wait_for_pids(mark, present=True)
        # Really running under the uid (not a setpriv that failed to exec).
        with anyio.fail_after(10):
            while uids_of(pid)[0] != uid or "python" not in Path(f"/proc/{pid}/comm").read_text():
                await anyio.sleep(0.01)
        with open(lock_file, "w") as fh:
            fh.write("424242\n")
        lease = IdentityRange(first=uid, count=1).lease()
        try:
            assert lease.uid == uid
            assert pids_with(mark) == []
        finally:
            lease.release()
        assert not os.path.exists(lock_file)  # handed back clean: no file left
    finally:
        straggler.kill()
        straggler.wait()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_file)
        IdentityRange(first=uid, count=1).forget()


# ---------------------------------------------------------------- rotation

LEASE_IN_ANOTHER_PROCESS = """
import sys
from psych_sandbox_core.kit.posix.identity import IdentityRange
lease = IdentityRange(first=int(sys.argv[1]), count=int(sys.argv[2])).lease()
print(lease.uid)
lease.release()
"""


@pytest.fixture
def fresh_range() -> Iterator[IdentityRange]:
    """A small range of its own (no other test leases from it), its cursor removed after."""
    import random

    identities = IdentityRange(first=1_960_000_000 + 8 * random.randrange(100_000), count=4)
    yield identities
    identities.forget()


def lease_elsewhere(identities: IdentityRange) -> int:
    """A lease taken and handed back by another host process."""
    import subprocess
    import sys

    done = subprocess.run(
        [
            sys.executable,
            "-c",
            LEASE_IN_ANOTHER_PROCESS,
            str(identities.first),
            str(identities.count),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return int(done.stdout)


def test_a_uid_comes_back_only_after_the_whole_range_was_leased(
    fresh_range: IdentityRange,
) -> None:
    # Leases taken in turn by this process and another one, each handed back at once: the
    # lowest free uid would be the same every time; rotation walks the range instead.
    uids = []
    for turn in range(2 * fresh_range.count + 1):
        if turn % 2:
            uids.append(lease_elsewhere(fresh_range))
        else:
            lease = fresh_range.lease()
            uids.append(lease.uid)
            lease.release()
    start = uids[0] - fresh_range.first
    expected = [fresh_range.first + (start + i) % fresh_range.count for i in range(len(uids))]
    assert uids == expected


def test_rotation_skips_a_uid_still_leased(fresh_range: IdentityRange) -> None:
    held = fresh_range.lease()
    try:
        others = []
        for _ in range(fresh_range.count):
            lease = fresh_range.lease()
            others.append(lease.uid)
            lease.release()
        assert held.uid not in others
        assert len(set(others)) == fresh_range.count - 1
    finally:
        held.release()


def test_a_uid_handed_back_clean_leaves_no_lock_file(fresh_range: IdentityRange) -> None:
    from psych_sandbox_core.kit.posix.identity import _lock_directory

    lease = fresh_range.lease()
    lock_file = os.path.join(_lock_directory(), str(lease.uid))
    assert os.path.exists(lock_file)
    lease.release()
    assert not os.path.exists(lock_file)
    leftovers = [
        n
        for n in os.listdir(_lock_directory())
        if n.isdigit() and fresh_range.first <= int(n) < fresh_range.first + fresh_range.count
    ]
    assert leftovers == []


def test_a_lease_without_a_thread_gives_way_to_what_can_take_long(
    fresh_range: IdentityRange,
) -> None:
    # lease_now() runs on the event loop: it leases as lease() does, but a cursor another
    # host holds (it would wait) or a uid whose last holder died (it would sweep first) is
    # left to lease() in a worker thread.
    import fcntl

    from psych_sandbox_core.kit.posix.identity import _cursor_path, _lock_directory

    fresh_range.lease().release()  # this process's first lease reaps dead hosts' uids
    quick = fresh_range.lease_now()
    assert quick is not None
    quick.release()
    cursor = os.open(_cursor_path(_lock_directory(), fresh_range), os.O_RDWR)
    try:
        fcntl.flock(cursor, fcntl.LOCK_EX)  # as another host leasing at this moment
        assert fresh_range.lease_now() is None
    finally:
        os.close(cursor)
    # The next uid's last holder died holding it: its file says so.
    with open(_cursor_path(_lock_directory(), fresh_range)) as file:
        start = int(file.read())
    dead = os.path.join(_lock_directory(), str(fresh_range.first + start))
    with open(dead, "w") as file:
        file.write("999999999\n")
    try:
        assert fresh_range.lease_now() is None
        swept = fresh_range.lease()  # in a thread: swept, then leased
        assert swept.uid == fresh_range.first + start
        swept.release()
    finally:
        if os.path.exists(dead):
            os.unlink(dead)


def test_every_uid_leased_is_exhaustion(fresh_range: IdentityRange) -> None:
    held = [fresh_range.lease() for _ in range(fresh_range.count)]
    try:
        with pytest.raises(IdentityExhausted):
            fresh_range.lease()
    finally:
        for lease in held:
            lease.release()


# ---------------------------------------------------------------- the sweep is unconditional


async def test_a_process_under_the_uid_outside_the_pid_namespace_dies_with_the_execution() -> None:
    # The pid namespace holds the program's tree, but proves nothing about the uid: a process
    # under it elsewhere (here started by the host, as one that escaped would run) is killed
    # before the uid goes back.
    import random

    uid = 1_980_000_000 + random.randrange(1_000_000)
    with own_uid(uid) as options, process_under(uid) as straggler:
        async with Sandbox(config(options=options)) as sandbox:
            result = await sandbox.run("import os; os.getuid()", profile=PROFILE)
        assert result.error is None, result.error
        assert result.return_value == uid
        assert result.grades["process_tree"] == "enforced"  # a pid namespace was used
        assert straggler.poll() == -signal.SIGKILL


async def test_a_uid_every_execution_shares_is_not_graded_as_a_boundary() -> None:
    """A fixed drop_to_uid puts every execution under one uid, with no filesystem boundary
    between them: identity is only unverified there, while a leased uid is enforced."""
    fixed = {"drop_to_uid": 65534, "drop_to_gid": 65534, "interpreter": SYSTEM_PYTHON}
    async with Sandbox(config(options=fixed)) as sandbox:
        shared = await sandbox.run("import os\nos.geteuid()", profile=PROFILE)
    async with Sandbox(config(options={"interpreter": SYSTEM_PYTHON})) as sandbox:
        leased = await sandbox.run("import os\nos.geteuid()", profile=PROFILE)
    assert shared.error is None and leased.error is None, (shared.error, leased.error)
    assert shared.return_value == 65534
    assert shared.grades["identity"] == "unverified"
    assert leased.return_value != 65534
    assert leased.grades["identity"] == "enforced"
