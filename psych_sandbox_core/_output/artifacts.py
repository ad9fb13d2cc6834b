"""What a collection of artifacts is, whichever way it was made.

A program's files reach the host one of two ways: the host walks the workspace itself
(artifact_walk.py), or, when it cannot reach it, the child sends them over the control
channel (artifact_channel.py). Both build the same :class:`Collection`: the files, each with
its digest and a content type sniffed from its bytes (content_type.py), and the entries
deliberately skipped, with why. The path rules here are shared by both and by export
(artifact_export.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..result import SkippedEntry

#: Opens a directory without following a link, relative to its parent's descriptor. getattr
#: for the POSIX-only flags: the module must import on Windows too, where no backend hands
#: the host a workspace to walk.
DIR_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_DIRECTORY", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)

#: Skipped entries listed by name; beyond this they are only counted.
MAX_SKIPPED_LISTED = 100

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


def collection_failure(folder: str | None, reason: str) -> Collection:
    """A collection that names why nothing could be collected."""
    result = Collection()
    result.skip(_folder_label(folder), reason)
    return result


def _folder_label(folder: str | None) -> str:
    parts = safe_parts(folder) if folder else None
    return "/".join(parts) if parts else "."


def collection_problem(skipped: list[SkippedEntry]) -> str | None:
    """Why nothing (or not everything) could be collected, when the collection says so."""
    for entry in skipped:
        # unreachable and interrupted are the host's own words; unreadable and changed speak
        # for the whole collection only when they name the workspace itself.
        if entry.reason in ("unreachable", "interrupted") or (
            entry.path == "." and entry.reason in COLLECTION_FAILURES
        ):
            return COLLECTION_FAILURES[entry.reason]
    return None


def safe_parts(relative: str) -> list[str] | None:
    if os.path.isabs(relative) or "\x00" in relative:
        return None
    parts = [p for p in relative.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        return None
    return parts


def printable_name(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False  # undecodable bytes (surrogate-escaped)
    return name.isprintable() and "\\" not in name
