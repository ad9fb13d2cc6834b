"""The ``psych-sandbox`` command's arguments: the parser and ``--version``.

Building the parser imports nothing but :mod:`argparse`: ``--help`` and a usage error import
no model, backend or plugin.
"""

from __future__ import annotations

import argparse

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see __init__.py)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="psych-sandbox",
        description="Run an untrusted Python program in an isolated sandbox.",
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="show the core's version and every installed backend's, then exit",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run one program and report its result")
    run.add_argument("file", help="the program's source file, or - for standard input")
    exec_ = commands.add_parser(
        "exec",
        help="run one command where a program would run (same containment, limits, grades)",
        description="Run one command in the sandbox: psych-sandbox exec [options] -- ARGV... "
        "runs ARGV without a shell; with --shell, its one argument is run by /bin/sh -c.",
    )
    for command in (run, exec_):
        command.add_argument("--profile", default="default", help="profile name (default: default)")
        command.add_argument(
            "--timeout",
            type=float,
            default=None,
            help="wall-clock limit in seconds (narrows only)",
        )
        command.add_argument("--json", action="store_true", help="print exactly one JSON object")
        command.add_argument(
            "--explain",
            action="store_true",
            help="also print the guidance a failure carries for a model",
        )
        command.add_argument(
            "--artifacts",
            default=None,
            metavar="DIR",
            help="write the files left in the workspace to DIR (never overwrites)",
        )
        command.add_argument(
            "--input",
            action="append",
            default=[],
            metavar="PATH[=NAME]",
            help="place the file PATH in the workspace (as NAME) before it starts; repeatable",
        )
    run.add_argument(
        "--tools", default=None, help="a Python file whose plain functions the program may call"
    )
    exec_.add_argument(
        "--shell", action="store_true", help="run the one argument given with /bin/sh -c"
    )
    exec_.add_argument("argv", nargs=argparse.REMAINDER, help="-- then the command's arguments")
    doctor = commands.add_parser("doctor", help="what this host can promise: backends, grades")
    doctor.add_argument("--json", action="store_true", help="print exactly one JSON object")
    profiles = commands.add_parser("profiles", help="list the configured profiles")
    profiles.add_argument("--json", action="store_true", help="print exactly one JSON object")
    mcp = commands.add_parser(
        "mcp",
        help="serve run_python as an MCP server; programs may call the configured upstream "
        "MCP servers' tools (needs psych-sandbox-mcp)",
    )
    mcp.add_argument(
        "--transport", choices=("stdio", "streamable-http"), default="stdio", help="default: stdio"
    )
    mcp.add_argument(
        "--host", default="127.0.0.1", help="streamable-http: address to listen on (loopback)"
    )
    mcp.add_argument(
        "--port", type=int, default=8000, help="streamable-http: port (0 picks a free one)"
    )
    serve = commands.add_parser(
        "serve", help="serve a profile as a remote sandbox service (psych-sandbox-remote)"
    )
    serve.add_argument("--profile", required=True, help="the profile to serve")
    serve.add_argument("--listen", required=True, metavar="HOST:PORT", help="address to listen on")
    for command in (run, exec_, doctor, profiles, mcp, serve):
        command.add_argument(
            "--config",
            default=None,
            help="deployment configuration file (TOML); default: $PSYCH_SANDBOX_CONFIG if set",
        )
    return parser


class _VersionAction(argparse.Action):
    """``--version``: read the installed plugins' metadata only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        from .._policy.versions import version_report

        print(version_report())
        parser.exit()
