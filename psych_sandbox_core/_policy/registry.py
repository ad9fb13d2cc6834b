"""Discovering backends from entry points and instantiating them from profile settings."""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
from dataclasses import dataclass
from typing import Any

import pluggy
from pydantic import ValidationError

from .. import __version__
from ..errors import ConfigurationError, UnknownBackendError
from ..kit import hookspecs
from ..kit.backend import Backend
from .settings_errors import describe_errors

ENTRY_POINT_GROUP = "psych_sandbox"
#: The plugins the core ships (as entry points of its own distribution, like any plugin):
#: asked for by name, each is registered from the core directly, with the core's own
#: distribution and version, sparing a scan of every installed distribution's metadata.
CORE_PLUGINS = {"subprocess": "psych_sandbox_core.backends.subprocess"}
CORE_DISTRIBUTION = "psych-sandbox-core"

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


@dataclass(frozen=True)
class _Registrar:
    """What one plugin's hook implementation is handed: every backend it adds is attributed
    to the distribution that plugin came from, fixed before the hook is called."""

    registry: BackendRegistry
    distribution: str | None
    version: str | None

    def add(self, backend: type[Backend]) -> None:
        if not (isinstance(backend, type) and issubclass(backend, Backend)):
            raise ConfigurationError(f"{backend!r} is not a psych_sandbox_core Backend subclass")
        backend_id = getattr(backend, "id", None)
        if not isinstance(backend_id, str) or not backend_id.isidentifier():
            raise ConfigurationError(f"backend {backend!r} has no valid 'id'")
        self.registry._backends[backend_id] = RegisteredBackend(
            backend, self.distribution, self.version
        )


def name_and_version(dist: Any) -> tuple[str, str]:
    """A distribution's name and version (``dist`` is an importlib.metadata distribution, or
    pluggy's facade of one) from the head of its metadata file, where they are plain
    ``Name:`` and ``Version:`` lines: reading them through ``dist.metadata`` parses the whole
    file with the email package, which costs a command's start-up several milliseconds.
    Anything unexpected takes that way."""
    found: dict[str, str] = {}
    for line in (dist.read_text("METADATA") or dist.read_text("PKG-INFO") or "").splitlines():
        if not line.strip():
            break  # the headers end here
        key, _, value = line.partition(":")
        if key in ("Name", "Version") and key not in found:
            found[key] = value.strip()
    if found.get("Name") and found.get("Version"):
        return found["Name"], found["Version"]
    return dist.metadata["Name"], dist.version


class BackendRegistry:
    """Backends registered through the hook, each with the distribution that served it.

    pluggy's manager does the work: it loads the entry-point group (only the entry point
    named for a backend when one is asked for), records which distribution each plugin came
    from (``list_plugin_distinfo``), and calls the hook.
    """

    def __init__(self) -> None:
        self._backends: dict[str, RegisteredBackend] = {}
        self._manager = pluggy.PluginManager(hookspecs.PROJECT)
        self._manager.add_hookspecs(hookspecs)
        #: Plugins whose hook has been called: each registers its backends once.
        self._asked: set[str] = set()
        #: Distributions named for plugins registered by hand (pluggy records only those it
        #: loaded from entry points).
        self._by_hand: dict[str, tuple[str | None, str | None]] = {}
        self._everything_loaded = False
        self._entry_points: list[importlib.metadata.EntryPoint] | None = None

    def register_plugin(
        self, plugin: object, name: str, distribution: str | None = None, version: str | None = None
    ) -> None:
        """Register an in-process plugin object (tests, embedders) as if from an entry point."""
        if self._manager.is_registered(plugin) or self._manager.has_plugin(name):
            return
        self._manager.register(plugin, name=name)
        self._by_hand[name] = (distribution, version)
        self._ask_new_plugins()

    def load(self, backend_id: str | None = None) -> None:
        """Load entry points: only the one named ``backend_id``, or all of them."""
        if self._everything_loaded or (
            backend_id is not None and self._manager.has_plugin(backend_id)
        ):
            return
        if backend_id in CORE_PLUGINS:
            plugin = importlib.import_module(CORE_PLUGINS[backend_id])
            self.register_plugin(plugin, backend_id, CORE_DISTRIBUTION, __version__)
            return
        if backend_id is not None and self._load_first_party(backend_id):
            return
        try:
            self._manager.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=backend_id)
        except Exception as exc:
            failed = backend_id if backend_id is not None else self._first_unloaded()
            raise ConfigurationError(
                f"the psych_sandbox plugin {failed!r} failed to load: {exc}"
            ) from exc
        finally:
            # Whatever loaded before a failure registers its backends all the same.
            self._ask_new_plugins()
        if backend_id is None:
            self._everything_loaded = True

    def _load_first_party(self, backend_id: str) -> bool:
        """Load a first-party backend's entry point from its own distribution's metadata,
        found by name, sparing the scan of every installed distribution that pluggy's loader
        makes (the costliest step of loading one backend). False when that distribution is
        not installed, has no such entry point, or the name is blocked: then the scan
        decides, as for any other backend."""
        distribution = KNOWN_DISTRIBUTIONS.get(backend_id)
        if distribution is None or self._manager.is_blocked(backend_id):
            return False
        try:
            dist = importlib.metadata.distribution(distribution)
        except importlib.metadata.PackageNotFoundError:
            return False
        found = dist.entry_points.select(group=ENTRY_POINT_GROUP, name=backend_id)
        if not found:
            return False
        try:
            plugin = next(iter(found)).load()
        except Exception as exc:
            raise ConfigurationError(
                f"the psych_sandbox plugin {backend_id!r} failed to load: {exc}"
            ) from exc
        self.register_plugin(plugin, backend_id, *name_and_version(dist))
        return True

    def _first_unloaded(self) -> str | None:
        """The entry point pluggy was loading when it failed: the first, in the order it
        reads them, that it did not register."""
        for dist in importlib.metadata.distributions():
            for entry_point in dist.entry_points:
                if entry_point.group == ENTRY_POINT_GROUP and not (
                    self._manager.has_plugin(entry_point.name)
                    or self._manager.is_blocked(entry_point.name)
                ):
                    return entry_point.name
        return None

    def _ask_new_plugins(self) -> None:
        """Call the hook of every plugin registered since the last call, each with a
        registrar bound to the distribution pluggy (or the caller) recorded for it."""
        self._manager.check_pending()
        loaded = {
            id(plugin): name_and_version(dist)
            for plugin, dist in self._manager.list_plugin_distinfo()
        }
        for name, plugin in self._manager.list_name_plugin():
            if name in self._asked or plugin is None:
                continue
            self._asked.add(name)
            distribution, version = loaded.get(id(plugin)) or self._by_hand.get(name, (None, None))
            others = [other for other in self._manager.get_plugins() if other is not plugin]
            # Through pluggy's own caller, narrowed to this plugin: what it adds is its own.
            call = self._manager.subset_hook_caller("psych_sandbox_register_backends", others)
            call(registry=_Registrar(self, distribution, version))

    def entry_points(self) -> list[importlib.metadata.EntryPoint]:
        """The ``psych_sandbox`` entry points installed here, none of them loaded, each with
        its distribution (``.dist``; read its name and version with :func:`name_and_version`).
        Read once per registry: scanning every distribution's metadata is a cost worth paying
        once. The standard library's reader, already imported: the backport costs a command
        that remembers ``default``'s choice more than the scan itself."""
        if self._entry_points is None:
            self._entry_points = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
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
        registered = self.get(backend_id)
        try:
            parsed = registered.cls.Options.model_validate(options)
        except ValidationError as exc:
            problems = describe_errors(exc, model=registered.cls.Options)
            raise ConfigurationError(
                f"invalid settings for backend {backend_id!r}: {problems}"
            ) from None
        return registered.cls(parsed)
