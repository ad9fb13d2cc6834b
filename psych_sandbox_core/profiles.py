"""Profiles: a deployment's names for a backend, its settings and its caps."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .grading import Level
from .terms import ExecutionLimits

DEFAULT_PROFILE = "default"


class ProfileConfig(BaseModel):
    """One profile as a deployment configures it."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    #: Backend id; None (only for the default profile) picks the strongest backend that
    #: actually works on this host.
    backend: str | None = None
    #: The backend's own settings, validated by its strict options model.
    options: dict[str, Any] = Field(default_factory=dict)
    #: The deployment's caps; requests and tenant policy can only narrow them.
    limits: ExecutionLimits = Field(default_factory=ExecutionLimits)
    #: The lowest level an execution under this profile may run at.
    required_level: Level = Level.NONE
    #: Whether programs under this profile may be granted network access at all.
    allow_network: bool = False


class DeploymentConfig(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    profiles: dict[str, ProfileConfig] = Field(default_factory=dict)
