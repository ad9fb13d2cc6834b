"""Per-execution private working directories, and removing them without following links."""

from __future__ import annotations

import os
import stat
import tempfile


def create_workspace(owner: tuple[int, int] | None = None) -> str:
    """A fresh private directory (0700), owned by ``owner`` (uid, gid) when given."""
    path = tempfile.mkdtemp(prefix="psych-ws-")
    if owner is not None:
        os.chown(path, *owner)
    return path


def remove_tree(path: str) -> None:
    """Delete ``path`` and everything under it without ever following a symlink out of it.

    Directories the program made read-only or unsearchable are opened up first (on the
    directory itself, never through a link), so cleanup cannot be blocked by permissions.
    """
    try:
        top = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(top.st_mode):
        os.unlink(path)
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        _remove_children(fd)
    finally:
        os.close(fd)
    os.rmdir(path)


def _remove_children(dir_fd: int) -> None:
    # Every step is relative to an open directory descriptor opened with O_NOFOLLOW, so a
    # link swapped in cannot redirect the walk outside the tree.
    try:
        os.fchmod(dir_fd, stat.S_IRWXU)
    except OSError:
        pass
    with os.scandir(dir_fd) as entries:
        names = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
    for name, is_dir in names:
        if is_dir:
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            try:
                _remove_children(child)
            finally:
                os.close(child)
            os.rmdir(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
