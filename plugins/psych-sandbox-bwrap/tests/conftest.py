"""The bwrap backend's tests run on asyncio: what they test is the sandbox, not the loop
(the core's suite covers trio)."""

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
