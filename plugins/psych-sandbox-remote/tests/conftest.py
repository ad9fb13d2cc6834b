"""The remote backend's tests run on asyncio (the shared conformance suite runs on trio too).
The requirement marks and the session's private state are psych-sandbox-testing's plugin's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The helpers module sits beside the tests; under --import-mode=importlib (the monorepo's
# setting) test directories are not put on sys.path, so put this one there.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
