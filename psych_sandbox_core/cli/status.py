"""What the ``psych-sandbox`` command's exit status says, and the signals that cancel a run.

0 when the program succeeded, 1 when it failed, 2 for usage or configuration errors,
128 + the signal's number when SIGINT, SIGTERM or SIGHUP cancelled the run (130, 143, 129).
``exec`` exits with the command's own exit status when it ran to its exit, and as ``run``
does otherwise (1 for a timeout, a limit or a refusal).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_PROGRAM_FAILED = 1
EXIT_USAGE = 2

#: Signals that cancel a run: the execution is torn down, its partial result printed, and the
#: command exits with 128 + the signal's number, as a shell reports a process it killed.
#: Names, so that a command other than ``run`` never imports :mod:`signal`.
CANCEL_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
