"""What one execution's outputs become: previews for the model, attachments for the rest.

The host hands :func:`preserve` the captured streams, the return value and the collected
artifacts; each becomes a preview in the result and, with a ledger, a durable attachment
(attachments.py). Without a blob store only what fits inline is kept whole: when the caller
required preservation, losing bytes fails the execution as ``artifacts_unavailable``
(:func:`unavailable_failure`) rather than quietly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..budgets import ExecutionMeter
from ..errors import ErrorKind
from ..result import (
    ArtifactInfo,
    Attachment,
    AttachmentKind,
    ExecutionFailure,
    SkippedEntry,
    StreamOutput,
)
from .artifact_channel import ChannelCollector, channel_request
from .artifact_walk import collect
from .artifacts import (
    MAX_SKIPPED_LISTED,
    Collection,
    CollectionLimits,
    collection_failure,
    safe_parts,
)
from .attachments import AttachmentLedger
from .capture import OutputPolicy, Preview, StreamCapture, make_preview


@dataclass
class OutputContext:
    """Where one execution's outputs are recorded: its run, tenant, slot and policy."""

    policy: OutputPolicy
    ledger: AttachmentLedger | None
    tenant: str
    run_id: str
    slot: str = ""

    def __post_init__(self) -> None:
        if self.ledger is not None and not self.slot:
            self.slot = self.ledger.new_slot(self.tenant, self.run_id)


@dataclass
class Preserved:
    """What :func:`preserve` hands back to the host for the result."""

    stdout: Preview
    stderr: Preview
    stdout_info: StreamOutput
    stderr_info: StreamOutput
    attachments: list[Attachment] = field(default_factory=list)
    artifacts: list[ArtifactInfo] = field(default_factory=list)
    skipped: list[SkippedEntry] = field(default_factory=list)
    skipped_unlisted: int = 0
    #: Set when preservation was required and could not be done.
    unavailable: str | None = None


def _limits(policy: OutputPolicy) -> CollectionLimits:
    return CollectionLimits(
        per_file_bytes=policy.artifact_bytes,
        total_bytes=policy.artifacts_total_bytes,
        max_files=policy.max_artifacts,
    )


def collect_artifacts(
    context: OutputContext | None, workspace: str | None, *, empty: bool = False
) -> Collection | None:
    """Collect the workspace's artifacts under the context's policy (blocking: run in a
    worker thread). None when no artifacts were asked for; a collection naming why when the
    workspace cannot be reached (no path and nothing sent over the channel). ``empty``: the
    caller saw the workspace empty once nothing could write to it any more, so there is no
    walk to make (it would find nothing, in any folder)."""
    if context is None or not context.policy.collect_artifacts:
        return None
    policy = context.policy
    if workspace is None:
        return collection_failure(policy.artifacts_folder, "unreachable")
    folder = policy.artifacts_folder
    if empty and (folder is None or safe_parts(folder) is not None):
        return Collection()
    return collect(workspace, _limits(policy), folder=folder)


def artifact_collector(
    context: OutputContext | None, workspace: str | None
) -> ChannelCollector | Collection | None:
    """For a backend that cannot hand its workspace to the host: a collector for the files
    the child sends over the channel (or, for a folder no request can name, the collection
    saying so). None when the host collects itself or no artifacts were asked for."""
    if context is None or workspace is not None or not context.policy.collect_artifacts:
        return None
    policy = context.policy
    request = channel_request(policy.artifacts_folder, _limits(policy))
    if request is None:
        result = Collection()
        result.skip(str(policy.artifacts_folder)[:200], "unsafe_name")
        return result
    return ChannelCollector(request)


def stream_info(
    capture: StreamCapture, preview: Preview, attachment: str | None = None
) -> StreamOutput:
    return StreamOutput(
        total_bytes=capture.total_bytes,
        captured_bytes=capture.captured_bytes,
        dropped_bytes=capture.dropped_bytes,
        total_lines=capture.total_lines,
        shown_bytes=preview.shown_bytes,
        omitted_bytes=preview.omitted_bytes,
        omitted_lines=preview.omitted_lines,
        after_end_bytes=capture.after_end_bytes,
        attachment=attachment,
    )


_EMPTY_PREVIEW = Preview("", 0, 0, 0)


async def preserve(
    context: OutputContext | None,
    *,
    stdout: StreamCapture,
    stderr: StreamCapture,
    value_json: str | None,
    collection: Collection | None,
    withheld: bool,
    meter: ExecutionMeter | None = None,
) -> Preserved:
    """Previews for the model and durable attachments for everything else.

    With ``meter``, every attachment is paid for from the execution's byte budget before it
    is stored: a stream or return value it cannot pay for keeps only its preview, an artifact
    is skipped (reason ``budget_exhausted``)."""
    if withheld:
        empty = stream_info(StreamCapture(0), _EMPTY_PREVIEW)
        return Preserved(_EMPTY_PREVIEW, _EMPTY_PREVIEW, empty, empty)
    policy = context.policy if context is not None else OutputPolicy()
    previews = [make_preview(capture, policy.preview_bytes) for capture in (stdout, stderr)]
    if context is None or context.ledger is None:
        return Preserved(
            previews[0],
            previews[1],
            stream_info(stdout, previews[0]),
            stream_info(stderr, previews[1]),
        )
    ledger = context.ledger
    attachments: list[Attachment] = []
    lost: list[str] = []
    over_budget: list[str] = []

    def admit(name: str, data: bytes) -> bool:
        if meter is None or meter.admit_stored(len(data), f"attachment {name}") is None:
            return True
        over_budget.append(name)
        return False

    async def keep(
        name: str, kind: AttachmentKind, data: bytes, complete: bool, ctype: str | None = None
    ) -> Attachment:
        admitted = admit(name, data)
        attachment, preserved = await ledger.keep(
            tenant=context.tenant,
            run_id=context.run_id,
            slot=context.slot,
            name=name,
            kind=kind,
            data=data,
            policy=policy,
            complete=complete,
            content_type=ctype,
            admitted=admitted,
        )
        attachments.append(attachment)
        if not preserved and admitted:
            lost.append(name)
        return attachment

    infos = []
    for name, capture, preview in (
        ("stdout", stdout, previews[0]),
        ("stderr", stderr, previews[1]),
    ):
        attachment = await keep(name, "stream", capture.data, not capture.truncated)
        infos.append(stream_info(capture, preview, attachment.handle))
    if value_json is not None:
        await keep("return_value", "return_value", value_json.encode(), True, "application/json")
    artifacts: list[ArtifactInfo] = []
    skipped = list(collection.skipped) if collection is not None else []
    unlisted = collection.skipped_unlisted if collection is not None else 0
    if collection is not None:
        for item in collection.files:
            if not admit(f"artifacts/{item.path}", item.data):
                if len(skipped) < MAX_SKIPPED_LISTED:
                    skipped.append(SkippedEntry(path=item.path, reason="budget_exhausted"))
                else:
                    unlisted += 1
                continue
            attachment = await keep(
                f"artifacts/{item.path}", "artifact", item.data, True, item.content_type
            )
            artifacts.append(
                ArtifactInfo(
                    path=item.path,
                    size_bytes=len(item.data),
                    sha256=item.sha256,
                    content_type=item.content_type,
                    attachment=attachment.handle,
                )
            )
    unavailable = None
    if lost and policy.require_preservation:
        unavailable = (
            "preservation was required but no blob store could keep "
            + _listed(lost)
            + f" (larger than the {policy.inline_bytes}-byte inline limit)"
        )
    elif over_budget and policy.require_preservation:
        unavailable = (
            "preservation was required but storing "
            + _listed(over_budget)
            + " would have taken the execution past its byte budget "
            "(total_bytes_per_execution)"
        )
    return Preserved(
        previews[0],
        previews[1],
        infos[0],
        infos[1],
        attachments=attachments,
        artifacts=artifacts,
        skipped=skipped,
        skipped_unlisted=unlisted,
        unavailable=unavailable,
    )


def _listed(names: list[str]) -> str:
    return ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")


def unavailable_failure(message: str, failure: ExecutionFailure | None) -> ExecutionFailure:
    """The artifacts_unavailable failure, keeping what the program's own failure said."""
    if failure is not None:
        message += f"; the program had also failed ({failure.kind.value}: {failure.message})"
        return ExecutionFailure.of(
            ErrorKind.ARTIFACTS_UNAVAILABLE,
            message,
            traceback=failure.traceback,
            line=failure.line,
            column=failure.column,
            exception_type=failure.exception_type,
        )
    return ExecutionFailure.of(ErrorKind.ARTIFACTS_UNAVAILABLE, message)
