"""Commands whose work is another module's or another distribution's: ``doctor`` and
``profiles`` (doctor.py), ``mcp`` (psych-sandbox-mcp) and ``serve`` (psych-sandbox-remote).
The core parses their arguments, so ``--help`` lists them all; a distribution not installed
is named with its install line."""

from __future__ import annotations

import sys

from .status import EXIT_USAGE

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see __init__.py)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from typing import Any


def command_doctor(args: argparse.Namespace) -> int:
    from .doctor import command_doctor

    return command_doctor(args.config, args.json)


def command_profiles(args: argparse.Namespace) -> int:
    from .doctor import command_profiles

    return command_profiles(args.config, args.json)


def command_mcp(args: argparse.Namespace) -> int:
    serve = _handed_to(
        "psych_sandbox_mcp.command", "mcp", "the MCP integration", "psych-sandbox-mcp"
    )
    if serve is None:
        return EXIT_USAGE
    result: int = serve(args.config, args.transport, host=args.host, port=args.port)
    return result


def command_serve(args: argparse.Namespace) -> int:
    serve = _handed_to(
        "psych_sandbox_remote.serve", "serve", "the remote backend", "psych-sandbox-remote"
    )
    if serve is None:
        return EXIT_USAGE
    result: int = serve(args.profile, args.listen, args.config)
    return result


def _handed_to(
    module: str, command: str, what: str, distribution: str
) -> Callable[..., Any] | None:
    """The ``main`` of ``module``, which runs ``command``; None, said on stderr with the
    install line, when ``distribution`` (or what it needs) cannot be imported."""
    import importlib

    try:
        main: Callable[..., Any] = importlib.import_module(module).main
    except ImportError:
        print(
            f"psych-sandbox: {command} needs {what}; install it with: pip install {distribution}",
            file=sys.stderr,
        )
        return None
    return main
