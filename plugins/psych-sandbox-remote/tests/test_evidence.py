"""Evidence seen on the service reaches this host's own accounts: connections the service's
probe listeners saw are replayed to this host's listeners, so the core withholds the output
exactly as it does for a local child."""

from __future__ import annotations

import os

import pytest
from psych_sandbox_core.backend import LaunchRequest, ProbeTargets
from psych_sandbox_core.grading import Grade, Guarantee, Mechanisms, grade
from psych_sandbox_core.host import ProbeHarness, bootstrap_source
from psych_sandbox_core.protocol import HelloFrame
from psych_sandbox_core.terms import ExecutionLimits
from remote_support import hello

from psych_sandbox_remote.client import MAX_REPLAYED_CONNECTIONS, Endpoint, RemoteExecution
from psych_sandbox_remote.options import RemoteOptions


@pytest.mark.anyio
@pytest.mark.parametrize("seen", [1, 3, 1000])
async def test_connections_seen_remotely_are_counted_here(seen: int) -> None:
    async with ProbeHarness().active() as harness:
        assert harness.targets is not None
        request = LaunchRequest(
            bootstrap_source=bootstrap_source(), probe=harness.targets, limits=ExecutionLimits()
        )
        execution = RemoteExecution(
            Endpoint("http://127.0.0.1:1"), RemoteOptions(url="http://127.0.0.1:1"), request
        )
        await execution._replay_connections(seen)
        assert harness.connections == min(seen, MAX_REPLAYED_CONNECTIONS)
        await execution.close()


STRONG = Mechanisms(
    filesystem_boundary=True,
    network_namespace=True,
    ipc_namespace=True,
    process_tree_boundary=True,
    unprivileged_identity=True,
    exclusive_identity=True,
)


@pytest.mark.anyio
@pytest.mark.parametrize("service_uid", [12345, None])
async def test_identity_is_judged_against_the_services_uid(service_uid: int | None) -> None:
    request = LaunchRequest(
        bootstrap_source="", probe=ProbeTargets(None, None, None, 1), limits=ExecutionLimits()
    )
    execution = RemoteExecution(
        Endpoint("http://127.0.0.1:1"), RemoteOptions(url="http://127.0.0.1:1"), request
    )
    try:
        judged(execution, service_uid)
    finally:
        await execution.close()


def judged(execution: RemoteExecution, service_uid: int | None) -> None:
    execution.mechanisms = STRONG
    execution.host_uid = os.getuid() if service_uid is None else service_uid
    line = hello(12345)
    # The hello arrives in pieces, as relayed chunks do.
    execution._judge_identity(line[:40])
    execution._judge_identity(line[40:])
    report = HelloFrame.model_validate_json(line).report
    here = grade(execution.mechanisms, report, host_uid=os.getuid())[Guarantee.IDENTITY]
    there = grade(STRONG, report, host_uid=execution.host_uid)[Guarantee.IDENTITY]
    if service_uid is None:
        assert execution.mechanisms == STRONG
    else:
        # The child runs as the service's own uid: never graded better than the service
        # itself would grade it.
        assert there is Grade.UNVERIFIED
        assert here is not Grade.ENFORCED
