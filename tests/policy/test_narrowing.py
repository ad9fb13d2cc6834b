"""The four narrowings: no combination of backend, tenant policy, request and profile widens
any limit or grant. And a request is plain, replayable data."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from psych_sandbox_core import ExecutionLimits, Level, ProfileConfig, Sandbox
from psych_sandbox_core._policy.narrowing import (
    BackendCapability,
    ExecutionRequest,
    LimitCeilings,
    TenantPolicy,
    narrow,
    request_for,
)
from psych_sandbox_core.errors import ErrorKind
from psych_sandbox_core.grading import level_at_least

from ..conftest import PROFILE, config

LIMIT_NAMES = list(ExecutionLimits.model_fields)
OPTIONAL_ON_PROFILE = {"memory_bytes", "file_size_bytes", "processes"}
levels = st.sampled_from(list(Level))
ints = st.integers(min_value=1, max_value=2**31)
seconds = st.floats(min_value=0.001, max_value=10_000, allow_nan=False, allow_infinity=False)


def _value(name: str) -> st.SearchStrategy[Any]:
    if name == "grace_seconds":
        return st.floats(min_value=0, max_value=60, allow_nan=False)
    if name == "wall_seconds":
        return seconds
    if name == "return_value_bytes":
        return st.integers(min_value=1, max_value=1024 * 1024)
    return ints


ceilings = st.builds(LimitCeilings, **{name: st.none() | _value(name) for name in LIMIT_NAMES})
profile_limits = st.builds(
    ExecutionLimits,
    **{
        name: (st.none() | _value(name)) if name in OPTIONAL_ON_PROFILE else _value(name)
        for name in LIMIT_NAMES
    },
)
profiles = st.builds(
    ProfileConfig,
    backend=st.just("subprocess"),
    limits=profile_limits,
    required_level=levels,
    allow_network=st.booleans(),
)
policies = st.builds(
    TenantPolicy, limits=ceilings, allow_network=st.booleans(), minimum_level=levels
)
requests = st.builds(ExecutionRequest, limits=ceilings, network=st.booleans(), minimum_level=levels)
capabilities = st.builds(
    BackendCapability,
    backend_id=st.just("subprocess"),
    claims=levels,
    network=st.booleans(),
    limits=ceilings,
)


def _within(value: Any, ceiling: Any) -> bool:
    """A limit of None is uncapped: only None is within None... and everything is within it."""
    if ceiling is None:
        return True
    return value is not None and value <= ceiling


@given(capabilities, policies, requests, profiles)
def test_no_stage_is_ever_widened(
    capability: BackendCapability,
    policy: TenantPolicy,
    request: ExecutionRequest,
    profile: ProfileConfig,
) -> None:
    terms = narrow(capability, policy, request, "p", profile)
    for name in LIMIT_NAMES:
        got = getattr(terms.limits, name)
        assert _within(got, getattr(profile.limits, name)), name
        for stage in (capability.limits, policy.limits, request.limits):
            assert _within(got, getattr(stage, name)), name
    # A grant only when every stage grants it.
    if terms.network:
        assert request.network and policy.allow_network and profile.allow_network
        assert capability.network
    # The required level is at least every stage's.
    for floor in (profile.required_level, policy.minimum_level, request.minimum_level):
        assert level_at_least(terms.required_level, floor)
    # Either the backend can reach the required level, or nothing runs.
    if terms.refusal is None:
        assert level_at_least(capability.claims, terms.required_level)
        assert terms.network == request.network
    else:
        assert terms.refusal.kind in (
            ErrorKind.ISOLATION_UNAVAILABLE,
            ErrorKind.NETWORK_NOT_ALLOWED,
        )


@given(capabilities, policies, requests, profiles, ceilings)
def test_narrowing_a_stage_further_never_widens_the_result(
    capability: BackendCapability,
    policy: TenantPolicy,
    request: ExecutionRequest,
    profile: ProfileConfig,
    tighter: LimitCeilings,
) -> None:
    before = narrow(capability, policy, request, "p", profile)
    stricter_policy = policy.model_copy(
        update={"limits": _meet(policy.limits, tighter), "allow_network": False}
    )
    after = narrow(capability, stricter_policy, request, "p", profile)
    for name in LIMIT_NAMES:
        assert _within(getattr(after.limits, name), getattr(before.limits, name)), name
    assert not after.network


@given(capabilities, policies, requests, profiles)
def test_the_order_of_policy_and_request_does_not_matter(
    capability: BackendCapability,
    policy: TenantPolicy,
    request: ExecutionRequest,
    profile: ProfileConfig,
) -> None:
    swapped_request = request.model_copy(update={"limits": policy.limits})
    swapped_policy = policy.model_copy(update={"limits": request.limits})
    a = narrow(capability, policy, request, "p", profile)
    b = narrow(capability, swapped_policy, swapped_request, "p", profile)
    assert a.limits == b.limits


def _meet(a: LimitCeilings, b: LimitCeilings) -> LimitCeilings:
    values = {}
    for name in LIMIT_NAMES:
        present = [v for v in (getattr(a, name), getattr(b, name)) if v is not None]
        values[name] = min(present) if present else None
    return LimitCeilings(**values)


@given(requests, st.text(min_size=1, max_size=20).filter(lambda s: s.strip() == s))
def test_a_request_is_hashable_serialisable_and_replayable(
    request: ExecutionRequest, name: str
) -> None:
    request = request.model_copy(update={"profile": name})
    text = request.to_json()
    json.loads(text)  # plain JSON
    replayed = ExecutionRequest.from_json(text)
    assert replayed == request
    assert hash(replayed) == hash(request)
    assert replayed.to_json() == text


def test_a_request_has_no_field_for_a_backend_client_credential_path_or_callable() -> None:
    assert set(ExecutionRequest.model_fields) == {"profile", "limits", "network", "minimum_level"}
    for forbidden in ("backend", "client", "credential", "token", "path", "callback"):
        with pytest.raises(ValidationError):
            ExecutionRequest.model_validate({forbidden: "x"})
    with pytest.raises(ValidationError):
        ExecutionRequest(profile=print)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        ExecutionRequest(limits={"wall_seconds": 0})  # type: ignore[arg-type]
    request = ExecutionRequest()
    with pytest.raises(ValidationError):
        request.network = True  # type: ignore[misc]


def test_timeout_is_a_request_that_only_narrows() -> None:
    request = request_for(ExecutionRequest(limits=LimitCeilings(wall_seconds=5.0)), None, 60.0)
    assert request.limits.wall_seconds == 5.0
    assert request_for(None, "x", 2.0).limits.wall_seconds == 2.0
    for bad in (0, -1, float("nan"), float("inf"), True):
        with pytest.raises(ValueError):
            request_for(None, None, bad)
    with pytest.raises(ValueError, match="contradicts"):
        request_for(ExecutionRequest(profile="a"), "b", None)


def test_refusals_name_the_stage_and_the_deployment() -> None:
    capability = BackendCapability("subprocess", Level.PROCESS)
    profile = ProfileConfig(backend="subprocess")
    terms = narrow(capability, TenantPolicy(), ExecutionRequest(network=True), "default", profile)
    assert terms.refusal is not None
    assert terms.refusal.kind is ErrorKind.NETWORK_NOT_ALLOWED
    assert "profile 'default'" in terms.refusal.message
    terms = narrow(
        capability,
        TenantPolicy(minimum_level=Level.ISOLATED),
        ExecutionRequest(),
        "default",
        profile,
    )
    assert terms.refusal is not None
    assert terms.refusal.kind is ErrorKind.ISOLATION_UNAVAILABLE
    assert "deployment" in terms.refusal.message


@pytest.mark.anyio
async def test_a_profile_keeps_the_terms_of_a_request_it_saw_but_not_a_refusal() -> None:
    async with Sandbox(config()) as sandbox:
        loaded = await sandbox._load(PROFILE)
        backend = BackendCapability.of(type(loaded.backend))

        def direct(policy: TenantPolicy | None, request: ExecutionRequest) -> Any:
            return narrow(backend, policy or TenantPolicy(), request, PROFILE, loaded.config)

        plain = request_for(None, PROFILE, None)
        kept = loaded.terms(None, plain)
        assert kept == direct(None, plain)
        # An equal request (made anew, as every run() makes one) finds the same terms.
        assert loaded.terms(None, request_for(None, PROFILE, None)) is kept
        # Another request, or another policy, has terms of its own.
        shorter = request_for(None, PROFILE, 0.5)
        assert loaded.terms(None, shorter) == direct(None, shorter) != kept
        policy = TenantPolicy(limits=LimitCeilings(wall_seconds=0.25))
        assert loaded.terms(policy, plain) == direct(policy, plain) != kept
        # A refusal is made anew for every execution.
        networked = ExecutionRequest(profile=PROFILE, network=True)
        first, second = loaded.terms(None, networked), loaded.terms(None, networked)
        assert first.refusal is not None and first == second and first is not second
