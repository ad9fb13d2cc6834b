"""Tenants: who a bearer token speaks for, and what the operator allowed each of them.

Tokens come from ``PSYCH_SANDBOX_SERVE_TOKENS`` (``tenant=token,...``) or the configuration's
``[serve.tenants.NAME]`` tables, never from a command line. A tenant's terms are its profile's
caps narrowed by its own policy: a tenant can be given less than the profile, never more.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from typing import Annotated

from psych_sandbox_core.kit import (
    ConfigurationError,
    ExecutionLimits,
)
from pydantic import BaseModel, ConfigDict, Field

TOKENS_ENV = "PSYCH_SANDBOX_SERVE_TOKENS"
TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: Shorter tokens are guessable: refused at start-up.
MIN_TOKEN_CHARS = 16


class TenantPolicy(BaseModel):
    """``[serve.tenants.NAME]``: what one tenant may ask for."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    #: The tenant's token, when not given in the environment.
    token: Annotated[str, Field(min_length=MIN_TOKEN_CHARS, max_length=512)] | None = None
    #: Narrows the profile's caps (unset fields keep the profile's).
    limits: dict[str, int | float | None] = Field(default_factory=dict)
    #: Whether this tenant's programs may be granted network access (if the profile allows).
    allow_network: bool = False


@dataclass(frozen=True)
class Tenant:
    name: str
    limits: ExecutionLimits
    allow_network: bool


class Tenants:
    """Token to tenant, compared in constant time. Holds the tokens; never shows them."""

    def __init__(self, tokens: dict[str, str], tenants: dict[str, Tenant]) -> None:
        self._tokens = [(tenant, token.encode()) for tenant, token in tokens.items()]
        self._tenants = tenants

    def __repr__(self) -> str:
        return f"Tenants({sorted(self._tenants)})"

    def __len__(self) -> int:
        return len(self._tokens)

    def authenticate(self, header: bytes | None) -> Tenant | None:
        if header is None or not header.startswith(b"Bearer "):
            return None
        presented = header[len(b"Bearer ") :].strip()
        found: str | None = None
        for tenant, token in self._tokens:
            # Every token is compared, so the time taken says nothing about which matched.
            if hmac.compare_digest(presented, token):
                found = tenant
        return None if found is None else self._tenants[found]


def parse_tokens(text: str) -> dict[str, str]:
    """``tenant=token,...`` as a mapping. Errors never quote a token."""
    tokens: dict[str, str] = {}
    for number, item in enumerate(text.split(","), start=1):
        item = item.strip()
        if not item:
            continue
        tenant, sep, token = item.partition("=")
        tenant, token = tenant.strip(), token.strip()
        if not sep or not TENANT_NAME.fullmatch(tenant):
            raise ConfigurationError(
                f"{TOKENS_ENV}: item {number} is not tenant=token with a plain tenant name"
            )
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigurationError(
                f"{TOKENS_ENV}: the token of tenant {tenant!r} is shorter than "
                f"{MIN_TOKEN_CHARS} characters"
            )
        if tenant in tokens:
            raise ConfigurationError(f"{TOKENS_ENV}: tenant {tenant!r} is named twice")
        tokens[tenant] = token
    return tokens


def build_tenants(
    caps: ExecutionLimits,
    allow_network: bool,
    policies: dict[str, TenantPolicy],
    environment_tokens: dict[str, str],
) -> Tenants:
    tokens = {name: policy.token for name, policy in policies.items() if policy.token}
    tokens.update(environment_tokens)
    if not tokens:
        raise ConfigurationError(
            f"no tokens: set {TOKENS_ENV} (tenant=token,...) or give [serve.tenants.NAME] "
            "a token in the configuration"
        )
    if len({token for token in tokens.values()}) != len(tokens):
        raise ConfigurationError("two tenants share a token")
    tenants: dict[str, Tenant] = {}
    for name in tokens:
        policy = policies.get(name, TenantPolicy())
        tenants[name] = Tenant(
            name=name,
            limits=narrowed(caps, policy.limits, name),
            allow_network=allow_network and policy.allow_network,
        )
    return Tenants(tokens, tenants)


def narrowed(
    caps: ExecutionLimits, policy: dict[str, int | float | None], tenant: str
) -> ExecutionLimits:
    """The caps, each lowered to the tenant's where the tenant's is lower; never raised."""
    values = caps.model_dump()
    for name, value in policy.items():
        if name not in values:
            raise ConfigurationError(f"tenant {tenant!r}: no limit is called {name!r}")
        cap = values[name]
        if value is None:
            continue  # unlimited asks for nothing narrower
        values[name] = value if cap is None else min(cap, value)
    try:
        return ExecutionLimits.model_validate(values, strict=False)
    except ValueError as exc:
        raise ConfigurationError(f"tenant {tenant!r}: invalid limits: {exc}") from None
