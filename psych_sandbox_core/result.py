"""What an execution hands back: output, return value, usage, grades and a typed failure."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .artifacts import SkippedEntry
from .attachments import ArtifactInfo, Attachment
from .errors import EXCEPTION_GUIDANCE, GUIDANCE, ErrorKind


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
    level: str
    grades: dict[str, str] = Field(default_factory=dict)
    usage: Usage
    profile: str
    backend: BackendIdentity
    #: Binding calls the program made (name, outcome, bytes), in order.
    calls: list[dict[str, Any]] = Field(default_factory=list)
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
