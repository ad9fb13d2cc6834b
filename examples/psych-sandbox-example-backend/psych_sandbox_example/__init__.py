"""An example psych-sandbox backend: the subprocess mechanism under the id ``example``.

A real backend would start the bootstrap inside its own boundary (a namespace, a container, a
remote service) and report the mechanisms it applied. It never states its level: the core
grades its mechanisms against what the child observes.
"""

from __future__ import annotations

from typing import ClassVar

from psych_sandbox_core.backend_kit import (
    BackendOptions,
    BackendRegistrar,
    Level,
    SubprocessBackend,
    SubprocessOptions,
    hookimpl,
)


class ExampleOptions(SubprocessOptions):
    """The backend's own settings: strict, unknown keys rejected (inherited)."""


class ExampleBackend(SubprocessBackend):
    id: ClassVar[str] = "example"
    Options: ClassVar[type[BackendOptions]] = ExampleOptions
    # What this backend aims for; a report that comes back weaker gets its output withheld.
    claims: ClassVar[Level] = Level.PROCESS


@hookimpl
def psych_sandbox_register_backends(registry: BackendRegistrar) -> None:
    registry.add(ExampleBackend)
