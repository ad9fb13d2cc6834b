"""The outcome as pure functions over a record of what happened: refusal, classification and
its precedence, withholding, and assembling the result. No process, no I/O."""

from __future__ import annotations

import dataclasses
import signal
from typing import Any

import pytest

from psych_sandbox_core._engine.outcome import (
    Happened,
    assemble,
    failure_of,
    refusal_of,
    returned_json,
    withheld,
)
from psych_sandbox_core._engine.plan import ExecutionPlan
from psych_sandbox_core._engine.program import Program
from psych_sandbox_core._output.capture import StreamCapture, make_preview
from psych_sandbox_core._output.preservation import Preserved
from psych_sandbox_core.errors import ErrorKind
from psych_sandbox_core.grading import Grade, Guarantee, Level
from psych_sandbox_core.kit.exit_status import ExitStatus
from psych_sandbox_core.protocol import ProgramError, ResultFrame
from psych_sandbox_core.protocol.limits import MAX_SOURCE_BYTES
from psych_sandbox_core.result import BackendIdentity, ExecutionFailure, StreamOutput
from psych_sandbox_core.terms import ExecutionLimits

ALL_ENFORCED = {g: Grade.ENFORCED for g in Guarantee}
LIMITS = ExecutionLimits(wall_seconds=7.0, cpu_seconds=3)


def plan(**changes: Any) -> ExecutionPlan:
    fields: dict[str, Any] = {
        "source": "1",
        "limits": LIMITS,
        "profile": "p",
        "backend_identity": BackendIdentity(id="b", distribution=None, version=None),
        "claimed_level": Level.ISOLATED,
    }
    fields.update(changes)
    program_fields = {"source", "command", "inputs", "preamble", "variables_json", "keep_variables"}
    fields["program"] = Program(**{key: fields.pop(key) for key in program_fields & fields.keys()})
    return ExecutionPlan(**fields)


def result(outcome: str = "returned", **fields: Any) -> ResultFrame:
    return ResultFrame.model_validate(
        {
            "type": "result",
            "outcome": outcome,
            "value_json": None,
            "error": None,
            "detail": None,
            **fields,
        }
    )


def status(code: int | None = 0, sig: int | None = None, **fields: Any) -> ExitStatus:
    return ExitStatus(code=code, signal=sig, cpu_seconds=None, peak_memory_bytes=None, **fields)


def happened(**changes: Any) -> Happened:
    fields: dict[str, Any] = {
        "plan": plan(),
        "grades": ALL_ENFORCED,
        "ran": True,
        "status": status(),
        "result": result(value_json="5"),
        "value": 5,
    }
    fields.update(changes)
    return Happened(**fields)


def kind_of(h: Happened) -> ErrorKind | None:
    failure = failure_of(h)
    return None if failure is None else failure.kind


def test_the_record_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        happened().ran = False  # type: ignore[misc]


def test_a_returned_result_is_no_failure() -> None:
    assert failure_of(happened()) is None


RAISED = ProgramError(type="ValueError", message="bad", traceback="tb", line=1, column=2)


@pytest.mark.parametrize(
    ("changes", "kind"),
    [
        (
            {"backend_failure": ExecutionFailure.of(ErrorKind.BACKEND_NOT_READY, "x")},
            ErrorKind.BACKEND_NOT_READY,
        ),
        ({"cancelled": True}, ErrorKind.CANCELLED),
        (
            {"refusal": ExecutionFailure.of(ErrorKind.PROGRAM_REJECTED, "x")},
            ErrorKind.PROGRAM_REJECTED,
        ),
        ({"violation": "bad frame"}, ErrorKind.PROTOCOL_ERROR),
        ({"startup_failure": "slow"}, ErrorKind.BACKEND_NOT_READY),
        ({"connections_during_run": 1}, ErrorKind.ISOLATION_UNAVAILABLE),
        (
            {"grades": {**ALL_ENFORCED, Guarantee.NETWORK: Grade.UNAVAILABLE}},
            ErrorKind.ISOLATION_UNAVAILABLE,
        ),
        ({"timed_out": True}, ErrorKind.TIMEOUT),
        ({"cpu_spent_with_host": True, "host_cpu_seconds": 2.5}, ErrorKind.TIMEOUT),
        ({"result": result("raised", error=RAISED)}, ErrorKind.EXCEPTION),
        (
            {"result": result("raised", error=RAISED.model_copy(update={"type": "MemoryError"}))},
            ErrorKind.MEMORY_LIMIT,
        ),
        ({"result": result("invalid_output", detail="set")}, ErrorKind.INVALID_OUTPUT),
        ({"result": result("output_limit")}, ErrorKind.OUTPUT_LIMIT),
        (
            {"result": None, "status": status(failure_hint=(ErrorKind.MEMORY_LIMIT, "oom"))},
            ErrorKind.MEMORY_LIMIT,
        ),
        ({"result": None, "ran": False}, ErrorKind.WORKER_EXIT),
        ({"result": None, "status": status(None, signal.SIGXCPU)}, ErrorKind.TIMEOUT),
        (
            {"result": None, "status": status(None, signal.SIGKILL, reaped_cpu_seconds=3.0)},
            ErrorKind.TIMEOUT,
        ),
        (
            {"result": None, "status": status(None, signal.SIGKILL, reaped_cpu_seconds=1.0)},
            ErrorKind.WORKER_EXIT,
        ),
        ({"result": None, "status": status(None, signal.SIGABRT)}, ErrorKind.ABORT),
        ({"result": None, "status": status(3)}, ErrorKind.WORKER_EXIT),
        ({"result": None, "status": None}, ErrorKind.WORKER_EXIT),
    ],
)
def test_each_ending_has_its_kind(changes: dict[str, Any], kind: ErrorKind) -> None:
    assert kind_of(happened(**changes)) is kind


# Each entry outranks every one after it: the order is what makes an output untrustworthy
# before what the program did.
PRECEDENCE: list[tuple[str, dict[str, Any], ErrorKind]] = [
    (
        "backend",
        {"backend_failure": ExecutionFailure.of(ErrorKind.BACKEND_NOT_READY, "x")},
        ErrorKind.BACKEND_NOT_READY,
    ),
    ("cancelled", {"cancelled": True}, ErrorKind.CANCELLED),
    (
        "refusal",
        {"refusal": ExecutionFailure.of(ErrorKind.PROGRAM_REJECTED, "x")},
        ErrorKind.PROGRAM_REJECTED,
    ),
    ("violation", {"violation": "v"}, ErrorKind.PROTOCOL_ERROR),
    ("startup", {"startup_failure": "s"}, ErrorKind.BACKEND_NOT_READY),
    ("network", {"connections_during_run": 2}, ErrorKind.ISOLATION_UNAVAILABLE),
    ("timeout", {"timed_out": True}, ErrorKind.TIMEOUT),
    ("host cpu", {"cpu_spent_with_host": True, "host_cpu_seconds": 1.0}, ErrorKind.TIMEOUT),
    ("raised", {"result": result("raised", error=RAISED)}, ErrorKind.EXCEPTION),
]


@pytest.mark.parametrize("index", range(len(PRECEDENCE)), ids=[p[0] for p in PRECEDENCE])
def test_what_ranks_first_decides(index: int) -> None:
    changes: dict[str, Any] = {}
    for _, more, _ in PRECEDENCE[index:]:
        changes.update(more)
    assert kind_of(happened(**changes)) is PRECEDENCE[index][2]


def test_messages_name_the_limits_and_what_never_ran() -> None:
    failure = failure_of(happened(timed_out=True))
    assert failure is not None and "7 s" in failure.message
    failure = failure_of(happened(cancelled=True, ran=False))
    assert failure is not None and failure.message.endswith("; the program never ran")
    failure = failure_of(happened(cpu_spent_with_host=True, host_cpu_seconds=2.5))
    assert failure is not None and "2.50 s" in failure.message
    failure = failure_of(happened(result=None, ran=False, status=status(None, signal.SIGKILL)))
    assert failure is not None
    assert failure.message == "the sandboxed interpreter killed by SIGKILL before the handshake"
    failure = failure_of(happened(result=result("raised", error=RAISED)))
    assert failure is not None
    assert (failure.message, failure.line, failure.column) == ("ValueError: bad", 1, 2)


def test_network_reached_under_granted_network_is_not_withheld() -> None:
    h = happened(connections_during_run=1, plan=plan(network_allowed=True))
    assert failure_of(h) is None


def test_no_grades_means_no_level_comparison() -> None:
    # A child that never reported has no grades; its failure is about that, not the level.
    h = happened(grades={}, ran=False, result=None, status=status(1))
    assert kind_of(h) is ErrorKind.WORKER_EXIT


# ---------------------------------------------------------------- refusal


def test_a_plan_refusal_comes_first() -> None:
    refused = ExecutionFailure.of(ErrorKind.NETWORK_NOT_ALLOWED, "no")
    assert refusal_of(plan(refusal=refused), ALL_ENFORCED) == refused


def test_network_unavailable_refuses_an_isolated_requirement() -> None:
    grades = {**ALL_ENFORCED, Guarantee.NETWORK: Grade.UNAVAILABLE}
    failure = refusal_of(plan(required_level=Level.ISOLATED, claimed_level=Level.NONE), grades)
    assert failure is not None and "could not deny network access" in failure.message
    granted = refusal_of(
        plan(required_level=Level.ISOLATED, claimed_level=Level.NONE, network_allowed=True),
        grades,
    )
    assert granted is None or "could not deny network access" not in granted.message


def test_a_level_below_the_requirement_or_the_claim_is_refused() -> None:
    weak = {**ALL_ENFORCED, Guarantee.FILESYSTEM: Grade.UNAVAILABLE}
    failure = refusal_of(plan(required_level=Level.ISOLATED, claimed_level=Level.NONE), weak)
    assert failure is not None and "requires the isolated level" in failure.message
    assert "filesystem=unavailable" in failure.message
    failure = refusal_of(plan(claimed_level=Level.ISOLATED), weak)
    assert failure is not None and "claimed the isolated level at selection" in failure.message
    assert refusal_of(plan(), ALL_ENFORCED) is None


def test_a_source_no_run_frame_can_carry_is_rejected() -> None:
    failure = refusal_of(plan(source="x" * (MAX_SOURCE_BYTES + 1)), ALL_ENFORCED)
    assert failure is not None and failure.kind is ErrorKind.PROGRAM_REJECTED
    failure = refusal_of(plan(source="a\ud800"), ALL_ENFORCED)
    assert failure is not None and "character 1" in failure.message


# ---------------------------------------------------------------- withholding and assembly


def test_withholding_follows_the_failure_kind() -> None:
    assert withheld(ExecutionFailure.of(ErrorKind.ISOLATION_UNAVAILABLE, "x"))
    assert withheld(ExecutionFailure.of(ErrorKind.NETWORK_NOT_ALLOWED, "x"))
    assert not withheld(ExecutionFailure.of(ErrorKind.TIMEOUT, "x"))
    assert not withheld(None)


def kept(**changes: Any) -> Preserved:
    capture = StreamCapture(100)
    capture.end()
    info = StreamOutput.model_validate(
        {
            "total_bytes": 0,
            "captured_bytes": 0,
            "dropped_bytes": 0,
            "total_lines": 0,
            "shown_bytes": 0,
            "omitted_bytes": 0,
            "omitted_lines": 0,
        }
    )
    preview = make_preview(capture, 100)
    return Preserved(stdout=preview, stderr=preview, stdout_info=info, stderr_info=info, **changes)


def test_the_value_is_shown_only_without_a_failure() -> None:
    h = happened()
    assert returned_json(h, None) == "5"
    assert assemble(h, None, kept()).return_value == 5
    failure = ExecutionFailure.of(ErrorKind.ARTIFACTS_UNAVAILABLE, "gone")
    assert returned_json(h, failure) is None
    assert assemble(h, failure, kept()).return_value is None


CALL = {"name": "t", "outcome": "ok", "carries": "value", "argument_bytes": 2, "result_bytes": 1}


def test_assembly_reports_grades_level_usage_and_calls() -> None:
    h = happened(
        usage=(1.25, 4096),
        host_cpu_seconds=0.1234567,
        wall_seconds=1.0000004,
        calls=[CALL],
        grades={Guarantee.NETWORK: Grade.ENFORCED, Guarantee.FILESYSTEM: Grade.UNVERIFIED},
    )
    r = assemble(h, None, kept())
    assert list(r.grades) == ["filesystem", "network"]  # in the guarantees' own order
    assert r.level == "none"
    assert (r.usage.cpu_seconds, r.usage.peak_memory_bytes, r.usage.measured_by) == (
        1.25,
        4096,
        "host",
    )
    assert (r.usage.host_cpu_seconds, r.usage.wall_seconds) == (0.123457, 1.0)
    assert [call.model_dump() for call in r.calls] == [CALL]
    unmeasured = assemble(happened(usage=None), None, kept())
    assert unmeasured.usage.measured_by == "none" and unmeasured.usage.host_cpu_seconds == 0.0
