"""Collecting the files a program leaves in its workspace, without being led outside it.

Traversal, absolute paths, symlinks and hard links are one attack spelled differently, so the
walk trusts nothing it finds:

* every step is relative to a directory descriptor opened with ``O_NOFOLLOW``; a symlink is
  never followed, it is listed as skipped;
* a candidate is opened with ``O_NOFOLLOW | O_NONBLOCK`` and checked again through the open
  descriptor: it must still be the regular file the walk saw (same device and inode), on the
  workspace's filesystem, and its resolved path must still be inside the workspace;
* a regular file with more than one link is skipped. A hard link is indistinguishable from
  its original, and one made to a host file before the run (or to a file the program could
  read but not copy) would otherwise be served as the program's own output. A program that
  wants a file collected writes it; it has no need to link one;
* FIFOs, device nodes, sockets and anything else that is not a regular file are skipped
  without being opened.

Each file has its own size cap and all of them share a total; the content type is sniffed from
the bytes (never the name), and each file carries its sha256. Collection runs after the
program ended and before the workspace is removed (see workspace.remove_tree).

A backend whose workspace the host cannot reach has the child send its files over the control
channel instead (artifact_channel.py).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable

from ..protocol.limits import MAX_ARTIFACT_DEPTH, MAX_ARTIFACT_ENTRIES
from .artifacts import (
    DIR_FLAGS,
    CollectedFile,
    Collection,
    CollectionLimits,
    printable_name,
    safe_parts,
)
from .content_type import sniff_content_type

_FILE_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
)

#: Directory entries examined in all before the walk stops: a program can create millions.
MAX_ENTRIES = MAX_ARTIFACT_ENTRIES
#: Deepest directory the walk enters (each level holds one descriptor while it is open).
MAX_DEPTH = MAX_ARTIFACT_DEPTH


def collect(
    workspace: str,
    limits: CollectionLimits,
    *,
    folder: str | None = None,
    on_candidate: Callable[[str], None] | None = None,
) -> Collection:
    """The regular files under ``workspace`` (or its ``folder``), each checked to be inside.

    ``on_candidate`` is called with a file's relative path after it was seen and before it is
    opened; it exists so tests can change the tree at the worst moment.
    """
    result = Collection()
    root_real = os.path.realpath(workspace)
    try:
        root_fd = os.open(workspace, DIR_FLAGS)
    except OSError:
        return result
    try:
        root_dev = os.fstat(root_fd).st_dev
        start_fd = root_fd
        prefix = ""
        if folder:
            parts = safe_parts(folder)
            if parts is None:
                raise ValueError(f"artifact folder {folder!r} must be a relative path inside")
            opened = _descend(root_fd, parts, result)
            if opened is None:
                return result
            start_fd = opened
            prefix = "/".join(parts)
        try:
            walker = _Walker(result, limits, root_real, root_dev, on_candidate)
            walker.walk(start_fd, prefix, 0)
        finally:
            if start_fd != root_fd:
                os.close(start_fd)
    finally:
        os.close(root_fd)
    return result


def _descend(root_fd: int, parts: list[str], result: Collection) -> int | None:
    """Open the output folder component by component, never through a link."""
    fd = root_fd
    for index, part in enumerate(parts):
        try:
            child = os.open(part, DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                result.skip("/".join(parts[: index + 1]), "symlink")
            child = -1
        if fd != root_fd:
            os.close(fd)
        if child < 0:
            return None
        fd = child
    return fd


class _Walker:
    def __init__(
        self,
        result: Collection,
        limits: CollectionLimits,
        root_real: str,
        root_dev: int,
        on_candidate: Callable[[str], None] | None,
    ) -> None:
        self.result = result
        self.limits = limits
        self.root_real = root_real
        self.root_dev = root_dev
        self.on_candidate = on_candidate
        self.entries = 0

    def walk(self, dir_fd: int, prefix: str, depth: int) -> None:
        try:
            with os.scandir(dir_fd) as listing:
                names = sorted(entry.name for entry in listing)
        except OSError:
            self.result.skip(prefix or ".", "unreadable")
            return
        for name in names:
            self.entries += 1
            relative = f"{prefix}/{name}" if prefix else name
            if self.entries > MAX_ENTRIES:
                self.result.skip(relative, "entry_limit")
                return
            if not printable_name(name):
                self.result.skip(_display(relative), "unsafe_name")
                continue
            try:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                self.result.skip(relative, "vanished")
                continue
            mode = info.st_mode
            if stat.S_ISDIR(mode):
                self._enter(dir_fd, name, relative, depth, info)
            elif stat.S_ISREG(mode):
                self._take(dir_fd, name, relative, info)
            else:
                self.result.skip(relative, _kind(mode))

    def _enter(
        self, dir_fd: int, name: str, relative: str, depth: int, info: os.stat_result
    ) -> None:
        if info.st_dev != self.root_dev:
            self.result.skip(relative, "other_filesystem")
            return
        if depth + 1 > MAX_DEPTH:
            self.result.skip(relative, "too_deep")
            return
        try:
            child = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            reason = "changed" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else "unreadable"
            self.result.skip(relative, "vanished" if exc.errno == errno.ENOENT else reason)
            return
        try:
            now = os.fstat(child)
            if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
                self.result.skip(relative, "changed")
                return
            self.walk(child, relative, depth + 1)
        finally:
            os.close(child)

    def _take(self, dir_fd: int, name: str, relative: str, info: os.stat_result) -> None:
        result, limits = self.result, self.limits
        if info.st_nlink > 1:
            result.skip(relative, "hard_link")
            return
        if info.st_dev != self.root_dev:
            result.skip(relative, "other_filesystem")
            return
        if len(result.files) >= limits.max_files:
            result.skip(relative, "too_many")
            return
        if info.st_size > limits.per_file_bytes:
            result.skip(relative, "too_large")
            return
        if result.total_bytes + info.st_size > limits.total_bytes:
            result.skip(relative, "total_cap")
            return
        if self.on_candidate is not None:
            self.on_candidate(relative)
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                result.skip(relative, "vanished")
            elif exc.errno in (errno.ELOOP, errno.ENOTDIR):
                result.skip(relative, "changed")
            else:
                result.skip(relative, "unreadable")
            return
        try:
            now = os.fstat(fd)
            if (
                not stat.S_ISREG(now.st_mode)
                or (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino)
                or now.st_nlink != 1
            ):
                result.skip(relative, "changed")
                return
            if not self._inside(fd):
                result.skip(relative, "outside")
                return
            room = min(limits.per_file_bytes, limits.total_bytes - result.total_bytes)
            data = _read_at_most(fd, room + 1)
        except OSError:
            result.skip(relative, "unreadable")
            return
        finally:
            os.close(fd)
        if len(data) > room:
            # It grew after the size check: something is still writing it.
            result.skip(relative, "changed")
            return
        result.total_bytes += len(data)
        result.files.append(
            CollectedFile(
                path=relative,
                data=data,
                sha256=hashlib.sha256(data).hexdigest(),
                content_type=sniff_content_type(data),
            )
        )

    def _inside(self, fd: int) -> bool:
        """Whether the open file's resolved path is still under the workspace."""
        try:
            resolved = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return True  # no /proc: the descriptor-relative walk is the guarantee
        return resolved.startswith(self.root_real.rstrip("/") + "/")


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    remaining = limit
    while remaining > 0:
        try:
            chunk = os.read(fd, min(remaining, 1024 * 1024))
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "not_regular"


def _display(relative: str) -> str:
    return relative.encode("utf-8", errors="surrogateescape").decode("ascii", "backslashreplace")
