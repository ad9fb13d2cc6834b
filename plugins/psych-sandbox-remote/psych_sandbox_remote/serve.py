"""``psych-sandbox serve --profile NAME --listen HOST:PORT [--config FILE]``.

Loads the profile, runs one trial execution on it (the level and grades the description
reports are what that trial reached here, not what the backend claims), reads the tenants'
tokens from ``PSYCH_SANDBOX_SERVE_TOKENS`` or the configuration (never a command line) and
serves with uvicorn until SIGINT or SIGTERM.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys
from typing import Annotated

import anyio
from psych_sandbox_core.kit import (
    ConfigurationError,
    Level,
)
from psych_sandbox_core.kit.relay import (
    HANDSHAKE_SECONDS,
)
from psych_sandbox_core.service_kit import (
    BackendRegistry,
    DeploymentConfig,
    ProfileConfig,
    availability,
    create_backend,
    describe_errors,
    resolve_config,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10
    import tomli as tomllib  # type: ignore[import-not-found,no-redef,unused-ignore]

from .service import ServedProfile, Service
from .tenants import TOKENS_ENV, TenantPolicy, build_tenants, parse_tokens


class ServeSettings(BaseModel):
    """The ``[serve]`` table of a configuration file (read only by ``serve``)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    #: Executions run at once; beyond it a start is refused (503, "full"), never queued.
    capacity: Annotated[int, Field(ge=1, le=4096)] = max(1, os.cpu_count() or 1)
    tenants: dict[str, TenantPolicy] = Field(default_factory=dict)
    #: TLS for the listener; without it, only a loopback address is served unless the
    #: operator vouches for the path (a pod network behind a Service, a sidecar).
    tls_certfile: str | None = None
    tls_keyfile: str | None = None
    trusted_plaintext: bool = False
    #: How long a child of the served profile may take to start and reach its channel
    #: (a cold container takes seconds, bubblewrap a fraction of one): it bounds the wait
    #: for the channel, and with the wall clock and grace, how long an execution may live.
    handshake_seconds: Annotated[float, Field(gt=0, le=600)] = HANDSHAKE_SECONDS


def load(path: str | None) -> tuple[DeploymentConfig, ServeSettings]:
    """The deployment configuration and its ``[serve]`` table."""
    if path is None:
        return resolve_config(None), ServeSettings()
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read the configuration file {path}: {exc.strerror}"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{path} is not valid TOML: {exc}") from None
    serve = data.pop("serve", {})
    try:
        settings = ServeSettings.model_validate_json(json.dumps(serve))
    except ValidationError as exc:
        raise ConfigurationError(
            f"invalid [serve] table in {path}: {describe_errors(exc, model=ServeSettings)}"
        ) from None
    try:
        config = DeploymentConfig.model_validate_json(json.dumps(data, default=str))
    except ValidationError as exc:
        raise ConfigurationError(
            f"invalid configuration in {path}: {describe_errors(exc, model=DeploymentConfig)}"
        ) from None
    return config, settings


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigurationError(f"--listen {listen!r} is not HOST:PORT")
    return host, int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def prepare(
    profile_name: str,
    config: DeploymentConfig,
    settings: ServeSettings,
    registry: BackendRegistry | None = None,
) -> Service:
    """The service for one profile, its level established by a trial execution."""
    registry = registry or BackendRegistry()
    profile = config.profiles.get(profile_name)
    if profile is None:
        if profile_name not in registry.ids():
            raise ConfigurationError(
                f"no profile {profile_name!r} in the configuration and no backend of that name"
            )
        profile = ProfileConfig(backend=profile_name)
    if profile.backend is None:
        raise ConfigurationError(
            f"profile {profile_name!r} names no backend: a service serves one backend, so "
            "its level is that backend's"
        )
    if profile.backend == "remote":
        raise ConfigurationError("a service cannot serve the remote backend itself")
    backend = create_backend(registry, profile_name, profile.backend, dict(profile.options))
    found = await availability(registry, profile.backend, dict(profile.options))
    if not found.available or found.level is None:
        raise ConfigurationError(
            f"profile {profile_name!r} cannot run here: {found.reason or 'no level reached'}"
        )
    registered = registry.get(profile.backend)
    tenants = build_tenants(
        profile.limits,
        profile.allow_network,
        settings.tenants,
        parse_tokens(os.environ.get(TOKENS_ENV, "")),
    )
    label = (
        profile.backend
        if registered.version is None
        else (f"{profile.backend} {registered.version}")
    )
    served = ServedProfile(
        name=profile_name,
        backend=backend,
        backend_label=label,
        caps=profile.limits,
        allow_network=profile.allow_network,
        level=Level(found.level),
        grades=dict(found.grades),
    )
    return Service(served, tenants, settings.capacity, settings.handshake_seconds)


def main(profile: str, listen: str, config_path: str | None) -> int:
    """Serve until interrupted; 2 for a configuration error."""
    import uvicorn

    try:
        host, port = parse_listen(listen)
        config, settings = load(config_path)
        if settings.tls_certfile is None and not (_is_loopback(host) or settings.trusted_plaintext):
            raise ConfigurationError(
                f"listening on {host} without TLS would take tokens in plaintext from the "
                "network: set [serve] tls_certfile and tls_keyfile, or trusted_plaintext = true "
                "where the operator vouches for the path"
            )
        service = anyio.run(prepare, profile, config, settings)
    except ConfigurationError as exc:
        print(f"psych-sandbox serve: {exc}", file=sys.stderr)
        return 2
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        print(f"psych-sandbox serve: cannot listen on {listen}: {exc.strerror}", file=sys.stderr)
        return 2
    sock.listen(256)
    bound = sock.getsockname()[1]
    scheme = "https" if settings.tls_certfile else "http"
    uv_config = uvicorn.Config(
        service,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        ssl_certfile=settings.tls_certfile,
        ssl_keyfile=settings.tls_keyfile,
    )
    server = uvicorn.Server(uv_config)
    described = service.profile
    print(
        f"psych-sandbox serve: listening on {scheme}://{_url_host(host)}:{bound} (profile "
        f"{described.name}, backend {described.backend_label}, level {described.level.value}, "
        f"{len(service.tenants)} tenant(s), capacity {service.load.capacity})",
        file=sys.stderr,
        flush=True,
    )
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
