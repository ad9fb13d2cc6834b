"""Backend selection as a test drives it: the registry of the backends installed here, the
trial of one of them, forgetting the trials and selections earlier tests in this process
left remembered, and the problems of a configuration with the backends installed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from psych_sandbox_core._policy import trials
from psych_sandbox_core._policy.config import ConfigProblem, config_problems
from psych_sandbox_core._policy.registry import BackendRegistry
from psych_sandbox_core._policy.trials import availability
from psych_sandbox_core.kit.backend import Availability

if TYPE_CHECKING:
    # For the annotations only: a host run as another user (as_user) imports this module
    # from a staged environment without pytest.
    import pytest

__all__ = [
    "Availability",
    "BackendRegistry",
    "ConfigProblem",
    "availability",
    "config_problems",
    "forget_selections",
    "forget_trials",
]


def forget_trials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start with no trial remembered, until ``monkeypatch`` is undone."""
    monkeypatch.setattr(trials, "_TRIALS", {})


def forget_selections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start with no default selection remembered, until ``monkeypatch`` is undone."""
    monkeypatch.setattr(trials, "_SELECTED", {})
