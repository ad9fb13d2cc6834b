"""The remote backend's tests run on asyncio (the shared conformance suite runs on trio too)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The helpers module sits beside the tests; under --import-mode=importlib (the monorepo's
# setting) test directories are not put on sys.path, so put this one there.
sys.path.insert(0, str(Path(__file__).parent))

from remote_support import skip_unless_required


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


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
