"""The docker backend's tests run real containers on asyncio (what they test is the
container, not the loop), except the shared conformance suite, which runs on trio too. The
local image is built once per session when it is absent."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Under --import-mode=importlib test directories are not on sys.path; the helpers are here.
sys.path.insert(0, str(Path(__file__).parent))

from docker_support import engine_problem, ensure_image, leftover_containers
from psych_sandbox_testing.requirements import skip_unless_required


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def engine() -> str:
    # Under PSYCH_SANDBOX_REQUIRE_BACKENDS naming "docker" (or "gvisor", for runsc), what
    # would skip these tests fails them instead.
    problem = engine_problem()
    if problem is not None:
        requirement, reason = problem
        skip_unless_required(requirement, f"no container engine here: {reason}")
    failure = ensure_image()
    if failure is not None:
        skip_unless_required("docker", failure)
    return "docker"


@pytest.fixture(autouse=True)
def no_container_left(request: pytest.FixtureRequest, no_cgroup_left: None) -> Iterator[None]:
    """After every test that ran containers, none of this process's is left, nor any new
    cgroup in any hierarchy (checked after this, by the fixture it requests)."""
    yield
    if "engine" in request.fixturenames:
        assert leftover_containers() == []
