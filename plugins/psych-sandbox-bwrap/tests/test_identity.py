"""On a root host every execution's bwrap runs as a host uid of its own, asserted from the
host: two running executions never share one, a program in another execution cannot reach a
running execution's workspace, and nothing runs under a uid once its execution is over.

The user namespace bwrap makes belongs to the host uid that made it, and a host process with
that uid holds every capability in it: shared, that uid lets any program running as it (an
execution of a backend without a pid namespace, or a service running as "nobody") walk into
a running sandbox through /proc/<pid>/root. The last test shows exactly that with the shared
identity the host_uid option configures, which is why it is the weaker choice."""

from __future__ import annotations

import textwrap
from functools import partial
from typing import Any

import anyio
import pytest
from bwrap_support import (
    FAST_LIMITS,
    marker,
    needs_root,
    opens_of,
    pids_with,
    requires_bwrap,
    uids_of,
    wait_for_pids,
)
from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core.result import ExecutionResult
from psych_sandbox_core.testing.programs import SECRET_SPY, secret_holder

pytestmark = [requires_bwrap, needs_root, pytest.mark.anyio]

NOBODY = 65534
#: The weaker configurations: every execution under the one identity.
SHARED_BWRAP = {"host_uid": NOBODY, "host_gid": NOBODY}
SHARED_SUBPROCESS = {"drop_to_uid": NOBODY, "drop_to_gid": NOBODY}


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def deployment(bwrap: dict[str, Any], subprocess: dict[str, Any]) -> DeploymentConfig:
    limits = ExecutionLimits(**FAST_LIMITS)
    return DeploymentConfig(
        profiles={
            "jail": ProfileConfig(backend="bwrap", options=bwrap, limits=limits),
            # Without a pid namespace this program sees every process of the host.
            "plain": ProfileConfig(
                backend="subprocess",
                options={"use_namespaces": False, **subprocess},
                limits=limits,
            ),
        }
    )


async def spy_on_a_running_execution(
    bwrap: dict[str, Any], subprocess: dict[str, Any]
) -> tuple[str, list[ExecutionResult], list[str]]:
    """Run a holder, then spies from bwrap and from a plain subprocess execution while it
    runs; return the secret, the spies' results and the host's record of opens of it."""
    mark, secret = marker(), "SECRET-" + marker()
    async with Sandbox(deployment(bwrap, subprocess)) as sandbox, anyio.create_task_group() as tg:
        tg.start_soon(partial(sandbox.run, secret_holder(mark, secret), profile="jail"))
        (pid,) = await wait_for_pids(mark)
        # The host (root) reaches the secret's inode through the holder's own root, and
        # watches it: any spy that opens it is seen, whatever path it took.
        path = f"/proc/{pid}/root/workspace/secret.txt"
        with opens_of(path) as opened:
            spies = [
                await sandbox.run(SECRET_SPY, profile="jail"),
                await sandbox.run(SECRET_SPY, profile="plain"),
            ]
        # The control: the secret was there all along, and the watch sees an open.
        with opens_of(path) as control, open(path) as fh:
            assert fh.read() == secret
        assert control
        tg.cancel_scope.cancel()
    return secret, spies, opened


async def test_two_running_executions_run_as_distinct_host_uids() -> None:
    marks = [marker(), marker()]
    async with Sandbox(deployment({}, {})) as sandbox, anyio.create_task_group() as tg:
        for mark in marks:
            tg.start_soon(partial(sandbox.run, secret_holder(mark, "x"), profile="jail"))
        pids = [(await wait_for_pids(mark))[0] for mark in marks]
        uids = [uids_of(pid) for pid in pids]
        tg.cancel_scope.cancel()
    # Each process under one uid in all four slots, none root, and not the same for both.
    assert all(len(set(ids)) == 1 for ids in uids), uids
    first, second = uids[0][0], uids[1][0]
    assert first != second, f"both executions ran as host uid {first}"
    assert 0 not in (first, second)
    # (Whether anything still runs under a uid afterwards is not asked here: the uid is
    # free again, and another execution on this host may already hold it.)
    assert pids_with(marks[0]) == [] and pids_with(marks[1]) == []


async def test_a_program_in_another_execution_cannot_read_a_running_workspace() -> None:
    secret, spies, opened = await spy_on_a_running_execution({}, {})
    for spy in spies:
        assert spy.error is None, spy.error
        assert "looked at" in spy.stdout
        assert spy.return_value == []
        assert secret not in spy.stdout + spy.stderr + repr(spy.return_value)
    # Seen from the host: nothing but the host itself opened the secret's inode.
    assert opened == []


async def test_with_one_shared_host_uid_the_spy_does_read_it() -> None:
    """The control for the test above, and the reason host_uid is the weaker option: the
    same spy, when both backends are configured with the one shared identity, walks into
    the running sandbox and reads its secret."""
    secret, spies, opened = await spy_on_a_running_execution(SHARED_BWRAP, SHARED_SUBPROCESS)
    in_bwrap, plain = spies
    # bwrap's pid namespace hides the holder from a program in another sandbox ...
    assert in_bwrap.return_value == []
    # ... but not from a program on the host under the same uid.
    assert plain.return_value == [secret] * len(plain.return_value) and plain.return_value
    assert opened

