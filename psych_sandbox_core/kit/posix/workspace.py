"""Per-execution private working directories (removed by ``removal.remove_tree``)."""

from __future__ import annotations

import os

from .temp_dirs import WORKSPACE_PREFIX, make_owned_directory


def create_workspace(owner: tuple[int, int] | None = None) -> str:
    """A fresh private directory (0700), owned by ``owner`` (uid, gid) when given, named for
    this host so that a later host removes it if this one is killed before it can."""
    path = make_owned_directory(WORKSPACE_PREFIX)
    if owner is not None:
        os.chown(path, *owner)
    return path
