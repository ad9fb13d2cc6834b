"""The ``remote`` backend: the core's own conversation, with a service's child at the far end.

The core drives an execution exactly as it drives a local child (see wire.py): this backend's
:class:`Launched` is a transport. Its channel yields the bytes the service relays from the
child's control channel and posts the host's frames back; its stdout and stderr are the
relayed streams; its teardown asks the service to terminate and finish the child. So grading,
the withholding rule, binding calls (the client's budgets, run log, paging), cancellation and
artifacts are the core's, unchanged, and nothing here counts or decides them.

Before anything is started the service's description is read (the only request ever retried)
and a service that cannot meet the terms is refused here, as data: nothing is sent.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from psych_sandbox_core.kit import (
    Backend,
    BackendRegistrar,
    BackendUnavailable,
    ErrorKind,
    Launched,
    LaunchRequest,
    Level,
    hookimpl,
)
from psych_sandbox_core.kit.relay import (
    PROTOCOL_VERSION,
    level_at_least,
)

from .client import Endpoint, RemoteExecution, read_description
from .options import RemoteOptions
from .wire import REMOTE_PROTOCOL_VERSION, Description, unmet_limits

#: Attempts at reading a description before an endpoint counts as down, and the pause
#: before each further attempt. Only the description is retried: it runs no program.
DESCRIPTION_ATTEMPTS = 3
DESCRIPTION_BACKOFF_SECONDS = (0.1, 0.4)


class RemoteBackend(
    Backend[RemoteOptions],
    id="remote",
    # A service is used only where it is isolated: a weaker one would have its output
    # withheld, so it is refused before anything is sent.
    claims=Level.ISOLATED,
    # A command travels in the run frame over the relayed channel, as a program does; a
    # service whose child does not run it is refused (see refusal_for).
    runs_commands=True,
):
    """Runs the bootstrap on a ``psych-sandbox serve`` service."""

    #: A prepared execution would hold one of the service's slots while it waits: only a
    #: profile that asks (``warm = N``) keeps any.
    prepared_by_default = False

    def __init__(self, options: RemoteOptions) -> None:
        super().__init__(options)
        self._endpoints = [Endpoint(url) for url in options.urls]
        self._next = 0

    def unavailable_reason(self) -> str | None:
        if not self._endpoints:
            return "no service is configured (set the profile's url option)"
        name = self.options.token_env
        if name is not None and not os.environ.get(name):
            return f"the environment variable {name} (the service's token) is not set"
        return None

    @asynccontextmanager
    async def launch(self, request: LaunchRequest) -> AsyncIterator[Launched]:
        endpoint, description, problems = await self._choose()
        if endpoint is None or description is None:
            raise BackendUnavailable(
                "no remote sandbox service answered with its description ("
                + "; ".join(problems)
                + "); nothing was sent"
            )
        execution = RemoteExecution(endpoint, self.options, request)
        try:
            refusal = refusal_for(description, request)
            if refusal is not None:
                execution.refuse(*refusal)
                yield execution
                return
            async with execution.running():
                yield execution
        finally:
            with anyio.CancelScope(shield=True):
                await execution.close()
        if execution.failure is not None and execution.failure[0] in (
            ErrorKind.REMOTE_DISCONNECTED,
            ErrorKind.REMOTE_TIMEOUT,
        ):
            endpoint.described = None
            endpoint.down_until = time.monotonic() + self.options.stall_seconds

    async def _choose(self) -> tuple[Endpoint | None, Description | None, list[str]]:
        """The next endpoint, in turn, whose description can be read; endpoints that failed
        lately are tried last."""
        count = len(self._endpoints)
        if not count:
            return None, None, ["no service is configured"]
        start, self._next = self._next, (self._next + 1) % count
        order = [self._endpoints[(start + i) % count] for i in range(count)]
        now = time.monotonic()
        order.sort(key=lambda endpoint: endpoint.down_until > now)
        problems: list[str] = []
        for endpoint in order:
            described = endpoint.described
            if described is not None and now - described[0] <= self.options.description_seconds:
                return endpoint, described[1], problems
            description, problem = await self._describe(endpoint)
            if description is not None:
                endpoint.described = (time.monotonic(), description)
                endpoint.down_until = 0.0
                return endpoint, description, problems
            endpoint.down_until = time.monotonic() + self.options.stall_seconds
            problems.append(f"{endpoint.url}: {problem}")
        return None, None, problems

    async def _describe(self, endpoint: Endpoint) -> tuple[Description | None, str]:
        problem = ""
        for attempt in range(DESCRIPTION_ATTEMPTS):
            if attempt:
                await anyio.sleep(DESCRIPTION_BACKOFF_SECONDS[attempt - 1])
            description, problem = await read_description(endpoint, self.options)
            if description is not None:
                return description, ""
        return None, problem


def refusal_for(description: Description, request: LaunchRequest) -> tuple[ErrorKind, str] | None:
    """Why a service's description is not enough for this execution, or None."""
    if description.protocol != REMOTE_PROTOCOL_VERSION:
        return ErrorKind.REMOTE_ERROR, (
            f"the service speaks remote protocol {description.protocol}, this client "
            f"{REMOTE_PROTOCOL_VERSION}; nothing was sent"
        )
    if description.child_protocol != PROTOCOL_VERSION:
        return ErrorKind.REMOTE_ERROR, (
            f"the service's sandboxed interpreter speaks protocol {description.child_protocol}, "
            f"this host {PROTOCOL_VERSION}; nothing was sent"
        )
    if not level_at_least(description.level, RemoteBackend.claims):
        return ErrorKind.ISOLATION_UNAVAILABLE, (
            f"the service reports the {description.level.value} level; this backend runs "
            f"programs only at the {RemoteBackend.claims.value} level; nothing was sent"
        )
    short = unmet_limits(request.limits, description.limits)
    if short:
        return ErrorKind.POLICY_REFUSED, (
            "the service cannot meet these terms (" + ", ".join(short) + "); nothing was sent"
        )
    return None


@hookimpl
def psych_sandbox_register_backends(registry: BackendRegistrar) -> None:
    registry.add(RemoteBackend)
