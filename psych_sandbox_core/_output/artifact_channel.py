"""Collecting artifacts over the control channel, for a backend whose workspace the host
cannot reach (a tmpfs in a mount namespace or a container).

The child sends its files as artifact frames; :class:`ChannelCollector` builds the same
:class:`~.artifacts.Collection` the workspace walk builds, trusting none of them: every path,
offset and cap is checked by the host as the bytes arrive, and the digest and content type
are computed here, never taken from the child.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ..errors import ProtocolViolation
from ..protocol.codec import chunk_size_at_least, decode_chunk
from ..protocol.frames import ArtifactFrame, ArtifactRequest, ArtifactSkippedFrame
from ..protocol.limits import ARTIFACT_CHUNK_BYTES, MAX_ARTIFACT_ENTRIES, MAX_ARTIFACT_PATH_CHARS
from .artifacts import CollectedFile, Collection, CollectionLimits, safe_parts
from .content_type import sniff_content_type


def channel_request(folder: str | None, limits: CollectionLimits) -> ArtifactRequest | None:
    """The run frame's collection request, or None when the folder is not a safe relative
    path (the caller then reports it as unsafe_name)."""
    parts: list[str] | None = []
    if folder:
        parts = safe_parts(folder)
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
