"""The deployment's ``[mcp]`` section: the upstream MCP servers whose tools programs may call,
and the profile ``psych-sandbox mcp`` runs programs under.

Plain, strict models with no MCP import, kept in the core (and exposed to psych-sandbox-mcp
by the integration kit), so a configuration file is validated at load the same way whether
or not that integration is installed::

    [mcp]
    profile = "agents"

    [mcp.upstreams.everything]
    transport = "stdio"
    command = "mcp-server-everything"
    args = ["stdio"]

    [mcp.upstreams.search]
    transport = "streamable-http"
    url = "https://search.example/mcp"
    headers = { Authorization = "Bearer ..." }
    approval = ["delete-index"]     # needs a person's approval: never offered to a program
"""

from __future__ import annotations

import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: An upstream's name qualifies its tools when two upstreams offer the same name
#: (``name/tool``), so it may not contain the separator.
UPSTREAM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class _Upstream(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    #: Tools of this upstream that need a person's approval: they are never offered to a
    #: program, and a call to one is refused before it reaches the upstream
    #: (approval_required), as for every tool that may suspend the run.
    approval: list[str] = Field(default_factory=list)
    #: How long one call (or the tool listing) may wait for the upstream's answer; past it
    #: the call fails as unreachable. The execution's own wall clock bounds it too.
    timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = 60.0


class StdioUpstream(_Upstream):
    """An upstream started as a local process, spoken to over its stdin and stdout."""

    transport: Literal["stdio"]
    command: Annotated[str, Field(min_length=1)]
    args: list[str] = Field(default_factory=list)
    #: Variables added to the small default environment the SDK gives the process (PATH,
    #: HOME and the like): the host's own environment is not handed over.
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None


class HttpUpstream(_Upstream):
    """An upstream reached over MCP's streamable HTTP transport."""

    transport: Literal["streamable-http"]
    url: str
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return url


Upstream = Annotated[StdioUpstream | HttpUpstream, Field(discriminator="transport")]


class McpSettings(BaseModel):
    """The ``[mcp]`` section of a deployment configuration."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    #: The profile ``psych-sandbox mcp`` runs programs under (a configured profile, an
    #: installed backend's id, or ``default``).
    profile: str = "default"
    #: Upstream MCP servers, by a name of the deployment's choosing; every tool they offer
    #: when an execution starts is callable from it.
    upstreams: dict[str, Upstream] = Field(default_factory=dict)

    @field_validator("upstreams")
    @classmethod
    def _names(cls, upstreams: dict[str, Upstream]) -> dict[str, Upstream]:
        for name in upstreams:
            if not UPSTREAM_NAME.fullmatch(name):
                raise ValueError(
                    f"{name!r} is not a valid upstream name (letters, digits, '_', '.', '-'; "
                    "at most 64)"
                )
        return upstreams
