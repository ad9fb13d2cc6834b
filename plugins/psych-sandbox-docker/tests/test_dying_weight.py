"""A killed container's parent cgroup gets the most CPU weight among the executions, on the
real cgroup filesystem."""

from __future__ import annotations

import os
import uuid

import pytest

from psych_sandbox_docker import engine as eng


def test_a_killed_containers_parent_gets_the_most_cpu_weight() -> None:
    if os.geteuid() != 0 or not eng.cgroup_hierarchies():
        pytest.skip("needs root and cgroups")
    name = f"test-dying-{uuid.uuid4().hex[:12]}"
    eng.create_cgroup_parent(name)
    try:
        files = eng.dying_weight_files(name)
        if not files:
            pytest.skip("no hierarchy here weighs CPU")
        before = {path: path.read_text().strip() for path, _ in files}
        eng.hasten(files)
        for path, value in files:
            assert path.read_text().strip() == value.decode() != before[path]
    finally:
        assert eng.remove_cgroup_parent(name) is not None
    # A parent already gone is left as it is, without a word.
    eng.hasten(files)
