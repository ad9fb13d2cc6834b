"""Deprecated: the backend kit moved to :mod:`psych_sandbox_core.kit`.

Kept for one release (0.2) so that backends written against 0.1 still import; it re-exports
the kit's names. New code imports ``psych_sandbox_core.kit``.
"""

from __future__ import annotations

from typing import Any

from . import kit
from .kit import *  # noqa: F403
from .kit import __all__ as __all__


def __getattr__(name: str) -> Any:
    return getattr(kit, name)
