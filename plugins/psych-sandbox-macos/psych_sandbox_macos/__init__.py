"""psych-sandbox-macos: the process level on macOS, with a seatbelt profile per execution.

Installing this distribution is all it takes: the ``psych_sandbox`` entry point registers the
``macos`` backend. On any other platform it stays installed and reports itself unavailable
("requires macOS") in ``psych-sandbox doctor``.
"""

from .backend import MacosBackend, MacosOptions
from .seatbelt import SeatbeltPolicy, SeatbeltProfile, generate

__all__ = ["MacosBackend", "MacosOptions", "SeatbeltPolicy", "SeatbeltProfile", "generate"]
__version__ = "0.2.0"
