"""The ``psych-sandbox`` command.

Exit status: 0 when the program succeeded, 1 when it failed, 2 for usage or configuration
errors, 128 + the signal's number when SIGINT, SIGTERM or SIGHUP cancelled the run (130, 143,
129). ``exec`` exits with the command's own exit status when it ran to its exit, and as
``run`` does otherwise (1 for a timeout, a limit or a refusal).

Human output shows everything foreign through :func:`visible.visible`: the program's streams
and tracebacks as blocks of lines under a gutter, and every line of the run's report starting
with :data:`visible.SUMMARY_MARK`, which foreign text can never show.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import ConfigurationError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see __init__.py)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    import anyio

    from .._api.sandbox import Sandbox
    from ..result import ExecutionResult
    from .render import LiveOutput

# Everything else is imported by the command that uses it: ``--help`` and a usage error
# import no model, backend or plugin, and ``run`` nothing that ``doctor`` alone needs.

EXIT_OK = 0
EXIT_PROGRAM_FAILED = 1
EXIT_USAGE = 2

#: Signals that cancel a run: the execution is torn down, its partial result printed, and the
#: command exits with 128 + the signal's number, as a shell reports a process it killed.
#: Names, so that a command other than ``run`` never imports :mod:`signal`.
CANCEL_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


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


def console_main() -> int:
    """The ``psych-sandbox`` command in a process of its own (the console script and
    ``python -m psych_sandbox_core``): :func:`main`, with the cyclic garbage collector kept
    out of the start-up and the exit. Start-up builds tens of thousands of objects that live
    as long as the process (modules, classes, pydantic's validators, which make a full
    collection cost tens of milliseconds), walked again by every collection: the collector is
    paused while the command imports, and what the imports built is then frozen out of later
    collections (:func:`_resume_collector`).
    At exit the interpreter's final collection is skipped the same way: the process ends and
    everything goes with it. (An application calling :func:`main` keeps its collector as is.)
    """
    import gc

    global _collector_paused
    gc.disable()
    _collector_paused = True
    try:
        return main()
    finally:
        _resume_collector()
        gc.freeze()


#: Whether console_main paused the collector, which is resumed once the command's imports
#: are done.
_collector_paused = False


def _resume_collector() -> None:
    """Freeze what the start-up built out of every later collection and resume the
    collector, if console_main paused it."""
    global _collector_paused
    if _collector_paused:
        import gc

        gc.freeze()
        gc.enable()
        _collector_paused = False


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code not in (0, None) else EXIT_OK
    if args.command not in ("run", "exec"):
        _resume_collector()  # (theirs is resumed once their imports are done)
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


def _read_source(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    try:
        with open(name, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise _UsageError(f"cannot read {name}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise _UsageError(f"{name} is not UTF-8 text") from None


class _UsageError(Exception):
    pass


def _input_options(values: Sequence[str]) -> dict[str, str]:
    """``--input PATH[=NAME]`` options as inputs= (NAME defaults to PATH's last component)."""
    import os

    inputs: dict[str, str] = {}
    for value in values:
        path, _, name = value.rpartition("=") if "=" in value else (value, "", "")
        name = name or os.path.basename(path)
        if not path or name in inputs:
            raise _UsageError(f"--input {value}: " + ("no path" if not path else "name taken"))
        inputs[name] = path
    return inputs


def _bad_timeout(args: argparse.Namespace) -> bool:
    """Whether --timeout is unusable (said on stderr), checked before anything is read."""
    import math

    if args.timeout is not None and not (args.timeout > 0 and math.isfinite(args.timeout)):
        print("psych-sandbox: --timeout must be a positive, finite number", file=sys.stderr)
        return True
    return False


def _command_run(args: argparse.Namespace) -> int:
    if _bad_timeout(args):
        return EXIT_USAGE
    try:
        source = _read_source(args.file)
    except _UsageError as exc:
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

    return _execute(args, start)


def _command_exec(args: argparse.Namespace) -> int:
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

    return _execute(args, start)


def _execute(args: argparse.Namespace, start: Any) -> int:
    """Run one execution for ``run`` or ``exec`` (``start(sandbox, inputs, cancel, live)``
    begins it, handing output to ``live`` as it comes), print its result, and say how it went
    in the exit status."""
    try:
        inputs = _input_options(args.input)
    except _UsageError as exc:
        print(f"psych-sandbox: {exc}", file=sys.stderr)
        return EXIT_USAGE

    # What running a program needs, imported once the command line is known to be usable.
    import json
    import os
    import signal
    import tempfile

    import anyio

    from .._api.sandbox import Sandbox
    from .._output.blobstore import FilesystemBlobStore
    from .._policy.selection_cache import SelectionCache
    from ..errors import InvalidRequestError
    from .render import LiveOutput, print_notes, print_summary, result_as_json
    from .visible import visible

    _resume_collector()

    # A person sees the output as it arrives; --json prints the one record at the end.
    live = None if args.json else LiveOutput()
    if live is not None:
        _escape_unshowable()

    received: list[int] = []

    async def run() -> ExecutionResult:
        cancel = anyio.Event()
        # Taken before anything is created, so a signal at any point from here on cancels
        # through the one path an embedding application uses too (Sandbox.run's cancel event)
        # and every temporary file, process and container goes with the execution.
        with anyio.open_signal_receiver(
            *(signal.Signals[name] for name in CANCEL_SIGNALS)
        ) as signals:
            async with anyio.create_task_group() as watchers:

                async def watch() -> None:
                    async for signum in signals:
                        received.append(signum)
                        cancel.set()

                watchers.start_soon(watch)
                try:
                    outcome = await run_cancellable(cancel)
                except Exception as exc:
                    # Raised again below, outside the task group, which would otherwise
                    # wrap it in an exception group (a configuration or --artifacts error).
                    failure: Exception | None = exc
                else:
                    failure = None
                finally:
                    watchers.cancel_scope.cancel()
        if failure is not None:
            raise failure
        return outcome

    async def run_cancellable(cancel: anyio.Event) -> ExecutionResult:
        # Results too large to hand over whole are paged from a store that lives for this run.
        with tempfile.TemporaryDirectory(prefix="psych-tool-results-") as store:
            blob_store = FilesystemBlobStore(store)
            # One program per process: default's choice is remembered across runs for a
            # short while instead of trying backends anew each time (selection_cache.py).
            async with Sandbox(
                args.config, blob_store=blob_store, selection_cache=SelectionCache()
            ) as sandbox:
                outcome: ExecutionResult = await start(sandbox, inputs, cancel, live)
                if live is not None:
                    live.finish()
                if args.artifacts is not None:
                    await _write_artifacts(sandbox, outcome, args.artifacts)
                return outcome

    try:
        result = anyio.run(run)
    except _ArtifactsRefused as exc:
        print(f"psych-sandbox: --artifacts: {visible(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except InvalidRequestError as exc:
        print(f"psych-sandbox: {visible(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.json:
            print(json.dumps(result_as_json(result)))
        else:
            assert live is not None
            print_summary(
                result,
                artifacts=args.artifacts is not None,
                explain=args.explain,
                streamed={"stdout", "stderr"} - live.incomplete,
            )
        sys.stdout.flush()
        print_notes(result)
    except OSError:
        # Nobody reads any more (a closed pipe, a terminal hung up): the exit status is all
        # that can still be said. Later writes, and the flush at exit, go nowhere quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.dup2(devnull, sys.stderr.fileno())
        os.close(devnull)
    if received:
        return 128 + received[0]
    if result.exit_status is not None:
        return result.exit_status
    return EXIT_OK if result.ok else EXIT_PROGRAM_FAILED


def _escape_unshowable() -> None:
    import io

    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            # A terminal that cannot show a character gets its escape, not a crash.
            stream.reconfigure(errors="backslashreplace")


class _ArtifactsRefused(Exception):
    """--artifacts could not be written (artifact_export.ArtifactExportError's message), raised
    as this so that a run without --artifacts never imports the exporter."""


async def _write_artifacts(sandbox: Sandbox, result: ExecutionResult, directory: str) -> None:
    from .._output.artifact_export import ArtifactExportError, export_artifacts
    from .render import export_note
    from .visible import SUMMARY_MARK, visible

    try:
        written, partial = await export_artifacts(
            sandbox.attachments,
            tenant=result.tenant or "default",
            run_id=result.run_id or "",
            artifacts=result.artifacts,
            directory=directory,
        )
    except ArtifactExportError as exc:
        raise _ArtifactsRefused(str(exc)) from None
    for path in partial:
        print(
            f"{SUMMARY_MARK} psych-sandbox: {visible(path)}: only a preview was kept; not written",
            file=sys.stderr,
        )
    # Marked like the report: the program's stderr is printed on the same stream.
    note = export_note(len(written), directory, result)
    print(f"{SUMMARY_MARK} psych-sandbox: {note}", file=sys.stderr)


def _command_doctor(args: argparse.Namespace) -> int:
    from .doctor import command_doctor

    return command_doctor(args.config, args.json)


def _command_profiles(args: argparse.Namespace) -> int:
    from .doctor import command_profiles

    return command_profiles(args.config, args.json)


def _command_mcp(args: argparse.Namespace) -> int:
    serve = _handed_to(
        "psych_sandbox_mcp.command", "mcp", "the MCP integration", "psych-sandbox-mcp"
    )
    if serve is None:
        return EXIT_USAGE
    result: int = serve(args.config, args.transport, host=args.host, port=args.port)
    return result


def _command_serve(args: argparse.Namespace) -> int:
    serve = _handed_to(
        "psych_sandbox_remote.serve", "serve", "the remote backend", "psych-sandbox-remote"
    )
    if serve is None:
        return EXIT_USAGE
    result: int = serve(args.profile, args.listen, args.config)
    return result


def _handed_to(module: str, command: str, what: str, distribution: str) -> Any:
    """The ``main`` of ``module``, which runs ``command`` (its distribution's: the core only
    hands it over); None, said on stderr with the install line, when ``distribution`` (or
    what it needs) cannot be imported."""
    import importlib

    try:
        return importlib.import_module(module).main
    except ImportError:
        print(
            f"psych-sandbox: {command} needs {what}; install it with: pip install {distribution}",
            file=sys.stderr,
        )
        return None


_COMMANDS = {
    "run": _command_run,
    "exec": _command_exec,
    "doctor": _command_doctor,
    "profiles": _command_profiles,
    "mcp": _command_mcp,
    "serve": _command_serve,
}
