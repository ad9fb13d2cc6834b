"""What an execution's ending means: refusal, classification, withholding and the result.

Pure functions over one frozen record of what happened (:class:`Happened`), which the host
driver fills in once the child is gone. Nothing here performs I/O or reads a clock; the
only asynchronous step of building a result, preserving its output (attachments.py), is the
driver's, between :func:`failure_of` and :func:`assemble`.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._output.preservation import Preserved
from ..errors import ErrorKind, ProtocolViolation
from ..grading import Grade, Guarantee, Level, level_at_least, level_of
from ..kit.exit_status import ExitStatus
from ..protocol import ResultFrame
from ..protocol.codec import decode_value_json
from ..protocol.limits import MAX_SOURCE_BYTES
from ..result import CallRecord, ExecutionFailure, ExecutionResult, Usage
from ..terms import ExecutionLimits
from .plan import ExecutionPlan

#: Failures under which nothing the program produced is shown: it was produced under
#: weaker terms than the execution's.
WITHHOLDING = frozenset({ErrorKind.ISOLATION_UNAVAILABLE, ErrorKind.NETWORK_NOT_ALLOWED})


@dataclass(frozen=True)
class Happened:
    """Everything the outcome of one execution depends on, recorded once it is over."""

    plan: ExecutionPlan
    #: The child's grades, weakened by host-side evidence; empty when it never reported.
    grades: Mapping[Guarantee, Grade]
    #: The program was sent to the child.
    ran: bool = False
    cancelled: bool = False
    #: The program was refused before it ran (not for a cancellation).
    refusal: ExecutionFailure | None = None
    #: How the child broke the protocol (the first violation).
    violation: str | None = None
    #: The child never connected or reported in time.
    startup_failure: str | None = None
    #: The backend could not start a child here at all.
    backend_failure: ExecutionFailure | None = None
    timed_out: bool = False
    #: Host work on the program's behalf and its own CPU together reached its CPU limit.
    cpu_spent_with_host: bool = False
    #: Connections the host's loopback listeners saw while the program ran.
    connections_during_run: int = 0
    result: ResultFrame | None = None
    #: The value the result frame returns, parsed once when it was checked.
    value: Any = None
    status: ExitStatus | None = None
    calls: Sequence[dict[str, Any]] = ()
    #: CPU the host spent on the program's behalf; None when no call server was bound.
    host_cpu_seconds: float | None = None
    wall_seconds: float = 0.0
    #: The child's CPU seconds and peak memory, as the backend measured them.
    usage: tuple[float | None, int | None] | None = None


def refusal_of(plan: ExecutionPlan, grades: Mapping[Guarantee, Grade]) -> ExecutionFailure | None:
    """Why the program must not be sent to a child graded ``grades``, or None."""
    program = plan.program
    return _terms_refusal(plan, grades) or _unsendable_source(program.source, program.caller_chars)


def _terms_refusal(
    plan: ExecutionPlan, grades: Mapping[Guarantee, Grade]
) -> ExecutionFailure | None:
    if plan.refusal is not None:
        return plan.refusal
    level = level_of(grades)
    if (
        not plan.network_allowed
        and grades.get(Guarantee.NETWORK) is Grade.UNAVAILABLE
        and (level_at_least(plan.required_level, Level.ISOLATED))
    ):
        return ExecutionFailure.of(
            ErrorKind.ISOLATION_UNAVAILABLE,
            "the sandbox could not deny network access, which this execution requires",
        )
    if not level_at_least(level, plan.required_level):
        return ExecutionFailure.of(
            ErrorKind.ISOLATION_UNAVAILABLE,
            f"this execution requires the {plan.required_level.value} level but the backend "
            f"reached only {level.value} ({_weak_grades(grades)})",
        )
    if not level_at_least(level, plan.claimed_level):
        return ExecutionFailure.of(
            ErrorKind.ISOLATION_UNAVAILABLE,
            f"the backend claimed the {plan.claimed_level.value} level at selection but its "
            f"report reached only {level.value} ({_weak_grades(grades)}); not running under "
            "weaker terms",
        )
    return None


def _unsendable_source(source: str, given: int = 0) -> ExecutionFailure | None:
    """A program text no run frame can carry: refused as data, before anything runs.
    ``given``: characters of the caller's preamble and variables, counted with it."""
    if len(source) + given > MAX_SOURCE_BYTES:
        besides = f" and {given} of preamble and variables" if given else ""
        return ExecutionFailure.of(
            ErrorKind.PROGRAM_REJECTED,
            f"the program text is {len(source)} characters{besides}; at most "
            f"{MAX_SOURCE_BYTES} are accepted; nothing was run",
        )
    try:
        source.encode("utf-8")
    except UnicodeEncodeError as exc:
        return ExecutionFailure.of(
            ErrorKind.PROGRAM_REJECTED,
            f"the program text is not valid Unicode at character {exc.start} (a lone "
            "surrogate); nothing was run",
        )
    return None


def _weak_grades(grades: Mapping[Guarantee, Grade]) -> str:
    weak = [
        f"{g.value}={grades[g].value}" for g in Guarantee if grades.get(g) is not Grade.ENFORCED
    ]
    return ", ".join(weak) or "all enforced"


def failure_of(happened: Happened) -> ExecutionFailure | None:
    """How the execution failed, or None when the program returned. The order is the order
    of precedence: what makes the output untrustworthy comes before what the program did."""
    h, plan, status = happened, happened.plan, happened.status
    if h.backend_failure is not None:
        return h.backend_failure
    if h.cancelled:
        return ExecutionFailure.of(
            ErrorKind.CANCELLED,
            "the execution was cancelled before it finished"
            + ("" if h.ran else "; the program never ran"),
        )
    if h.refusal is not None:
        return h.refusal
    if h.violation is not None:
        return ExecutionFailure.of(ErrorKind.PROTOCOL_ERROR, h.violation)
    if h.startup_failure is not None:
        return ExecutionFailure.of(ErrorKind.BACKEND_NOT_READY, h.startup_failure)
    if h.connections_during_run and not plan.network_allowed:
        # The program reached a listener while it ran, under terms that denied it network:
        # what it produced was produced under weaker terms.
        return ExecutionFailure.of(
            ErrorKind.ISOLATION_UNAVAILABLE,
            "a loopback listener the host opened for this execution saw a connection while "
            "the program ran, though network access was not granted; the output is withheld",
        )
    if h.grades and not level_at_least(level_of(h.grades), plan.claimed_level):
        # Evidence gathered while the program ran (a listener saw a connection) weakened the
        # terms after the fact: the output is withheld.
        return ExecutionFailure.of(
            ErrorKind.ISOLATION_UNAVAILABLE,
            "evidence gathered during the run showed weaker isolation than the backend "
            f"claimed ({_weak_grades(h.grades)}); the output is withheld",
        )
    if h.timed_out:
        return ExecutionFailure.of(
            ErrorKind.TIMEOUT,
            f"the {_what(plan)} exceeded its wall-clock limit of {plan.limits.wall_seconds:g} s "
            "and was killed",
        )
    if h.cpu_spent_with_host and h.host_cpu_seconds is not None:
        return ExecutionFailure.of(
            ErrorKind.TIMEOUT,
            f"the {_what(plan)} exceeded its CPU limit of {plan.limits.cpu_seconds} s and was "
            f"killed: {h.host_cpu_seconds:.2f} s of it were spent by the host searching "
            "tool results on its behalf (read_tool_output patterns)",
        )
    if h.result is not None:
        return _result_failure(h.result)
    if status is not None and status.failure_hint is not None:
        # The backend's runtime knows how the child ended (e.g. an OOM kill of a container).
        return ExecutionFailure.of(*status.failure_hint)
    if not h.ran:
        how = status.describe() if status is not None else "did not start"
        return ExecutionFailure.of(
            ErrorKind.WORKER_EXIT, f"the sandboxed interpreter {how} before the handshake"
        )
    if status is not None and _cpu_exhausted(status, plan.limits):
        return ExecutionFailure.of(
            ErrorKind.TIMEOUT,
            f"the {_what(plan)} exceeded its CPU limit of {plan.limits.cpu_seconds} s and was "
            "killed",
        )
    if status is not None and status.signal == signal.SIGABRT:
        return ExecutionFailure.of(
            ErrorKind.ABORT,
            "the program aborted (SIGABRT: os.abort() or a failed assertion in native code) "
            "before returning a result",
        )
    how = status.describe() if status is not None else "ended"
    return ExecutionFailure.of(
        ErrorKind.WORKER_EXIT, f"the process running the program {how} before returning a result"
    )


def _what(plan: ExecutionPlan) -> str:
    return plan.program.what


def _result_failure(result: ResultFrame) -> ExecutionFailure | None:
    """What the program's own result frame says (the conversation checked its shape)."""
    if result.outcome in ("returned", "exited"):
        return None  # a command's exit status, whatever it is, is its answer (exit_status)
    if result.outcome == "raised" and result.error is not None:
        error = result.error
        kind = ErrorKind.MEMORY_LIMIT if error.type == "MemoryError" else ErrorKind.EXCEPTION
        return ExecutionFailure.of(
            kind,
            f"{error.type}: {error.message}" if error.message else error.type,
            traceback=error.traceback,
            line=error.line,
            column=error.column,
            exception_type=error.type,
        )
    kind = ErrorKind.OUTPUT_LIMIT
    if result.outcome == "invalid_output":
        kind = ErrorKind.INVALID_OUTPUT
    return ExecutionFailure.of(kind, result.detail or result.outcome)


def _cpu_exhausted(status: ExitStatus, limits: ExecutionLimits) -> bool:
    if status.signal is None:
        return False  # (and no POSIX signal names to compare with on Windows)
    if status.signal == signal.SIGXCPU:
        return True
    # The hard limit's SIGKILL: the tree's CPU, or failing that wait4's lower bound, shows
    # the limit was reached.
    spent = max(status.cpu_seconds or 0.0, status.reaped_cpu_seconds or 0.0)
    return status.signal == signal.SIGKILL and spent >= limits.cpu_seconds


def withheld(failure: ExecutionFailure | None) -> bool:
    """Whether this failure hides the program's output."""
    return failure is not None and failure.kind in WITHHOLDING


def returned_json(happened: Happened, failure: ExecutionFailure | None) -> str | None:
    """The JSON text of the value the program returned, when it is shown."""
    result = happened.result
    if failure is None and result is not None:
        return result.value_json
    return None


def exit_status_of(happened: Happened, failure: ExecutionFailure | None) -> int | None:
    """A command's exit status when it ran to its own exit and that is shown; else None."""
    result = happened.result
    if failure is None and result is not None and result.outcome == "exited":
        return result.exit_status
    return None


def assemble(
    happened: Happened, failure: ExecutionFailure | None, kept: Preserved
) -> ExecutionResult:
    """The result, from what happened, its failure and its preserved output."""
    h, plan = happened, happened.plan
    # A failure (preservation's own included) shows no value.
    value = h.value if returned_json(h, failure) is not None else None
    cpu, peak = h.usage if h.usage is not None else (None, None)
    return ExecutionResult(
        stdout=kept.stdout.text,
        stderr=kept.stderr.text,
        stdout_info=kept.stdout_info,
        stderr_info=kept.stderr_info,
        run_id=None if plan.output is None else plan.output.run_id,
        tenant=None if plan.output is None else plan.output.tenant,
        attachments=kept.attachments,
        artifacts=kept.artifacts,
        skipped_artifacts=kept.skipped,
        skipped_artifacts_unlisted=kept.skipped_unlisted,
        return_value=value,
        exit_status=exit_status_of(h, failure),
        variables=_variables(h, value_shown=returned_json(h, failure) is not None),
        error=failure,
        level=level_of(h.grades),
        grades={g: h.grades[g] for g in Guarantee if g in h.grades},
        usage=Usage(
            wall_seconds=round(h.wall_seconds, 6),
            cpu_seconds=cpu,
            peak_memory_bytes=peak,
            measured_by="none" if cpu is None else "host",
            host_cpu_seconds=(
                round(h.host_cpu_seconds, 6) if h.host_cpu_seconds is not None else 0.0
            ),
        ),
        profile=plan.profile,
        backend=plan.backend_identity,
        calls=[CallRecord.model_validate(call) for call in h.calls],
    )


def _variables(h: Happened, *, value_shown: bool) -> dict[str, Any] | None:
    """The program's variables, when asked for and it returned (see RunFrame.keep_variables).
    The child's text is hostile input: held to the return value's cap, decoded as a value is,
    and an object or nothing."""
    text = None if h.result is None else h.result.variables_json
    if not (h.plan.program.keep_variables and value_shown) or text is None:
        return None
    try:
        variables = decode_value_json(text, h.plan.limits.return_value_bytes)
    except ProtocolViolation:
        return None
    if not isinstance(variables, dict):
        return None
    return variables
