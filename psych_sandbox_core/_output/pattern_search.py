"""Searching bytes with a caller-supplied regular expression without risking the host.

A pattern comes from a model and can backtrack for longer than the universe has left.
Python's ``re`` holds the GIL and cannot be interrupted, so the search runs in a short-lived
child interpreter, killed from outside at a wall-clock deadline, and limited by the kernel in
CPU and memory: before it reads the pattern the child arms a CPU-time timer whose signal kills
it (no Python handler is involved, so a match holding the interpreter lock cannot stop it),
with RLIMIT_CPU as the backstop, and caps its address space with RLIMIT_AS. The host reaps it
with wait4, so the CPU it cost is the kernel's count, not the child's; the caller charges it to
whoever the search was for. The host only ever sees a bounded list of matches.
"""

from __future__ import annotations

import json
import math
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import anyio

from ..kit.exit_status import ExitStatus
from ..kit.posix.process import ManagedProcess

#: Wall-clock deadline for one search, including the child's start-up (tens of ms).
DEFAULT_DEADLINE_SECONDS = 5.0
#: Most matches one search returns; the rest are counted as not shown.
DEFAULT_MAX_MATCHES = 100
#: Longest pattern accepted (a model's search, not a program).
MAX_PATTERN_CHARS = 1000
#: Characters of context returned around each match (the matching line, clipped).
LINE_CLIP = 400
#: Address space for the searching child when the caller names none: enough for the data and
#: re's state, no more.
CHILD_MEMORY_BYTES = 1024 * 1024 * 1024
#: Most output a child may send: bounded by max_matches; more is a broken child.
MAX_OUTPUT_BYTES = 64 * 1024 * 1024

# argv: address-space bytes, CPU seconds (0: none). Limits are only ever lowered: each is
# clamped against what the child inherited. The CPU timer is armed for what is left after
# start-up; the rlimit, counted from exec, is a whole second above it (SIGXCPU), and the hard
# limit a second above that (SIGKILL) in case the timer's signal was somehow survived.
_CHILD = r"""
import json, math, re, resource, signal, sys, time
memory, cpu = int(sys.argv[1]), float(sys.argv[2])
def lower(which, soft, hard):
    old_soft, old_hard = resource.getrlimit(which)
    inf = resource.RLIM_INFINITY
    hard = hard if old_hard == inf else min(hard, old_hard)
    soft = min(soft, hard) if old_soft == inf else min(soft, old_soft, hard)
    resource.setrlimit(which, (soft, hard))
try:
    lower(resource.RLIMIT_AS, memory, memory)
except (ValueError, OSError):
    pass  # a platform that maps more than any practical cap at exec
if cpu > 0:
    whole = math.ceil(cpu) + 1
    lower(resource.RLIMIT_CPU, whole, whole + 1)
    signal.signal(signal.SIGPROF, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_PROF, max(cpu - time.process_time(), 0.001))
header = json.loads(sys.stdin.buffer.readline())
data = sys.stdin.buffer.read().decode("utf-8", errors="replace")
try:
    rx = re.compile(header["pattern"], re.IGNORECASE if header["ignore_case"] else 0)
except re.error as exc:
    sys.stdout.write(json.dumps({"error": "invalid pattern: %s" % exc}))
    sys.exit(0)
found, total, clip = [], 0, header["clip"]
for m in rx.finditer(data):
    total += 1
    if len(found) < header["max"]:
        start = data.rfind("\n", 0, m.start()) + 1
        end = data.find("\n", m.end())
        end = len(data) if end < 0 else end
        line = data[start:min(end, start + clip)]
        number = data.count("\n", 0, m.start()) + 1
        found.append({"start": m.start(), "end": m.end(), "line_number": number,
                      "match": m.group(0)[:clip], "line": line})
sys.stdout.write(json.dumps({"matches": found, "total": total}))
"""

_NOT_REAPED = ExitStatus(code=None, signal=None, cpu_seconds=None, peak_memory_bytes=None)
#: Signals that mean the child spent its CPU allowance: the timer's, the soft rlimit's.
_CPU_SIGNALS = frozenset({signal.SIGPROF, signal.SIGXCPU})

#: Why a search failed: a bad pattern, the wall-clock deadline, the CPU allowance, memory.
FailureReason = Literal["invalid", "deadline", "cpu", "memory"]


class PatternSearchError(ValueError):
    """The pattern is invalid, or the search ran past its deadline, CPU or memory."""

    def __init__(
        self, message: str, reason: FailureReason = "invalid", cpu_seconds: float = 0.0
    ) -> None:
        super().__init__(message)
        self.reason: FailureReason = reason
        #: CPU the search child cost before it failed (0 when none was started).
        self.cpu_seconds = cpu_seconds


@dataclass(frozen=True)
class Match:
    #: Character offsets into the text (the bytes decoded as UTF-8, errors replaced).
    start: int
    end: int
    line_number: int
    match: str
    #: The line containing the match, clipped.
    line: str


@dataclass(frozen=True)
class SearchResult:
    matches: list[Match]
    #: Every match in the text, including those past ``max_matches``.
    total_matches: int
    #: CPU seconds the search child cost, as the kernel accounted it when the host reaped it.
    cpu_seconds: float = 0.0


async def search_bytes(
    data: bytes,
    pattern: str,
    *,
    ignore_case: bool = False,
    max_matches: int = DEFAULT_MAX_MATCHES,
    deadline_seconds: float = DEFAULT_DEADLINE_SECONDS,
    cpu_seconds: float | None = None,
    memory_bytes: int | None = None,
    on_cost: Callable[[float], None] | None = None,
) -> SearchResult:
    """All matches of ``pattern`` in ``data`` (as UTF-8 text), found in a child process.

    ``cpu_seconds`` caps the child's CPU time (None: the deadline alone bounds it) and
    ``memory_bytes`` its address space (None: CHILD_MEMORY_BYTES). ``on_cost`` is called with
    the child's CPU seconds once it is reaped, whatever the outcome, cancellation included.
    """
    if not isinstance(pattern, str) or not pattern:
        raise PatternSearchError("the pattern must be a non-empty string")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternSearchError(f"the pattern is longer than {MAX_PATTERN_CHARS} characters")
    if max_matches < 1:
        raise PatternSearchError("max_matches must be at least 1")
    if cpu_seconds is not None and not cpu_seconds > 0:
        raise PatternSearchError("no CPU time is left for a search", "cpu")
    header = json.dumps(
        {"pattern": pattern, "ignore_case": ignore_case, "max": max_matches, "clip": LINE_CLIP}
    ).encode()
    memory = CHILD_MEMORY_BYTES if memory_bytes is None else memory_bytes
    argv = [
        sys.executable,
        "-I",
        "-S",
        "-c",
        _CHILD,
        str(memory),
        repr(float(cpu_seconds or 0)),
    ]
    process = await ManagedProcess.spawn(argv, env={}, cwd="/", with_stdin=True)
    output = bytearray()
    status = _NOT_REAPED
    try:
        with anyio.move_on_after(deadline_seconds) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_feed, process, header + b"\n" + data)
                tg.start_soon(_drop, process)
                async for chunk in process.stdout:
                    output += chunk
                    if len(output) > MAX_OUTPUT_BYTES:
                        break
                tg.cancel_scope.cancel()
            await process.wait_exited()
    finally:
        with anyio.CancelScope(shield=True):
            status = await process.kill_and_reap()
            await process.aclose()
            if on_cost is not None:
                on_cost(status.reaped_cpu_seconds or 0.0)
    cost = status.reaped_cpu_seconds or 0.0
    if scope.cancelled_caught:
        raise PatternSearchError(
            f"the search did not finish within {deadline_seconds:g} s; use a simpler pattern",
            "deadline",
            cost,
        )
    if status.signal in _CPU_SIGNALS or (
        status.signal == signal.SIGKILL
        and cpu_seconds is not None
        and cost >= math.ceil(cpu_seconds) + 1
    ):
        raise PatternSearchError(
            f"the search used its CPU allowance of {cpu_seconds or 0:.3g} s and was stopped; "
            "use a simpler pattern",
            "cpu",
            cost,
        )
    try:
        answer = json.loads(bytes(output))
    except ValueError:
        raise PatternSearchError(
            "the search failed (the pattern needed more memory than allowed)", "memory", cost
        ) from None
    if "error" in answer:
        raise PatternSearchError(str(answer["error"]), "invalid", cost)
    return SearchResult(
        matches=[Match(**m) for m in answer["matches"]],
        total_matches=int(answer["total"]),
        cpu_seconds=cost,
    )


async def _feed(process: ManagedProcess, payload: bytes) -> None:
    assert process.stdin is not None
    try:
        await process.stdin.send(payload)
        await process.stdin.send_eof()
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass  # the child died (memory, CPU); its status says so


async def _drop(process: ManagedProcess) -> None:
    """Drain the child's stderr so a traceback cannot block it; nothing in it is used."""
    try:
        async for _ in process.stderr:
            pass
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass
