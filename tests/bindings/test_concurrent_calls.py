"""Binding calls in flight together, judged on the host: each accepted call is served in a
task of its own, a cancel frame cancels one tool, the end of the program or of the execution
cancels every call still in flight, and the ordering rule and the limit on calls in flight
hold against a program that writes raw frames on the channel."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from psych_sandbox_core import BindingBudgets, DeploymentConfig, ErrorKind, ProfileConfig, Sandbox
from psych_sandbox_core._bindings.bindings import FunctionBindings
from psych_sandbox_core._bindings.call_server import CallServer
from psych_sandbox_core._bindings.runlog import MemoryRunLog
from psych_sandbox_core._engine.calls_in_flight import calls_in_flight
from psych_sandbox_core._engine.conversation import State
from psych_sandbox_core.protocol import CallFrame
from psych_sandbox_core.protocol.framing import HANDSHAKE_CEILINGS
from psych_sandbox_core.terms import ExecutionLimits

from ..conftest import FAST_LIMITS, PROFILE
from ..engine.test_conversation import in_state

pytestmark = pytest.mark.anyio

RUN = "concurrent-calls"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the host's side is anyio throughout; the cancel test runs on both


def deployment(calls_in_flight: int = 16, **limits: Any) -> DeploymentConfig:
    return DeploymentConfig(
        profiles={
            PROFILE: ProfileConfig(
                backend="subprocess",
                limits=ExecutionLimits(**{**FAST_LIMITS, **limits}),
                budgets=BindingBudgets(calls_in_flight=calls_in_flight),
            )
        }
    )


class Tools:
    """Tools that say on the host when they start, end and are cancelled."""

    def __init__(self, together: int = 0) -> None:
        self.events: list[tuple[str, str]] = []
        self._together = together
        self._all_started = anyio.Event()
        self.cancelled = anyio.Event()
        #: Set when two calls of ``block`` are running.
        self.two_blocking = anyio.Event()

    async def gathered(self, n: int) -> int:
        """Returns only once ``together`` calls are running at the same time."""
        self.events.append(("start", f"gathered {n}"))
        if sum(kind == "start" for kind, _ in self.events) == self._together:
            self._all_started.set()
        await self._all_started.wait()
        self.events.append(("end", f"gathered {n}"))
        return n

    async def block(self, tag: str) -> None:
        """Runs until it is cancelled."""
        self.events.append(("start", tag))
        if sum(kind == "start" for kind, _ in self.events) == 2:
            self.two_blocking.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.events.append(("cancelled", tag))
            self.cancelled.set()
            raise

    async def quick(self, tag: str) -> str:
        self.events.append(("start", tag))
        self.events.append(("end", tag))
        return tag

    def bindings(self) -> FunctionBindings:
        return FunctionBindings(
            {"gathered": self.gathered, "block": self.block, "quick": self.quick}
        )


async def run(
    source: str, tools: Tools, config: DeploymentConfig | None = None
) -> tuple[Any, MemoryRunLog]:
    log = MemoryRunLog()
    async with Sandbox(config or deployment(), run_log=log) as sandbox:
        result = await sandbox.run(source, profile=PROFILE, bindings=tools.bindings(), run_id=RUN)
    return result, log


async def logged(log: MemoryRunLog) -> list[tuple[int, str, str | None]]:
    return [(e.call_id, e.name, e.outcome) for e in await log.entries(RUN)]


async def test_calls_under_gather_all_run_on_the_host_at_once() -> None:
    # Each tool returns only once all eight run together: served one at a time, the first
    # would wait for ever (the wall clock would end the run).
    tools = Tools(together=8)
    result, log = await run(
        "import asyncio\nreturn await asyncio.gather(*[gathered(n) for n in range(8)])",
        tools,
        deployment(wall_seconds=10.0),
    )
    assert result.error is None, result.error
    assert result.return_value == list(range(8))
    kinds = [kind for kind, _ in tools.events]
    assert kinds == ["start"] * 8 + ["end"] * 8
    # Accepted, counted and logged in id order, each closed with its outcome.
    assert await logged(log) == [(n, "gathered", "ok") for n in range(8)]
    assert [c.outcome for c in result.calls] == ["ok"] * 8


async def test_calls_from_threads_and_tasks_run_on_the_host_at_once() -> None:
    tools = Tools(together=6)
    result, _ = await run(
        """
import asyncio, threading
results = {}
def worker(n):
    results[n] = asyncio.run(gathered(n))
threads = [threading.Thread(target=worker, args=(n,)) for n in range(3)]
for t in threads:
    t.start()
tasks = [asyncio.create_task(gathered(n)) for n in range(3, 6)]
done = await asyncio.gather(*tasks)
for t in threads:
    t.join()
return sorted([*results.values(), *done])
""",
        tools,
        deployment(wall_seconds=10.0),
    )
    assert result.error is None, result.error
    assert result.return_value == list(range(6))
    assert [kind for kind, _ in tools.events] == ["start"] * 6 + ["end"] * 6


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_call_the_program_stops_waiting_for_is_cancelled_on_the_host_alone() -> None:
    tools = Tools()
    result, log = await run(
        """
import asyncio
try:
    await asyncio.wait_for(block("timed out"), 0.05)
except TimeoutError:
    pass
task = asyncio.create_task(block("task cancelled"))
await asyncio.sleep(0.05)
task.cancel()
sibling = asyncio.create_task(quick("sibling"))
try:
    await task
except asyncio.CancelledError:
    pass
return await sibling
""",
        tools,
    )
    assert result.error is None, result.error
    assert result.return_value == "sibling"
    # The tools saw their own cancellation, on the host.
    assert ("cancelled", "timed out") in tools.events
    assert ("cancelled", "task cancelled") in tools.events
    assert [(c.name, c.outcome) for c in result.calls] == [
        ("block", "cancelled"),
        ("block", "cancelled"),
        ("quick", "ok"),
    ]
    assert await logged(log) == [
        (0, "block", "cancelled"),
        (1, "block", "cancelled"),
        (2, "quick", "ok"),
    ]


async def test_calls_still_in_flight_when_the_program_ends_are_cancelled_and_recorded() -> None:
    # A thread cannot cancel its call; the program's end does it for every call in flight.
    tools = Tools()
    result, log = await run(
        """
import asyncio, threading
threading.Thread(target=lambda: asyncio.run(block("thread")), daemon=True).start()
left = asyncio.create_task(block("task"))
await asyncio.sleep(0.1)
return "done"
""",
        tools,
    )
    assert result.error is None, result.error
    assert result.return_value == "done"
    assert sorted(tag for kind, tag in tools.events if kind == "cancelled") == ["task", "thread"]
    assert sorted(outcome for _, _, outcome in await logged(log)) == ["cancelled", "cancelled"]
    assert await log.dangling(RUN) == []


async def test_calls_in_flight_when_the_run_is_cancelled_are_cancelled_and_recorded() -> None:
    tools = Tools()
    cancel = anyio.Event()
    log = MemoryRunLog()

    async def cancel_once_both_started() -> None:
        await tools.two_blocking.wait()
        cancel.set()

    async with Sandbox(deployment(), run_log=log) as sandbox, anyio.create_task_group() as tg:
        tg.start_soon(cancel_once_both_started)
        result = await sandbox.run(
            "import asyncio\nawait asyncio.gather(block('a'), block('b'))",
            profile=PROFILE,
            bindings=tools.bindings(),
            run_id=RUN,
            cancel=cancel,
        )
    assert result.error is not None and result.error.kind is ErrorKind.CANCELLED
    assert sorted(tag for kind, tag in tools.events if kind == "cancelled") == ["a", "b"]
    assert await logged(log) == [(0, "block", "cancelled"), (1, "block", "cancelled")]


# ---------------------------------------------------------------- raw frames on the channel

#: The program finds the channel the way any hostile program would: from its own argv.
PRELUDE = """
import json, os, socket, sys
FD = int(next(a for a in sys.argv if a.startswith("channel=fd:"))[len("channel=fd:"):])
channel = socket.socket(fileno=os.dup(FD))
def call_bytes(n, name="block", **arguments):
    return json.dumps(
        {"type": "call", "id": n, "name": name, "arguments": {"tag": str(n), **arguments}}
    ).encode() + b"\\n"
def call(n, name="block", **arguments):
    channel.sendall(call_bytes(n, name, **arguments))
def cancel(n):
    channel.sendall(json.dumps({"type": "cancel", "id": n}).encode() + b"\\n")
def reply():
    line = b""
    while not line.endswith(b"\\n"):
        line += channel.recv(1)
    return json.loads(line)
"""

HOSTILE = {
    "a cancel for a call never made": ("cancel(0)", "a cancel for call 0, which was never made"),
    "a second cancel of one call": (
        "call(0)\ncancel(0)\ncancel(0)",
        "a second cancel for call 0",
    ),
    "a repeated call id": ("call(0)\ncall(0)", "call id 0 is not the successor"),
    "a skipped call id": ("call(0)\ncall(2)", "call id 2 is not the successor"),
    "more calls in flight than the limit": (
        "call(0)\ncall(1)\ncall(2)",
        "call 2 would be more than 2 calls in flight",
    ),
    "a call and garbage in one write": (
        "channel.sendall(call_bytes(0) + b'junk\\n')",
        "malformed frame from child",
    ),
    "a cancel frame too long": (
        "channel.sendall(b'{\"type\":\"cancel\",\"id\":0' + b' ' * 300 + b'}\\n')",
        "a cancel frame longer than its ceiling",
    ),
}


@pytest.mark.parametrize(("frames", "violation"), list(HOSTILE.values()), ids=list(HOSTILE))
async def test_a_hostile_call_or_cancel_frame_is_a_protocol_error(
    frames: str, violation: str
) -> None:
    tools = Tools()
    source = PRELUDE + frames + "\nimport time\ntime.sleep(30)\n"
    result, log = await run(source, tools, deployment(calls_in_flight=2))
    assert result.error is not None and result.error.kind is ErrorKind.PROTOCOL_ERROR
    assert violation in result.error.message
    # Every call the host accepted ended coherently: its tool cancelled, nothing dangling.
    started = [tag for kind, tag in tools.events if kind == "start"]
    assert sorted(tag for kind, tag in tools.events if kind == "cancelled") == sorted(started)
    assert await log.dangling(RUN) == []
    assert all(outcome == "cancelled" for _, _, outcome in await logged(log))


async def test_a_cancel_that_crosses_its_reply_changes_nothing() -> None:
    tools = Tools()
    result, log = await run(
        PRELUDE
        + """
call(0, name="quick")
first = reply()
cancel(0)  # crossed its reply: the host takes it as nothing
call(1)
cancel(1)
second = reply()
return [first["carries"], second["error_kind"]]
""",
        tools,
    )
    assert result.error is None, result.error
    assert result.return_value == ["value", "cancelled"]
    assert await logged(log) == [(0, "quick", "ok"), (1, "block", "cancelled")]


def test_the_cancel_frame_is_what_the_bootstrap_writes() -> None:
    from psych_sandbox_core.protocol import CancelFrame, decode_child_frame

    line = json.dumps({"type": "cancel", "id": 3}, separators=(",", ":")).encode()
    assert decode_child_frame(line) == CancelFrame(type="cancel", id=3)


class _QuietLink:
    """A link nobody reads: replies are kept, nothing arrives."""

    ceilings = HANDSHAKE_CEILINGS

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def receive(self) -> None:
        await anyio.sleep_forever()

    async def send(self, frame: Any) -> None:
        self.sent.append(frame)

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_calls_in_flight_when_the_reading_ends_are_cancelled_and_closed() -> None:
    # The program's frames stop (a violation, the channel's end) right after two calls were
    # accepted: neither is left running, answered, or dangling in the run log.
    tools = Tools()
    log = MemoryRunLog()
    server = CallServer(tools.bindings(), ["block", "quick"], run_log=log)
    conversation = in_state(State.RUNNING, with_collector=False)
    link = _QuietLink()
    async with calls_in_flight(server, link, conversation, 4) as flight:
        for n, name in enumerate(["block", "quick"]):
            frame = CallFrame(type="call", id=n, name=name, arguments={"tag": name})
            assert await flight.accept(frame) == []
        conversation.violate("the test ends the program here")
        flight.end()
    assert link.sent == []
    outcomes = [(e.call_id, e.outcome) for e in await log.entries(server.scope.run_id)]
    # The tool that got as far as waiting saw its cancellation; the quick one may finish.
    assert ("cancelled", "block") in tools.events
    assert outcomes[0] == (0, "cancelled") and outcomes[1] in [(1, "ok"), (1, "cancelled")]
    assert [c["outcome"] for c in server.record] == [o for _, o in outcomes]
    assert await log.dangling(server.scope.run_id) == []


class _OneByOneLink:
    """A program awaiting its calls one by one: each call frame arrives only once the host
    sent its last frame (the run frame, then each reply); the channel ends after ``calls``.
    Says which task read each frame."""

    ceilings = HANDSHAKE_CEILINGS

    def __init__(self, calls: int) -> None:
        self._calls = calls
        self._sent = anyio.Event()
        self.sent: list[Any] = []
        self.read_by: list[int] = []

    async def receive(self) -> CallFrame | None:
        await self._sent.wait()
        self._sent = anyio.Event()
        self.read_by.append(anyio.get_current_task().id)
        made = len(self.read_by) - 1
        if made == self._calls:
            return None
        return CallFrame(type="call", id=made, name="where", arguments={})

    async def send(self, frame: Any) -> None:
        self.sent.append(frame)
        self._sent.set()

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_call_alone_in_flight_is_served_by_the_task_that_read_it() -> None:
    # The fast path a program awaiting its calls one by one takes: no hand-off to another
    # task (and so no extra turn of the event loop) between reading a call and its reply,
    # and, when no tool waits, the reading never moves to another task.
    from psych_sandbox_core._engine.conversing import LinkedConversation

    from ..engine.test_conversation import terms

    served_by: list[int] = []

    async def where() -> None:
        served_by.append(anyio.get_current_task().id)

    provider = FunctionBindings({"where": where})
    server = CallServer(provider, await provider.list_tools())
    conversation = in_state(State.GRADED, with_collector=False)
    talk = LinkedConversation(conversation)
    link = _OneByOneLink(calls=5)
    talk._link = link
    await talk.program(
        terms(tools=server.offered, argument_bytes=server.budgets.argument_bytes_per_call),
        server,
    )
    assert [frame.type for frame in link.sent] == ["run"] + ["reply"] * 5
    assert served_by == link.read_by[:5]
    assert len(set(link.read_by)) == 1
    assert [c["outcome"] for c in server.record] == ["ok"] * 5


@pytest.mark.parametrize("anyio_backend", ["trio"])  # trio's instruments count task steps
async def test_a_tool_that_never_waits_gives_no_other_task_a_turn() -> None:
    # A standby is woken only when the serving suspends: calls answered at once cost no
    # worker a step (one each would be a turn of the event loop per call).
    import trio

    from psych_sandbox_core._engine.conversing import LinkedConversation

    from ..engine.test_conversation import terms

    class WorkerSteps(trio.abc.Instrument):
        def __init__(self) -> None:
            self.steps = 0

        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            if task.name.endswith("CallsInFlight._worker"):
                self.steps += 1

    async def where() -> None:
        pass

    provider = FunctionBindings({"where": where})
    server = CallServer(provider, await provider.list_tools())
    talk = LinkedConversation(in_state(State.GRADED, with_collector=False))
    link = _OneByOneLink(calls=20)
    talk._link = link
    counted = WorkerSteps()
    trio.lowlevel.add_instrument(counted)
    try:
        await talk.program(
            terms(tools=server.offered, argument_bytes=server.budgets.argument_bytes_per_call),
            server,
        )
    finally:
        trio.lowlevel.remove_instrument(counted)
    assert [frame.type for frame in link.sent] == ["run"] + ["reply"] * 20
    assert counted.steps == 0
