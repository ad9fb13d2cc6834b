"""The one hook psych-sandbox plugins implement.

Plugins are discovered from the ``psych_sandbox`` entry-point group; the entry point's name
is the backend id it provides. Hooks only register classes: all I/O is async on the backend.
Each plugin's hook is called once, with a registrar of its own: what it adds is attributed to
the distribution the plugin came from (registry.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import pluggy

if TYPE_CHECKING:
    from .backend import Backend

PROJECT = "psych_sandbox"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class BackendRegistrar(Protocol):
    def add(self, backend: type[Backend]) -> None:
        """Register one backend class under its ``id``."""


@hookspec
def psych_sandbox_register_backends(registry: BackendRegistrar) -> None:
    """Register backend classes with ``registry.add(BackendClass)``."""
