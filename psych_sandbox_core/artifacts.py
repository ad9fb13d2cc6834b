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

A backend whose workspace the host cannot reach (a tmpfs in a mount namespace or a container)
has the child send its files over the control channel instead; :class:`ChannelCollector`
builds the same :class:`Collection` from those frames, trusting none of them: every path,
offset and cap is checked by the host as the bytes arrive, and the digest and content type
are computed here, never taken from the child.
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

from .errors import ProtocolViolation
from .protocol.codec import chunk_size_at_least, decode_chunk
from .protocol.frames import ArtifactFrame, ArtifactRequest, ArtifactSkippedFrame
from .protocol.limits import (
    ARTIFACT_CHUNK_BYTES,
    MAX_ARTIFACT_DEPTH,
    MAX_ARTIFACT_ENTRIES,
    MAX_ARTIFACT_PATH_CHARS,
    MAX_JSON_DEPTH,
    MAX_JSON_ELEMENTS,
)
from .protocol.shape import ShapeLimits, check_shape

#: A file is called JSON only when parsing it is as bounded as parsing a frame's value.
_SNIFF_SHAPE = ShapeLimits(MAX_JSON_DEPTH, MAX_JSON_ELEMENTS, "depth", "elements")

# getattr for the POSIX-only flags: the module must import on Windows too, where no backend
# hands the host a workspace to walk.
_DIR_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_DIRECTORY", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
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
#: Skipped entries listed by name; beyond this they are only counted.
MAX_SKIPPED_LISTED = 100


class SkippedEntry(BaseModel):
    """Something in the workspace that was deliberately not collected, and why."""

    model_config = ConfigDict(frozen=True)

    path: str
    #: symlink, hard_link, fifo, socket, device, not_regular, too_large, total_cap,
    #: too_many, too_deep, changed, vanished, outside, other_filesystem, unsafe_name,
    #: unreadable, entry_limit, budget_exhausted (the execution's byte budget could not pay
    #: for storing it); for the collection as a whole (path "." or the output
    #: folder), also one of COLLECTION_FAILURES.
    reason: str


#: Reasons that nothing (or not everything) could be collected at all, and what they mean.
COLLECTION_FAILURES = {
    "unreachable": "the backend cannot hand its workspace to the host and the files were not "
    "sent over the control channel",
    "interrupted": "the execution ended before the sandbox finished sending its files (it "
    "timed out, crashed, was cancelled or broke the protocol)",
    "unreadable": "the sandbox could not read its own workspace",
    "changed": "the workspace was replaced while the program ran",
}


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


# ---------------------------------------------------------------- collecting over the channel


def collection_failure(folder: str | None, reason: str) -> Collection:
    """A collection that names why nothing could be collected."""
    result = Collection()
    result.skip(_folder_label(folder), reason)
    return result


def _folder_label(folder: str | None) -> str:
    parts = _safe_parts(folder) if folder else None
    return "/".join(parts) if parts else "."


def channel_request(folder: str | None, limits: CollectionLimits) -> ArtifactRequest | None:
    """The run frame's collection request, or None when the folder is not a safe relative
    path (the caller then reports it as unsafe_name)."""
    parts: list[str] | None = []
    if folder:
        parts = _safe_parts(folder)
    if parts is None or len("/".join(parts)) > MAX_ARTIFACT_PATH_CHARS:
        return None
    return ArtifactRequest(
        folder="/".join(parts),
        max_files=min(limits.max_files, 2**31),
        file_bytes=limits.per_file_bytes,
        total_bytes=limits.total_bytes,
    )


@dataclass
class _Incoming:
    path: str
    data: bytearray = field(default_factory=bytearray)


class ChannelCollector:
    """The host's side of collecting over the control channel: a state machine fed with the
    child's artifact frames. No I/O. Anything an honest bootstrap would not send raises
    ProtocolViolation; the execution then ends as protocol_error and nothing is kept."""

    def __init__(self, request: ArtifactRequest) -> None:
        self.request = request
        self._folder = request.folder.split("/") if request.folder else []
        self._result = Collection()
        self._current: _Incoming | None = None
        #: Every path named so far: a file's may not come again. A skipped entry's may (an
        #: unprintable name is shown cut short, so two can look alike) but not a file's.
        self._named: set[str] = set()
        self._count = 0
        #: Folders implied by the files so far: no file may have one's name, nor sit below
        #: a file.
        self._folders: set[str] = set()
        self._files: set[str] = set()
        #: Bytes received in all, kept or abandoned: what the total cap bounds.
        self._received = 0
        self.started = False

    # Every entry examined may be named once; the folder itself and the entry that hit the
    # examination limit are the two beyond that.
    _MAX_NAMED = MAX_ARTIFACT_ENTRIES + 2

    def receive(self, frame: ArtifactFrame | ArtifactSkippedFrame) -> None:
        self.started = True
        if isinstance(frame, ArtifactFrame):
            self._chunk(frame)
        else:
            self._skipped(frame)

    def _chunk(self, frame: ArtifactFrame) -> None:
        request, current = self.request, self._current
        if current is not None and frame.path != current.path:
            raise ProtocolViolation(
                f"artifact {frame.path!r} began before {current.path!r} was finished"
            )
        if current is None:
            self._check_file_path(frame.path)
            if frame.path in self._named:
                raise ProtocolViolation(f"artifact {frame.path!r} was sent twice")
            if len(self._result.files) >= request.max_files:
                raise ProtocolViolation(
                    f"more than the {request.max_files} artifacts the host asked for"
                )
            self._name(frame.path)
            current = self._current = _Incoming(frame.path)
            self._claim(frame.path)
        received = len(current.data)
        if frame.offset != received:
            raise ProtocolViolation(
                f"artifact {frame.path!r}: a chunk at offset {frame.offset}, expected {received}"
            )
        # Caps first, from the text's length alone: nothing over a cap is ever decoded.
        at_least = chunk_size_at_least(frame.data)
        self._check_caps(frame.path, received + at_least, self._received + at_least)
        data = decode_chunk(frame.data)
        self._check_caps(frame.path, received + len(data), self._received + len(data))
        if not frame.last and len(data) != ARTIFACT_CHUNK_BYTES:
            raise ProtocolViolation(
                f"artifact {frame.path!r}: a chunk of {len(data)} bytes that is not the last; "
                f"every chunk but the last holds {ARTIFACT_CHUNK_BYTES}"
            )
        current.data += data
        self._received += len(data)
        if frame.last:
            content = bytes(current.data)
            self._current = None
            self._result.total_bytes += len(content)
            self._result.files.append(
                CollectedFile(
                    path=current.path,
                    data=content,
                    sha256=hashlib.sha256(content).hexdigest(),
                    content_type=sniff_content_type(content),
                )
            )

    def _check_caps(self, path: str, file_bytes: int, total_bytes: int) -> None:
        request = self.request
        if file_bytes > request.file_bytes:
            raise ProtocolViolation(
                f"artifact {path!r} exceeds the {request.file_bytes}-byte cap per file"
            )
        if total_bytes > request.total_bytes:
            raise ProtocolViolation(
                f"artifacts exceed the {request.total_bytes}-byte cap on all of them together"
            )

    def _skipped(self, frame: ArtifactSkippedFrame) -> None:
        current = self._current
        if current is not None:
            if frame.path != current.path:
                raise ProtocolViolation(
                    f"{frame.path!r} was skipped before artifact {current.path!r} was finished"
                )
            # The child abandons the file it was sending (it changed or could not be read):
            # its bytes still counted against the total, and are dropped here.
            self._current = None
            self._result.skip(frame.path, frame.reason)
            return
        self._check_skipped_path(frame.path)
        if frame.path in self._files:
            raise ProtocolViolation(f"{frame.path!r} was skipped after it was sent")
        self._name(frame.path)
        self._result.skip(frame.path, frame.reason)

    def _name(self, path: str) -> None:
        self._count += 1
        if self._count > self._MAX_NAMED:
            raise ProtocolViolation(
                f"more than {self._MAX_NAMED} artifact paths; the walk examines at most "
                f"{MAX_ARTIFACT_ENTRIES} entries"
            )
        self._named.add(path)

    def _claim(self, path: str) -> None:
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts))]
        if path in self._folders or any(prefix in self._files for prefix in prefixes):
            raise ProtocolViolation(
                f"artifact {path!r} cannot exist beside the artifacts already sent (a file "
                "and a folder of the same name)"
            )
        self._files.add(path)
        self._folders.update(prefixes)

    def _check_file_path(self, path: str) -> None:
        parts = _checked_parts(path, allow_escapes=False)
        self._check_under_folder(path, parts, exact=False)

    def _check_skipped_path(self, path: str) -> None:
        if path == ".":
            return  # the collection as a whole
        parts = _checked_parts(path, allow_escapes=True)
        self._check_under_folder(path, parts, exact=True)

    def _check_under_folder(self, path: str, parts: list[str], *, exact: bool) -> None:
        folder = self._folder
        if not folder:
            return
        inside = parts[: len(folder)] == folder and (
            len(parts) > len(folder) or (exact and len(parts) == len(folder))
        )
        # A folder skipped on the way down names an ancestor of the output folder.
        on_the_way = exact and parts == folder[: len(parts)]
        if not (inside or on_the_way):
            raise ProtocolViolation(
                f"artifact path {path!r} is outside the requested folder {self.request.folder!r}"
            )

    def at_result(self) -> None:
        """The result frame arrived: no file may be left half sent."""
        if self._current is not None:
            raise ProtocolViolation(
                f"the result arrived while artifact {self._current.path!r} was half sent"
            )

    def collection(self) -> Collection:
        return self._result


def _checked_parts(path: str, *, allow_escapes: bool) -> list[str]:
    """The components of a path a child named, or ProtocolViolation saying what was wrong.

    Relative, normalized ("/"-separated, no empty, "." or ".." component), no NUL, printable.
    A skipped entry's name may carry the backslash escapes the child uses to show an
    unprintable name; a file's may not, so every collected path can be written out as is.
    """
    if len(path) > MAX_ARTIFACT_PATH_CHARS or "\x00" in path:
        raise ProtocolViolation(f"artifact path {path[:200]!r} is too long or holds a NUL")
    if path.startswith("/"):
        raise ProtocolViolation(f"artifact path {path[:200]!r} is absolute")
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise ProtocolViolation(
                f"artifact path {path[:200]!r} is not normalized (empty, '.' or '..' component)"
            )
        printable = part.isprintable() and _encodable(part)
        if not printable or (not allow_escapes and "\\" in part):
            raise ProtocolViolation(f"artifact path {path[:200]!r} has an unsafe component")
    return parts


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
            # The program wrote these bytes: measured before parsing, like any frame, so a
            # deep or wide text costs the host a scan, never a recursion or a huge tree.
            check_shape(data, _SNIFF_SHAPE, "the file")
            json.loads(text)
        except (ValueError, ProtocolViolation, RecursionError):
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
