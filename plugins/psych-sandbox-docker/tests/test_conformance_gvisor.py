"""The docker backend passes the shared behaviour suite under gVisor (runsc), with the same
declarations as under runc except where the runtime differs."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from docker_conformance import DockerConformance


class TestGvisorConformance(DockerConformance):
    options: ClassVar[dict[str, Any]] = {"runtime": "runsc"}
    # The pids cgroup is the process limit only under runc (see the README).
    enforced = DockerConformance.enforced - {"process_count"}
    # The program's processes live in gVisor's own kernel, not in the host's /proc: what is
    # left is judged by the containers left.
    processes_visible = False

    # Commands: the same backend and plugin code as under runc (test_conformance.py); only
    # whether the runtime ends the whole tree is the runtime's own.
    test_a_command_runs_where_a_program_runs = None  # type: ignore[assignment]
    test_a_string_is_run_by_a_shell_only_when_asked = None  # type: ignore[assignment]

    @pytest.fixture
    def anyio_backend(self) -> str:
        # The same plugin code as under runc, where every test runs on both
        # loops; only the runtime differs, and a runtime does not see the host's event loop.
        return "asyncio"
