"""``run`` and ``exec``: the command line read into how one execution starts, checked
before anything is imported or read (a bad ``--timeout``, a missing command, an unreadable
source file are usage errors, exit status 2)."""

from __future__ import annotations

import sys

from .execution import UsageError, execute
from .status import EXIT_USAGE

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see __init__.py)
if TYPE_CHECKING:
    import argparse
    from typing import Any

    import anyio

    from .._api.sandbox import Sandbox
    from .render import LiveOutput


def _read_source(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    try:
        with open(name, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise UsageError(f"cannot read {name}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{name} is not UTF-8 text") from None


def _bad_timeout(args: argparse.Namespace) -> bool:
    """Whether --timeout is unusable (said on stderr), checked before anything is read."""
    import math

    if args.timeout is not None and not (args.timeout > 0 and math.isfinite(args.timeout)):
        print("psych-sandbox: --timeout must be a positive, finite number", file=sys.stderr)
        return True
    return False


def command_run(args: argparse.Namespace) -> int:
    if _bad_timeout(args):
        return EXIT_USAGE
    try:
        source = _read_source(args.file)
    except UsageError as exc:
        print(f"psych-sandbox: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from .._bindings.bindings import load_function_tools

    bindings = load_function_tools(args.tools) if args.tools is not None else None

    def start(
        sandbox: Sandbox, inputs: dict[str, str], cancel: anyio.Event, live: LiveOutput | None
    ) -> Any:
        return sandbox.run(
            source,
            profile=args.profile,
            timeout=args.timeout,
            bindings=bindings,
            cancel=cancel,
            inputs=inputs,
            on_output=live,
        )

    return execute(args, start)


def command_exec(args: argparse.Namespace) -> int:
    if _bad_timeout(args):
        return EXIT_USAGE
    argv = list(args.argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("psych-sandbox: exec needs a command: exec [options] -- ARGV...", file=sys.stderr)
        return EXIT_USAGE
    if args.shell and len(argv) != 1:
        print("psych-sandbox: with --shell, give the command as one argument", file=sys.stderr)
        return EXIT_USAGE

    def start(
        sandbox: Sandbox, inputs: dict[str, str], cancel: anyio.Event, live: LiveOutput | None
    ) -> Any:
        return sandbox.exec(
            argv[0] if args.shell else argv,
            shell=args.shell,
            profile=args.profile,
            timeout=args.timeout,
            cancel=cancel,
            inputs=inputs,
            on_output=live,
        )

    return execute(args, start)
