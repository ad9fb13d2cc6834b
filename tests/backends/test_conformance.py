"""The subprocess backend passes the shared behaviour suite, on asyncio and on trio."""

from __future__ import annotations

import os
import shutil

from psych_sandbox_testing.conformance import BackendConformance
from psych_sandbox_testing.host import execution_cgroups_here


class TestSubprocessConformance(BackendConformance):
    backend = "subprocess"
    level = "process"
    # Only the interpreter's temporary directory is passed on.
    environment = frozenset({"TMPDIR"})
    runs_commands = True
    # With a cgroup of the execution's own, usage is read while the child lives and the
    # cgroup tells that nothing of the program is left to write to the workspace.
    early_result = execution_cgroups_here()
    # The system's interpreter: the test's own may live where a leased uid cannot reach.
    command_python = shutil.which("python3", path=os.defpath)
