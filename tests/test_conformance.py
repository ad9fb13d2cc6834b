"""The subprocess backend passes the shared behaviour suite."""

from __future__ import annotations

import pytest

from psych_sandbox_core.testing.conformance import BackendConformance


class TestSubprocessConformance(BackendConformance):
    backend = "subprocess"
    level = "process"
    # Only the interpreter's temporary directory is passed on.
    environment = frozenset({"TMPDIR"})


class TestSubprocessTeardownOnTrio(TestSubprocessConformance):
    """Teardown is loop-specific code: what is about it runs on trio too."""

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "trio"

    # The rest does not depend on the loop; once (above) is enough.
    test_prints_and_returns_at_the_declared_level = None  # type: ignore[assignment]
    test_exception_reports_the_program_lines = None  # type: ignore[assignment]
    test_cpu_loop_is_a_timeout = None  # type: ignore[assignment]
    test_worker_exit = None  # type: ignore[assignment]
    test_host_environment_secret_not_visible = None  # type: ignore[assignment]
    test_workspace_removed_after_the_run = None  # type: ignore[assignment]
    test_canary_and_listeners_agree_with_the_grades = None  # type: ignore[assignment]
    test_hostile_frames_are_protocol_errors_and_the_host_stays_healthy = None  # type: ignore[assignment]
    # The CLI runs its own loop in its own process: the test's loop does not matter.
    test_a_signal_to_the_cli_cancels_the_run_and_leaves_nothing = None  # type: ignore[assignment]
