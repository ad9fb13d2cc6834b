"""The shape of JSON text before it is parsed: how deep it nests and how many elements it holds.

A parser's cost follows the shape of what it reads, not its length: sixteen megabytes of
``[[],[],...]`` become millions of lists. So every JSON text a child sends is measured on its
raw bytes first, and refused when its depth or element count passes a named limit, before
any parser builds anything. No I/O.

Depth counts ``[`` and ``{`` open at once, outside strings. Elements are the ``[``, ``{``,
``,`` and ``:`` outside strings: every value and every key the parser builds, except the
outermost value, follows exactly one of them, so a text of N elements makes at most N + 1
objects. Both are measured in one pass over the text, a bounded chunk at a time with the
per-byte work in C (counting, splitting on quotes, deleting everything but structure), so a
measurement costs a few milliseconds per megabyte and stops as soon as a limit is passed.
Past the text's first syntax error the numbers may be anything: the parser stops there too.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from ..errors import ProtocolViolation

#: Bytes measured per step: small enough that one step's transient copies stay small and a
#: worker thread doing this gives the interpreter lock back often, large enough that the
#: per-step overhead vanishes next to the work done in C.
SCAN_CHUNK_BYTES = 64 * 1024

#: Everything but the structural characters, deleted from text outside strings.
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b"[]{},:")))
#: Depth change per bracket, indexed by byte value.
_STEP = [0] * 256
for _opening in b"[{":
    _STEP[_opening] = 1
for _closing in b"]}":
    _STEP[_closing] = -1
#: Both kinds of bracket as one, for the cheap depth bound.
_ONE_KIND = bytes.maketrans(b"{}", b"[]")
_NO_LIMIT = 2**62


@dataclass(frozen=True)
class Shape:
    """Deepest nesting and element count of a JSON text (see the module docstring)."""

    depth: int
    elements: int


@dataclass(frozen=True)
class ShapeLimits:
    """The most a JSON text may nest and hold, and the names of those limits."""

    depth: int
    elements: int
    depth_name: str
    elements_name: str


def measure(data: bytes) -> Shape:
    """The exact shape of ``data`` when it is JSON (up to its first syntax error otherwise)."""
    return _scan(data, _NO_LIMIT, _NO_LIMIT, exact=True)


def check_shape(data: bytes, limits: ShapeLimits, what: str) -> None:
    """Raise ProtocolViolation naming the limit ``data`` (described as ``what``) passes."""
    if len(data) <= limits.depth and len(data) <= limits.elements:
        return  # each level and each element takes a byte: so short a text passes neither
    # The common case costs one pass: with so few brackets and separators in the whole
    # text, strings included, no limit can be passed.
    structure = data.translate(None, _NOT_STRUCTURE)
    opening = structure.count(b"[") + structure.count(b"{")
    closing = structure.count(b"]") + structure.count(b"}")
    if opening <= limits.depth and len(structure) - closing <= limits.elements:
        return
    shape = _scan(data, limits.depth, limits.elements, exact=False)
    if shape.depth > limits.depth:
        raise ProtocolViolation(
            f"{what} nests deeper than {limits.depth} levels ({limits.depth_name} spent)"
        )
    if shape.elements > limits.elements:
        raise ProtocolViolation(
            f"{what} holds more than {limits.elements} elements ({limits.elements_name} spent)"
        )


def _scan(data: bytes, max_depth: int, max_elements: int, *, exact: bool) -> Shape:
    """The shape of ``data``, stopping once a limit is passed. Unless ``exact``, the depth
    may be any upper bound not above ``max_depth`` where that is cheaper to know."""
    size = len(data)
    depth = deepest = elements = 0
    in_string = False
    position = 0
    while position < size:
        end = _step_end(data, position)
        step = data[position:end]
        if b"\\" in step:
            # Escapes pair from the left, as JSON reads them: every escaped backslash, then
            # every escaped quote, becomes two bytes of no meaning. Each quote left then
            # opens or closes a string. (A step never splits an escape: see _step_end.)
            step = step.replace(b"\\\\", b"__").replace(b'\\"', b"__")
        pieces = step.split(b'"')
        # Pieces alternate between outside and inside strings.
        outside = b"".join(pieces[1 if in_string else 0 :: 2])
        if len(pieces) % 2 == 0:
            in_string = not in_string
        structure = outside.translate(None, _NOT_STRUCTURE)
        brackets = structure.translate(None, b",:")
        elements += len(structure) - brackets.count(b"]") - brackets.count(b"}")
        if brackets:
            peak, lowest, depth = _depths(brackets, depth, max_depth, exact)
            deepest = max(deepest, peak)
            if lowest < 0:
                break  # a bracket closed that never opened: the parser stops here
        if deepest > max_depth or elements > max_elements:
            break
        position = end
    return Shape(depth=deepest, elements=elements)


def _step_end(data: bytes, position: int) -> int:
    """Where the step from ``position`` ends: at most SCAN_CHUNK_BYTES on, and never inside
    an escape. A run of backslashes at the end moves to the next step, which then starts
    where the run does; a step made of backslashes only keeps an even number of them, so
    the next starts on a pair's boundary too."""
    end = min(position + SCAN_CHUNK_BYTES, len(data))
    if end == len(data):
        return end
    run = end - position - len(data[position:end].rstrip(b"\\"))
    if run == end - position:
        return end - run % 2
    return end - run


def _depths(brackets: bytes, depth: int, max_depth: int, exact: bool) -> tuple[int, int, int]:
    """Highest, lowest and final depth over ``brackets``, starting at ``depth``; unless
    ``exact``, the highest may be an upper bound when that bound is within ``max_depth``."""
    if not exact:
        # A run of more openers than the limit passes it wherever it starts (depth is never
        # negative where the parser still reads); with its empty pairs removed, the rest
        # nests at most one level less than the whole, a bound that settles wide data
        # without walking every bracket.
        too_deep = b"[" * (max_depth + 1)
        unified = brackets.translate(_ONE_KIND)
        rest = unified.replace(b"[]", b"")
        if too_deep in unified or too_deep in rest:
            return max_depth + 1, 0, depth
        if len(unified) - len(unified.lstrip(b"]")) > depth:
            return depth, -1, depth  # closes more than is open: the parser stops here
        if len(rest) * 2 <= len(brackets):
            bound = depth + 1 + _peak(rest, 0)[0]
            if bound <= max_depth:
                final = depth + 2 * (len(brackets) - brackets.count(b"]") - brackets.count(b"}"))
                final -= len(brackets)
                return bound, min(final, 0), final
    return _peak(brackets, depth)


def _peak(brackets: bytes, depth: int) -> tuple[int, int, int]:
    """Highest, lowest and final depth over ``brackets``, starting at ``depth``."""
    levels = list(accumulate(map(_STEP.__getitem__, brackets), initial=depth))
    return max(levels), min(levels), levels[-1]
