"""The pytest plugin (the ``pytest11`` entry point): what every test session of the core and of
a backend shares, loaded in any session of an environment with this distribution installed.

- the ``psych_missing(requirement, reason)`` marker, read before every test: the test skips,
  or fails where ``PSYCH_SANDBOX_REQUIRE_BACKENDS`` names the requirement
  (:func:`~psych_sandbox_testing.requirements.needs` makes the mark);
- a run log and a state directory of the session's own, and the copies staged for tests run
  as another user removed with it;
- ``no_cgroup_left``, for a suite whose every test must leave no new cgroup (it requests the
  fixture from an autouse fixture of its own: the core's tests do not ask it).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator

import pytest
from psych_sandbox_core.kit.posix.temp_dirs import make_owned_directory

from .requirements import skip_unless_required


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
def no_cgroup_left() -> Iterator[None]:
    """The test leaves no new cgroup in any hierarchy (v1 controllers and v2)."""
    # Imported here: the host probes are Linux's, and the plugin loads on every platform.
    from .host import no_cgroup_left

    with no_cgroup_left():
        yield


def _private_variable(variable: str, prefix: str, file: str | None = None) -> Iterator[None]:
    """``variable`` pointed, for the session, at a directory of its own (or ``file`` in it),
    removed afterwards. Named for this process: a later session removes it should this one be
    killed before its clean-up runs."""
    directory = make_owned_directory(prefix)
    previous = os.environ.get(variable)
    os.environ[variable] = directory if file is None else os.path.join(directory, file)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = previous
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(autouse=True, scope="session")
def _private_run_log() -> Iterator[None]:
    # Runs that span executions are counted in a durable log; a test session keeps its own,
    # so no test reads another session's counts (nor leaves any in the user's state dir).
    yield from _private_variable("PSYCH_SANDBOX_RUN_LOG", "psych-test-runlog-", "run-log.sqlite")


@pytest.fixture(autouse=True, scope="session")
def _private_state_directory() -> Iterator[None]:
    # What the CLI remembers between runs (the default profile's backend) goes to a state
    # directory of this session's, not the user's, and goes with it.
    yield from _private_variable("XDG_STATE_HOME", "psych-test-state-")


@pytest.fixture(autouse=True, scope="session")
def _staged_copies_removed() -> Iterator[None]:
    # Copies of the environment staged for tests that run as another user go with the
    # session (a pytest-xdist worker ends without running exit handlers). Only a session that
    # imported the module can have staged any (it needs pwd, which not every platform has).
    yield
    as_user = sys.modules.get("psych_sandbox_testing.as_user")
    if as_user is not None:
        as_user.remove_staged()
