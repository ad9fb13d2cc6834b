"""The conversation as a state machine, with no I/O: every state against every input, the
messages a violation carries, what the host sends, and arbitrary input sequences."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from psych_sandbox_testing.fake_backend import honest_report

from psych_sandbox_core._engine.conversation import (
    TRANSITIONS,
    Answer,
    CancelCall,
    Close,
    Conversation,
    DecodeValue,
    Narrow,
    ProgramTerms,
    Send,
    State,
)
from psych_sandbox_core._engine.program import Program
from psych_sandbox_core._output.artifact_channel import ChannelCollector, channel_request
from psych_sandbox_core._output.artifacts import CollectionLimits
from psych_sandbox_core.errors import ErrorKind
from psych_sandbox_core.grading import Grade, Guarantee, Mechanisms
from psych_sandbox_core.protocol import (
    PROTOCOL_VERSION,
    AbortFrame,
    ArtifactFrame,
    ArtifactSkippedFrame,
    CallFrame,
    CancelFrame,
    ChildFrame,
    HelloFrame,
    NetworkObservation,
    ReplyFrame,
    ResultFrame,
    RunFrame,
)
from psych_sandbox_core.protocol.framing import FrameCeilings
from psych_sandbox_core.result import ExecutionFailure
from psych_sandbox_core.terms import ExecutionLimits

LIMITS = ExecutionLimits(wall_seconds=5.0)


def hello(protocol: int = PROTOCOL_VERSION, **report: Any) -> HelloFrame:
    return HelloFrame(type="hello", protocol=protocol, report=honest_report(**report))


def call(call_id: int = 0) -> CallFrame:
    return CallFrame(type="call", id=call_id, name="tool", arguments={})


def result(outcome: str = "returned", value_json: str | None = None, **fields: Any) -> ResultFrame:
    return ResultFrame.model_validate(
        {
            "type": "result",
            "outcome": outcome,
            "value_json": value_json,
            "error": None,
            "detail": None,
            **fields,
        }
    )


def artifact(path: str = "out/a.txt", data: bytes = b"x") -> ArtifactFrame:
    encoded = base64.b64encode(data).decode()
    return ArtifactFrame(type="artifact", path=path, offset=0, data=encoded, last=True)


def skipped(path: str = "out/b") -> ArtifactSkippedFrame:
    return ArtifactSkippedFrame(type="artifact_skipped", path=path, reason="symlink")


def collector() -> ChannelCollector:
    request = channel_request("out", CollectionLimits(1000, 10000, 10))
    assert request is not None
    return ChannelCollector(request)


def terms(**changes: Any) -> ProgramTerms:
    fields: dict[str, Any] = {
        "source": "1",
        "limits": LIMITS,
        "argument_bytes": 1000,
        "tools": ["tool"],
        "refusal": None,
    }
    fields.update(changes)
    program_fields = {"source", "command", "inputs", "preamble", "variables_json", "keep_variables"}
    fields["program"] = Program(**{key: fields.pop(key) for key in program_fields & fields.keys()})
    return ProgramTerms(**fields)


def refusal() -> ExecutionFailure:
    return ExecutionFailure.of(ErrorKind.ISOLATION_UNAVAILABLE, "not here")


def fresh() -> Conversation:
    return Conversation(Mechanisms(), host_uid=0)


def perform_sends(conversation: Conversation, actions: list[Any]) -> None:
    """What a driver does with the sends: tell the conversation they went out."""
    for action in actions:
        if isinstance(action, Send):
            conversation.sent(action.frame)


def in_state(state: State, *, with_collector: bool = True) -> Conversation:
    """A conversation brought to ``state`` through its own inputs only."""
    c = fresh()
    if state is State.AWAITING_HELLO:
        return c
    if state is State.VIOLATED:
        c.receive(call())
        return c
    c.receive(hello())
    if state is State.GRADED:
        return c
    if state is State.REFUSED:
        perform_sends(c, c.start(terms(refusal=refusal())))
        return c
    perform_sends(c, c.start(terms(collector=collector() if with_collector else None)))
    if state is State.RUNNING:
        return c
    if state is State.COLLECTING_ARTIFACTS:
        c.receive(artifact())
        return c
    assert state is State.DONE
    c.receive(result())
    return c


def cancel(call_id: int = 0) -> CancelFrame:
    return CancelFrame(type="cancel", id=call_id)


FRAMES: dict[str, Callable[[], ChildFrame]] = {
    "hello": hello,
    "call": call,
    "cancel": cancel,
    "result": result,
    "artifact": lambda: artifact("out/c.txt"),
    "artifact_skipped": skipped,
}


def test_every_state_is_reachable_and_in_the_table() -> None:
    assert set(TRANSITIONS) == set(State)
    for state in State:
        assert in_state(state).state is state


@pytest.mark.parametrize("state", list(State), ids=lambda s: s.name)
@pytest.mark.parametrize("kind", list(FRAMES))
def test_each_frame_in_each_state_moves_as_the_table_says(state: State, kind: str) -> None:
    c = in_state(state)
    actions = c.receive(FRAMES[kind]())
    expected = TRANSITIONS[state].get(kind, State.VIOLATED)
    if state is State.DONE:
        expected = State.VIOLATED  # nothing may follow the result
    if kind == "call" and expected is not State.VIOLATED:
        # A call is answered by the driver; the conversation waits in its state.
        assert actions == [Answer(call())]
    if kind == "cancel" and expected is not State.VIOLATED:
        # So is a cancel (the driver knows which calls are in flight).
        assert actions == [CancelCall(cancel())]
    assert c.state is expected
    if expected is State.VIOLATED:
        assert c.violation
        assert actions == [Close()] or state is State.VIOLATED
    else:
        assert c.violation is None


@pytest.mark.parametrize("state", list(State), ids=lambda s: s.name)
def test_the_end_of_the_channel_in_each_state(state: State) -> None:
    c = in_state(state)
    before = c.violation
    assert c.receive(None) == [Close()]
    assert c.state is TRANSITIONS[state]["end"]
    assert c.violation == before  # an end is not a violation; the exit status says how


@pytest.mark.parametrize("kind", ["artifact", "artifact_skipped"])
def test_files_the_host_did_not_ask_for_are_a_violation(kind: str) -> None:
    c = in_state(State.RUNNING, with_collector=False)
    c.receive(FRAMES[kind]())
    assert c.state is State.VIOLATED
    assert c.violation == f"a frame of type {kind!r}, but the host asked for no files"


@pytest.mark.parametrize(
    ("state", "frame", "message"),
    [
        (State.AWAITING_HELLO, call(), "expected a hello frame first, got 'call'"),
        (State.RUNNING, hello(), "unexpected 'hello' frame after the handshake"),
        (State.COLLECTING_ARTIFACTS, call(), "a call after the program's files were sent"),
        (State.COLLECTING_ARTIFACTS, cancel(), "a cancel after the program's files were sent"),
        (State.DONE, call(), "a frame of type 'call' after the result"),
    ],
)
def test_violations_say_what_happened(state: State, frame: ChildFrame, message: str) -> None:
    c = in_state(state)
    c.receive(frame)
    assert c.violation == message


@pytest.mark.parametrize("then", [result, artifact], ids=["result", "artifact"])
def test_a_reply_that_went_out_while_the_program_ended_is_no_error(
    then: Callable[[], ChildFrame],
) -> None:
    # Replies are written while frames are read: the program's end may be read first.
    c = in_state(State.RUNNING)
    c.receive(then())
    ended = c.state
    c.sent(ReplyFrame(id=0, carries="value", value_json="1"))
    assert c.state is ended and c.violation is None


def test_a_hello_of_another_protocol_version_is_a_violation() -> None:
    c = fresh()
    c.receive(hello(protocol=PROTOCOL_VERSION + 1))
    assert c.state is State.VIOLATED
    assert c.violation == (
        f"child speaks protocol {PROTOCOL_VERSION + 1}, host speaks {PROTOCOL_VERSION}"
    )
    assert c.grades == {}


def test_a_hello_is_graded_from_the_mechanisms_and_the_report() -> None:
    c = Conversation(Mechanisms(network_namespace=True), host_uid=0)
    c.receive(hello())
    assert c.state is State.GRADED
    assert c.grades[Guarantee.WALL_CLOCK] is Grade.ENFORCED
    assert c.hello is not None


def test_host_evidence_of_network_outranks_the_report() -> None:
    c = Conversation(Mechanisms(network_namespace=True), host_uid=0)
    c.network_reached()
    assert c.grades == {}  # nothing graded yet: nothing to weaken
    c.receive(hello())
    c.network_reached()
    assert c.grades[Guarantee.NETWORK] is Grade.UNAVAILABLE


def test_reported_connections_count_the_probes_own() -> None:
    c = fresh()
    assert c.reported_connections() == 0
    network = NetworkObservation(ipv4="connected", ipv6="connected", interfaces_up=[])
    c.receive(hello(network=network))
    assert c.reported_connections() == 2


def test_starting_sends_the_program_under_the_execution_ceilings() -> None:
    c = in_state(State.GRADED)
    wanted = collector()
    actions = c.start(terms(collector=wanted, end_marker="<end-marker-0123456789>"))
    assert actions[0] == Narrow(
        FrameCeilings.for_execution(
            argument_bytes=1000, return_value_bytes=LIMITS.return_value_bytes
        )
    )
    assert isinstance(actions[1], Send)
    run = actions[1].frame
    assert isinstance(run, RunFrame)
    assert (run.source, run.tools, run.end_marker) == ("1", ["tool"], "<end-marker-0123456789>")
    assert run.limits.argument_bytes == 1000
    assert run.limits.return_value_bytes == LIMITS.return_value_bytes
    assert run.artifacts == wanted.request
    # Given only once it went out.
    assert c.state is State.GRADED and not c.ran
    c.sent(run)
    assert c.state is State.RUNNING and c.ran


def test_a_refusal_is_an_abort_and_is_recorded() -> None:
    c = in_state(State.GRADED)
    actions = c.start(terms(refusal=refusal()))
    assert actions == [Send(AbortFrame(reason="not here")), Close()]
    assert c.refusal == refusal()
    perform_sends(c, actions)
    assert c.state is State.REFUSED and not c.ran


def test_a_cancellation_before_the_program_is_an_abort_but_not_a_refusal() -> None:
    c = in_state(State.GRADED)
    actions = c.start(terms(cancelled=True))
    assert actions == [Send(AbortFrame(reason="cancelled before the program ran")), Close()]
    assert c.refusal is None


def test_a_run_frame_lost_on_the_way_leaves_the_program_not_run() -> None:
    c = in_state(State.GRADED)
    c.start(terms())
    c.receive(None)  # the channel broke before the run frame went out
    assert c.state is State.DONE and not c.ran


def test_a_returned_value_is_decoded_by_the_driver_before_the_result_counts() -> None:
    c = in_state(State.RUNNING, with_collector=False)
    frame = result(value_json="[1, 2]")
    assert c.receive(frame) == [DecodeValue(frame, LIMITS.return_value_bytes)]
    assert c.state is State.RUNNING and c.result is None
    assert c.value_decoded([1, 2]) == [Close()]
    assert (c.state, c.result, c.value) == (State.DONE, frame, [1, 2])


def test_a_value_the_driver_could_not_decode_is_a_violation() -> None:
    c = in_state(State.RUNNING, with_collector=False)
    c.receive(result(value_json="{"))
    c.violate("a value in a frame is not JSON")
    assert (c.state, c.result) == (State.VIOLATED, None)
    assert c.violation == "a value in a frame is not JSON"


def test_a_raised_outcome_without_an_error_is_a_violation() -> None:
    c = in_state(State.RUNNING)
    c.receive(result(outcome="raised"))
    assert c.violation == "a result frame with outcome 'raised' carries no error"


def test_variables_the_run_frame_did_not_ask_for_are_a_violation() -> None:
    # The program can write its own result frame: variables nobody asked for, or sent with
    # a failure, are not taken.
    for keep, outcome in ((False, "returned"), (True, "invalid_output")):
        c = fresh()
        c.receive(hello())
        perform_sends(c, c.start(terms(keep_variables=keep)))
        c.receive(result(outcome=outcome, variables_json="{}", detail="d"))
        assert c.violation == "a result frame carries variables the run frame did not ask for"
    asked = fresh()
    asked.receive(hello())
    perform_sends(asked, asked.start(terms(keep_variables=True)))
    frame = result(value_json="1", variables_json='{"a": 1}')
    assert asked.receive(frame) == [DecodeValue(frame, LIMITS.return_value_bytes)]


def test_a_collecting_runs_channel_is_held_after_its_result() -> None:
    c = in_state(State.COLLECTING_ARTIFACTS)
    assert c.receive(result()) == []  # no Close: read to its end after the teardown
    assert c.state is State.DONE
    assert c.collector is not None
    assert [f.path for f in c.collector.collection().files] == ["out/a.txt"]


def test_a_codec_violation_after_the_result_says_so() -> None:
    c = in_state(State.DONE)
    c.violate("malformed frame from child")
    assert c.violation == "after the result: malformed frame from child"


def test_an_artifact_the_collector_refuses_is_a_violation() -> None:
    c = in_state(State.RUNNING)
    c.receive(artifact(path="elsewhere/x"))
    assert c.state is State.VIOLATED and c.violation


def test_the_first_violation_is_the_one_reported() -> None:
    c = in_state(State.RUNNING)
    c.receive(hello())
    first = c.violation
    c.violate("later")
    c.receive(call())
    assert c.violation == first and c.state is State.VIOLATED


def test_a_reply_is_a_frame_of_the_running_state_only() -> None:
    c = in_state(State.RUNNING)
    c.sent(ReplyFrame(id=0, carries="value", value_json="1"))
    assert c.state is State.RUNNING
    with pytest.raises(AssertionError):
        in_state(State.GRADED).sent(ReplyFrame(id=0, carries="value", value_json="1"))


INPUTS: list[Callable[[Conversation], object]] = [
    *(lambda c, k=k: c.receive(FRAMES[k]()) for k in FRAMES),
    lambda c: c.receive(None),
    lambda c: c.violate("codec"),
    lambda c: c.receive(result(value_json="1")),
]


@given(st.lists(st.sampled_from(range(len(INPUTS))), max_size=12), st.booleans())
def test_any_sequence_of_child_inputs_keeps_the_invariants(steps: list[int], refuse: bool) -> None:
    c = fresh()
    graded_once = False
    for step in steps:
        was = c.state
        INPUTS[step](c)
        if c.state is State.GRADED and not graded_once:
            graded_once = True
            perform_sends(c, c.start(terms(refusal=refusal() if refuse else None)))
        # A violation is final, and only a violation carries a message.
        if was is State.VIOLATED:
            assert c.state is State.VIOLATED
        assert (c.violation is not None) == (c.state is State.VIOLATED)
        # The program ran only if a run frame went out, and never after a refusal.
        assert not (c.ran and c.refusal is not None)
        # A result is accepted only in the done state (and kept if a violation follows).
        if c.result is not None:
            assert c.state in (State.DONE, State.VIOLATED)


@pytest.mark.parametrize("module", ["_engine.conversation", "_engine.outcome"])
def test_the_conversation_and_the_outcome_do_no_io(module: str) -> None:
    """Judged from the source: nothing awaits, and nothing that does I/O or reads a clock is
    imported (a driver, a remote transport and a test drive the same objects)."""
    import ast
    from importlib import import_module

    source = Path(import_module(f"psych_sandbox_core.{module}").__file__ or "").read_text()
    tree = ast.parse(source)
    asynchronous = [
        node
        for node in ast.walk(tree)
        if isinstance(node, (ast.AsyncFunctionDef, ast.Await, ast.AsyncFor, ast.AsyncWith))
    ]
    assert asynchronous == []
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
    doing_io = {"anyio", "asyncio", "trio", "socket", "os", "time", "subprocess", "threading"}
    assert imported & doing_io == set()
