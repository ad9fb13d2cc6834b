"""What ``default`` chose on this host, remembered across processes for a short while.

Choosing runs a trial execution of each backend in the default order until one works (see
trials.select_default): a whole execution before the program's own. A process that runs
many programs pays it once; the ``psych-sandbox`` command runs one program per process, so
it remembers the choice in the user's state directory (state.py) for :data:`TTL_SECONDS`.

What a remembered choice may and may not do:

- It is used only while everything it was found under is unchanged: the core's version, the
  installed ``psych_sandbox`` entry points with their distributions' versions, the
  deployment's ``backend_preference``, the effective uid, ``PATH`` (where backends find
  their binaries), the interpreter running the host and the kernel's boot id; and for at
  most :data:`TTL_SECONDS` (a clock that went backwards ends it too).
- It only names a backend. The level, grades and notes of an execution are always its own
  report's, graded by the core as on every run: a stale choice can run weaker than a fresh
  one would (reported as such, with the ``below_isolated`` note), never be reported stronger
  than it is. Required levels are enforced on the execution itself, as always.
- When the remembered backend no longer starts (``backend_not_ready``: the program did not
  run), the choice is forgotten and made again with trials, and the program runs on the new
  choice, as if nothing had been remembered (sandbox.py). When it starts but reports less
  than it claims, the host refuses the execution as ``isolation_unavailable`` (before the
  program runs, see docs/architecture.md); that one result is returned and the choice is
  forgotten, so the next run chooses again.
- A stronger backend that starts working here (a container engine started, say) is noticed
  when the choice expires, or at once by ``psych-sandbox doctor``, which never uses it.
- The file is trusted only if it is the user's own: the directory and the file must be owned
  by the effective uid and writable by nobody else, the file is opened without following a
  link, read within a bound and checked field by field; anything else is ignored and the
  choice is made afresh. Whoever can write it can already act as the user, and even then
  can only steer ``default`` to another installed backend, graded as above.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
import time
from collections.abc import Sequence

from .. import __version__
from ..grading import Level
from .registry import BackendRegistry, name_and_version
from .selection import Candidate, Selection
from .state import state_directory

#: How long a choice is remembered: long enough that a command run once per program in a
#: loop chooses once per burst, short enough that a host that changed is noticed soon.
TTL_SECONDS = 300.0

#: The file's name in the state directory.
FILE_NAME = "default-selection.json"

#: A remembered choice is a few hundred bytes; anything much larger is not one of ours.
MAX_FILE_BYTES = 64 * 1024

#: Bumped whenever the file's layout changes, so an older layout is never misread.
FORMAT = 1

_ORIGINS = frozenset({"configured", "first-party", "third-party"})


class SelectionCache:
    """A remembered ``default`` choice in ``directory`` (the user's state directory when
    None). Every failure to read or write it is silent: it only ever saves a trial."""

    def __init__(self, directory: str | None = None, *, ttl_seconds: float = TTL_SECONDS):
        self._directory = directory
        self.ttl_seconds = ttl_seconds

    def _path(self, create: bool) -> str | None:
        directory = self._directory
        if directory is None:
            try:
                directory = state_directory(create=create)
            except OSError:
                return None
        return os.path.join(directory, FILE_NAME)

    def load(self, registry: BackendRegistry, preference: Sequence[str] = ()) -> Selection | None:
        """The remembered choice, if it is still valid here and now; otherwise None."""
        path = self._path(create=False)
        if path is None:
            return None
        try:
            data = json.loads(_read_private(path))
            return _selection_from(data, _key(registry, preference), self.ttl_seconds)
        except (OSError, ValueError, TypeError, KeyError, IndexError):
            return None

    def store(
        self, registry: BackendRegistry, preference: Sequence[str], selection: Selection
    ) -> None:
        """Remember ``selection``, found by trials just now, replacing any earlier choice."""
        path = self._path(create=True)
        if path is None:
            return
        order = list(selection.order)
        record = {
            "format": FORMAT,
            "key": _key(registry, preference),
            "created": time.time(),
            "order": [[c.backend_id, c.claims.value, c.origin] for c in order],
            "chosen": order.index(selection.chosen),
            "skipped": [[order.index(c), reason] for c, reason in selection.skipped],
        }
        directory = os.path.dirname(path)
        try:
            if not _private_directory(directory):
                return
            fd, temporary = tempfile.mkstemp(dir=directory, prefix=".selection-")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(record, fh)
                os.replace(temporary, path)  # readers see the old file or the new, whole
            except BaseException:
                os.unlink(temporary)
                raise
        except OSError:
            return

    def forget(self) -> None:
        """Drop the remembered choice: the next run chooses with trials again."""
        path = self._path(create=False)
        if path is None:
            return
        try:
            os.unlink(path)
        except OSError:
            pass


def _euid() -> int:
    geteuid = getattr(os, "geteuid", None)
    return geteuid() if geteuid is not None else -1


def _private_directory(directory: str) -> bool:
    """Whether ``directory`` (not a link) is the user's own and writable by nobody else."""
    info = os.lstat(directory)
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == _euid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _read_private(path: str) -> str:
    """The file's text, if it and its directory are the user's own; else OSError."""
    if not _private_directory(os.path.dirname(path)):
        raise PermissionError(f"{os.path.dirname(path)} is not private to this user")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not (
            stat.S_ISREG(info.st_mode)
            and info.st_uid == _euid()
            and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            and info.st_size <= MAX_FILE_BYTES
        ):
            raise PermissionError(f"{path} is not a private file of this user")
        data = os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{path} is too large")
    return data.decode("utf-8")


def _boot_id() -> str:
    """This boot of the kernel (Linux): a reboot may change what works here."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read(64).strip()
    except OSError:
        return ""


def _file_identity(path: str) -> list[int]:
    try:
        info = os.stat(path)
    except OSError:
        return []
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns]


def _key(registry: BackendRegistry, preference: Sequence[str]) -> list[object]:
    """Everything a remembered choice is valid under, as plain JSON data compared whole."""
    installed = sorted(
        [
            entry_point.name,
            entry_point.value,
            *(name_and_version(entry_point.dist) if entry_point.dist is not None else ("", "")),
        ]
        for entry_point in registry.entry_points()
    )
    return [
        FORMAT,
        __version__,
        _euid(),
        _boot_id(),
        os.environ.get("PATH", ""),
        sys.executable,
        _file_identity(sys.executable),
        list(preference),
        installed,
    ]


def _selection_from(data: object, key: list[object], ttl_seconds: float) -> Selection | None:
    """The selection ``data`` records, if it is well formed, current and made under ``key``;
    malformed data raises (TypeError, ValueError, KeyError, IndexError)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != key:
        return None
    created = data["created"]
    if not isinstance(created, (int, float)) or isinstance(created, bool):
        return None
    age = time.time() - created
    if not 0 <= age < ttl_seconds:
        return None
    order: list[Candidate] = []
    for backend_id, claims, origin in data["order"]:
        if (
            not (isinstance(backend_id, str) and backend_id.isidentifier())
            or origin not in _ORIGINS
        ):
            return None
        order.append(Candidate(backend_id, Level(claims), origin))
    if len({c.backend_id for c in order}) != len(order):
        return None
    chosen = data["chosen"]
    if not (isinstance(chosen, int) and 0 <= chosen < len(order)):
        return None
    skipped: list[tuple[Candidate, str]] = []
    for index, reason in data["skipped"]:
        # Only candidates tried before the chosen one, in order, can have been skipped.
        if not (isinstance(index, int) and 0 <= index < chosen and isinstance(reason, str)):
            return None
        skipped.append((order[index], reason))
    return Selection(order[chosen], tuple(order), tuple(skipped), remembered=True)
