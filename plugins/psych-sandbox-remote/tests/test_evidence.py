"""Evidence seen where the child runs reaches this host's own accounts. A service's own
probe listeners count connections the program made there, and its relay leaves out the
middle of a long stream: the client hands both to the core through the launch contract
(``Launched.connections_elsewhere`` and ``Launched.unrelayed``), which counts them as a local
child's (the core's tests/engine/test_driver.py shows the core withholding and counting).
The service's uid reaches the grading the same way (``Launched.host_uid``). The stream-end
counts across a real service are checked by the conformance suite's exact byte count."""

from __future__ import annotations

import pytest
from psych_sandbox_core import ExecutionLimits
from psych_sandbox_core.kit import LaunchRequest, ProbeTargets
from pydantic import ValidationError
from remote_support import started

from psych_sandbox_remote.client import Endpoint, RemoteExecution
from psych_sandbox_remote.options import RemoteOptions
from psych_sandbox_remote.wire import EVENT, MAX_COUNT, Ended, Started, Status

pytestmark = pytest.mark.anyio

EXECUTION = "a" * 32


def execution() -> RemoteExecution:
    request = LaunchRequest(
        bootstrap_source="",
        targets=lambda: ProbeTargets(None, None, None, 1),
        limits=ExecutionLimits(),
    )
    return RemoteExecution(
        Endpoint("http://127.0.0.1:1"), RemoteOptions(url="http://127.0.0.1:1"), request
    )


@pytest.mark.parametrize("seen", [0, 3, MAX_COUNT])
async def test_connections_the_service_saw_are_handed_to_the_core(seen: int) -> None:
    remote = execution()
    try:
        status = Status(type="status", execution=EXECUTION, code=0, signal=None, connections=seen)
        remote._take_status(status)
        assert remote.connections_elsewhere() == seen
    finally:
        await remote.close()


async def test_a_streams_unrelayed_middle_and_the_services_uid_are_handed_to_the_core() -> None:
    remote = execution()
    try:
        remote._on_event(started(EXECUTION).strip())
        assert remote.host_uid is not None
        end = Ended(type="stdout_end", execution=EXECUTION, skipped_bytes=70, skipped_newlines=7)
        remote._on_event(end.model_dump_json().encode())
        assert remote.unrelayed("stdout") == (70, 7)
        assert remote.unrelayed("stderr") == (0, 0)
    finally:
        await remote.close()


@pytest.mark.parametrize("field", ["skipped_bytes", "skipped_newlines"])
async def test_a_service_claiming_impossible_counts_is_malformed(field: str) -> None:
    line = Ended(type="stdout_end", execution=EXECUTION).model_dump_json()
    for bad in (-1, MAX_COUNT + 1):
        with pytest.raises(ValidationError):
            EVENT.validate_json(line.replace(f'"{field}":0', f'"{field}":{bad}').encode())
    assert isinstance(EVENT.validate_json(started(EXECUTION)), Started)
