"""psych-sandbox-bwrap: the isolated level on Linux, with bubblewrap.

Installing this distribution is all it takes: the ``psych_sandbox`` entry point registers
the ``bwrap`` backend, and the default profile picks it where a trial execution reaches the
isolated level.
"""

from .backend import BwrapBackend, BwrapOptions

__all__ = ["BwrapBackend", "BwrapOptions"]
__version__ = "0.2.0"
