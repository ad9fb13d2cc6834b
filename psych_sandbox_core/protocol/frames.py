"""The frame vocabulary of the wire protocol (see docs/protocol.md). No I/O here.

Frames from the child are hostile: each is rebuilt field by field through strict models
(no coercion, extra fields forbidden, finite numbers only) in a discriminated union on
``type``. Frames the host sends are built from the same kind of models.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .limits import (
    ARTIFACT_CHUNK_BASE64_CHARS,
    MAX_ARTIFACT_PATH_CHARS,
    MAX_CALL_ID,
    MAX_CATALOGUE_DESCRIPTION_CHARS,
    MAX_CATALOGUE_SCHEMA_CHARS,
    MAX_COMMAND_ARGS,
    MAX_COMMAND_CHARS,
    MAX_INPUT_BASE64_CHARS,
    MAX_INPUT_NAME_CHARS,
    MAX_INPUTS,
    MAX_SOURCE_BYTES,
    MAX_TEXT_CHARS,
    MAX_TOOL_NAME_CHARS,
    MAX_TOOLS,
    PROTOCOL_VERSION,
)


class Frame(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)


Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
ShortText = Annotated[str, Field(max_length=4096)]
CallId = Annotated[int, Field(ge=0, le=MAX_CALL_ID)]
ToolName = Annotated[str, Field(min_length=1, max_length=MAX_TOOL_NAME_CHARS)]
NonNegative = Annotated[int, Field(ge=-1, le=2**63)]

# ---------------------------------------------------------------- child -> host


class RLimitObservation(Frame):
    """One resource limit as the child sees it; -1 means unlimited."""

    name: Annotated[str, Field(max_length=32)]
    soft: NonNegative
    hard: NonNegative


ProbeOutcome = Literal["connected", "refused", "unreachable", "skipped"]


class NetworkObservation(Frame):
    ipv4: ProbeOutcome
    ipv6: ProbeOutcome
    #: Names of non-loopback interfaces that are up.
    interfaces_up: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=256)]


class ContainmentReport(Frame):
    """What the child observes of its own containment, before any program runs."""

    uid: int
    euid: int
    gid: int
    pid: int
    #: None when the host planted no canary.
    canary_readable: bool | None
    network: NetworkObservation
    limits: Annotated[list[RLimitObservation], Field(max_length=32)]
    #: Effective capability mask as reported by the kernel (hex), None where not observable.
    capabilities: Annotated[str | None, Field(max_length=32)]
    #: Whether this process can see a process it did not start (host processes visible).
    sees_foreign_processes: bool | None
    python: ShortText
    platform: ShortText


class HelloFrame(Frame):
    type: Literal["hello"]
    protocol: int
    report: ContainmentReport


class CallFrame(Frame):
    type: Literal["call"]
    id: CallId
    name: ToolName
    arguments: dict[str, Any]


class CancelFrame(Frame):
    """The program stopped waiting for call ``id`` (a timeout, a cancelled task): the host
    cancels that tool call and still answers it, so the child's place is freed."""

    type: Literal["cancel"]
    id: CallId


class ProgramError(Frame):
    """An uncaught exception in the program, frames already filtered to the model's."""

    type: Annotated[str, Field(max_length=256)]
    message: Text
    traceback: Text
    line: Annotated[int, Field(ge=0)] | None
    column: Annotated[int, Field(ge=0)] | None


#: "exited": a command (command mode) ran to its own exit; exit_status says how.
ResultOutcome = Literal["returned", "raised", "invalid_output", "output_limit", "exited"]


class ResultFrame(Frame):
    type: Literal["result"]
    outcome: ResultOutcome
    #: The return value as JSON text (null when the program returned nothing).
    value_json: str | None
    error: ProgramError | None
    #: Human-readable explanation for invalid_output / output_limit.
    detail: Text | None
    #: A command's exit status (0-255) when the outcome is "exited"; None otherwise.
    exit_status: Annotated[int, Field(ge=0, le=255)] | None = None
    #: The program's global names holding JSON data, as a JSON object's text, when the run
    #: frame asked for them (keep_variables) and the program returned; within the return
    #: value's cap together with value_json.
    variables_json: str | None = None


ArtifactPath = Annotated[str, Field(min_length=1, max_length=MAX_ARTIFACT_PATH_CHARS)]


class ArtifactFrame(Frame):
    """One chunk of a file the program left in its workspace (sent only when the run frame
    asked for a collection, after the program ended and before the result)."""

    type: Literal["artifact"]
    #: Relative to the workspace, "/"-separated; the host checks it component by component.
    path: ArtifactPath
    #: Where this chunk starts in the file: consecutive, from 0.
    offset: Annotated[int, Field(ge=0, le=MAX_CALL_ID)]
    #: The chunk's bytes as base64; every chunk but the last holds ARTIFACT_CHUNK_BYTES.
    data: Annotated[str, Field(max_length=ARTIFACT_CHUNK_BASE64_CHARS)]
    #: Whether this chunk ends the file.
    last: bool


SkipReason = Literal[
    "symlink",
    "hard_link",
    "fifo",
    "socket",
    "device",
    "not_regular",
    "too_large",
    "total_cap",
    "too_many",
    "too_deep",
    "changed",
    "vanished",
    "other_filesystem",
    "unsafe_name",
    "unreadable",
    "entry_limit",
]


class ArtifactSkippedFrame(Frame):
    """An entry of the workspace the child did not send, and why. Naming the file whose
    chunks are being sent abandons it (it changed or could not be read to the end)."""

    type: Literal["artifact_skipped"]
    path: ArtifactPath
    reason: SkipReason


ChildFrame = Annotated[
    HelloFrame | CallFrame | CancelFrame | ResultFrame | ArtifactFrame | ArtifactSkippedFrame,
    Field(discriminator="type"),
]

# ---------------------------------------------------------------- host -> child


class ChildLimits(Frame):
    """Limits the child applies to itself after the handshake; None means leave as inherited."""

    cpu_seconds: int | None
    memory_bytes: int | None
    file_size_bytes: int | None
    processes: int | None
    return_value_bytes: int
    #: The execution's argument budget per call, in bytes of JSON as UTF-8 (None: only the
    #: channel's ceiling). The child refuses larger arguments itself: a call frame longer
    #: than this plus its envelope is a protocol violation, refused by its length.
    argument_bytes: Annotated[int, Field(gt=0)] | None = None
    #: Calls the program may have in flight at once (None: the child's default, 16).
    calls_in_flight: Annotated[int, Field(gt=0)] | None = None


class ArtifactRequest(Frame):
    """Which files the child should send back, and the caps the host will enforce anyway.
    Only set when the backend cannot hand the workspace to the host."""

    #: A folder relative to the workspace, normalized; "" means the whole workspace.
    folder: Annotated[str, Field(max_length=MAX_ARTIFACT_PATH_CHARS)]
    max_files: Annotated[int, Field(ge=1, le=2**31)]
    file_bytes: Annotated[int, Field(ge=1, le=MAX_CALL_ID)]
    total_bytes: Annotated[int, Field(ge=1, le=MAX_CALL_ID)]


class CatalogueEntry(Frame):
    """What the program's TOOLS says about one tool (see catalogue.py)."""

    name: ToolName
    description: Annotated[str, Field(max_length=MAX_CATALOGUE_DESCRIPTION_CHARS)] = ""
    #: The input schema as compact JSON text, parsed by the child only if the program reads
    #: it; None when unknown or left out (get_tool_info has it).
    input_schema_json: Annotated[str, Field(max_length=MAX_CATALOGUE_SCHEMA_CHARS)] | None = None


class CommandSpec(Frame):
    """A command to run instead of a program (command mode): an argument vector, executed
    without a shell, or with ``shell`` its one element run by ``/bin/sh -c``."""

    argv: Annotated[
        list[Annotated[str, Field(max_length=MAX_COMMAND_CHARS)]],
        Field(min_length=1, max_length=MAX_COMMAND_ARGS),
    ]
    shell: bool = False


class InputFile(Frame):
    """A file the child writes into its fresh workspace before the program starts."""

    #: One file name: no separator, not "." or "..", no NUL (checked by the host first).
    name: Annotated[str, Field(min_length=1, max_length=MAX_INPUT_NAME_CHARS)]
    #: The file's bytes as base64.
    data: Annotated[str, Field(max_length=MAX_INPUT_BASE64_CHARS)]


class RunFrame(Frame):
    type: Literal["run"] = "run"
    source: Annotated[str, Field(max_length=MAX_SOURCE_BYTES)]
    #: Run this command instead of the source (which is then empty).
    command: CommandSpec | None = None
    #: Files to place in the workspace before the program or command starts.
    inputs: Annotated[list[InputFile], Field(max_length=MAX_INPUTS)] | None = None
    #: Every name a call may carry (the catalogue lookups included).
    tools: Annotated[list[ToolName], Field(max_length=MAX_TOOLS)]
    #: The tools the program's TOOLS lists, described; None: TOOLS lists ``tools`` by name.
    catalogue: Annotated[list[CatalogueEntry], Field(max_length=MAX_TOOLS)] | None = None
    limits: ChildLimits
    #: Send the workspace's files before the result (None: the host collects, or nobody).
    artifacts: ArtifactRequest | None = None
    #: Written by the child to fd 1 and fd 2 after the program ended and its output was
    #: flushed, before the result frame: the host then knows both streams are complete
    #: without waiting for their end (None: the host waits for the end, as always).
    end_marker: Annotated[str, Field(pattern=r"^[\x21-\x7e]{16,128}$")] | None = None
    #: Code run ahead of the program in its namespace, compiled as a file of its own so the
    #: program's line numbers stay its own (the caller's, not the model's).
    preamble: Annotated[str, Field(max_length=MAX_SOURCE_BYTES)] | None = None
    #: Names given to the program, as a JSON object's text (identifiers, checked by the host).
    variables_json: Annotated[str, Field(max_length=MAX_SOURCE_BYTES)] | None = None
    #: Send back the program's global names that hold JSON data with its result.
    keep_variables: bool = False


class AbortFrame(Frame):
    type: Literal["abort"] = "abort"
    reason: Text


class ReplyFrame(Frame):
    type: Literal["reply"] = "reply"
    id: CallId
    #: "value": value_json holds the whole result; "handle": handle names a stored result
    #: to read with read_tool_output; "error": error_kind and message say why not.
    carries: Literal["value", "handle", "error"]
    value_json: str | None = None
    handle: dict[str, Any] | None = None
    error_kind: str | None = None
    message: str | None = None


HostFrame = Annotated[RunFrame | AbortFrame | ReplyFrame, Field(discriminator="type")]

PROTOCOL = PROTOCOL_VERSION
