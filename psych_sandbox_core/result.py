"""What an execution hands back: output, return value, usage, grades and a typed failure.

The models only, typed for their readers (a level is a :class:`Level`, grades are keyed by
:class:`Guarantee` and valued by :class:`Grade`). Their JSON form (``to_json_object``) is a
wire format, pinned by tests/api/test_result_json.py: plain strings, in the order given here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from .errors import EXCEPTION_GUIDANCE, GUIDANCE, ErrorKind
from .grading import Grade, Guarantee, Level


class ExecutionFailure(BaseModel):
    """Why an execution failed. Data for the model, never an exception."""

    model_config = ConfigDict(frozen=True)

    kind: ErrorKind
    message: str
    guidance: str
    traceback: str | None = None
    #: Line and column in the model's own program text, where one applies.
    line: int | None = None
    column: int | None = None
    #: The exception's type name for kind=exception.
    exception_type: str | None = None

    @classmethod
    def of(cls, kind: ErrorKind, message: str, **extra: Any) -> ExecutionFailure:
        guidance = GUIDANCE[kind]
        if kind is ErrorKind.EXCEPTION:
            guidance = EXCEPTION_GUIDANCE.get(extra.get("exception_type") or "", guidance)
        return cls(kind=kind, message=message, guidance=guidance, **extra)


class StreamOutput(BaseModel):
    model_config = ConfigDict(frozen=True)

    #: Bytes the program wrote to the stream in all.
    total_bytes: int
    #: Bytes the host kept (at most the capture cap).
    captured_bytes: int
    #: Bytes written past the capture cap and not kept (the middle, between the kept head
    #: and tail).
    dropped_bytes: int
    #: Lines the program wrote in all (a final line without a newline counts).
    total_lines: int = 0
    #: Bytes of the stream the preview (the ``stdout``/``stderr`` text) shows.
    shown_bytes: int = 0
    #: Bytes and newlines between the preview's head and tail, whether dropped at capture or
    #: cut for the preview budget.
    omitted_bytes: int = 0
    omitted_lines: int = 0
    #: Bytes written after the program ended (after its end marker, by a process it left
    #: behind): neither kept nor counted in total_bytes.
    after_end_bytes: int = 0
    #: Handle of the stream's durable copy (see attachments.py), when one was recorded.
    attachment: str | None = None


class Usage(BaseModel):
    model_config = ConfigDict(frozen=True)

    wall_seconds: float
    #: CPU of the whole sandboxed process tree as the kernel accounted it, through a mechanism
    #: the program cannot influence (a cgroup); None if not measured.
    cpu_seconds: float | None
    #: Peak memory of the sandboxed tree as that mechanism charged it; None if not measured.
    peak_memory_bytes: int | None
    #: Who measured cpu and memory: "host" (the kernel's accounting, read by the host) or
    #: "none" (nothing here can measure the whole tree: the fields are None, never low).
    measured_by: str
    #: CPU seconds of host processes that worked on the program's behalf (read_tool_output
    #: pattern searches), as the kernel accounted them when the host reaped them. Not part
    #: of cpu_seconds; counted against the CPU limit together with it.
    host_cpu_seconds: float = 0.0


class BackendIdentity(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    distribution: str | None
    version: str | None


class ExecutionNote(BaseModel):
    """Something a person should know about an execution that is not a failure of it."""

    model_config = ConfigDict(frozen=True)

    #: What the note is about; ``below_isolated``: the program ran below the isolated level
    #: although nothing asked for less (``default`` fell back to a weaker backend).
    code: str
    #: One line for a person, saying what is not enforced and how to fix it.
    message: str
    #: The guarantees the isolated level needs that were not enforced for this execution.
    not_enforced: list[str] = Field(default_factory=list)
    #: How this host could reach the isolated level (why a stronger backend did not work).
    fix: str | None = None


Storage = Literal["inline", "blob", "preview_only"]
AttachmentKind = Literal["stream", "return_value", "artifact"]


class Attachment(BaseModel):
    """One durable output of an execution, as the result describes it (see attachments.py)."""

    model_config = ConfigDict(frozen=True)

    handle: str
    #: "stdout", "stderr", "return_value", or "artifacts/<path>".
    name: str
    kind: AttachmentKind
    #: Bytes the attachment stands for.
    size_bytes: int
    sha256: str
    content_type: str
    #: Where the bytes are kept; "preview_only" means a reader gets the preview alone.
    stored: Storage
    #: False when the bytes kept are fewer than the program produced (a stream past its
    #: capture cap, or a preview-only attachment).
    complete: bool


class ArtifactInfo(BaseModel):
    """A file the program left in its workspace, collected and checked."""

    model_config = ConfigDict(frozen=True)

    path: str
    size_bytes: int
    sha256: str
    content_type: str
    attachment: str


class SkippedEntry(BaseModel):
    """Something in the workspace that was deliberately not collected, and why."""

    model_config = ConfigDict(frozen=True)

    path: str
    #: symlink, hard_link, fifo, socket, device, not_regular, too_large, total_cap,
    #: too_many, too_deep, changed, vanished, outside, other_filesystem, unsafe_name,
    #: unreadable, entry_limit, budget_exhausted (the execution's byte budget could not pay
    #: for storing it); for the collection as a whole (path "." or the output
    #: folder), also one of artifacts.COLLECTION_FAILURES.
    reason: str


class CallRecord(BaseModel):
    """One binding call the program made, as the host answered it."""

    model_config = ConfigDict(frozen=True)

    #: The tool's name as the program gave it.
    name: str
    #: "ok", or the kind of failure the program saw (bindings.CallErrorKind).
    outcome: str
    #: What the reply carried: the value, a handle to page it, or an error.
    carries: Literal["value", "handle", "error"]
    #: Size of the arguments as JSON.
    argument_bytes: int
    #: Size of the value handed over (0 for a handle or an error).
    result_bytes: int
    #: Size of a result stored for paging; absent unless the reply carried a handle.
    stored_bytes: int | None = None

    @model_serializer(mode="wrap")
    def _without_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # stored_bytes is left out, not null, when there is none (the pinned JSON form).
        data: dict[str, Any] = handler(self)
        if self.stored_bytes is None:
            data.pop("stored_bytes", None)
        return data


class ExecutionResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    stdout: str
    stderr: str
    stdout_info: StreamOutput
    stderr_info: StreamOutput
    #: The program's return value (JSON data); None when it returned nothing or failed.
    return_value: Any = None
    #: Command mode: the command's exit status (0-255) when it ran to its own exit; None
    #: for a program, and for a command that did not (a timeout, a limit, a refusal: see
    #: error). A command that exits non-zero has no error: its status is its answer. Left
    #: out of the JSON form when None.
    exit_status: int | None = None
    #: With ``keep_variables``: the program's global names holding JSON data when it
    #: returned (None otherwise, or when what the child sent is not a JSON object within the
    #: return value's cap), to give the next program as ``variables``.
    variables: dict[str, Any] | None = None
    error: ExecutionFailure | None
    #: The level the grades earn, and the grades themselves.
    level: Level
    grades: dict[Guarantee, Grade] = Field(default_factory=dict)
    usage: Usage
    profile: str
    backend: BackendIdentity
    #: Binding calls the program made (name, outcome, bytes), in order.
    calls: list[CallRecord] = Field(default_factory=list)
    #: The run and tenant whose record holds this execution's attachments.
    run_id: str | None = None
    tenant: str | None = None
    #: Durable copies of the streams, the return value and each artifact.
    attachments: list[Attachment] = Field(default_factory=list)
    #: Files the program left in its workspace, collected and checked.
    artifacts: list[ArtifactInfo] = Field(default_factory=list)
    #: Workspace entries deliberately not collected, and why (links, FIFOs, caps...).
    skipped_artifacts: list[SkippedEntry] = Field(default_factory=list)
    skipped_artifacts_unlisted: int = 0
    #: What a person should know that is not a failure (see ExecutionNote).
    notes: list[ExecutionNote] = Field(default_factory=list)

    @model_serializer(mode="wrap")
    def _without_exit_status(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A program's result has no exit status: its JSON form stays as it was (pinned).
        data: dict[str, Any] = handler(self)
        if self.exit_status is None:
            data.pop("exit_status", None)
        return data

    @property
    def ok(self) -> bool:
        """Whether it ran to its end: a program returned, a command exited (see
        exit_status for how)."""
        return self.error is None

    def to_json_object(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        return data

    def for_model(self, max_chars: int = 4000, *, reader: str | None = "read_output") -> str:
        """The compact view a tool loop hands back to a model, at most ``max_chars``
        characters: what was printed, what was returned, and on failure its kind, message,
        the program's own traceback and guidance; where something was cut, how to read the
        rest (``reader``: the binding a later program reads an output through, None to name
        only the handle). Grades, digests and usage stay on the full result."""
        if max_chars < 1:
            raise ValueError("max_chars must be at least 1")
        return _model_view(self, max_chars, reader)


@dataclass
class _Section:
    label: str
    text: str
    #: The attachment holding the whole, if one was recorded.
    handle: str | None = None
    #: Already shortened before this view (at capture, or for the stream's preview).
    cut: bool = False


def _model_view(result: ExecutionResult, max_chars: int, reader: str | None) -> str:
    error = result.error
    status = "ok" if error is None else f"failed: {error.kind.value}: {error.message}"
    if error is None and result.exit_status is not None:
        status = f"exit status {result.exit_status}"
    sections = []
    for label, text, info in (
        ("stdout", result.stdout, result.stdout_info),
        ("stderr", result.stderr, result.stderr_info),
    ):
        if text:
            cut = bool(info.omitted_bytes or info.dropped_bytes)
            sections.append(_Section(label, text, info.attachment, cut))
    if error is None and result.return_value is not None:
        handle = next((a.handle for a in result.attachments if a.name == "return_value"), None)
        sections.append(
            _Section("returned", json.dumps(result.return_value, ensure_ascii=False), handle)
        )
    if error is not None:
        if error.traceback:
            sections.append(_Section("traceback", error.traceback))
        sections.append(_Section("guidance", error.guidance))
    # The status line first, whole up to half the budget; then each section gets an equal
    # share of what is left, a section that needs less handing the rest on to later ones.
    status = _clip_middle(status, max_chars // 2)
    room = max_chars - len(status)
    parts = [status]
    for index, section in enumerate(sections):
        share = room // (len(sections) - index)
        header = f"\n{section.label}:\n"
        body = section.text.rstrip("\n")
        note = _read_more(section, reader, result) if section.cut else ""
        if len(header) + len(body) + len(note) > share:
            note = note or _read_more(section, reader, result)
            body = _clip_middle(body, max(0, share - len(header) - len(note)))
        piece = header + body + note
        parts.append(piece)
        room -= len(piece)
    return "".join(parts)[:max_chars]


def _read_more(section: _Section, reader: str | None, result: ExecutionResult) -> str:
    """Where the whole of a cut section can be read, if anywhere."""
    label, handle = section.label, section.handle
    attachment = next((a for a in result.attachments if a.handle == handle), None)
    if handle is None or attachment is None or attachment.stored == "preview_only":
        return f"\n[{label} cut; the whole was not kept]"
    partly = "" if attachment.complete else " (what capture kept of it)"
    if reader is None:
        return (
            f"\n[{label} cut; the whole{partly} is attachment {handle!r} of run {result.run_id!r}]"
        )
    return (
        f"\n[{label} cut; a later program of this run reads the whole{partly} with "
        f"await {reader}({handle!r}, offset=0) or pattern=...]"
    )


def _clip_middle(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters: its head and tail, the middle counted."""
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text)} characters; middle cut ...]\n"
    if limit <= len(marker) + 2:
        return text[:limit]
    keep = limit - len(marker)
    head = keep // 2
    return text[:head] + marker + text[len(text) - (keep - head) :]
