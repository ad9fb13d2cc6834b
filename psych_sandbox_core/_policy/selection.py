"""The order in which ``default`` tries backends, and why it chose the one it did.

The order is stable and documented (docs/architecture.md): the level a backend claims
first (isolated before process before none); within a level, the ids the deployment lists
in ``backend_preference``, then the project's own backends in :data:`FIRST_PARTY` order, then
every other backend by id. Installing a third-party backend therefore never changes what
``default`` runs unless it is stronger, or the deployment says so. The first candidate whose
trial execution works is the one chosen (see trials.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..grading import ISOLATED_ENFORCED, Grade, Guarantee, Level, level_at_least
from ..result import ExecutionNote
from .registry import KNOWN_DISTRIBUTIONS, BackendRegistry

#: The project's own backends, in the order ``default`` prefers them within a level, each
#: with the distribution that must be serving it: a third party registering one of these ids
#: from its own distribution is ordered as a third party.
FIRST_PARTY: tuple[tuple[str, str], ...] = (
    ("bwrap", "psych-sandbox-bwrap"),
    ("docker", "psych-sandbox-docker"),
    ("gvisor", "psych-sandbox-docker"),
    ("macos", "psych-sandbox-macos"),
    ("windows", "psych-sandbox-windows"),
    ("subprocess", "psych-sandbox-core"),
    ("remote", "psych-sandbox-remote"),
)

_LEVEL_RANK = {Level.ISOLATED: 0, Level.PROCESS: 1, Level.NONE: 2}


@dataclass(frozen=True)
class Candidate:
    """One backend in the order ``default`` tries them."""

    backend_id: str
    claims: Level
    #: "configured" (listed in backend_preference), "first-party" or "third-party".
    origin: str


def default_order(registry: BackendRegistry, preference: Sequence[str] = ()) -> list[Candidate]:
    """Every installed backend in the order ``default`` tries them."""
    first_party = {
        backend_id: (index, dist) for index, (backend_id, dist) in enumerate(FIRST_PARTY)
    }
    keyed: list[tuple[tuple[int, int, int, str], Candidate]] = []
    for backend_id in registry.ids():
        registered = registry.get(backend_id)
        claims = Level(registered.cls.claims)
        known = first_party.get(backend_id)
        if backend_id in preference:
            origin, group, position = "configured", 0, list(preference).index(backend_id)
        elif known is not None and registered.distribution == known[1]:
            origin, group, position = "first-party", 1, known[0]
        else:
            origin, group, position = "third-party", 2, 0
        keyed.append(
            (
                (_LEVEL_RANK[claims], group, position, backend_id),
                Candidate(backend_id, claims, origin),
            )
        )
    return [candidate for _, candidate in sorted(keyed, key=lambda item: item[0])]


@dataclass(frozen=True)
class Selection:
    """What ``default`` chose on this host, and what it tried first."""

    chosen: Candidate
    order: tuple[Candidate, ...]
    #: Candidates tried before the chosen one, each with why it does not work here.
    skipped: tuple[tuple[Candidate, str], ...] = ()
    #: Read back from an earlier process's trials (selection_cache.py), not tried here.
    remembered: bool = False

    @property
    def why(self) -> str:
        """One sentence for a person: why ``default`` runs the chosen backend."""
        chosen = self.chosen
        rule = {
            "configured": "listed in backend_preference",
            "first-party": "psych-sandbox's own backends come before third-party ones",
            "third-party": "third-party backends are ordered by id",
        }[chosen.origin]
        why = (
            f"the first backend that works here in the default order (strongest level first, "
            f"then preference: {', '.join(c.backend_id for c in self.order)}); "
            f"{chosen.backend_id} is {chosen.claims.value}-level and {rule}"
        )
        if self.skipped:
            why += "; tried first: " + "; ".join(
                f"{candidate.backend_id}: {reason}" for candidate, reason in self.skipped
            )
        return why

    def stronger(self) -> tuple[Candidate, str] | None:
        """The first installed backend stronger than the chosen one, and why it does not
        work here: what to fix to reach its level."""
        for candidate, reason in self.skipped:
            if level_at_least(candidate.claims, self.chosen.claims) and (
                candidate.claims is not self.chosen.claims
            ):
                return candidate, reason
        return None

    def fix(self) -> str:
        """How this host could reach the isolated level, in one clause."""
        stronger = self.stronger()
        if stronger is not None:
            candidate, reason = stronger
            return f"to fix: {candidate.backend_id}: {reason}"
        missing = [
            f"pip install {KNOWN_DISTRIBUTIONS[backend_id]}"
            for backend_id, _ in FIRST_PARTY[:2]
            if backend_id not in {c.backend_id for c in self.order}
        ]
        return "to fix: install an isolated backend" + (
            f" ({' or '.join(missing)})" if missing else ""
        )

    def below_required(self, profile: str, required: Level) -> str | None:
        """Why ``profile`` (whose backend this selection chooses) can never reach the level
        it requires on this host, or None when it can."""
        if level_at_least(self.chosen.claims, required):
            return None
        return (
            f"profiles.{profile}.required_level: {required.value} can never be reached on "
            f"this host: the strongest backend that works here is {self.chosen.backend_id} "
            f"({self.chosen.claims.value}); {self.fix()}"
        )

    def note(self, level: Level, grades: Mapping[Guarantee, Grade]) -> ExecutionNote | None:
        """The note for an execution ``default`` ran on this selection at ``level``: None
        at the isolated level."""
        if level is Level.ISOLATED:
            return None
        # What the isolated level needs (level_of's rule): its boundary enforced, and no
        # guarantee unavailable.
        not_enforced = [
            guarantee.value
            for guarantee in Guarantee
            if (
                grades.get(guarantee) is not Grade.ENFORCED
                if guarantee in ISOLATED_ENFORCED
                else grades.get(guarantee, Grade.UNAVAILABLE) is Grade.UNAVAILABLE
            )
        ]
        exposed = (
            " (the program could read any file this host lets its user read)"
            if Guarantee.FILESYSTEM.value in not_enforced
            else ""
        )
        fix = self.fix()
        message = (
            f"not isolated (level {level.value}): {', '.join(not_enforced)} not "
            f"enforced{exposed}; {fix}; "
            'or refuse such runs: required_level = "isolated" in the configuration'
        )
        return ExecutionNote(
            code="below_isolated", message=message, not_enforced=not_enforced, fix=fix
        )
