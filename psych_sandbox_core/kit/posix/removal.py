"""Removing a directory tree without following links.

Removal is the reverse of artifact collection (see ``_output/artifact_walk.py``) and obeys the
same rules: every step is relative to a directory descriptor opened with ``O_NOFOLLOW``, so a
link in the tree, or one swapped in while we work, is unlinked as a name and never followed
to delete something outside. Directories the program made read-only or unsearchable are
opened up first (on the directory itself, through its own descriptor), so permissions cannot
block cleanup.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat

#: How many directory descriptors one removal holds open at once. A program can nest
#: directories far deeper than any fd limit; below this depth a subtree is moved up to the
#: top of the workspace (a rename inside the same tree) and removed from there.
MAX_OPEN_DIRECTORIES = 64


#: How a directory is opened on every step: never through a link. (getattr: the module must
#: import on Windows too, whose backend removes its workspace its own way.)
DIRECTORY_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_DIRECTORY", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def remove_tree(path: str) -> None:
    """Delete ``path`` and everything under it without ever following a symlink out of it."""
    # The directory holding it is the host's choice (and may be reached through a link,
    # as /tmp is on macOS); only what lies below is the program's.
    full = os.path.abspath(path)
    try:
        parent = os.open(os.path.dirname(full), DIRECTORY_FLAGS & ~getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return
    try:
        remove_entry(parent, os.path.basename(full))
    finally:
        os.close(parent)


def remove_entry(dir_fd: int, name: str) -> None:
    """Delete the entry ``name`` of the directory open as ``dir_fd``, and everything under it
    if it is a directory, without ever following a symlink (one is removed as a name)."""
    try:
        top = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(top.st_mode):
        _unlink(name, dir_fd)
        return
    fd = _open_directory(name, dir_fd)
    if fd is None:
        return
    try:
        _empty(fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def _open_directory(name: str, dir_fd: int) -> int | None:
    """A descriptor on the directory ``name`` of ``dir_fd``, never through a link; None when
    it is gone, or was swapped for a link or a file since it was looked at (then removed as
    the name it now is)."""
    try:
        return os.open(name, DIRECTORY_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            _unlink(name, dir_fd)
            return None
        if exc.errno == errno.ENOENT:
            return None
        raise


def _open_up(dir_fd: int) -> None:
    try:
        os.fchmod(dir_fd, stat.S_IRWXU)
    except OSError:
        pass  # not ours to change (a non-root host); removal says so if it matters


def _empty(top_fd: int) -> None:
    """Remove everything below the directory open as ``top_fd`` (which is kept)."""
    _open_up(top_fd)
    # Each frame: (descriptor, name in its parent). The top frame has no name.
    stack: list[tuple[int, str | None]] = [(top_fd, None)]
    try:
        while stack:
            dir_fd, _ = stack[-1]
            descended = False
            with os.scandir(dir_fd) as entries:
                names = [entry.name for entry in entries]
            for name in names:
                try:
                    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not stat.S_ISDIR(info.st_mode):
                    _unlink(name, dir_fd)
                    continue
                if len(stack) >= MAX_OPEN_DIRECTORIES:
                    # Too deep to hold another descriptor: lift this subtree to the top.
                    lifted = f".psych-lifted-{secrets.token_hex(8)}"
                    os.rename(name, lifted, src_dir_fd=dir_fd, dst_dir_fd=top_fd)
                    descended = True  # the top now has more to do; rescan from there
                    continue
                child = _open_directory(name, dir_fd)
                if child is None:
                    continue
                _open_up(child)
                stack.append((child, name))
                descended = True
                break
            if descended:
                continue
            # This directory is empty: close it and remove it from its parent.
            finished_fd, finished_name = stack.pop()
            if finished_name is None:
                break
            os.close(finished_fd)
            os.rmdir(finished_name, dir_fd=stack[-1][0])
    finally:
        for fd, parent_name in stack:
            if parent_name is not None:
                os.close(fd)


def _unlink(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
