"""What is installed: the core's version and every backend's distribution and version.

Read from the ``psych_sandbox`` entry points' metadata, without loading any plugin: loading
runs a plugin's code, and a version report must work even where a plugin is broken.
"""

from __future__ import annotations

from dataclasses import dataclass

import importlib_metadata

from .. import __version__
from .registry import ENTRY_POINT_GROUP


@dataclass(frozen=True)
class InstalledBackend:
    #: The backend id (the entry point's name).
    id: str
    distribution: str | None
    version: str | None


def installed_backends() -> list[InstalledBackend]:
    """Every backend entry point, by id (one row per distribution that provides it)."""
    rows = {
        InstalledBackend(
            entry_point.name,
            entry_point.dist.metadata["Name"] if entry_point.dist is not None else None,
            entry_point.dist.version if entry_point.dist is not None else None,
        )
        for entry_point in importlib_metadata.entry_points(group=ENTRY_POINT_GROUP)
    }
    return sorted(rows, key=lambda row: (row.id, row.distribution or ""))


def version_report() -> str:
    """What ``psych-sandbox --version`` prints."""
    lines = [f"psych-sandbox-core {__version__}", "backends:"]
    backends = installed_backends()
    width = max((len(row.id) for row in backends), default=0)
    for row in backends:
        origin = row.distribution or "unknown distribution"
        if row.version:
            origin += f" {row.version}"
        lines.append(f"  {row.id:<{width}}  {origin}")
    return "\n".join(lines)
