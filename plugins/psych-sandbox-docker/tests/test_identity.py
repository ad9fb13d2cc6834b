"""On a root host every container runs as a uid of its own, asserted from the host: two
running containers never share one, a program in another execution cannot reach a running
container's workspace, and the control socket belongs to that uid alone.

runc maps no user namespace: the container's uid is a host uid. Shared, it lets any program
running as it outside a pid namespace (an execution of the subprocess backend configured with
that identity, a service running as "nobody") read a running container's workspace through
/proc/<pid>/root, and every container under it shares its RLIMIT_NPROC count. The last test
shows the first with the shared identity the container_uid option configures, which is why
that option is the weaker choice."""

from __future__ import annotations

import os
import textwrap
from functools import partial
from typing import Any

import anyio
import pytest
from docker_support import (
    FAST_LIMITS,
    PROFILE,
    leased,
    marker,
    opens_of,
    pids_with,
    skip_unless_required,
    uids_of,
    wait_until,
)
from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core.result import ExecutionResult
from psych_sandbox_core.testing.programs import SECRET_SPY, secret_holder

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("engine")]

NOBODY = 65534
#: The weaker configurations: every execution under the one identity.
SHARED_DOCKER = {"container_uid": NOBODY, "container_gid": NOBODY}
SHARED_SUBPROCESS = {"drop_to_uid": NOBODY, "drop_to_gid": NOBODY}


@pytest.fixture(autouse=True)
def _root_host() -> None:
    if os.geteuid() != 0:
        skip_unless_required("docker", "identities are leased only on a root host")


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def deployment(docker: dict[str, Any], subprocess: dict[str, Any]) -> DeploymentConfig:
    limits = ExecutionLimits(**FAST_LIMITS)
    return DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(
                backend="docker", options={"runtime": "runc", **docker}, limits=limits
            ),
            # Without a pid namespace this program sees every process of the host.
            "plain": ProfileConfig(
                backend="subprocess",
                options={"use_namespaces": False, **subprocess},
                limits=limits,
            ),
        }
    )


async def spy_on_a_running_container(
    docker: dict[str, Any], subprocess: dict[str, Any]
) -> tuple[str, list[ExecutionResult], list[str], int]:
    """Run a holder, then spies from a container and from a plain subprocess execution while
    it runs; return the secret, the spies' results, the host's record of opens of the secret
    and the holder's host uid."""
    mark, secret = marker(), "SECRET-" + marker()
    async with Sandbox(deployment(docker, subprocess)) as sandbox, anyio.create_task_group() as tg:
        tg.start_soon(partial(sandbox.run, secret_holder(mark, secret), profile=PROFILE))
        (pid,) = await wait_until(lambda: pids_with(mark))
        uid = uids_of(pid)[0]
        # The host (root) reaches the secret's inode through the holder's own root, and
        # watches it: any spy that opens it is seen, whatever path it took.
        path = f"/proc/{pid}/root/workspace/secret.txt"
        with opens_of(path) as opened:
            spies = [
                await sandbox.run(SECRET_SPY, profile=PROFILE),
                await sandbox.run(SECRET_SPY, profile="plain"),
            ]
        # The control: the secret was there all along, and the watch sees an open.
        with opens_of(path) as control, open(path) as fh:
            assert fh.read() == secret
        assert control
        tg.cancel_scope.cancel()
    return secret, spies, opened, uid


async def test_two_running_containers_run_as_distinct_host_uids() -> None:
    marks = [marker(), marker()]
    async with Sandbox(deployment({}, {})) as sandbox, anyio.create_task_group() as tg:
        for mark in marks:
            tg.start_soon(partial(sandbox.run, secret_holder(mark, "x"), profile=PROFILE))
        pids = [(await wait_until(lambda mark=mark: pids_with(mark)))[0] for mark in marks]
        uids = [uids_of(pid) for pid in pids]
        tg.cancel_scope.cancel()
    # Each process under one uid in all four slots, and not the same for both.
    assert all(len(set(ids)) == 1 for ids in uids), uids
    first, second = uids[0][0], uids[1][0]
    assert first != second, f"both containers ran as host uid {first}"
    assert leased(first) and leased(second)
    assert pids_with(marks[0]) == [] and pids_with(marks[1]) == []


async def test_a_program_in_another_execution_cannot_read_a_running_workspace() -> None:
    secret, spies, opened, uid = await spy_on_a_running_container({}, {})
    assert leased(uid)
    for spy in spies:
        assert spy.error is None, spy.error
        assert "looked at" in spy.stdout
        assert spy.return_value == []
        assert secret not in spy.stdout + spy.stderr + repr(spy.return_value)
    # Seen from the host: nothing but the host itself opened the secret's inode.
    assert opened == []


async def test_with_one_shared_uid_the_spy_does_read_it() -> None:
    """The control for the test above, and the reason container_uid is the weaker option:
    the same spy, when both backends are configured with the one shared identity, reads the
    running container's secret."""
    secret, spies, opened, uid = await spy_on_a_running_container(
        SHARED_DOCKER, SHARED_SUBPROCESS
    )
    in_container, plain = spies
    assert uid == NOBODY
    # The container's pid namespace hides the holder from a program in another container...
    assert in_container.return_value == []
    # ... but not from a program on the host under the same uid.
    assert plain.return_value and plain.return_value == [secret] * len(plain.return_value)
    assert opened


async def test_the_control_socket_belongs_to_the_container_uid() -> None:
    mark = marker()
    seen: dict[str, Any] = {}

    async def inspect() -> None:
        (pid,) = await wait_until(lambda: pids_with(mark))
        uid = uids_of(pid)[0]
        # The socket the container connected to, found through the container's own mount of
        # the socket directory.
        info = os.stat(f"/proc/{pid}/root/run/psych/control.sock")
        directory = os.stat(f"/proc/{pid}/root/run/psych")
        seen.update(uid=uid, owner=(info.st_uid, info.st_gid), mode=info.st_mode & 0o777,
                    dir_owner=directory.st_uid, dir_mode=directory.st_mode & 0o777)

    async with Sandbox(deployment({}, {})) as sandbox, anyio.create_task_group() as tg:
        tg.start_soon(inspect)
        result = await sandbox.run(
            "import subprocess, sys\n"
            f"subprocess.run([sys.executable, '-c', 'import time; time.sleep(0.5)', {mark!r}])\n"
            "import os\nos.getuid()",
            profile=PROFILE,
        )
    assert result.error is None, result.error
    assert leased(seen["uid"]) and result.return_value == seen["uid"]
    assert seen["owner"] == (seen["uid"], seen["uid"])
    assert seen["mode"] == 0o600
    # The directory stays root's, traversable only.
    assert (seen["dir_owner"], seen["dir_mode"]) == (0, 0o711)
