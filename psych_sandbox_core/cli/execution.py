"""One execution for ``run`` or ``exec``: the workspace's inputs, the signals that cancel
it, the sandbox it runs in, its artifacts written out, its result printed (for a person, or
as one JSON object) and its exit status.

Human output shows everything foreign through :func:`visible.visible`: the program's streams
and tracebacks as blocks of lines under a gutter, and every line of the run's report starting
with :data:`visible.SUMMARY_MARK`, which foreign text can never show.
"""

from __future__ import annotations

import sys

from .collector import resume
from .status import CANCEL_SIGNALS, EXIT_OK, EXIT_PROGRAM_FAILED, EXIT_USAGE

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see __init__.py)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from typing import Any

    from .._api.sandbox import Sandbox
    from ..result import ExecutionResult


class UsageError(Exception):
    """A command line that cannot be run (said on stderr, exit status 2)."""


def _input_options(values: Sequence[str]) -> dict[str, str]:
    """``--input PATH[=NAME]`` options as inputs= (NAME defaults to PATH's last component)."""
    import os

    inputs: dict[str, str] = {}
    for value in values:
        path, _, name = value.rpartition("=") if "=" in value else (value, "", "")
        name = name or os.path.basename(path)
        if not path or name in inputs:
            raise UsageError(f"--input {value}: " + ("no path" if not path else "name taken"))
        inputs[name] = path
    return inputs


def execute(args: argparse.Namespace, start: Any) -> int:
    """Run one execution for ``run`` or ``exec`` (``start(sandbox, inputs, cancel, live)``
    begins it, handing output to ``live`` as it comes), print its result, and say how it went
    in the exit status."""
    try:
        inputs = _input_options(args.input)
    except UsageError as exc:
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

    resume()

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
