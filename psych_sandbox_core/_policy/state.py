"""Where psych-sandbox keeps a user's state between processes."""

from __future__ import annotations

import os


def state_directory(*, create: bool = True) -> str:
    """``$XDG_STATE_HOME/psych-sandbox``, else ``~/.local/state/psych-sandbox``; with
    ``create``, made private to the user (0700) when missing (OSError when it cannot be)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    directory = os.path.join(state, "psych-sandbox")
    if create:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    return directory
