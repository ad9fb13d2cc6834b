"""The bwrap backend passes the shared behaviour suite."""

from __future__ import annotations

from bwrap_support import requires_bwrap
from psych_sandbox_core.testing.conformance import BackendConformance


@requires_bwrap
class TestBwrapConformance(BackendConformance):
    backend = "bwrap"
    level = "isolated"
    enforced = frozenset({"filesystem", "network", "process_tree", "identity"})
    workspace_path = "/workspace"
