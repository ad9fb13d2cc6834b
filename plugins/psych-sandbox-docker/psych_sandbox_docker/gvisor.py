"""Entry point of the ``gvisor`` backend: the docker backend with gVisor's runsc runtime."""

from __future__ import annotations

from psych_sandbox_core.kit import (
    BackendRegistrar,
    hookimpl,
)

from .backend import GvisorBackend


@hookimpl
def psych_sandbox_register_backends(registry: BackendRegistrar) -> None:
    registry.add(GvisorBackend)
