"""scripts/test-distributions (CI's run of each distribution against the cores it declares)
chooses its core versions as documented: the lower bound of each range and the tree's own,
the older one found at the commit that set it. Its environments are CI's to build; here, the
choices it makes."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import psych_sandbox_core

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "test-distributions"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("test_distributions_script", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    # Registered while it runs: its dataclasses look their module up by name.
    sys.modules[loader.name] = module
    try:
        loader.exec_module(module)
    finally:
        del sys.modules[loader.name]
    return module


@pytest.mark.parametrize(
    ("declared", "lowest"),
    [(">=0.2,<0.3", "0.2.0"), ("==0.2.0", "0.2.0"), ("~=0.2.1", "0.2.1"), (">=0.1,>=0.2", "0.2")],
)
def test_the_lowest_version_is_the_ranges_lower_bound(
    script: ModuleType, declared: str, lowest: str
) -> None:
    assert script.lowest_admitted(SpecifierSet(declared)) == Version(lowest)


def test_a_range_without_a_lower_bound_cannot_be_tested(script: ModuleType) -> None:
    with pytest.raises(SystemExit, match="no lower bound"):
        script.lowest_admitted(SpecifierSet("<0.3"))


def test_every_distribution_is_found_with_the_core_it_declares(script: ModuleType) -> None:
    found = {d.name: d for d in script.distributions()}
    expected = {
        project.parent.name
        for folder in ("plugins", "integrations", "testing")
        for project in (ROOT / folder).glob("*/pyproject.toml")
    }
    assert set(found) == expected
    assert "psych-sandbox-testing" in found
    current = psych_sandbox_core.__version__
    for distribution in found.values():
        assert distribution.core.contains(current), distribution


def test_a_version_is_found_at_the_commit_that_set_it(script: ModuleType) -> None:
    if subprocess.run(["git", "rev-parse"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    current = Version(psych_sandbox_core.__version__)
    commit = script.commit_of(current)
    shown = subprocess.run(
        ["git", "show", f"{commit}:psych_sandbox_core/__init__.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert script.version_in(shown) == current
    # The first such commit: its parent's core says another version (or it has none).
    before = subprocess.run(
        ["git", "show", f"{commit}^:psych_sandbox_core/__init__.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if before.returncode == 0:
        assert f'__version__ = "{current}"' not in before.stdout
    with pytest.raises(SystemExit, match="no commit sets"):
        script.commit_of(Version("0.0.1"))
