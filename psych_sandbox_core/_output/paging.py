"""Reading stored text by window or by pattern: the host side of read_tool_output (a result
too large to hand over whole) and of read_output (an earlier execution's output).

Windows and match offsets are both in characters of the result's JSON text, so a program can
search, then read around a match. The pattern search itself runs in a killable child process
(pattern_search.py): a backtracking pattern must not be able to hold the host. Its CPU is the
program's to pay for (host_work.py): each search gets only what is left of the execution's CPU
budget, and what it cost is charged there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .host_work import HostWork
from .pattern_search import PatternSearchError, search_bytes

#: Wall clock from spawn to exit of one search. Sized so ordinary searches over a few
#: megabytes, interpreter start-up included, are never refused.
DEFAULT_SEARCH_DEADLINE_SECONDS = 10.0
#: Window length (characters) when the program names none.
DEFAULT_WINDOW_CHARS = 64 * 1024
#: Matches returned by one search when the program names none, and the most it may ask for.
DEFAULT_MAX_MATCHES = 100
MAX_MATCHES = 10_000
#: Characters of the matching line handed back with each match (JSON text is often one line).
LINE_CONTEXT_CHARS = 160
#: Longest pattern accepted.
MAX_PATTERN_CHARS = 1000


class PagingError(Exception):
    """A read the program asked for cannot be served; ``kind`` says why."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True)
class SearchSettings:
    #: Wall-clock deadline of one search, enforced by killing the search process.
    deadline_seconds: float = DEFAULT_SEARCH_DEADLINE_SECONDS


def read_window(data: bytes, offset: int, length: int) -> dict[str, Any]:
    """Characters ``[offset, offset+length)`` of the stored JSON text."""
    text = data.decode("utf-8", "replace")
    total = len(text)
    start = min(max(offset, 0), total)
    end = min(start + max(length, 0), total)
    return {
        "text": text[start:end],
        "offset": start,
        "next_offset": end,
        "total_chars": total,
        "eof": end >= total,
    }


async def search(
    data: bytes,
    pattern: str,
    *,
    ignore_case: bool = False,
    max_matches: int = DEFAULT_MAX_MATCHES,
    settings: SearchSettings | None = None,
    work: HostWork | None = None,
) -> dict[str, Any]:
    """Matches of ``pattern`` in the stored text, found in a process killed at the deadline
    and, with ``work``, limited to and charged against the execution's CPU and memory."""
    settings = settings or SearchSettings()
    work = work or HostWork()
    remaining = work.remaining_cpu()
    if remaining is not None and remaining <= 0:
        raise PagingError("budget_exhausted", work.spent_message())
    # The execution's remaining CPU, capped by the deadline.
    budget_bound = remaining is not None and remaining < settings.deadline_seconds
    try:
        found = await search_bytes(
            data,
            pattern,
            ignore_case=ignore_case,
            max_matches=max_matches,
            deadline_seconds=settings.deadline_seconds,
            cpu_seconds=None if remaining is None else min(remaining, settings.deadline_seconds),
            memory_bytes=work.memory_bytes,
            on_cost=work.charge,
        )
    except PatternSearchError as exc:
        if exc.reason == "cpu" and budget_bound:
            work.spent = True
            raise PagingError(
                "budget_exhausted",
                "the pattern search was stopped when it had used the rest of this "
                "execution's CPU budget; the pattern probably backtracks catastrophically "
                "(nested quantifiers like (a+)+). " + work.spent_message(),
            ) from None
        if exc.reason in ("cpu", "deadline"):
            raise PagingError(
                "pattern_timeout",
                f"the pattern search did not finish within {settings.deadline_seconds:g} s "
                "and was stopped; the pattern probably backtracks catastrophically (nested "
                "quantifiers like (a+)+). Simplify it, or read the result by window",
            ) from None
        raise PagingError("invalid_arguments", str(exc)) from None
    return {
        "matches": [
            {
                "offset": m.start,
                "length": m.end - m.start,
                "line_number": m.line_number,
                "text": m.match,
                "line": m.line[:LINE_CONTEXT_CHARS],
            }
            for m in found.matches
        ],
        "total_matches": found.total_matches,
        "truncated": found.total_matches > len(found.matches),
    }


#: The arguments a read takes besides its handle.
READ_ARGUMENTS = frozenset({"offset", "length", "pattern", "ignore_case", "max_matches"})


async def read(
    data: bytes,
    arguments: Mapping[str, Any],
    *,
    tool: str,
    max_window_chars: int,
    settings: SearchSettings | None = None,
    work: HostWork | None = None,
) -> dict[str, Any]:
    """Answer one read of ``data`` as the program asked it of ``tool``: a window
    (``offset=``, ``length=``, at most ``max_window_chars``) or a pattern search
    (``pattern=``, ``ignore_case=``, ``max_matches=``). Raises PagingError."""
    unexpected = sorted(set(arguments) - READ_ARGUMENTS - {"handle"})
    if unexpected:
        raise PagingError(
            "invalid_arguments",
            f"{tool} got unexpected arguments {unexpected}; it takes handle= and either "
            "offset=/length= or pattern= (with ignore_case=, max_matches=)",
        )
    pattern = arguments.get("pattern")
    if pattern is not None:
        if not isinstance(pattern, str) or not 0 < len(pattern) <= MAX_PATTERN_CHARS:
            raise PagingError(
                "invalid_arguments",
                f"pattern must be a non-empty str of at most {MAX_PATTERN_CHARS} characters",
            )
        if "offset" in arguments or "length" in arguments:
            raise PagingError(
                "invalid_arguments", "give either pattern= or offset=/length=, not both"
            )
        ignore_case = arguments.get("ignore_case", False)
        max_matches = arguments.get("max_matches", DEFAULT_MAX_MATCHES)
        if not isinstance(ignore_case, bool):
            raise PagingError("invalid_arguments", "ignore_case must be a bool")
        if not _is_int(max_matches) or not 0 < max_matches <= MAX_MATCHES:
            raise PagingError(
                "invalid_arguments", f"max_matches must be an int from 1 to {MAX_MATCHES}"
            )
        return await search(
            data,
            pattern,
            ignore_case=ignore_case,
            max_matches=max_matches,
            settings=settings,
            work=work,
        )
    offset = arguments.get("offset", 0)
    length = arguments.get("length", DEFAULT_WINDOW_CHARS)
    if not _is_int(offset) or offset < 0:
        raise PagingError("invalid_arguments", "offset must be an int >= 0")
    if not _is_int(length) or length <= 0:
        raise PagingError("invalid_arguments", "length must be an int > 0")
    return read_window(data, offset, min(length, max(1, max_window_chars)))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
