"""Searching bytes with a caller-supplied regular expression without risking the host.

A pattern comes from a model and can backtrack for longer than the universe has left.
Python's ``re`` holds the GIL and cannot be interrupted, so the search runs in a short-lived
child interpreter with a deadline and a memory cap; past the deadline the child is killed
and the search fails with a clear error. The host only ever sees a bounded list of matches.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import anyio

#: Wall-clock deadline for one search, including the child's start-up (tens of ms).
DEFAULT_DEADLINE_SECONDS = 5.0
#: Most matches one search returns; the rest are counted as not shown.
DEFAULT_MAX_MATCHES = 100
#: Longest pattern accepted (a model's search, not a program).
MAX_PATTERN_CHARS = 1000
#: Characters of context returned around each match (the matching line, clipped).
LINE_CLIP = 400
#: Address space for the searching child: enough for the data and re's state, no more.
CHILD_MEMORY_BYTES = 1024 * 1024 * 1024

_CHILD = r"""
import json, re, resource, sys
limit = int(sys.argv[1])
try:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
except (ValueError, OSError):
    pass
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


class PatternSearchError(ValueError):
    """The pattern is invalid, or the search ran past its deadline or memory."""


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


async def search_bytes(
    data: bytes,
    pattern: str,
    *,
    ignore_case: bool = False,
    max_matches: int = DEFAULT_MAX_MATCHES,
    deadline_seconds: float = DEFAULT_DEADLINE_SECONDS,
) -> SearchResult:
    """All matches of ``pattern`` in ``data`` (as UTF-8 text), found in a child process."""
    if not isinstance(pattern, str) or not pattern:
        raise PatternSearchError("the pattern must be a non-empty string")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternSearchError(f"the pattern is longer than {MAX_PATTERN_CHARS} characters")
    if max_matches < 1:
        raise PatternSearchError("max_matches must be at least 1")
    header = json.dumps(
        {"pattern": pattern, "ignore_case": ignore_case, "max": max_matches, "clip": LINE_CLIP}
    ).encode()
    argv = [sys.executable, "-I", "-S", "-c", _CHILD, str(CHILD_MEMORY_BYTES)]
    process = await anyio.open_process(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    output = bytearray()
    try:
        with anyio.move_on_after(deadline_seconds) as scope:
            assert process.stdin is not None and process.stdout is not None
            async with anyio.create_task_group() as tg:

                async def feed() -> None:
                    assert process.stdin is not None
                    try:
                        await process.stdin.send(header + b"\n" + data)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        pass  # the child died (memory); its silence says so below
                    finally:
                        await process.stdin.aclose()

                tg.start_soon(feed)
                async for chunk in process.stdout:
                    output += chunk
                    if len(output) > 64 * 1024 * 1024:
                        break  # bounded by max_matches; more is a broken child
            await process.wait()
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
                await process.wait()
            await process.aclose()
    if scope.cancelled_caught:
        raise PatternSearchError(
            f"the search did not finish within {deadline_seconds:g} s; use a simpler pattern"
        )
    try:
        answer = json.loads(bytes(output))
    except ValueError:
        raise PatternSearchError(
            "the search failed (the pattern needed more memory than allowed)"
        ) from None
    if "error" in answer:
        raise PatternSearchError(str(answer["error"]))
    return SearchResult(
        matches=[Match(**m) for m in answer["matches"]], total_matches=int(answer["total"])
    )
