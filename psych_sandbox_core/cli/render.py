"""How the ``psych-sandbox`` command shows a result to a person.

Everything foreign goes through :func:`visible.visible`: the program's streams and tracebacks
as blocks of lines under a gutter, and every line of the report after
:data:`visible.SUMMARY_MARK`, which foreign text can never show. ``--json`` prints the
result's own JSON form instead (:func:`result_as_json`).
"""

from __future__ import annotations

import codecs
import json
import sys
from collections.abc import Collection
from typing import Any, TextIO

from .._output.artifacts import collection_problem
from .._output.streaming import OutputChunk
from ..errors import ErrorKind
from ..result import ArtifactInfo, Attachment, ExecutionResult, SkippedEntry
from .visible import SUMMARY_MARK, visible

#: A line longer than this is shown in pieces as it arrives rather than held for its end.
LIVE_LINE_CHARS = 4096
#: What the command shows of each stream as it arrives: a person reads a screenful, not a
#: flood; the report's preview has the end of a longer one.
LIVE_STREAM_BYTES = 1024 * 1024


def result_as_json(result: ExecutionResult) -> dict[str, Any]:
    return result.to_json_object()


def print_notes(result: ExecutionResult) -> None:
    """Each note on stderr, one line each, in either output mode: a run below the isolated
    level that nothing asked for must not go unsaid (``--json`` also carries it)."""
    for note in result.notes:
        sys.stderr.write(f"{SUMMARY_MARK} warning: {visible(note.message)}\n")
    sys.stderr.flush()


class LiveOutput:
    """Shows the program's streams as they arrive (``on_output``), as :func:`print_summary`
    shows them afterwards: whole lines under the gutter, stdout here and stderr on stderr.
    A piece of a line waits for its end (or for :data:`LIVE_LINE_CHARS` of it), so the
    gutter only ever starts a line; a character split between chunks is joined first.

    At most :data:`LIVE_STREAM_BYTES` of each stream are shown: a program cannot make the
    command write more than that (to a terminal, or a file it was redirected to). A stream
    not shown whole (cut there, or bytes dropped because the terminal was behind) is shown
    again by the report, as its preview (head and tail)."""

    def __init__(self) -> None:
        self._decoders = {
            name: codecs.getincrementaldecoder("utf-8")(errors="replace")
            for name in ("stdout", "stderr")
        }
        self._partial = {"stdout": "", "stderr": ""}
        self._shown = {"stdout": 0, "stderr": 0}
        self._cut: set[str] = set()
        self._gone = False
        #: Streams the report must show again: not everything of them was shown here.
        self.incomplete: set[str] = set()

    def __call__(self, chunk: OutputChunk) -> None:
        if self._gone:
            return
        try:
            self._show(chunk)
        except OSError:
            # Nobody reads any more (a closed pipe, a hung-up terminal): nothing more is
            # shown, and the command ends as it would have (see cli.py).
            self._gone = True

    def _show(self, chunk: OutputChunk) -> None:
        name = chunk.stream
        out = _stream_for(name)
        room = LIVE_STREAM_BYTES - self._shown[name]
        if room <= 0:
            if name not in self._cut:
                # Said once, when more than the bound arrived.
                self._flush(name)
                self._cut.add(name)
                self.incomplete.add(name)
                out.write(
                    f"{SUMMARY_MARK} {name}: more than {LIVE_STREAM_BYTES} bytes; the rest is "
                    "not shown as it arrives\n"
                )
            return
        if chunk.skipped_bytes:
            self._flush(name)
            self.incomplete.add(name)
            out.write(
                f"{SUMMARY_MARK} {name}: {chunk.skipped_bytes} bytes came faster than they "
                "could be shown\n"
            )
        data, rest = chunk.data[:room], chunk.data[room:]
        self._shown[name] += len(data)
        text = self._partial[name] + self._decoders[name].decode(data)
        end = text.rfind("\n") + 1
        if len(text) - end > LIVE_LINE_CHARS:
            end = len(text)
        if end:
            out.write(visible(text[:end], block=True) + "\n")
            out.flush()
        self._partial[name] = text[end:]
        if rest:
            self._show(OutputChunk(name, rest))  # past the bound: says so

    def finish(self) -> None:
        """The program ended: a last line without its newline is shown."""
        for name in ("stdout", "stderr"):
            if name not in self._cut:
                self._partial[name] += self._decoders[name].decode(b"", final=True)
            if not self._gone:
                try:
                    self._flush(name)
                except OSError:
                    self._gone = True

    def _flush(self, name: str) -> None:
        if self._partial[name]:
            out = _stream_for(name)
            out.write(visible(self._partial[name], block=True) + "\n")
            out.flush()
            self._partial[name] = ""


def _stream_for(name: str) -> TextIO:
    return sys.stdout if name == "stdout" else sys.stderr


def print_summary(
    result: ExecutionResult,
    *,
    artifacts: bool = False,
    explain: bool = False,
    streamed: Collection[str] = (),
) -> None:
    """The result for a person: the program's streams as blocks under a gutter (stdout here,
    stderr on stderr), then the report, each of its lines after the summary mark: what it
    returned or how it failed, the files written with ``--artifacts``, the guidance for a
    model only with ``--explain``, and the level line last. Attachment handles are not
    shown: the CLI's store ends with it, so only ``--json`` records them. ``streamed``: the
    streams shown whole as they arrived (:class:`LiveOutput`), not shown again."""
    out = sys.stdout

    def say(line: str) -> None:
        out.write(f"{SUMMARY_MARK} {line}\n")

    if result.stdout and "stdout" not in streamed:
        out.write(visible(result.stdout, block=True) + "\n")
        out.flush()  # before stderr, so the two keep their order on one terminal
    if result.stderr and "stderr" not in streamed:
        sys.stderr.write(visible(result.stderr, block=True) + "\n")
        sys.stderr.flush()
    info = result.stdout_info
    if info.dropped_bytes:
        say(f"stdout: {info.dropped_bytes} bytes past the capture cap were dropped")
    if result.error is None and result.exit_status is not None:
        say(f"exit status: {result.exit_status}")  # a command's (psych-sandbox exec)
    elif result.error is None:
        say(f"returned: {visible(json.dumps(result.return_value))}")
    else:
        error = result.error
        say(f"failed: {error.kind.value}: {visible(error.message)}")
        if error.traceback:
            out.write(visible(error.traceback, block=True) + "\n")
        if explain:
            say(f"guidance: {error.guidance}")
    if artifacts:
        # Written to the --artifacts folder, so they outlive the command. A collection that
        # failed as a whole (a timeout interrupted it) is said once, by the export note.
        whole_failure = collection_problem(result.skipped_artifacts) is not None
        for line in summary_lines(
            [],
            result.artifacts,
            [] if whole_failure else result.skipped_artifacts,
            0 if whole_failure else result.skipped_artifacts_unlisted,
        ):
            say(line)
    elif result.artifacts:
        say(f"{len(result.artifacts)} file(s) left in the workspace; --artifacts DIR keeps them")
    usage = result.usage
    cpu = "not measured" if usage.cpu_seconds is None else f"{usage.cpu_seconds:.3f} s"
    memory = (
        "not measured"
        if usage.peak_memory_bytes is None
        else f"{usage.peak_memory_bytes / 1048576:.1f} MiB"
    )
    say(
        f"profile {result.profile} · backend {result.backend.id} · level {result.level.value} · "
        f"wall {usage.wall_seconds:.3f} s · cpu {cpu} · peak memory {memory}"
    )


def export_note(written: int, directory: str, result: ExecutionResult) -> str:
    """What the CLI says after ``--artifacts``: never a bare "wrote 0"."""
    if written:
        return f"wrote {written} artifact(s) to {directory}"
    error = result.error
    if error is not None and error.kind in (
        ErrorKind.ISOLATION_UNAVAILABLE,
        ErrorKind.NETWORK_NOT_ALLOWED,
    ):
        return f"no artifacts written to {directory}: the output was withheld ({error.kind.value})"
    problem = collection_problem(result.skipped_artifacts)
    if problem is not None:
        return f"no artifacts could be collected: {problem}"
    count = len(result.skipped_artifacts) + result.skipped_artifacts_unlisted
    if count:
        return (
            f"no artifacts written to {directory}: all {count} entries found were skipped "
            "(listed above)"
        )
    return f"no artifacts written to {directory}: the program left no files to collect"


def summary_lines(
    attachments: list[Attachment],
    artifacts: list[ArtifactInfo],
    skipped: list[SkippedEntry],
    skipped_unlisted: int = 0,
) -> list[str]:
    """Lines listing attachments and artifacts, for a person reading the CLI's output (names
    and paths are the program's: shown through visible)."""
    lines: list[str] = []
    for attachment in attachments:
        if attachment.size_bytes == 0:
            continue  # an empty stream has nothing to read back
        where = {"inline": "inline", "blob": "stored", "preview_only": "preview only"}
        lines.append(
            f"attachment {visible(attachment.name)}: {attachment.size_bytes} bytes, "
            f"{attachment.content_type}, {where[attachment.stored]} ({attachment.handle})"
        )
    for artifact in artifacts:
        lines.append(
            f"artifact {visible(artifact.path)}: {artifact.size_bytes} bytes, "
            f"{artifact.content_type}, sha256 {artifact.sha256[:16]}…"
        )
    for entry in skipped:
        lines.append(f"skipped {visible(entry.path)}: {visible(entry.reason)}")
    if skipped_unlisted:
        lines.append(f"skipped {skipped_unlisted} more entries")
    return lines
