"""Profiles loaded on first use: each one's configuration, backend and identity, and the
terms of the requests it has seen; ``default``'s backend chosen by trials or remembered."""

from __future__ import annotations

import dataclasses
import difflib

import anyio

from .._policy.config import create_backend
from .._policy.narrowing import (
    BackendCapability,
    ExecutionRequest,
    TenantPolicy,
    Terms,
    narrow,
    strictest_level,
)
from .._policy.profiles import DEFAULT_PROFILE, DeploymentConfig, ProfileConfig
from .._policy.registry import BackendRegistry
from .._policy.selection import Selection
from .._policy.selection_cache import SelectionCache
from .._policy.trials import remembered_or_selected, select_default
from ..errors import ConfigurationError, UnknownBackendError, UnknownProfileError
from ..kit.backend import Backend
from ..result import BackendIdentity

#: How many different requests' terms a loaded profile keeps.
TERMS_KEPT = 64


@dataclasses.dataclass
class LoadedProfile:
    name: str
    config: ProfileConfig
    backend: Backend
    identity: BackendIdentity
    #: How ``default`` chose its backend on this host; None when the profile names one.
    selection: Selection | None = None
    #: The terms of the requests seen so far (see :meth:`terms`).
    _terms: dict[tuple[TenantPolicy | None, ExecutionRequest], Terms] = dataclasses.field(
        default_factory=dict, repr=False
    )

    def terms(self, policy: TenantPolicy | None, request: ExecutionRequest) -> Terms:
        """The terms of an execution of this profile (narrow). Kept for requests seen before:
        the same inputs give the same terms, and a caller sends the same request time after
        time. Refusals are not kept (each result gets a failure of its own), nor are the
        terms of more than TERMS_KEPT different requests (all are dropped then)."""
        key = (policy, request)
        try:
            kept, keepable = self._terms.get(key), True
        except TypeError:  # something unhashable in the policy or the request
            kept, keepable = None, False
        if kept is not None:
            return kept
        terms = narrow(
            BackendCapability.of(type(self.backend)),
            policy or TenantPolicy(),
            request,
            self.name,
            self.config,
        )
        if keepable and terms.refusal is None:
            if len(self._terms) >= TERMS_KEPT:
                self._terms.clear()
            self._terms[key] = terms
        return terms


class ProfileLoader:
    """A Sandbox's profiles, each loaded once, the first time an execution names it."""

    def __init__(
        self,
        config: DeploymentConfig,
        registry: BackendRegistry,
        selection_cache: SelectionCache | None,
    ) -> None:
        self.config = config
        self.registry = registry
        # Where default's choice is remembered across processes (selection_cache.py): for a
        # process that runs one program, as the CLI does. Without one, it is the process's.
        self._selection_cache = selection_cache
        self._remembered: Selection | None = None
        self._loaded: dict[str, LoadedProfile] = {}
        self._lock = anyio.Lock()

    def profile_names(self) -> list[str]:
        names = set(self.config.profiles) | {DEFAULT_PROFILE} | set(self.registry.ids())
        return sorted(names)

    def forget_stale_choice(self, loaded: LoadedProfile, not_ready: bool, weaker: bool) -> bool:
        """Forget a remembered choice of default's that an execution of ``loaded`` showed
        wrong here (its backend not ready, or weaker than it claims); True when it was."""
        selection = loaded.selection
        if selection is None or not selection.remembered or self._selection_cache is None:
            return False
        if not (not_ready or weaker):
            return False
        self._selection_cache.forget()
        self._loaded.pop(loaded.name, None)
        self._remembered = None
        return True

    async def load(self, name: str) -> LoadedProfile:
        if name in self._loaded:
            return self._loaded[name]
        async with self._lock:
            if name in self._loaded:
                return self._loaded[name]
            config = self.config.profiles.get(name)
            if config is None:
                if name == DEFAULT_PROFILE:
                    config = ProfileConfig()
                elif self._installed(name):
                    config = ProfileConfig(backend=name)
                else:
                    close = difflib.get_close_matches(name, self.profile_names(), n=1)
                    raise UnknownProfileError(
                        f"no profile named {name!r} is configured"
                        + (f" (did you mean {close[0]!r}?)" if close else "")
                        + f"; known profiles: {', '.join(self.profile_names())}"
                    )
            selection: Selection | None = None
            if config.backend is None:
                if name != DEFAULT_PROFILE:
                    raise ConfigurationError(f"profile {name!r} names no backend")
                selection = await self.default_selection()
                unreachable = selection.below_required(name, config.required_level)
                if unreachable is not None:
                    raise ConfigurationError(unreachable)
                backend_id = selection.chosen.backend_id
            else:
                backend_id = config.backend
            backend = create_backend(self.registry, name, backend_id, dict(config.options))
            registered = self.registry.get(backend_id)
            # The deployment's floor narrows every profile: below it a run is refused.
            floor = strictest_level([config.required_level, self.config.required_level])
            loaded = LoadedProfile(
                name,
                config.model_copy(update={"required_level": floor}),
                backend,
                BackendIdentity(
                    id=backend_id,
                    distribution=registered.distribution,
                    version=registered.version,
                ),
                selection,
            )
            self._loaded[name] = loaded
            return loaded

    def _installed(self, backend_id: str) -> bool:
        """Whether a backend of that id is installed, loading only its own plugin when the
        entry point is named for it (as it should be), not every installed one."""
        try:
            self.registry.get(backend_id)
        except UnknownBackendError:
            return False
        return True

    async def default_selection(self) -> Selection:
        """What ``default`` runs on this host (see trials.select_default), or what a
        selection cache remembers it ran on recently."""
        preference = self.config.backend_preference
        cache = self._selection_cache
        if cache is None:
            return await select_default(self.registry, preference)
        if self._remembered is None:
            self._remembered = await remembered_or_selected(self.registry, preference, cache)
        return self._remembered
