"""Trying backends for real: whether one works here, and which one ``default`` runs.

Whether a backend works is found by running a trivial program on it (a trial), never by
looking for a binary; its level and grades are the ones that trial earned. ``default`` runs
the first backend, in the order selection.py defines, whose trial reaches its claim. Both the
façade (sandbox.py) and ``psych-sandbox doctor`` (doctor.py) ask here, so they agree.

Answers are the process's: a trial runs a real execution, and the host does not change under
a running process, except for what a quick check refused (an image not built yet, an engine
not started), which is asked again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .._engine.host import ExecutionPlan, execute
from .._engine.program import Program
from ..errors import ConfigurationError, ErrorKind
from ..grading import Level, level_at_least
from ..kit.backend import Availability, Backend
from ..result import BackendIdentity, ExecutionResult
from ..terms import ExecutionLimits
from .registry import BackendRegistry
from .selection import Candidate, Selection, default_order
from .selection_cache import SelectionCache

#: Keyed by backend classes, not by registry, so the answer is the process's.
_SELECTED: dict[tuple[tuple[type[Backend], ...], tuple[str, ...]], Selection] = {}
_TRIALS: dict[type[Backend] | tuple[type[Backend], str], Availability] = {}


async def select_default(registry: BackendRegistry, preference: Sequence[str] = ()) -> Selection:
    """Run a trivial program on each installed backend in the default order (see
    selection.py) and choose the first whose report reaches its claim. Remembered for the
    process. Raises ConfigurationError when none works."""
    order = tuple(default_order(registry, preference))
    key = (tuple(registry.get(c.backend_id).cls for c in order), tuple(preference))
    cached = _SELECTED.get(key)
    if cached is not None:
        return cached
    skipped: list[tuple[Candidate, str]] = []
    for candidate in order:
        reason = await trial(registry, candidate.backend_id)
        if reason is None:
            selection = Selection(candidate, order, tuple(skipped))
            _SELECTED[key] = selection
            return selection
        skipped.append((candidate, reason))
    raise ConfigurationError(
        "no installed backend works on this host: "
        + "; ".join(f"{c.backend_id}: {reason}" for c, reason in skipped)
    )


async def remembered_or_selected(
    registry: BackendRegistry, preference: Sequence[str], cache: SelectionCache
) -> Selection:
    """What ``cache`` remembers ``default`` chose recently, if that backend is still
    installed and claims the level it was chosen at; else a fresh choice, stored there."""
    remembered = cache.load(registry, preference)
    if remembered is not None and not _still_claims(registry, remembered.chosen):
        remembered = None
    if remembered is None:
        remembered = await select_default(registry, preference)
        cache.store(registry, preference, remembered)
    return remembered


def _still_claims(registry: BackendRegistry, candidate: Candidate) -> bool:
    """Whether ``candidate`` is installed here and claims the level it was chosen at."""
    try:
        registered = registry.get(candidate.backend_id)
    except ConfigurationError:
        return False
    return Level(registered.cls.claims) is candidate.claims


async def trial(registry: BackendRegistry, backend_id: str) -> str | None:
    """Why ``backend_id`` does not work here (None when a trial execution reached its claim)."""
    return (await availability(registry, backend_id)).reason


async def availability(
    registry: BackendRegistry, backend_id: str, options: dict[str, object] | None = None
) -> Availability:
    """Whether ``backend_id`` works here, found by running a trivial program on it with
    default settings, or with ``options`` (a profile's); its level and grades are the
    trial's. A trial that ran is remembered for the process."""
    registered = registry.get(backend_id)
    key: type[Backend] | tuple[type[Backend], str] = registered.cls
    if options:
        key = (registered.cls, json.dumps(options, sort_keys=True, default=str))
    cached = _TRIALS.get(key)
    if cached is not None:
        return cached
    result: ExecutionResult | None = None
    reason: str | None
    try:
        backend = registry.create(backend_id, dict(options or {}))
    except ConfigurationError as exc:
        reason = str(exc)
    else:
        reason = backend.unavailable_reason()
        if reason is None:
            plan = ExecutionPlan(
                program=Program(source="None"),
                limits=ExecutionLimits(wall_seconds=60.0),
                profile="<trial>",
                backend_identity=BackendIdentity(
                    id=backend_id,
                    distribution=registered.distribution,
                    version=registered.version,
                ),
                claimed_level=registered.cls.claims,
            )
            result = await execute(backend, plan)
            if result.error is not None:
                reason = f"{result.error.kind.value}: {result.error.message}"
            elif not level_at_least(result.level, registered.cls.claims):
                reason = f"reached only the {result.level.value} level"
    grades = {} if result is None else result.grades
    outcome = Availability(
        available=reason is None,
        reason=reason,
        level=None if result is None or not grades else result.level,
        grades={guarantee.value: grade.value for guarantee, grade in grades.items()},
    )
    # What a quick check refused (an image not built yet, an engine not started) can change
    # under a running process, and asking again costs nothing; only a trial that ran is kept.
    if result is not None and (
        result.error is None or result.error.kind is not ErrorKind.BACKEND_NOT_READY
    ):
        _TRIALS[key] = outcome
    return outcome
