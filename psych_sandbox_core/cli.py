"""The ``psych-sandbox`` command.

Exit status: 0 when the program succeeded, 1 when it failed, 2 for usage or configuration
errors.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import anyio

from .artifacts import ArtifactExportError
from .attachments import export_artifacts, export_note, summary_lines
from .bindings import load_function_tools
from .blobstore import FilesystemBlobStore
from .doctor import command_doctor, command_profiles
from .errors import ConfigurationError
from .result import ExecutionResult
from .sandbox import Sandbox

EXIT_OK = 0
EXIT_PROGRAM_FAILED = 1
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="psych-sandbox",
        description="Run an untrusted Python program in an isolated sandbox.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run one program and report its result")
    run.add_argument("file", help="the program's source file, or - for standard input")
    run.add_argument("--profile", default="default", help="profile name (default: default)")
    run.add_argument(
        "--timeout", type=float, default=None, help="wall-clock limit in seconds (narrows only)"
    )
    run.add_argument("--json", action="store_true", help="print exactly one JSON object")
    run.add_argument(
        "--artifacts", default=None, metavar="DIR",
        help="write the files the program left in its workspace to DIR (never overwrites)",
    )
    run.add_argument(
        "--tools", default=None, help="a Python file whose plain functions the program may call"
    )
    doctor = commands.add_parser("doctor", help="what this host can promise: backends, grades")
    doctor.add_argument("--json", action="store_true", help="print exactly one JSON object")
    profiles = commands.add_parser("profiles", help="list the configured profiles")
    profiles.add_argument("--json", action="store_true", help="print exactly one JSON object")
    for command in (run, doctor, profiles):
        command.add_argument(
            "--config", default=None, help="deployment configuration file (TOML); default: "
            "$PSYCH_SANDBOX_CONFIG if set"
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code not in (0, None) else EXIT_OK
    handler = _COMMANDS[args.command]
    try:
        return handler(args)
    except ConfigurationError as exc:
        print(f"psych-sandbox: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE


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


def _command_run(args: argparse.Namespace) -> int:
    if args.timeout is not None and not (args.timeout > 0 and math.isfinite(args.timeout)):
        print("psych-sandbox: --timeout must be a positive, finite number", file=sys.stderr)
        return EXIT_USAGE
    try:
        source = _read_source(args.file)
    except _UsageError as exc:
        print(f"psych-sandbox: {exc}", file=sys.stderr)
        return EXIT_USAGE

    bindings = load_function_tools(args.tools) if args.tools is not None else None

    async def run() -> ExecutionResult:
        # Results too large to hand over whole are paged from a store that lives for this run.
        with tempfile.TemporaryDirectory(prefix="psych-tool-results-") as store:
            blob_store = FilesystemBlobStore(store)
            async with Sandbox(args.config, blob_store=blob_store) as sandbox:
                outcome = await sandbox.run(
                    source, profile=args.profile, timeout=args.timeout, bindings=bindings
                )
                if args.artifacts is not None:
                    await _write_artifacts(sandbox, outcome, args.artifacts)
                return outcome

    try:
        result = anyio.run(run)
    except ArtifactExportError as exc:
        print(f"psych-sandbox: --artifacts: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(result_as_json(result)))
    else:
        print_summary(result)
    return EXIT_OK if result.ok else EXIT_PROGRAM_FAILED


async def _write_artifacts(sandbox: Sandbox, result: ExecutionResult, directory: str) -> None:
    written, partial = await export_artifacts(
        sandbox.attachments,
        tenant=result.tenant or "default",
        run_id=result.run_id or "",
        artifacts=result.artifacts,
        directory=directory,
    )
    for path in partial:
        print(f"psych-sandbox: {path}: only a preview was kept; not written", file=sys.stderr)
    print(f"psych-sandbox: {export_note(len(written), directory, result)}", file=sys.stderr)


def result_as_json(result: ExecutionResult) -> dict[str, Any]:
    return result.to_json_object()


def print_summary(result: ExecutionResult) -> None:
    out = sys.stdout
    if result.stdout:
        out.write(result.stdout if result.stdout.endswith("\n") else result.stdout + "\n")
    if result.stderr:
        sys.stderr.write(result.stderr if result.stderr.endswith("\n") else result.stderr + "\n")
    info = result.stdout_info
    if info.dropped_bytes:
        out.write(f"[stdout: {info.dropped_bytes} bytes past the capture cap were dropped]\n")
    print("---", file=out)
    for line in summary_lines(
        result.attachments, result.artifacts, result.skipped_artifacts,
        result.skipped_artifacts_unlisted,
    ):
        print(line, file=out)
    if result.error is None:
        print(f"returned: {json.dumps(result.return_value)}", file=out)
    else:
        error = result.error
        print(f"failed: {error.kind.value}: {error.message}", file=out)
        if error.traceback:
            out.write(error.traceback if error.traceback.endswith("\n") else error.traceback + "\n")
        print(f"guidance: {error.guidance}", file=out)
    usage = result.usage
    cpu = "not measured" if usage.cpu_seconds is None else f"{usage.cpu_seconds:.3f} s"
    memory = (
        "not measured"
        if usage.peak_memory_bytes is None
        else f"{usage.peak_memory_bytes / 1048576:.1f} MiB"
    )
    print(
        f"profile {result.profile} · backend {result.backend.id} · level {result.level} · "
        f"wall {usage.wall_seconds:.3f} s · cpu {cpu} · peak memory {memory}",
        file=out,
    )


def _command_doctor(args: argparse.Namespace) -> int:
    return command_doctor(args.config, args.json)


def _command_profiles(args: argparse.Namespace) -> int:
    return command_profiles(args.config, args.json)


_COMMANDS = {"run": _command_run, "doctor": _command_doctor, "profiles": _command_profiles}


if __name__ == "__main__":
    sys.exit(main())
