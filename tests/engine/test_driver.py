"""The host driver against the fake backend (psych_sandbox_testing.fake_backend): the
conversation over a real channel reader, cold and warm, without spawning a process. What
the fake child did is judged from the fake launch itself (its exit status, what it received,
whether it is still live), never from what the script says about itself."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from psych_sandbox_testing.fake_backend import (
    FakeBackend,
    Relayed,
    ScriptedChild,
    honest_report,
)

from psych_sandbox_core._bindings.bindings import FunctionBindings, ToolSpec
from psych_sandbox_core._bindings.call_server import CallServer
from psych_sandbox_core._engine.host import (
    ExecutionPlan,
    NotPrepared,
    PreparedChild,
    execute,
    prepare,
)
from psych_sandbox_core._engine.pool import WarmPool, WarmSettings
from psych_sandbox_core._engine.program import Program
from psych_sandbox_core.errors import ErrorKind
from psych_sandbox_core.grading import Grade, Guarantee, Level, Mechanisms
from psych_sandbox_core.protocol import (
    AbortFrame,
    HostFrame,
    NetworkObservation,
    ReplyFrame,
    RunFrame,
)
from psych_sandbox_core.result import BackendIdentity
from psych_sandbox_core.terms import ExecutionLimits

pytestmark = pytest.mark.anyio

LIMITS = ExecutionLimits(wall_seconds=30.0, grace_seconds=0.1)
NETWORK_UNREACHABLE = NetworkObservation(ipv4="unreachable", ipv6="unreachable", interfaces_up=[])


def plan(**changes: Any) -> ExecutionPlan:
    fields: dict[str, Any] = {
        "source": "the program",
        "limits": LIMITS,
        "profile": "p",
        "backend_identity": BackendIdentity(id="fake", distribution=None, version=None),
        "claimed_level": Level.NONE,
    }
    fields.update(changes)
    program_fields = {"source", "command", "inputs", "preamble", "variables_json", "keep_variables"}
    fields["program"] = Program(**{key: fields.pop(key) for key in program_fields & fields.keys()})
    return ExecutionPlan(**fields)


class Seen:
    """What the fake child received from the host, recorded by its script."""

    def __init__(self) -> None:
        self.frames: list[HostFrame | None] = []

    async def receive(self, child: ScriptedChild) -> HostFrame | None:
        frame = await child.receive()
        self.frames.append(frame)
        return frame


async def test_a_program_runs_and_returns() -> None:
    seen = Seen()

    async def script(child: ScriptedChild) -> None:
        await child.hello()
        await seen.receive(child)
        await child.stdout(b"out\n")
        await child.stderr(b"err\n")
        await child.returned({"answer": 4})

    backend = FakeBackend(script, usage=(0.5, 1024))
    result = await execute(backend, plan())
    assert result.error is None
    assert result.return_value == {"answer": 4}
    assert (result.stdout, result.stderr) == ("out\n", "err\n")
    assert (result.usage.cpu_seconds, result.usage.measured_by) == (0.5, "host")
    run = seen.frames[0]
    assert isinstance(run, RunFrame) and run.source == "the program" and run.end_marker is None
    launched = backend.launched[0]
    assert launched.status is not None and launched.status.code == 0
    assert backend.live == 0


async def test_binding_calls_are_answered_in_order() -> None:
    replies: list[HostFrame | None] = []

    async def script(child: ScriptedChild) -> None:
        await child.hello()
        await child.receive()
        replies.append(await child.call(0, "add", {"a": 1, "b": 2}))
        replies.append(await child.call(1, "add", {"a": 3, "b": 4}))
        await child.returned(None)

    calls = CallServer(FunctionBindings({"add": lambda a, b: a + b}), [ToolSpec("add")])
    result = await execute(FakeBackend(script), plan(calls=calls))
    assert result.error is None
    assert [r.value_json for r in replies if isinstance(r, ReplyFrame)] == ["3", "7"]
    assert [c.name for c in result.calls] == ["add", "add"]


async def test_a_call_out_of_order_is_a_protocol_error_and_the_child_is_killed() -> None:
    async def script(child: ScriptedChild) -> None:
        await child.hello()
        await child.receive()
        await child.call(5, "add", {})
        await child.sleep_forever()

    calls = CallServer(FunctionBindings({"add": lambda: 0}), [ToolSpec("add")])
    backend = FakeBackend(script)
    result = await execute(backend, plan(calls=calls))
    assert result.error is not None and result.error.kind is ErrorKind.PROTOCOL_ERROR
    assert "not the successor" in result.error.message
    launched = backend.launched[0]
    assert launched.status is not None and launched.status.signal == signal.SIGKILL
    assert backend.live == 0


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b"not json\n", "malformed frame"),
        (b'{"type":"hello","protocol":1}\n', "malformed frame"),
        (b'{"type":"reply","id":0,"carries":"value","value_json":"1"}\n', "malformed frame"),
    ],
)
async def test_a_bad_frame_is_a_protocol_error(payload: bytes, expected: str) -> None:
    async def script(child: ScriptedChild) -> None:
        await child.hello()
        await child.receive()
        await child.send(payload)
        await child.sleep_forever()

    result = await execute(FakeBackend(script), plan())
    assert result.error is not None and result.error.kind is ErrorKind.PROTOCOL_ERROR
    assert expected in result.error.message


async def test_a_value_over_its_cap_is_a_protocol_error() -> None:
    async def script(child: ScriptedChild) -> None:
        await child.hello()
        await child.receive()
        await child.returned("x" * 100)

    limits = LIMITS.model_copy(update={"return_value_bytes": 10})
    result = await execute(FakeBackend(script), plan(limits=limits))
    assert result.error is not None and result.error.kind is ErrorKind.PROTOCOL_ERROR


async def test_a_refused_program_is_never_sent() -> None:
    seen = Seen()

    async def script(child: ScriptedChild) -> None:
        await child.hello()
        await seen.receive(child)

    backend = FakeBackend(script)
    result = await execute(backend, plan(required_level=Level.ISOLATED))
    assert result.error is not None and result.error.kind is ErrorKind.ISOLATION_UNAVAILABLE
    assert isinstance(seen.frames[0], AbortFrame)
    assert result.grades  # graded from its own report


async def test_a_child_that_ends_before_its_report_never_ran() -> None:
    async def script(child: ScriptedChild) -> None:
        child.exit_code = 3

    result = await execute(FakeBackend(script), plan())
    assert result.error is not None and result.error.kind is ErrorKind.WORKER_EXIT
    assert result.error.message == (
        "the sandboxed interpreter exited with status 3 before the handshake"
    )
    assert result.grades == {}


async def test_a_child_that_ends_without_a_result() -> None:
    async def script(child: ScriptedChild) -> None:
        await child.hello()
        await child.receive()
        child.exit_code = 1

    result = await execute(FakeBackend(script), plan())
    assert result.error is not None and result.error.kind is ErrorKind.WORKER_EXIT
    assert "before returning a result" in result.error.message


async def test_the_wall_clock_terminates_the_child() -> None:
    async def script(child: ScriptedChild) -> None:
        await child.hello()
        await child.receive()
        await child.sleep_forever()

    backend = FakeBackend(script)
    limits = LIMITS.model_copy(update={"wall_seconds": 0.2})
    result = await execute(backend, plan(limits=limits))
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT
    launched = backend.launched[0]
    assert launched.status is not None and launched.status.signal == signal.SIGTERM


async def test_a_cancellation_during_the_run() -> None:
    cancel = anyio.Event()

    async def script(child: ScriptedChild) -> None:
        await child.hello()
        await child.receive()
        cancel.set()  # the caller cancels while the program runs
        await child.sleep_forever()

    result = await execute(FakeBackend(script), plan(cancel=cancel))
    assert result.error is not None and result.error.kind is ErrorKind.CANCELLED
    assert not result.error.message.endswith("never ran")


async def test_a_cancellation_before_the_start_launches_nothing() -> None:
    async def script(child: ScriptedChild) -> None:
        raise AssertionError("never launched")

    cancel = anyio.Event()
    cancel.set()
    backend = FakeBackend(script)
    result = await execute(backend, plan(cancel=cancel))
    assert result.error is not None and result.error.kind is ErrorKind.CANCELLED
    assert backend.launched == []


async def test_an_unavailable_backend_is_not_ready() -> None:
    async def script(child: ScriptedChild) -> None:
        raise AssertionError("never launched")

    result = await execute(FakeBackend(script, unavailable="no engine"), plan())
    assert result.error is not None and result.error.kind is ErrorKind.BACKEND_NOT_READY
    assert result.error.message == "no engine"


# ---------------------------------------------------------------- warm: prepare, then serve


async def test_a_prepared_child_is_graded_before_its_program_exists() -> None:
    seen = Seen()

    async def script(child: ScriptedChild) -> None:
        await child.hello()
        await seen.receive(child)
        await child.returned(1)

    backend = FakeBackend(script)
    async with anyio.create_task_group() as tg:
        child = await prepare(tg, backend, LIMITS)
        assert seen.frames == []  # graded, waiting: nothing sent yet
        assert backend.live == 1
        result = await child.serve(plan())
    assert result is not None and result.error is None and result.return_value == 1
    assert backend.live == 0
    with pytest.raises(RuntimeError, match="exactly one program"):
        await child.serve(plan())


@pytest.mark.parametrize("how", ["exits", "lies"])
async def test_a_child_that_cannot_be_prepared_raises(how: str) -> None:
    async def script(child: ScriptedChild) -> None:
        if how == "lies":
            await child.send({"type": "call", "id": 0, "name": "x", "arguments": {}})
            await child.sleep_forever()

    backend = FakeBackend(script)
    async with anyio.create_task_group() as tg:
        with pytest.raises(NotPrepared):
            await prepare(tg, backend, LIMITS)
    assert backend.live == 0


async def test_a_prepared_child_that_dies_waiting_is_gone_and_serves_nothing() -> None:
    die = anyio.Event()
    gone: list[PreparedChild] = []

    async def script(child: ScriptedChild) -> None:
        await child.hello()
        await die.wait()

    backend = FakeBackend(script)
    async with anyio.create_task_group() as tg:
        child = await prepare(tg, backend, LIMITS, gone.append)
        die.set()
        await backend.launched[0].wait_exited()
    assert gone == [child]
    assert await child.serve(plan()) is None  # the caller runs it elsewhere
    assert backend.live == 0


def _returns_then_lingers(value: int, release: anyio.Event) -> Callable[[ScriptedChild], Any]:
    """A child that prints, returns ``value`` with both end markers written, and stays alive
    until ``release`` is set (its result is handed back meanwhile)."""

    async def script(child: ScriptedChild) -> None:
        await child.hello()
        run = await child.receive()
        # Decided once the child was graded: a cold child gets its marker too.
        assert isinstance(run, RunFrame) and run.end_marker is not None
        marker = run.end_marker.encode()
        await child.stdout(b"out\n" + marker)
        await child.stderr(marker)
        await child.returned(value)
        await release.wait()

    return script


async def test_an_early_result_comes_before_the_teardown() -> None:
    release = anyio.Event()
    backend = FakeBackend(_returns_then_lingers(2, release), early_result_ok=True)
    async with anyio.create_task_group() as tg:
        child = await prepare(tg, backend, LIMITS)
        result = await child.serve(plan())
        assert backend.launched[0].status is None  # not exited yet
        assert backend.live == 1
        release.set()
    assert result is not None and result.error is None and result.return_value == 2
    assert result.stdout == "out\n"
    assert backend.launched[0].status is not None and backend.launched[0].status.code == 0
    assert backend.live == 0


async def test_a_caller_that_goes_away_cancels_its_warm_execution() -> None:
    started = anyio.Event()

    async def script(child: ScriptedChild) -> None:
        await child.hello()
        await child.receive()
        started.set()
        await child.sleep_forever()

    backend = FakeBackend(script)
    async with anyio.create_task_group() as tg:
        child = await prepare(tg, backend, LIMITS)
        with anyio.CancelScope() as caller:
            tg.start_soon(_cancel_when, started, caller)
            await child.serve(plan())
        # The caller returns only once its execution is torn down, as a cold one's does.
        assert backend.live == 0
    assert caller.cancelled_caught
    assert backend.live == 0
    # Cancelled as a cancelled execution is: terminated, not left to run.
    status = backend.launched[0].status
    assert status is not None and status.signal == signal.SIGTERM


async def test_a_cold_result_comes_before_the_teardown_in_a_task_group() -> None:
    release = anyio.Event()
    backend = FakeBackend(_returns_then_lingers(3, release), early_result_ok=True)
    async with anyio.create_task_group() as tg:
        result = await execute(backend, plan(), tg)
        assert backend.launched[0].status is None  # not exited yet
        assert backend.live == 1
        release.set()
    assert result.error is None and result.return_value == 3 and result.stdout == "out\n"
    # The task group awaited the teardown.
    assert backend.launched[0].status is not None and backend.launched[0].status.code == 0
    assert backend.live == 0


async def test_a_caller_that_goes_away_cancels_its_cold_execution_in_a_task_group() -> None:
    started = anyio.Event()

    async def script(child: ScriptedChild) -> None:
        await child.hello()
        await child.receive()
        started.set()
        await child.sleep_forever()

    backend = FakeBackend(script, early_result_ok=True)
    async with anyio.create_task_group() as tg:
        with anyio.CancelScope() as caller:
            tg.start_soon(_cancel_when, started, caller)
            await execute(backend, plan(), tg)
        assert backend.live == 0  # torn down before the caller returned
    assert caller.cancelled_caught
    assert backend.live == 0
    status = backend.launched[0].status
    assert status is not None and status.signal == signal.SIGTERM


async def _cancel_when(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def test_the_pool_gives_each_program_a_fresh_prepared_child() -> None:
    async def script(child: ScriptedChild) -> None:
        await child.hello()
        run = await child.receive()
        assert isinstance(run, RunFrame)
        await child.returned(run.source)

    backend = FakeBackend(script)
    async with anyio.create_task_group() as tg:
        pool = WarmPool(backend, LIMITS, WarmSettings(1, 2**30, 60.0), tg)
        await pool.wait_ready()
        first = await pool.run(plan(source="one"))
        await pool.wait_ready()
        second = await pool.run(plan(source="two"))
        tg.cancel_scope.cancel()
    assert (first.return_value, second.return_value) == ("one", "two")
    # Two served, each by its own child; the refill after the second was torn down.
    served = [launched for launched in backend.launched if launched.status is not None]
    assert len(served) >= 2
    assert backend.live == 0


async def test_mechanisms_reach_the_grades() -> None:
    async def script(child: ScriptedChild) -> None:
        await child.hello()
        await child.receive()
        await child.returned(None)

    weak = await execute(FakeBackend(script), plan())
    strong = await execute(FakeBackend(script, mechanisms=Mechanisms(pids_cgroup=True)), plan())
    assert weak.grades != strong.grades


async def test_a_relayed_childs_identity_is_graded_against_both_hosts() -> None:
    """A child that runs beside another host (a relay's service) is graded against that
    host's uid too: running as the far host's own uid, it holds that host's secrets, and the
    identity guarantee is not enforced even though this host's uid differs."""
    far_uid = 4242

    async def script(child: ScriptedChild) -> None:
        await child.hello(
            honest_report(uid=far_uid, euid=far_uid, gid=far_uid, capabilities="0" * 16)
        )
        await child.receive()
        await child.returned(None)

    strong = Mechanisms(unprivileged_identity=True, exclusive_identity=True, ipc_namespace=True)
    here = await execute(FakeBackend(script, mechanisms=strong), plan())
    there = await execute(FakeBackend(script, mechanisms=strong, far_host_uid=far_uid), plan())
    assert here.grades[Guarantee.IDENTITY] is Grade.ENFORCED
    assert there.grades[Guarantee.IDENTITY] is not Grade.ENFORCED


async def test_what_a_relay_saw_elsewhere_counts_here() -> None:
    """Connections a relay's far-side listeners saw withhold the output as this host's own
    would, and bytes it did not relay between a stream's head and tail are counted in that
    stream's totals."""

    async def script(child: ScriptedChild) -> None:
        await child.hello(honest_report(network=NETWORK_UNREACHABLE))
        await child.receive()
        await child.stdout(b"head\n")
        await child.returned(None)

    quiet = await execute(FakeBackend(script), plan())
    assert quiet.error is None and quiet.stdout == "head\n"
    assert (quiet.stdout_info.total_bytes, quiet.stdout_info.total_lines) == (5, 1)
    skipped = await execute(
        FakeBackend(script, relayed=Relayed(unrelayed={"stdout": (1000, 10)})), plan()
    )
    assert skipped.error is None
    assert (skipped.stdout_info.total_bytes, skipped.stdout_info.total_lines) == (1005, 11)
    assert skipped.stdout_info.dropped_bytes == 1000
    seen = await execute(FakeBackend(script, relayed=Relayed(connections_elsewhere=1)), plan())
    assert seen.error is not None and seen.error.kind is ErrorKind.ISOLATION_UNAVAILABLE
    assert "loopback listener" in seen.error.message and seen.stdout == ""
