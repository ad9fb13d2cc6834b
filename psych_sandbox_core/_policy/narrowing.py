"""The four narrowings: what a request asks for, and the terms one execution actually gets.

The terms of an execution are the intersection of what the backend can do, what the tenant's
policy allows, what the request asks for and what the deployment profile caps. Each stage can
only narrow, and that is enforced by intersecting (the minimum of every limit, the AND of
every grant, the maximum of every required level), never by asking a stage to behave.

An :class:`ExecutionRequest` is what an agent's spec carries. It is plain data: frozen,
hashable, JSON-serialisable and replayable, with no field for a backend, a client, a
credential, a host path or a callable, because a spec is hashed, stored and replayed and
none of those survive that.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from ..budgets import BindingBudgets
from ..errors import ErrorKind
from ..grading import Level, LevelSetting, level_at_least
from ..result import ExecutionFailure
from ..terms import ExecutionLimits
from .profiles import DEFAULT_PROFILE, ProfileConfig

Positive = Annotated[int, Field(gt=0)]
PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
ProfileName = Annotated[str, Field(min_length=1, max_length=128)]


class LimitCeilings(BaseModel):
    """Ceilings on :class:`ExecutionLimits`; None on a field means "no ceiling from here".

    The same shape serves a request (what it asks for) and a tenant policy (what it allows):
    both can only lower what the profile caps.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    cpu_seconds: Positive | None = None
    wall_seconds: PositiveSeconds | None = None
    memory_bytes: Positive | None = None
    file_size_bytes: Positive | None = None
    processes: Positive | None = None
    stdout_bytes: Positive | None = None
    stderr_bytes: Positive | None = None
    return_value_bytes: Positive | None = None
    grace_seconds: Annotated[float, Field(ge=0, le=60, allow_inf_nan=False)] | None = None


class ExecutionRequest(BaseModel):
    """What an agent's spec carries: a profile name and plain-data requests. Nothing else."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    profile: ProfileName = DEFAULT_PROFILE
    #: Limits the program asks for; they can only narrow the profile's caps.
    limits: LimitCeilings = Field(default_factory=LimitCeilings)
    #: Whether the program wants network access (granted only if every stage allows it).
    network: bool = False
    #: The lowest level the program is willing to run at.
    minimum_level: LevelSetting = Level.NONE

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, data: str | bytes) -> ExecutionRequest:
        return cls.model_validate_json(data)


class TenantPolicy(BaseModel):
    """What a tenant's policy allows. Like every stage, it can only narrow."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    limits: LimitCeilings = Field(default_factory=LimitCeilings)
    #: False forbids network access whatever the profile allows; True leaves it to the others.
    allow_network: bool = True
    minimum_level: LevelSetting = Level.NONE
    #: Narrows the profile's binding budgets field by field (never widens them).
    budgets: BindingBudgets | None = None


@dataclass(frozen=True)
class BackendCapability:
    """What a backend can offer at best: the level it claims and whether it can grant network.

    A claim, not a proof: the grades from the child's report still decide whether the program
    runs, and withhold its output if the claim turns out wrong.
    """

    backend_id: str
    #: The level the backend claims it can reach: a claim, never reported as a level.
    claims: Level
    #: Whether the backend can run a program with network access at all.
    network: bool = False
    limits: LimitCeilings = field(default_factory=LimitCeilings)

    @classmethod
    def of(cls, backend_cls: type[Any]) -> BackendCapability:
        """Read a backend class's capability: its ``claims`` and an optional ``grants_network``."""
        return cls(
            backend_id=str(backend_cls.id),
            claims=Level(backend_cls.claims),
            network=bool(getattr(backend_cls, "grants_network", False)),
        )


@dataclass(frozen=True)
class Terms:
    """The narrowed terms of one execution, or why there are none."""

    limits: ExecutionLimits
    network: bool
    required_level: Level
    #: Set when the request cannot be met; the program must not run.
    refusal: ExecutionFailure | None = None


def strictest_level(levels: Iterable[Level]) -> Level:
    """The highest of the required levels (the intersection of what each stage accepts)."""
    strictest = Level.NONE
    for level in levels:
        if level_at_least(level, strictest):
            strictest = level
    return strictest


def _minimum(values: Iterable[Any]) -> Any:
    present = [value for value in values if value is not None]
    return min(present) if present else None


def intersect_limits(caps: ExecutionLimits, *ceilings: LimitCeilings) -> ExecutionLimits:
    """Every limit the smallest any stage gives it. A None cap on the profile means uncapped."""
    update: dict[str, Any] = {}
    for name in ExecutionLimits.model_fields:
        update[name] = _minimum(
            [getattr(caps, name), *(getattr(ceiling, name) for ceiling in ceilings)]
        )
    # Validate again rather than copy: the result must satisfy every rule a profile does.
    return ExecutionLimits.model_validate(update)


def narrow(
    capability: BackendCapability,
    policy: TenantPolicy,
    request: ExecutionRequest,
    profile_name: str,
    profile: ProfileConfig,
) -> Terms:
    """Intersect the four stages. A request that cannot be met comes back as a refusal."""
    limits = intersect_limits(profile.limits, capability.limits, policy.limits, request.limits)
    required = strictest_level(
        [profile.required_level, policy.minimum_level, request.minimum_level]
    )
    network = (
        request.network and profile.allow_network and policy.allow_network and capability.network
    )
    refusal: ExecutionFailure | None = None
    if request.network and not network:
        denied_by = [
            who
            for who, allows in (
                (f"the profile {profile_name!r}", profile.allow_network),
                ("the tenant policy", policy.allow_network),
                (f"the backend {capability.backend_id!r}", capability.network),
            )
            if not allows
        ]
        refusal = ExecutionFailure.of(
            ErrorKind.NETWORK_NOT_ALLOWED,
            f"network access was requested but is not allowed by {' nor by '.join(denied_by)}; "
            "the program was not run",
        )
    elif not level_at_least(capability.claims, required):
        refusal = ExecutionFailure.of(
            ErrorKind.ISOLATION_UNAVAILABLE,
            f"this execution requires the {required.value} level, but the profile "
            f"{profile_name!r} uses the backend {capability.backend_id!r}, which reaches at most "
            f"{capability.claims.value} on this deployment; the program was not run",
        )
    return Terms(limits=limits, network=network, required_level=required, refusal=refusal)


def request_for(
    request: ExecutionRequest | None, profile: str | None, timeout: float | None
) -> ExecutionRequest:
    """Fold the ``profile=`` and ``timeout=`` shortcuts of ``Sandbox.run`` into one request.

    Raises ValueError for misuse: a timeout that is not a positive number, or a profile
    argument that contradicts the request's own.
    """
    if request is None:
        request = ExecutionRequest(profile=profile or DEFAULT_PROFILE)
    elif not isinstance(request, ExecutionRequest):
        raise TypeError("request must be an ExecutionRequest")
    elif profile is not None and profile != request.profile:
        raise ValueError(
            f"profile={profile!r} contradicts the request's profile {request.profile!r}"
        )
    if timeout is not None:
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not (0 < timeout < float("inf"))
        ):
            raise ValueError("timeout must be a positive, finite number of seconds")
        wall = float(timeout)
        if request.limits.wall_seconds is not None:
            wall = min(wall, request.limits.wall_seconds)
        request = request.model_copy(
            update={"limits": request.limits.model_copy(update={"wall_seconds": wall})}
        )
    return request
