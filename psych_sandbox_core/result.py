"""What an execution hands back: output, return value, usage, grades and a typed failure.

The models only, typed for their readers (a level is a :class:`Level`, grades are keyed by
:class:`Guarantee` and valued by :class:`Grade`). Their JSON form (``to_json_object``) is a
wire format, pinned by tests/test_result_json.py: plain strings, in the order given here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from .errors import GUIDANCE, ErrorKind
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
        return cls(kind=kind, message=message, guidance=GUIDANCE[kind], **extra)


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

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json_object(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        return data
