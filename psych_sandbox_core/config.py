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
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .errors import ConfigurationError
from .profiles import DeploymentConfig
from .registry import BackendRegistry

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib  # type: ignore[import-not-found,no-redef,unused-ignore]

#: The environment variable naming a configuration file when no path is given.
ENV_VAR = "PSYCH_SANDBOX_CONFIG"

ConfigSource = DeploymentConfig | str | os.PathLike[str] | None


def describe_errors(exc: ValidationError, prefix: tuple[str | int, ...] = ()) -> str:
    """One line per problem, each naming its dotted key."""
    problems = []
    for err in exc.errors(include_url=False, include_input=False):
        key = ".".join(str(part) for part in (*prefix, *err["loc"])) or "(top level)"
        problems.append(f"{key}: {err['msg']}")
    return "; ".join(problems)


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
            f"invalid configuration in {origin}: {describe_errors(exc)}"
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


def check_backends(config: DeploymentConfig, registry: BackendRegistry) -> None:
    """Check, at load, that every profile names an installed backend and that its settings
    pass that backend's own strict options model."""
    for name, profile in config.profiles.items():
        if profile.backend is None:
            continue
        try:
            registered = registry.get(profile.backend)
        except ConfigurationError as exc:
            raise ConfigurationError(f"profiles.{name}.backend: {exc}") from None
        try:
            registered.cls.Options.model_validate(profile.options)
        except ValidationError as exc:
            raise ConfigurationError(
                "invalid configuration: "
                + describe_errors(exc, ("profiles", name, "options"))
            ) from None
