"""The macos backend's tests. What can be tested on any host (the generated profile, grades,
refusals, registration) runs everywhere; what needs seatbelt runs on macOS (CI) and fails
there rather than skipping."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Helpers sit beside the tests; under --import-mode=importlib test directories are not put on
# sys.path, so put this one there.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
