"""The child's environment: built from an allow-list, never copied from the host's.

Every backend hands the child exactly this (plus the request's own additions), so it lives
apart from the host's conversation with the child and is offered to backends through the
backend kit.
"""

from __future__ import annotations


def child_environment(temp_dir: str) -> dict[str, str]:
    """The child's whole environment: built from an allow-list, never copied."""
    return {"TMPDIR": temp_dir}
