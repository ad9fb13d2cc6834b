"""The ``psych-sandbox`` command: its entry point. The parser is parser.py, ``run`` and
``exec`` are run_commands.py over execution.py, the commands another module or distribution
does are handed_over.py, and status.py says what the exit status means.

Everything else is imported by the command that uses it: ``--help`` and a usage error import
no model, backend or plugin, and ``run`` nothing that ``doctor`` alone needs.
"""

from __future__ import annotations

import sys

from ..errors import ConfigurationError
from . import collector
from .handed_over import command_doctor, command_mcp, command_profiles, command_serve
from .parser import build_parser
from .run_commands import command_exec, command_run
from .status import EXIT_OK, EXIT_USAGE

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see __init__.py)
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["build_parser", "console_main", "main"]


def console_main() -> int:
    """The ``psych-sandbox`` command in a process of its own (the console script and
    ``python -m psych_sandbox_core``): :func:`main`, with the cyclic garbage collector kept
    out of the start-up (collector.py) and the exit: the interpreter's final collection is
    skipped the same way, since the process ends and everything goes with it. (An
    application calling :func:`main` keeps its collector as is.)
    """
    import gc

    collector.pause()
    try:
        return main()
    finally:
        collector.resume()
        gc.freeze()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code not in (0, None) else EXIT_OK
    if args.command not in ("run", "exec"):
        collector.resume()  # (theirs is resumed once their imports are done)
    handler = _COMMANDS[args.command]
    try:
        return handler(args)
    except ConfigurationError as exc:
        print(f"psych-sandbox: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        # Interrupted before a run began (while reading the program or loading tools):
        # nothing was created yet, so there is nothing to report or clean.
        import signal

        return 128 + signal.SIGINT


_COMMANDS = {
    "run": command_run,
    "exec": command_exec,
    "doctor": command_doctor,
    "profiles": command_profiles,
    "mcp": command_mcp,
    "serve": command_serve,
}
