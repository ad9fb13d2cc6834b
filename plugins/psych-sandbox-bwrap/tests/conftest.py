"""The bwrap backend's tests run on asyncio: what they test is the sandbox, not the loop
(the shared conformance suite runs on trio too, and the core's suite covers trio)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The helpers module sits beside the tests; under --import-mode=importlib (the monorepo's
# setting) test directories are not put on sys.path, so put this one there.
sys.path.insert(0, str(Path(__file__).parent))

from bwrap_support import skip_unless_required
from psych_sandbox_core.testing.host import no_cgroup_left


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "psych_missing(requirement, reason): cannot run here (skip, or fail when "
        "PSYCH_SANDBOX_REQUIRE_BACKENDS names the requirement)",
    )


@pytest.fixture(autouse=True)
def _requirements(request: pytest.FixtureRequest) -> None:
    mark = request.node.get_closest_marker("psych_missing")
    if mark is not None:
        skip_unless_required(*mark.args)


@pytest.fixture(autouse=True)
def _no_cgroup_left() -> Iterator[None]:
    """No test leaves a new cgroup in any hierarchy (v1 controllers and v2)."""
    with no_cgroup_left():
        yield


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
