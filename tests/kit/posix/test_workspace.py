"""Workspace removal: never follows a link out, survives permissions and absurd depth."""

from __future__ import annotations

import os
from pathlib import Path

from psych_sandbox_core.kit.posix.removal import MAX_OPEN_DIRECTORIES, remove_tree
from psych_sandbox_core.kit.posix.workspace import create_workspace


def test_removal_leaves_link_targets_outside_alone(tmp_path: Path) -> None:
    outside = tmp_path / "host"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    workspace = Path(create_workspace())
    (workspace / "to-dir").symlink_to(outside, target_is_directory=True)
    (workspace / "to-file").symlink_to(outside / "keep")
    os.link(outside / "keep", workspace / "hard")
    remove_tree(str(workspace))
    assert not workspace.exists()
    assert (outside / "keep").read_text() == "keep"
    assert os.stat(outside / "keep").st_nlink == 1


def test_removal_opens_up_read_only_and_unsearchable_directories(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    (workspace / "a" / "b").mkdir(parents=True)
    (workspace / "a" / "b" / "f").write_text("x")
    (workspace / "a" / "b").chmod(0o500)
    (workspace / "a").chmod(0)
    remove_tree(str(workspace))
    assert not workspace.exists()


def test_removal_of_a_tree_deeper_than_the_descriptor_budget(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    fd = os.open(workspace, os.O_RDONLY)
    for _ in range(MAX_OPEN_DIRECTORIES * 5):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    with open(os.open("leaf", os.O_WRONLY | os.O_CREAT, dir_fd=fd), "w") as fh:
        fh.write("x")
    os.close(fd)
    before = len(os.listdir("/proc/self/fd"))
    remove_tree(str(workspace))
    assert not workspace.exists()
    assert len(os.listdir("/proc/self/fd")) == before


def test_removing_a_symlink_itself_does_not_touch_its_target(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "f").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    remove_tree(str(link))
    assert not link.exists() and (target / "f").exists()
    remove_tree(str(tmp_path / "missing"))  # nothing there: nothing to do
