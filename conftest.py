"""Settings every test session shares, core and plugins alike."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from psych_sandbox_core.kit.posix.temp_dirs import make_owned_directory
from psych_sandbox_core.testing.as_user import remove_staged


@pytest.fixture(autouse=True, scope="session")
def _private_run_log() -> Iterator[None]:
    # Runs that span executions are counted in a durable log; a test session keeps its own,
    # so no test reads another session's counts (nor leaves any in the user's state dir).
    # Named for this process (as the state directory below): a later session removes it
    # should this one be killed before its clean-up runs.
    directory = make_owned_directory("psych-test-runlog-")
    previous = os.environ.get("PSYCH_SANDBOX_RUN_LOG")
    os.environ["PSYCH_SANDBOX_RUN_LOG"] = os.path.join(directory, "run-log.sqlite")
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("PSYCH_SANDBOX_RUN_LOG", None)
        else:
            os.environ["PSYCH_SANDBOX_RUN_LOG"] = previous
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(autouse=True, scope="session")
def _private_state_directory() -> Iterator[None]:
    # What the CLI remembers between runs (the default profile's backend) goes to a state
    # directory of this session's, not the user's, and goes with it.
    directory = make_owned_directory("psych-test-state-")
    previous = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = directory
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("XDG_STATE_HOME", None)
        else:
            os.environ["XDG_STATE_HOME"] = previous
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(autouse=True, scope="session")
def _staged_copies_removed() -> Iterator[None]:
    # Copies of the environment staged for tests that run as another user go with the
    # session (a pytest-xdist worker ends without running exit handlers).
    yield
    remove_staged()
