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
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = (
    os.O_RDONLY
    | os.O_NOFOLLOW
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
)

#: Directory entries examined in all before the walk stops: a program can create millions.
MAX_ENTRIES = 10_000
#: Deepest directory the walk enters (each level holds one descriptor while it is open).
MAX_DEPTH = 32
#: Skipped entries listed by name; beyond this they are only counted.
MAX_SKIPPED_LISTED = 100


class SkippedEntry(BaseModel):
    """Something in the workspace that was deliberately not collected, and why."""

    model_config = ConfigDict(frozen=True)

    path: str
    #: symlink, hard_link, fifo, socket, device, not_regular, too_large, total_cap,
    #: too_many, too_deep, changed, vanished, outside, other_filesystem, unsafe_name,
    #: unreadable, entry_limit.
    reason: str


@dataclass(frozen=True)
class CollectedFile:
    #: Path relative to the collection root, "/"-separated.
    path: str
    data: bytes
    sha256: str
    content_type: str


@dataclass
class Collection:
    files: list[CollectedFile] = field(default_factory=list)
    skipped: list[SkippedEntry] = field(default_factory=list)
    #: Skipped entries beyond the listed ones.
    skipped_unlisted: int = 0
    total_bytes: int = 0

    def skip(self, path: str, reason: str) -> None:
        if len(self.skipped) < MAX_SKIPPED_LISTED:
            self.skipped.append(SkippedEntry(path=path, reason=reason))
        else:
            self.skipped_unlisted += 1


@dataclass(frozen=True)
class CollectionLimits:
    per_file_bytes: int
    total_bytes: int
    max_files: int


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
        root_fd = os.open(workspace, _DIR_FLAGS)
    except OSError:
        return result
    try:
        root_dev = os.fstat(root_fd).st_dev
        start_fd = root_fd
        prefix = ""
        if folder:
            parts = _safe_parts(folder)
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


def _safe_parts(relative: str) -> list[str] | None:
    if os.path.isabs(relative) or "\x00" in relative:
        return None
    parts = [p for p in relative.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        return None
    return parts


def _descend(root_fd: int, parts: list[str], result: Collection) -> int | None:
    """Open the output folder component by component, never through a link."""
    fd = root_fd
    for index, part in enumerate(parts):
        try:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
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
            if not _printable(name):
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
            child = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
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


def _printable(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False  # undecodable bytes (surrogate-escaped)
    return name.isprintable() and "\\" not in name


def _display(relative: str) -> str:
    return relative.encode("utf-8", errors="surrogateescape").decode("ascii", "backslashreplace")


# ---------------------------------------------------------------- content sniffing

_MAGIC: tuple[tuple[bytes, int, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", 0, "image/png"),
    (b"\xff\xd8\xff", 0, "image/jpeg"),
    (b"GIF87a", 0, "image/gif"),
    (b"GIF89a", 0, "image/gif"),
    (b"BM", 0, "image/bmp"),
    (b"II*\x00", 0, "image/tiff"),
    (b"MM\x00*", 0, "image/tiff"),
    (b"%PDF-", 0, "application/pdf"),
    (b"PK\x03\x04", 0, "application/zip"),
    (b"PK\x05\x06", 0, "application/zip"),
    (b"\x1f\x8b", 0, "application/gzip"),
    (b"BZh", 0, "application/x-bzip2"),
    (b"\xfd7zXZ\x00", 0, "application/x-xz"),
    (b"\x28\xb5\x2f\xfd", 0, "application/zstd"),
    (b"7z\xbc\xaf\x27\x1c", 0, "application/x-7z-compressed"),
    (b"\x7fELF", 0, "application/x-elf"),
    (b"SQLite format 3\x00", 0, "application/vnd.sqlite3"),
    (b"\x00asm", 0, "application/wasm"),
    (b"OggS", 0, "audio/ogg"),
    (b"ID3", 0, "audio/mpeg"),
    (b"fLaC", 0, "audio/flac"),
    (b"\x93NUMPY", 0, "application/x-npy"),
    (b"PAR1", 0, "application/vnd.apache.parquet"),
)


def sniff_content_type(data: bytes) -> str:
    """A content type from the bytes alone.

    Text is reported as ``text/plain`` or ``application/json`` and never as HTML or SVG,
    even when it is markup: whatever serves an artifact must not render the sandbox's bytes
    as a page from a trusted origin.
    """
    for magic, offset, kind in _MAGIC:
        if data[offset : offset + len(magic)] == magic:
            return kind
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "audio/wav"
    if data[4:8] == b"ftyp":
        return "video/mp4"
    if not data:
        return "application/octet-stream"
    if b"\x00" in data[:8192]:
        return "application/octet-stream"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "application/octet-stream"
    controls = sum(1 for ch in text[:8192] if ord(ch) < 32 and ch not in "\t\n\r\f\b")
    if controls * 100 > min(len(text), 8192):
        return "application/octet-stream"
    stripped = text.lstrip()
    if stripped[:1] in ("{", "[") and len(data) <= 8 * 1024 * 1024:
        try:
            json.loads(text)
        except ValueError:
            pass
        else:
            return "application/json"
    return "text/plain; charset=utf-8"


# ---------------------------------------------------------------- writing artifacts out


class ArtifactExportError(ValueError):
    """An artifact could not be written where it was asked to go (and why)."""


def write_artifacts(directory: str, files: list[tuple[str, bytes]]) -> list[str]:
    """Write each ``(relative path, bytes)`` under ``directory``; returns the paths written.

    ``directory`` is the caller's own choice and is created if missing. Below it nothing is
    followed: every folder is made and opened with ``O_NOFOLLOW`` relative to its parent, each
    file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (never executable), and an existing
    file or link in the way is an error rather than something to overwrite.
    """
    os.makedirs(directory, exist_ok=True)
    top = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    written: list[str] = []
    try:
        for path, data in files:
            parts = _safe_parts(path)
            if parts is None or not all(_printable(p) for p in parts):
                raise ArtifactExportError(f"artifact name {path!r} is not a safe relative path")
            fd = top
            try:
                for part in parts[:-1]:
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass
                    try:
                        child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                    except OSError as exc:
                        raise ArtifactExportError(
                            f"cannot write {path!r}: {part!r} in the way is not a folder "
                            "(links are not followed)"
                        ) from exc
                    if fd != top:
                        os.close(fd)
                    fd = child
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                try:
                    out = os.open(parts[-1], flags | getattr(os, "O_CLOEXEC", 0), 0o644, dir_fd=fd)
                except FileExistsError:
                    raise ArtifactExportError(
                        f"refusing to overwrite {os.path.join(directory, *parts)!r}"
                    ) from None
                with os.fdopen(out, "wb") as fh:
                    fh.write(data)
                written.append("/".join(parts))
            finally:
                if fd != top:
                    os.close(fd)
    finally:
        os.close(top)
    return written
