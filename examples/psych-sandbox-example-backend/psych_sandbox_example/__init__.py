"""An example psych-sandbox backend: the subprocess mechanism under the id ``example``.

A real backend would start the bootstrap inside its own boundary (a namespace, a container, a
remote service) and report the mechanisms it applied. It never states its level: the core
grades its mechanisms against what the child observes.
"""

from __future__ import annotations

from psych_sandbox_core.kit import (
    BackendRegistrar,
    Level,
    SubprocessBackend,
    SubprocessOptions,
    hookimpl,
)


class ExampleOptions(SubprocessOptions):
    """The backend's own settings: strict, unknown keys rejected (inherited)."""


class ExampleBackend(
    SubprocessBackend,
    id="example",
    # A narrower settings model than the one inherited.
    options=ExampleOptions,
    # What this backend aims for; a report that comes back weaker gets its output withheld.
    claims=Level.PROCESS,
):
    """The subprocess mechanism under another id."""


@hookimpl
def psych_sandbox_register_backends(registry: BackendRegistrar) -> None:
    registry.add(ExampleBackend)
