"""The subprocess backend passes the shared behaviour suite, on asyncio and on trio."""

from __future__ import annotations

from psych_sandbox_core.testing.conformance import BackendConformance


class TestSubprocessConformance(BackendConformance):
    backend = "subprocess"
    level = "process"
    # Only the interpreter's temporary directory is passed on.
    environment = frozenset({"TMPDIR"})
