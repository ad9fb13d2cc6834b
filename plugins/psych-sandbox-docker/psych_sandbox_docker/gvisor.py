"""Entry point of the ``gvisor`` backend: the docker backend with gVisor's runsc runtime."""

from __future__ import annotations

from psych_sandbox_core import hookspecs

from .backend import GvisorBackend


@hookspecs.hookimpl
def psych_sandbox_register_backends(registry: hookspecs.BackendRegistrar) -> None:
    registry.add(GvisorBackend)
