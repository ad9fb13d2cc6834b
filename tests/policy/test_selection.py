"""The order ``default`` tries backends in: the level claimed first, then the deployment's
preference, then psych-sandbox's own backends, then third-party ones by id. Installing a
backend never changes what ``default`` runs unless it is stronger or the deployment says so.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar

import pytest

from psych_sandbox_core._policy.config import check_config
from psych_sandbox_core._policy.profiles import DeploymentConfig
from psych_sandbox_core._policy.registry import BackendRegistry
from psych_sandbox_core._policy.selection import FIRST_PARTY, Candidate, Selection, default_order
from psych_sandbox_core.errors import ConfigurationError
from psych_sandbox_core.grading import Level
from psych_sandbox_core.kit.backend import Backend, Launched, LaunchRequest
from psych_sandbox_core.kit.hookspecs import hookimpl


def _backend(backend_id: str, level: Level) -> type[Backend]:
    class Listed(Backend):
        id: ClassVar[str] = backend_id
        claims: ClassVar[Level] = level

        def unavailable_reason(self) -> str | None:
            return "never run by these tests"

        def launch(self, request: LaunchRequest) -> AbstractAsyncContextManager[Launched]:
            raise NotImplementedError

    return Listed


def _registry(*backends: tuple[str, Level, str | None]) -> BackendRegistry:
    """The installed backends plus ``backends``, each registered from its distribution."""
    registry = BackendRegistry()
    registry.load()
    for backend_id, level, distribution in backends:
        cls = _backend(backend_id, level)

        class Plugin:
            @staticmethod
            @hookimpl
            def psych_sandbox_register_backends(registry: Any, cls: Any = cls) -> None:
                registry.add(cls)

        registry.register_plugin(Plugin(), f"test-{backend_id}", distribution, "1.0")
    return registry


def _ids(order: list[Candidate]) -> list[str]:
    return [candidate.backend_id for candidate in order]


def test_a_third_party_backend_at_the_same_level_comes_after_the_first_party_one() -> None:
    # "aaa" sorts before "subprocess": by id alone it would become default on a host where
    # nothing isolated works.
    registry = _registry(("aaa", Level.PROCESS, "someone-elses-backend"))
    order = default_order(registry)
    ids = _ids(order)
    assert ids.index("subprocess") < ids.index("aaa")
    assert {c.backend_id: c.origin for c in order}["aaa"] == "third-party"
    assert {c.backend_id: c.origin for c in order}["subprocess"] == "first-party"


def test_level_comes_first_then_first_party_order_then_ids() -> None:
    registry = _registry(
        ("zeta", Level.ISOLATED, "z-backend"),
        ("alpha", Level.ISOLATED, "a-backend"),
        ("weak", Level.NONE, "w-backend"),
    )
    order = default_order(registry)
    ranks = {Level.ISOLATED: 0, Level.PROCESS: 1, Level.NONE: 2}
    assert [ranks[c.claims] for c in order] == sorted(ranks[c.claims] for c in order)
    isolated = [c for c in order if c.claims is Level.ISOLATED]
    first_party = [c.backend_id for c in isolated if c.origin == "first-party"]
    assert first_party == [b for b, _ in FIRST_PARTY if b in first_party]
    # Every first-party isolated backend before every third-party one; these by id.
    assert _ids(isolated)[len(first_party) :] == ["alpha", "zeta"]
    # A stronger third-party backend does come before a weaker first-party one.
    assert _ids(order).index("zeta") < _ids(order).index("subprocess")
    assert _ids(order)[-1] == "weak"


def test_a_first_party_id_from_another_distribution_is_third_party() -> None:
    # Registered under an id of ours, from a distribution that is not ours: no precedence.
    registry = _registry(("remote", Level.PROCESS, "not-psych-sandbox-remote"))
    order = default_order(registry)
    assert {c.backend_id: c.origin for c in order}["remote"] == "third-party"
    assert _ids(order).index("subprocess") < _ids(order).index("remote")


def test_the_deployment_can_prefer_a_backend_within_its_level() -> None:
    registry = _registry(("aaa", Level.PROCESS, "someone-elses-backend"))
    order = default_order(registry, ["aaa"])
    ids = _ids(order)
    assert ids.index("aaa") < ids.index("subprocess")
    assert {c.backend_id: c.origin for c in order}["aaa"] == "configured"
    # A preference never lifts a backend above a stronger level.
    for candidate in order:
        if candidate.claims is Level.ISOLATED:
            assert ids.index(candidate.backend_id) < ids.index("aaa")
    # The order is the same however often it is asked for.
    assert _ids(default_order(registry, ["aaa"])) == ids


def test_an_unknown_preference_is_a_configuration_error_with_a_hint() -> None:
    config = DeploymentConfig(backend_preference=["subprocces"])
    with pytest.raises(ConfigurationError, match="did you mean 'subprocess'"):
        check_config(config, BackendRegistry())
    with pytest.raises(ValueError, match="more than once"):
        DeploymentConfig(backend_preference=["subprocess", "subprocess"])


def test_why_names_the_rule_and_what_was_tried_first() -> None:
    registry = _registry(("aaa", Level.PROCESS, "someone-elses-backend"))
    order = tuple(default_order(registry))
    subprocess_ = next(c for c in order if c.backend_id == "subprocess")
    tried = tuple((c, "not here") for c in order[: order.index(subprocess_)])
    why = Selection(subprocess_, order, tried).why
    assert "psych-sandbox's own backends come before third-party ones" in why
    assert ", ".join(_ids(list(order))) in why
    for candidate, _ in tried:
        assert f"{candidate.backend_id}: not here" in why
