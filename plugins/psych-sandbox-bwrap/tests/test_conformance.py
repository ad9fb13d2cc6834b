"""The bwrap backend passes the shared behaviour suite, with the tests of what it declares:
a filesystem boundary, a workspace the host cannot reach (artifacts come over the channel),
a uid leased per execution on a root host (and the shared host_uid as the weaker control),
and size-capped memory-backed filesystems."""

from __future__ import annotations

from typing import Any, ClassVar

from bwrap_support import requires_bwrap
from psych_sandbox_testing.conformance import BackendConformance
from psych_sandbox_testing.host import execution_cgroups_here

NOBODY = 65534


@requires_bwrap
class TestBwrapConformance(BackendConformance):
    backend = "bwrap"
    level = "isolated"
    runs_commands = True
    enforced = frozenset({"filesystem", "network", "process_tree", "identity"})
    workspace_path = "/workspace"
    # A tmpfs inside bwrap's own mount namespace.
    workspace_on_host = False
    capped_filesystems = True
    # Where the execution has a cgroup of its own (a root host that can make one), usage
    # is read while the child lives and a warm result does not wait for the teardown.
    early_result = execution_cgroups_here()
    # Every execution's bwrap as one host uid: whatever else runs as it holds every
    # capability in the running sandboxes.
    shared_identity: ClassVar[tuple[dict[str, Any], tuple[int, int]] | None] = (
        {"host_uid": NOBODY, "host_gid": NOBODY},
        (NOBODY, NOBODY),
    )
