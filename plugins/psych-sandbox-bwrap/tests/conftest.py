"""The bwrap backend's tests run on asyncio: what they test is the sandbox, not the loop
(the core's suite covers trio)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
