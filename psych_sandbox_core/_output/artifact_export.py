"""Writing a result's artifacts out to a folder of the caller's choosing, following nothing."""

from __future__ import annotations

import os

from ..result import ArtifactInfo
from .artifacts import DIR_FLAGS, printable_name, safe_parts
from .attachments import AttachmentLedger


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
            parts = safe_parts(path)
            if parts is None or not all(printable_name(p) for p in parts):
                raise ArtifactExportError(f"artifact name {path!r} is not a safe relative path")
            fd = top
            try:
                for part in parts[:-1]:
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass
                    try:
                        child = os.open(part, DIR_FLAGS, dir_fd=fd)
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


async def export_artifacts(
    ledger: AttachmentLedger,
    *,
    tenant: str,
    run_id: str,
    artifacts: list[ArtifactInfo],
    directory: str,
) -> tuple[list[str], list[str]]:
    """Write a result's artifacts under ``directory`` (see :func:`write_artifacts`).

    Returns the paths written and those not written because only a preview was kept.
    """
    files: list[tuple[str, bytes]] = []
    partial: list[str] = []
    for artifact in artifacts:
        if not (await ledger.describe(artifact.attachment, tenant=tenant, run_id=run_id)).complete:
            partial.append(artifact.path)
            continue
        data = await ledger.read_all(artifact.attachment, tenant=tenant, run_id=run_id)
        files.append((artifact.path, data))
    return write_artifacts(directory, files), partial
