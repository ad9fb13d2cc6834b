"""The bwrap backend's tests run on asyncio: what they test is the sandbox, not the loop
(the shared conformance suite runs on trio too, and the core's suite covers trio). The
requirement marks and the session's private state are psych-sandbox-testing's plugin's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The helpers module sits beside the tests; under --import-mode=importlib (the monorepo's
# setting) test directories are not put on sys.path, so put this one there.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _no_cgroup_left(no_cgroup_left: None) -> None:
    """No test leaves a new cgroup in any hierarchy (v1 controllers and v2)."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
