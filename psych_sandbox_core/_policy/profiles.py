"""Profiles: a deployment's names for a backend, its settings and its caps."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .._output.capture import OutputPolicy
from ..budgets import BindingBudgets
from ..grading import Level, LevelSetting
from ..terms import ExecutionLimits
from .mcp_settings import McpSettings

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
    required_level: LevelSetting = Level.NONE
    #: Whether programs under this profile may be granted network access at all.
    allow_network: bool = False
    #: Budgets on binding calls; tenant policy may narrow them, a request never.
    budgets: BindingBudgets = Field(default_factory=BindingBudgets)
    #: Previews, attachments and artifact collection (see docs/output.md).
    output: OutputPolicy = Field(default_factory=OutputPolicy)
    #: The most children kept prepared (launched, connected, graded) ahead of their program,
    #: each used for exactly one program and discarded; within it the pool keeps as many as
    #: demand calls for (see pool.py). Needs the Sandbox used as ``async with``; 0 starts
    #: every execution cold. Unset: two, once the Sandbox runs the profile a second time (a
    #: Sandbox that runs one program prepares nothing it would not use).
    warm: Annotated[int, Field(ge=0, le=64)] | None = None
    #: The most memory the prepared children of this profile may hold together, as measured
    #: from the host once each is graded (a child its backend cannot measure counts at the
    #: limits' ``memory_bytes``): the pool keeps fewer rather than exceed it.
    warm_memory_bytes: Annotated[int, Field(gt=0)] = 1024 * 1024 * 1024
    #: Prepared children are discarded after this long without a program of the profile;
    #: the next program starts cold and the pool fills again.
    warm_idle_seconds: Annotated[float, Field(gt=0, le=86400, allow_inf_nan=False)] = 60.0


#: A profile name is used on command lines and in specs: keep it plain.
PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class DeploymentConfig(BaseModel):
    """A deployment's profiles. Installed backends are profiles of their own name too, with
    default settings, unless a profile here takes the name."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    profiles: dict[str, ProfileConfig] = Field(default_factory=dict)
    #: The lowest level any execution under any profile may run at: below it, a run is
    #: refused before the program runs (isolation_unavailable). One setting makes a
    #: deployment refuse rather than fall back to a weaker backend.
    required_level: LevelSetting = Level.NONE
    #: Backend ids ``default`` tries first within a level, before the built-in order (see
    #: selection.py): how a deployment prefers a third-party backend.
    backend_preference: list[str] = Field(default_factory=list)
    #: Upstream MCP servers and the profile ``psych-sandbox mcp`` serves (mcp_settings.py).
    mcp: McpSettings = Field(default_factory=McpSettings)

    @field_validator("profiles")
    @classmethod
    def _names_and_backends(cls, profiles: dict[str, ProfileConfig]) -> dict[str, ProfileConfig]:
        for name, profile in profiles.items():
            if not PROFILE_NAME.fullmatch(name):
                raise ValueError(
                    f"{name!r} is not a valid profile name (letters, digits, '_', '.', '-'; "
                    "at most 128)"
                )
            if profile.backend is None and name != DEFAULT_PROFILE:
                raise ValueError(f"profile {name!r} names no backend (only 'default' may omit it)")
            if profile.backend is None and profile.options:
                raise ValueError(
                    f"profile {name!r} has options but no backend; options belong to a backend"
                )
        return profiles

    @field_validator("backend_preference")
    @classmethod
    def _no_repeats(cls, preference: list[str]) -> list[str]:
        repeated = sorted({backend for backend in preference if preference.count(backend) > 1})
        if repeated:
            raise ValueError(f"lists {', '.join(map(repr, repeated))} more than once")
        return preference
