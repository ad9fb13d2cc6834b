"""The cgroup hierarchies as the host mounts them, and removing cgroups only where empty."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from psych_sandbox_core.kit.posix import cgroupfs

HIERARCHIES = cgroupfs.hierarchies()
pytestmark = pytest.mark.skipif(not HIERARCHIES, reason="no cgroup hierarchy is mounted here")


def test_every_mounted_hierarchy_is_listed_once() -> None:
    # Independently of mountinfo's parser: /proc/mounts, one hierarchy per device.
    expected: dict[int, str] = {}
    with open("/proc/mounts") as fh:
        for line in fh:
            _, point, fstype, *_ = line.split()
            if fstype in ("cgroup", "cgroup2"):
                expected.setdefault(os.stat(point).st_dev, point)
    listed = [str(h.point) for h in HIERARCHIES]
    assert len(listed) == len(set(listed))
    assert sorted(listed) == sorted(expected.values())
    for hierarchy in HIERARCHIES:
        assert hierarchy.version == (2 if hierarchy.fstype == "cgroup2" else 1)


@pytest.fixture
def scratch_cgroup() -> Iterator[Path]:
    """A fresh cgroup at the top of the first hierarchy this host lets us write."""
    name = f"psych-test-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    for hierarchy in HIERARCHIES:
        path = hierarchy.point / name
        try:
            path.mkdir()
        except OSError:
            continue
        try:
            yield path
        finally:
            cgroupfs.remove_tree(path)
            assert not path.exists()
        return
    pytest.skip("no cgroup hierarchy is writable here (not root?)")


def test_remove_tree_removes_empty_cgroups_deepest_first_and_never_a_busy_one(
    scratch_cgroup: Path,
) -> None:
    busy = scratch_cgroup / "a" / "busy"
    busy.mkdir(parents=True)
    (scratch_cgroup / "b").mkdir()
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        (busy / "cgroup.procs").write_text(str(sleeper.pid))
        # The kernel refuses the cgroup with a process, and so its parents: the rest goes.
        assert cgroupfs.remove_tree(scratch_cgroup) is False
        assert busy.is_dir()
        assert not (scratch_cgroup / "b").exists()
    finally:
        assert sleeper.stdin is not None
        sleeper.stdin.close()
        sleeper.wait()
    assert cgroupfs.remove_tree(scratch_cgroup) is True
    assert not scratch_cgroup.exists()
    # Nothing there is nothing left.
    assert cgroupfs.remove_tree(scratch_cgroup) is True
