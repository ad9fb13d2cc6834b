"""Plugin loading through pluggy's manager: real distributions on the path, loaded from the
entry-point group by pluggy, attributed from pluggy's own records, called through its hook."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from psych_sandbox_core._policy import registry as registry_module
from psych_sandbox_core._policy.registry import BackendRegistry
from psych_sandbox_core.backends.subprocess import SubprocessBackend
from psych_sandbox_core.errors import ConfigurationError
from psych_sandbox_core.kit.hookspecs import hookimpl

PLUGIN_MODULE = """
from typing import ClassVar
from psych_sandbox_core.backends.subprocess import SubprocessBackend
from psych_sandbox_core.kit.hookspecs import hookimpl

class {cls}(SubprocessBackend):
    id: ClassVar[str] = {backend_id!r}

@hookimpl
def psych_sandbox_register_backends(registry):
    registry.add({cls})
"""


def _distribution(root: Path, name: str, version: str, entry_points: dict[str, str]) -> None:
    """An installed distribution as importlib.metadata finds one: a dist-info folder."""
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = "".join(f"{key} = {value}\n" for key, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[psych_sandbox]\n{lines}")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _plugin_module(site: Path, module: str, cls: str, backend_id: str) -> None:
    (site / f"{module}.py").write_text(PLUGIN_MODULE.format(cls=cls, backend_id=backend_id))


def test_an_installed_plugin_is_attributed_to_its_distribution(site: Path) -> None:
    _plugin_module(site, "psych_pin_plugin_a", "PinA", "pin_a")
    _distribution(site, "psych-pin-dist", "3.1.4", {"pin_a": "psych_pin_plugin_a"})
    registry = BackendRegistry()
    registered = registry.get("pin_a")
    assert (registered.distribution, registered.version) == ("psych-pin-dist", "3.1.4")
    assert registered.cls.__module__ == "psych_pin_plugin_a"
    # The builtin backend, loaded from the same group, is the core's.
    builtin = registry.get("subprocess")
    assert builtin.cls is SubprocessBackend and builtin.distribution == "psych-sandbox-core"


def test_the_cores_own_backend_loads_without_reading_any_distribution(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.metadata

    import psych_sandbox_core

    def unread(*args: object, **kwargs: object) -> Any:
        raise AssertionError("installed distributions were scanned")

    monkeypatch.setattr(importlib.metadata, "distributions", unread)
    registered = BackendRegistry().get("subprocess")
    assert registered.cls is SubprocessBackend
    assert (registered.distribution, registered.version) == (
        "psych-sandbox-core",
        psych_sandbox_core.__version__,
    )


def _no_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make a scan of every installed distribution (pluggy's loader) fail the test."""
    import importlib.metadata

    def unread(*args: object, **kwargs: object) -> Any:
        raise AssertionError("installed distributions were scanned")

    monkeypatch.setattr(importlib.metadata, "distributions", unread)


def test_a_first_party_backend_loads_from_its_own_distribution_without_a_scan(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _plugin_module(site, "psych_pin_plugin_f", "PinF", "pin_f")
    _distribution(site, "psych-pin-first", "2.7", {"pin_f": "psych_pin_plugin_f"})
    monkeypatch.setitem(registry_module.KNOWN_DISTRIBUTIONS, "pin_f", "psych-pin-first")
    _no_scan(monkeypatch)
    registered = BackendRegistry().get("pin_f")
    assert registered.cls.__module__ == "psych_pin_plugin_f"
    assert (registered.distribution, registered.version) == ("psych-pin-first", "2.7")


def test_a_first_party_id_served_by_another_distribution_is_found_by_the_scan(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its own distribution is not installed: the scan finds whoever provides the id.
    _plugin_module(site, "psych_pin_plugin_g", "PinG", "pin_g")
    _distribution(site, "psych-pin-other", "0.3", {"pin_g": "psych_pin_plugin_g"})
    monkeypatch.setitem(registry_module.KNOWN_DISTRIBUTIONS, "pin_g", "psych-pin-absent")
    registered = BackendRegistry().get("pin_g")
    assert (registered.distribution, registered.version) == ("psych-pin-other", "0.3")


def test_a_broken_first_party_plugin_is_named(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _distribution(site, "psych-pin-first-broken", "1.0", {"pin_h": "no_such_module_pin_h"})
    monkeypatch.setitem(registry_module.KNOWN_DISTRIBUTIONS, "pin_h", "psych-pin-first-broken")
    _no_scan(monkeypatch)
    with pytest.raises(ConfigurationError, match="'pin_h' failed to load: No module named"):
        BackendRegistry().get("pin_h")


def test_a_backend_id_loads_only_its_own_entry_point(site: Path) -> None:
    _plugin_module(site, "psych_pin_plugin_b", "PinB", "pin_b")
    # Named for another backend, and broken: loading pin_b must never touch it.
    _distribution(
        site, "psych-pin-two", "1.0", {"pin_b": "psych_pin_plugin_b", "pin_x": "no_such_mod_x"}
    )
    registry = BackendRegistry()
    assert registry.get("pin_b").distribution == "psych-pin-two"
    with pytest.raises(ConfigurationError, match="'pin_x' failed to load"):
        registry.ids()


def test_a_broken_plugin_is_named_when_everything_is_loaded(site: Path) -> None:
    _distribution(site, "psych-pin-broken", "0.1", {"pin_broken": "no_such_module_pin"})
    with pytest.raises(ConfigurationError, match="'pin_broken' failed to load"):
        BackendRegistry().ids()
    with pytest.raises(ConfigurationError, match="'pin_broken' failed to load"):
        BackendRegistry().get("pin_broken")


class _Renamed(SubprocessBackend):
    id = "pin_by_hand"


class _ByHand:
    def __init__(self) -> None:
        self.calls = 0

    @hookimpl
    def psych_sandbox_register_backends(self, registry: Any) -> None:
        self.calls += 1
        registry.add(_Renamed)


def test_a_plugin_registered_by_hand_is_asked_once_and_attributed_as_told() -> None:
    registry = BackendRegistry()
    plugin = _ByHand()
    registry.register_plugin(plugin, "pin-by-hand", "hand-dist", "2.0")
    registry.register_plugin(plugin, "pin-by-hand", "hand-dist", "2.0")
    # Loading every entry point afterwards asks only the plugins it loaded.
    assert "pin_by_hand" in registry.ids() and "subprocess" in registry.ids()
    assert plugin.calls == 1
    registered = registry.get("pin_by_hand")
    assert (registered.distribution, registered.version) == ("hand-dist", "2.0")
    # A backend added by another plugin is not attributed to this one.
    assert registry.get("subprocess").distribution == "psych-sandbox-core"


def test_a_plugin_registered_by_hand_without_a_distribution_has_none() -> None:
    registry = BackendRegistry()
    registry.register_plugin(_ByHand(), "pin-anonymous")
    registered = registry.get("pin_by_hand")
    assert (registered.distribution, registered.version) == (None, None)
