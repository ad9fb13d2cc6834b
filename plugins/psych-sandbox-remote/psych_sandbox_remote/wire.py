"""The remote protocol: what a client and ``psych-sandbox serve`` say to each other. No I/O.

The service does not run the conversation with the child: it launches the child under one of
its local profiles and relays the child's bytes (control channel, stdout, stderr) as NDJSON
events over one HTTP response; the client runs the same conversation the core runs with a
local child (handshake, grading, the program, binding calls with its own budgets and run log,
artifacts) and writes the host's frames back with small POSTs. So the service holds no tool
registry and counts nothing, and everything it relays is checked by the client exactly as a
local child's frames are.

Endpoints (version 1)::

    GET  /v1/description                     what the service can do (no program involved)
    POST /v1/executions                      start one child; the response is the event stream
    POST /v1/executions/{id}/channel         bytes for the child's control channel
    POST /v1/executions/{id}/terminate       SIGTERM, grace, kill
    POST /v1/executions/{id}/finish          kill what is left, reap; a status event follows
    GET  /metrics                            load, for an autoscaler (Prometheus text)
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Literal

from psych_sandbox_core.kit import (
    ExecutionLimits,
    Level,
    Mechanisms,
)
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

#: The version of this remote protocol (not the child's protocol, which the description
#: names separately: both must match for a client to use a service).
REMOTE_PROTOCOL_VERSION = 1

#: Media type of the event stream.
NDJSON = "application/x-ndjson"

#: Largest piece of a child's stream relayed in one event: its base64 form (64 KiB) plus the
#: envelope stays well under MAX_EVENT_BYTES.
RELAY_CHUNK_BYTES = 48 * 1024

#: Longest event line a client accepts, newline excluded: a relayed chunk in base64 and its
#: envelope, or a status with a message of at most MAX_MESSAGE_CHARS (escaped, 6 bytes each).
MAX_EVENT_BYTES = 96 * 1024
#: Largest count a service may claim (unrelayed bytes, connections seen): 2**53, exact in any
#: JSON reader.
MAX_COUNT = 2**53

#: Longest free text (an error or failure message) taken from a service.
MAX_MESSAGE_CHARS = 4096

#: How often the service sends a heartbeat while nothing else happens. A client that hears
#: nothing for its ``stall_seconds`` (several heartbeats) ends the execution as remote_timeout.
HEARTBEAT_SECONDS = 1.0

#: Largest request body the service reads for a start or control request other than channel
#: bytes: a few small JSON fields.
MAX_REQUEST_BYTES = 64 * 1024

#: Largest channel request body: one host frame at its ceiling (a binding reply), newline
#: included.
MAX_CHANNEL_REQUEST_BYTES = 64 * 1024 * 1024 + 1

ExecutionId = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
Message = Annotated[str, Field(max_length=MAX_MESSAGE_CHARS)]


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Description(_Model):
    """What a service says it can do, read before any program is sent. Trusted only as far as
    the withholding rule allows: the child's own report is graded by the client all the same."""

    protocol: int
    #: The child protocol its bootstrap speaks (the client's host must speak the same).
    child_protocol: int
    #: The backend the served profile runs on, and its version.
    backend: Annotated[str, Field(max_length=128)]
    #: The level a trial execution reached at start-up, and its grades.
    level: Level
    grades: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=32)]] = (
        Field(default_factory=dict, max_length=64)
    )
    #: The largest terms it can meet for the caller (its profile's caps, narrowed by the
    #: caller's tenant when the request was authenticated).
    limits: ExecutionLimits
    network: bool = False
    #: Whether its children run commands (command mode) as well as Python programs: its
    #: backend's declaration. A command travels in the run frame over the relayed channel.
    runs_commands: bool = False
    #: Files the program leaves are sent over the control channel when asked for.
    artifacts: bool = True
    #: Executions it runs at once at most, and how many are running.
    capacity: Annotated[int, Field(ge=0)]
    in_flight: Annotated[int, Field(ge=0)]


class StartRequest(_Model):
    """Start one child. Carries no program: that goes over the channel once the client has
    accepted the child's report, so a refused start never had any program to run."""

    protocol: int
    limits: ExecutionLimits
    network: bool = False


class ErrorBody(_Model):
    """The body of every error status: a code a client can branch on, and a message."""

    error: Literal["unauthorized", "terms", "full", "bad_request", "not_found", "protocol"]
    message: Message


# ------------------------------------------------------------------ events (service -> client)


class Started(_Model):
    type: Literal["started"]
    execution: ExecutionId
    #: What the service's backend applied; graded by the client against the child's report.
    mechanisms: Mechanisms
    #: The uid the service runs as: the child's identity is judged against it, not the
    #: client's.
    host_uid: Annotated[int, Field(ge=0)]


class Data(_Model):
    """Bytes from the child: its control channel, stdout or stderr, in base64."""

    type: Literal["channel", "stdout", "stderr"]
    execution: ExecutionId
    data: Annotated[str, Field(max_length=MAX_EVENT_BYTES)]


class Ended(_Model):
    """One of the child's streams reached its end, or the child exited."""

    type: Literal["channel_end", "stdout_end", "stderr_end", "exited", "heartbeat"]
    execution: ExecutionId
    #: On a stream's end: bytes and newlines between the relayed head and tail that were
    #: not relayed (the client keeps no more than each stream's cap of head and tail).
    skipped_bytes: Annotated[int, Field(ge=0, le=MAX_COUNT)] = 0
    skipped_newlines: Annotated[int, Field(ge=0, le=MAX_COUNT)] = 0


class Status(_Model):
    """How the child ended, after a finish request: the service's own reading."""

    type: Literal["status"]
    execution: ExecutionId
    code: int | None
    signal: Annotated[int, Field(ge=1, le=128)] | None
    cpu_seconds: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    peak_memory_bytes: Annotated[int, Field(ge=0)] | None = None
    #: A failure kind the service's runtime knows of (e.g. an OOM kill) and its message.
    hint_kind: Annotated[str, Field(max_length=64)] | None = None
    hint_message: Message | None = None
    #: Connections the service's probe listeners saw (evidence of network exposure).
    connections: Annotated[int, Field(ge=0, le=MAX_COUNT)] = 0


class Failed(_Model):
    """The service could not start the child (its backend is not ready), or gave up."""

    type: Literal["failed"]
    execution: ExecutionId
    message: Message


class End(_Model):
    """The last event: everything of the execution is torn down on the service."""

    type: Literal["end"]
    execution: ExecutionId


Event = Annotated[Started | Data | Ended | Status | Failed | End, Field(discriminator="type")]
EVENT = TypeAdapter(Event)


def encode_event(event: Started | Data | Ended | Status | Failed | End) -> bytes:
    return event.model_dump_json().encode() + b"\n"


def data_event(kind: Literal["channel", "stdout", "stderr"], execution: str, data: bytes) -> bytes:
    """One relayed chunk, encoded without a model round trip (the hot path)."""
    encoded = base64.b64encode(data).decode("ascii")
    return f'{{"type":"{kind}","execution":"{execution}","data":"{encoded}"}}\n'.encode("ascii")


def decode_data(event: Data) -> bytes:
    """A relayed chunk's bytes; ValueError for anything but canonical base64."""
    try:
        return base64.b64decode(event.data, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"a {event.type} event whose data is not base64") from exc


def unmet_limits(asked: ExecutionLimits, caps: ExecutionLimits) -> list[str]:
    """The limits asked for beyond the caps: one rule, for the client reading a description
    and for the service refusing a start."""
    problems: list[str] = []
    offered = caps.model_dump()
    for name, value in asked.model_dump().items():
        cap = offered[name]
        if cap is None:
            continue
        if value is None:
            problems.append(f"{name}: unlimited asked, at most {cap} offered")
        elif value > cap:
            problems.append(f"{name}: {value} asked, at most {cap} offered")
    return problems
