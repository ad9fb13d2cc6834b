"""The docker backend's tests run real containers on asyncio (what they test is the
container, not the loop). The local image is built once per session when it is absent."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Under --import-mode=importlib test directories are not on sys.path; the helpers are here.
sys.path.insert(0, str(Path(__file__).parent))

from docker_support import engine_problem, ensure_image, leftover_containers


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def engine() -> str:
    problem = engine_problem()
    if problem is not None:
        pytest.skip(f"no container engine here: {problem}")
    ensure_image()
    return "docker"


@pytest.fixture(autouse=True)
def no_container_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test that ran containers, none of this process's is left."""
    yield
    if "engine" in request.fixturenames:
        assert leftover_containers() == []
