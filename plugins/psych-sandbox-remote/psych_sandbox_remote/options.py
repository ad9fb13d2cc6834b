"""The remote backend's settings, and the rule on where a credential may travel."""

from __future__ import annotations

import ipaddress
from typing import Annotated
from urllib.parse import urlsplit

from psych_sandbox_core.kit import (
    BackendOptions,
)
from pydantic import Field, field_validator, model_validator

from .stream import StreamCeilings

Seconds = Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)]


class RemoteOptions(BackendOptions):
    """``backend = "remote"``: where the service is and how to reach it."""

    #: One service URL, or several (executions are spread over them; one that stops
    #: answering is tried last for a while). None configured: the backend is installed but
    #: unavailable (the default profile passes it by).
    url: str | list[str] = Field(default_factory=list)
    #: The name of the environment variable holding this client's token. Read at each
    #: request; never the token itself in configuration.
    token_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")] | None = None
    #: The operator vouches for a plaintext (http://) path to a service off this machine
    #: (a sidecar, a private link): the token may be sent over it.
    trusted_plaintext: bool = False
    #: Silence from a service for this long ends its execution as remote_timeout (it sends
    #: a heartbeat every second).
    stall_seconds: Seconds = 10.0
    #: Connecting to a service.
    connect_seconds: Seconds = 10.0
    #: A description read this recently is used again without asking.
    description_seconds: Annotated[float, Field(ge=0, le=3600, allow_inf_nan=False)] = 2.0
    #: Ceilings on one execution's stream (see stream.py).
    max_stream_bytes: Annotated[int, Field(gt=0)] = StreamCeilings.stream_bytes
    max_lines: Annotated[int, Field(gt=0)] = StreamCeilings.lines
    max_blank_lines: Annotated[int, Field(ge=0)] = StreamCeilings.blank_lines

    @property
    def urls(self) -> list[str]:
        return [self.url] if isinstance(self.url, str) else list(self.url)

    @property
    def ceilings(self) -> StreamCeilings:
        return StreamCeilings(
            stream_bytes=self.max_stream_bytes,
            lines=self.max_lines,
            blank_lines=self.max_blank_lines,
        )

    @field_validator("url")
    @classmethod
    def _urls(cls, url: str | list[str]) -> str | list[str]:
        urls = [url] if isinstance(url, str) else url
        if len(urls) > 256:
            raise ValueError("names more than 256 services")
        for each in urls:
            parts = urlsplit(each)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{each!r} is not an http:// or https:// URL")
            if parts.username is not None or parts.password is not None:
                # A credential in a URL ends up in logs and messages: token_env only.
                raise ValueError("a URL may not carry a user or password; use token_env")
            if parts.query or parts.fragment:
                raise ValueError(f"{each!r} has a query or fragment; give the service's base URL")
        return url

    @model_validator(mode="after")
    def _credential_path(self) -> RemoteOptions:
        if self.token_env is None or self.trusted_plaintext:
            return self
        for each in self.urls:
            if urlsplit(each).scheme == "http" and not is_loopback(each):
                raise ValueError(
                    f"{each!r} is plaintext and not on this machine: the token would cross the "
                    "network readable; use https://, or set trusted_plaintext = true if the "
                    "operator vouches for the path"
                )
        return self


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
