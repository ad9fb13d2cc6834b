"""Deployment configuration: a TOML file that maps profile names to a backend, its settings
and its caps.

The file is found from, in order: the ``config=`` argument of :class:`~.sandbox.Sandbox`, the
CLI's ``--config``, or the ``PSYCH_SANDBOX_CONFIG`` environment variable. Invalid configuration
fails when it is loaded, with a message naming the key and the problem, never at the first
affected run. A file looks like::

    [profiles.default]
    backend = "subprocess"
    required_level = "process"

    [profiles.default.limits]
    cpu_seconds = 10
    wall_seconds = 60.0

    [profiles.default.options]
    use_namespaces = true
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..errors import ConfigurationError
from ..grading import level_at_least
from ..kit.backend import Backend
from .profiles import DEFAULT_PROFILE, DeploymentConfig
from .registry import BackendRegistry
from .settings_errors import describe_errors

#: The environment variable naming a configuration file when no path is given.
ENV_VAR = "PSYCH_SANDBOX_CONFIG"

ConfigSource = DeploymentConfig | str | os.PathLike[str] | None


def _plain(value: Any) -> Any:
    """TOML's dates and times have no meaning here; turn them into text so validation names
    the key that holds one instead of the encoder failing without a key."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, (datetime.date, datetime.time, datetime.datetime)):
        return value.isoformat()
    return value


def parse_config(text: str, *, origin: str = "<string>") -> DeploymentConfig:
    """Parse and validate TOML text. Raises ConfigurationError naming the key at fault."""
    # Only here: a run with no configuration file never reads TOML.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised only on 3.10
        import tomli as tomllib  # type: ignore[import-not-found,no-redef,unused-ignore]

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{origin} is not valid TOML: {exc}") from None
    try:
        # Through JSON so that strict validation reads TOML's strings as enum values (a
        # level) while still refusing every coercion ("10" is not a number).
        return DeploymentConfig.model_validate_json(json.dumps(_plain(data)))
    except ValidationError as exc:
        raise ConfigurationError(
            f"invalid configuration in {origin}: {describe_errors(exc, model=DeploymentConfig)}"
        ) from None


def load_config(path: str | os.PathLike[str]) -> DeploymentConfig:
    """Load and validate a configuration file."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read the configuration file {file}: {exc.strerror or exc}"
        ) from None
    except UnicodeDecodeError:
        raise ConfigurationError(f"the configuration file {file} is not UTF-8 text") from None
    return parse_config(text, origin=str(file))


def resolve_config(source: ConfigSource) -> DeploymentConfig:
    """A DeploymentConfig from what the caller gave: one, a path, or None (then the
    environment variable, else an empty configuration)."""
    if isinstance(source, DeploymentConfig):
        return source
    if source is None:
        from_env = os.environ.get(ENV_VAR)
        if not from_env:
            return DeploymentConfig()
        return load_config(from_env)
    if isinstance(source, (str, os.PathLike)):
        return load_config(source)
    raise TypeError(
        f"config must be a DeploymentConfig, a path or None, not {type(source).__name__}"
    )


@dataclass(frozen=True)
class ConfigProblem:
    """Something in a configuration that ``run`` refuses, with the message it refuses with."""

    #: The profile at fault; None for a deployment-wide setting.
    profile: str | None
    message: str


def config_problems(config: DeploymentConfig, registry: BackendRegistry) -> list[ConfigProblem]:
    """Everything in ``config`` that can never work with the backends installed here: a
    backend nothing provides, settings its own strict model refuses, a required level its
    backend can never reach, an unknown id in backend_preference.

    The one check behind ``Sandbox`` (which raises the first), ``doctor`` and ``profiles``
    (which report them all), so none of them accepts what another refuses.
    """
    problems: list[ConfigProblem] = []
    for backend_id in config.backend_preference:
        try:
            registry.get(backend_id)
        except ConfigurationError as exc:
            problems.append(ConfigProblem(None, f"backend_preference: {exc}"))
    mcp_profile = config.mcp.profile
    if mcp_profile not in config.profiles and mcp_profile != DEFAULT_PROFILE:
        try:
            registry.get(mcp_profile)
        except ConfigurationError:
            problems.append(
                ConfigProblem(
                    None,
                    f"mcp.profile: no profile named {mcp_profile!r} is configured and no "
                    "installed backend has that id",
                )
            )
    for name, profile in config.profiles.items():
        if profile.backend is None:
            continue  # default's backend is chosen on this host: see selection.py
        try:
            registered = registry.get(profile.backend)
        except ConfigurationError as exc:
            problems.append(ConfigProblem(name, f"profiles.{name}.backend: {exc}"))
            continue
        try:
            registered.cls.Options.model_validate(profile.options)
        except ValidationError as exc:
            problems.append(
                ConfigProblem(
                    name,
                    "invalid configuration: "
                    + describe_errors(exc, ("profiles", name, "options"), registered.cls.Options),
                )
            )
        if not level_at_least(registered.cls.claims, profile.required_level):
            problems.append(
                ConfigProblem(
                    name,
                    f"profiles.{name}.required_level: {profile.required_level.value} can never "
                    f"be reached: the backend {profile.backend!r} reaches at most "
                    f"{registered.cls.claims.value}; name a backend that reaches it (see "
                    "psych-sandbox doctor) or lower required_level",
                )
            )
    return problems


def check_config(config: DeploymentConfig, registry: BackendRegistry) -> None:
    """Raise ConfigurationError for the first of :func:`config_problems`."""
    problems = config_problems(config, registry)
    if problems:
        raise ConfigurationError(problems[0].message)


def create_backend(
    registry: BackendRegistry, profile: str, backend_id: str, options: dict[str, object]
) -> Backend:
    """The backend a profile runs on, set up with the profile's settings. A backend that
    refuses its settings here (an interpreter that cannot be found, a host it cannot run on)
    is a configuration error naming the profile."""
    try:
        return registry.create(backend_id, options)
    except ConfigurationError as exc:
        raise type(exc)(f"profile {profile!r}: {exc}") from None
