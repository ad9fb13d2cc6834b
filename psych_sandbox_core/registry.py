"""Discovering backends from entry points and instantiating them from profile settings."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import importlib_metadata
import pluggy
from pydantic import ValidationError

from . import hookspecs
from .backend import Backend
from .errors import ConfigurationError, UnknownBackendError

ENTRY_POINT_GROUP = "psych_sandbox"

#: Where to get a backend nobody has installed, for the error message.
KNOWN_DISTRIBUTIONS = {
    "bwrap": "psych-sandbox-bwrap",
    "docker": "psych-sandbox-docker",
    "macos": "psych-sandbox-macos",
    "windows": "psych-sandbox-windows",
    "remote": "psych-sandbox-remote",
}


@dataclass(frozen=True)
class RegisteredBackend:
    cls: type[Backend]
    distribution: str | None
    version: str | None


class BackendRegistry:
    """Backends registered through the hook, each with the distribution that served it."""

    def __init__(self) -> None:
        self._backends: dict[str, RegisteredBackend] = {}
        self._manager = pluggy.PluginManager(hookspecs.PROJECT)
        self._manager.add_hookspecs(hookspecs)
        self._loaded: set[str] = set()
        self._serving: tuple[str | None, str | None] = (None, None)
        self._everything_loaded = False
        self._entry_points: list[importlib_metadata.EntryPoint] | None = None

    # The registrar interface plugins see.
    def add(self, backend: type[Backend]) -> None:
        if not (isinstance(backend, type) and issubclass(backend, Backend)):
            raise ConfigurationError(f"{backend!r} is not a psych_sandbox_core Backend subclass")
        backend_id = getattr(backend, "id", None)
        if not isinstance(backend_id, str) or not backend_id.isidentifier():
            raise ConfigurationError(f"backend {backend!r} has no valid 'id'")
        self._backends[backend_id] = RegisteredBackend(backend, *self._serving)

    def register_plugin(
        self, plugin: object, name: str, distribution: str | None = None, version: str | None = None
    ) -> None:
        """Register an in-process plugin object (tests, embedders) as if from an entry point."""
        if self._manager.is_registered(plugin) or name in self._loaded:
            return
        self._manager.register(plugin, name=name)
        self._manager.check_pending()
        self._loaded.add(name)
        self._serving = (distribution, version)
        try:
            for impl in self._manager.hook.psych_sandbox_register_backends.get_hookimpls():
                if impl.plugin is plugin:
                    impl.function(registry=self)
        finally:
            self._serving = (None, None)

    def load(self, backend_id: str | None = None) -> None:
        """Load entry points: only the one named ``backend_id``, or all of them."""
        if self._everything_loaded or (backend_id is not None and backend_id in self._loaded):
            return
        for entry_point in self.entry_points():
            if backend_id is not None and entry_point.name != backend_id:
                continue
            if entry_point.name in self._loaded:
                continue
            try:
                plugin = entry_point.load()
            except Exception as exc:
                raise ConfigurationError(
                    f"the psych_sandbox plugin {entry_point.name!r} failed to load: {exc}"
                ) from exc
            dist = entry_point.dist
            self.register_plugin(
                plugin,
                entry_point.name,
                dist.metadata["Name"] if dist is not None else None,
                dist.version if dist is not None else None,
            )
        if backend_id is None:
            self._everything_loaded = True

    def entry_points(self) -> list[importlib_metadata.EntryPoint]:
        """The ``psych_sandbox`` entry points installed here, none of them loaded. Read once
        per registry: scanning every distribution's metadata is a cost worth paying once."""
        if self._entry_points is None:
            self._entry_points = list(importlib_metadata.entry_points(group=ENTRY_POINT_GROUP))
        return self._entry_points

    def ids(self) -> list[str]:
        self.load()
        return sorted(self._backends)

    def get(self, backend_id: str) -> RegisteredBackend:
        self.load(backend_id)
        if backend_id not in self._backends:
            self.load()
        try:
            return self._backends[backend_id]
        except KeyError:
            hint = KNOWN_DISTRIBUTIONS.get(backend_id)
            install = f"; install it with: pip install {hint}" if hint else ""
            close = difflib.get_close_matches(
                backend_id, [*self._backends, *KNOWN_DISTRIBUTIONS], n=1, cutoff=0.6
            )
            if not hint and close:
                install = f"; did you mean {close[0]!r}?"
            raise UnknownBackendError(
                f"no installed plugin provides the backend {backend_id!r} "
                f"(installed: {', '.join(sorted(self._backends)) or 'none'}){install}"
            ) from None

    def create(self, backend_id: str, options: dict[str, object]) -> Backend:
        """Instantiate a backend with its settings, validated by its own strict model."""
        from .config import describe_errors  # config.py builds on this module

        registered = self.get(backend_id)
        try:
            parsed = registered.cls.Options.model_validate(options)
        except ValidationError as exc:
            problems = describe_errors(exc, model=registered.cls.Options)
            raise ConfigurationError(
                f"invalid settings for backend {backend_id!r}: {problems}"
            ) from None
        return registered.cls(parsed)
