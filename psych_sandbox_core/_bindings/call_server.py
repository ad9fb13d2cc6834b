"""One execution's binding calls answered: a :class:`CallServer`.

Every call the program makes is answered through the execution's provider (bindings.py): the
server enforces the budgets (budgets.py), counts each accepted call in the run log
(runlog.py) before the tool runs, and pages a result too large to hand over whole through the
blob store (paging.py), read back by the built-in read_tool_output. A paged result is paid
for in full from the execution's byte budget before it is stored, and the CPU of a pattern
search from its CPU budget (host_work.py).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from .._output.attachments import AttachmentDenied, AttachmentLedger
from .._output.blobstore import BlobAddress, BlobNotFound, BlobStore
from .._output.host_work import HostWork
from .._output.paging import PagingError, SearchSettings, read
from ..budgets import BindingBudgets, ExecutionMeter
from ..errors import ConfigurationError, ProtocolViolation
from ..protocol import CallFrame, ReplyFrame
from ..protocol.codec import collector_paused
from ..protocol.frames import CatalogueEntry
from ..protocol.limits import MAX_FRAMES_MARGIN, MAX_TOOL_NAME_CHARS, MAX_TOOLS
from .bindings import BindingProvider, CallErrorKind, ToolCallError
from .builtins import BUILTIN_SPECS, READ_OUTPUT, READ_TOOL_OUTPUT
from .catalogue import LOOKUPS, Catalogue, CatalogueError, ToolSpec
from .runlog import MemoryRunLog, RunLog

_KINDS = {kind.value for kind in CallErrorKind}
#: How a call that got no reply is recorded (an enum member's value is a property call).
_CANCELLED = CallErrorKind.CANCELLED.value


@dataclass(frozen=True)
class ExecutionScope:
    """Who an execution belongs to: what handles and run-log entries are scoped by."""

    tenant: str
    run_id: str
    execution_id: str


@dataclass
class _Handle:
    address: BlobAddress
    size: int


@dataclass
class AcceptedCall:
    """A call the server accepted: its record entry, its run-log entry while open, and its
    reply when acceptance already decided it (a budget refused it)."""

    frame: CallFrame
    entry: dict[str, Any]
    seq: int | None
    reply: ReplyFrame | None = None


@dataclass
class CallServer:
    """Answers one execution's call frames: strict id order, offered names only, budgets
    enforced and every accepted call counted in the run log before the tool runs."""

    provider: BindingProvider | None = None
    #: The tools listed for this execution (a plain name means a tool that never suspends).
    tools: Sequence[ToolSpec | str] = ()
    budgets: BindingBudgets = field(default_factory=BindingBudgets)
    run_log: RunLog | None = None
    scope: ExecutionScope = field(
        default_factory=lambda: ExecutionScope("default", _token(), _token())
    )
    blob_store: BlobStore | None = None
    search: SearchSettings = field(default_factory=SearchSettings)
    #: Host-side work (pattern searches) done for this execution, bound to its limits by the
    #: host when the program starts.
    work: HostWork = field(default_factory=HostWork)
    #: Where earlier executions' outputs are recorded, when the profile offers read_output.
    outputs: AttachmentLedger | None = None

    def __post_init__(self) -> None:
        specs = [ToolSpec(t) if isinstance(t, str) else t for t in self.tools]
        self.tools = specs
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ConfigurationError("the binding provider listed a tool name more than once")
        for name in names:
            if not isinstance(name, str) or not 0 < len(name) <= MAX_TOOL_NAME_CHARS:
                raise ConfigurationError(
                    f"tool name {name!r} must be a non-empty str of at most "
                    f"{MAX_TOOL_NAME_CHARS} characters"
                )
        builtin = []
        if self.blob_store is not None and self.provider is not None:
            builtin.append(READ_TOOL_OUTPUT)
        if self.outputs is not None:
            builtin.append(READ_OUTPUT)
        # A built-in shadows a provider tool of the same name: it is how a program reads
        # what its own calls (or its run) produced, and must not be answerable by anyone else.
        shadowed = {*builtin, *LOOKUPS}
        described = [s for s in specs if not s.may_suspend and s.name not in shadowed]
        described += [BUILTIN_SPECS[name] for name in builtin]
        self._catalogue = Catalogue(described)
        self._catalogue_names = [spec.name for spec in described]
        self._callable = list(self._catalogue_names)
        if self._callable:
            # Bounded, read-only lookups over the same catalogue (list_tools, get_tool_info).
            self._callable += LOOKUPS
        self._suspending = frozenset(s.name for s in specs if s.may_suspend)
        if len(self._callable) > MAX_TOOLS:
            raise ConfigurationError(
                f"{len(self._callable)} tools offered; one execution may be offered at most "
                f"{MAX_TOOLS}"
            )
        self._offered = frozenset(self._callable)
        self.run_log = self.run_log or _default_log()
        self.meter = ExecutionMeter(self.budgets)
        self.expected_id = 0
        self.record: list[dict[str, Any]] = []
        self._handles: dict[str, _Handle] = {}

    @property
    def offered(self) -> list[str]:
        """The names a call may carry, sent to the child in the run frame."""
        return list(self._callable)

    def catalogue(self) -> list[CatalogueEntry]:
        """What the program's TOOLS says about each tool, as the run frame carries it."""
        return self._catalogue.entries()

    async def answer(self, frame: CallFrame) -> ReplyFrame:
        """Accept one call and serve it to its reply (one call at a time)."""
        return await self.complete(await self.accept(frame))

    async def accept(self, frame: CallFrame) -> AcceptedCall:
        """Take the next call, in the order the program made it: its id checked, its record
        and run-log entry made, the call and argument budgets charged. Raises
        ProtocolViolation for an id that is not the exact successor of the last (forged,
        repeated or skipped) and for calls that go on long after the budget was spent."""
        if frame.id != self.expected_id:
            raise ProtocolViolation(
                f"call id {frame.id} is not the successor of the last call "
                f"(expected {self.expected_id})"
            )
        self.expected_id += 1
        entry: dict[str, Any] = {
            "name": frame.name,
            "outcome": "cancelled",
            "carries": "error",
            "argument_bytes": 0,
            "result_bytes": 0,
        }
        self.record.append(entry)
        refusal = self.meter.admit_call()
        if refusal is not None:
            spam = MAX_FRAMES_MARGIN + self.budgets.calls_per_execution
            if self.meter.refused_after_exhaustion > spam:
                raise ProtocolViolation(
                    "the program kept calling bindings long after its call budget was spent"
                )
            return self._refused(frame, entry, CallErrorKind.BUDGET_EXHAUSTED, refusal)
        assert self.run_log is not None
        seq = await self.run_log.begin_call(
            self.scope.run_id,
            self.scope.execution_id,
            frame.id,
            frame.name,
            self.budgets.calls_per_run,
        )
        if seq is None:
            return self._refused(
                frame,
                entry,
                CallErrorKind.BUDGET_EXHAUSTED,
                f"this run has spent its budget of {self.budgets.calls_per_run} binding calls",
            )
        accepted = AcceptedCall(frame, entry, seq)
        try:
            if not frame.arguments:
                argument_bytes = 2  # "{}": most calls of a tool without parameters
            elif _few_elements(frame.arguments):
                argument_bytes = _json_bytes(frame.arguments)
            else:
                # Encoding holds the interpreter lock, and so the event loop, for milliseconds.
                argument_bytes = await anyio.to_thread.run_sync(_json_bytes, frame.arguments)
        except BaseException:
            await self.close(accepted)
            raise
        entry["argument_bytes"] = argument_bytes
        refusal = self.meter.admit_arguments(argument_bytes)
        if refusal is not None:
            accepted.reply = _error(frame.id, CallErrorKind.BUDGET_EXHAUSTED, refusal)
        return accepted

    def _refused(
        self, frame: CallFrame, entry: dict[str, Any], kind: CallErrorKind, message: str
    ) -> AcceptedCall:
        return AcceptedCall(frame, entry, None, _error(frame.id, kind, message))

    async def complete(
        self, call: AcceptedCall, scope: anyio.CancelScope | None = None
    ) -> ReplyFrame:
        """Serve an accepted call to its reply, counted and recorded. Cancelling ``scope``
        (the program stopped waiting) cancels the tool and answers the call as cancelled;
        a cancellation from outside (the execution ends) propagates, the call recorded as
        cancelled either way."""
        frame, entry = call.frame, call.entry
        outcome = _CANCELLED
        try:
            if call.reply is not None:
                reply = call.reply
            else:
                with scope if scope is not None else anyio.CancelScope() as within:
                    reply = await self._accepted(frame)
                if within.cancelled_caught:
                    reply = _error(
                        frame.id,
                        CallErrorKind.CANCELLED,
                        "the program stopped waiting for this call, and the tool was cancelled",
                    )
            outcome = reply.error_kind or "ok"
            return self._finish(entry, reply)
        finally:
            await self.close(call, outcome)

    async def close(self, call: AcceptedCall, outcome: str = _CANCELLED) -> None:
        """Close an accepted call's run-log entry with ``outcome`` (once; its record says
        cancelled until a reply is made for it)."""
        if call.seq is not None:
            seq, call.seq = call.seq, None
            assert self.run_log is not None
            if self.run_log.never_suspends:
                await self.run_log.finish_call(seq, outcome)
                return
            # Shielded: a cancelled execution still ends its call in the log, never dangling.
            with anyio.CancelScope(shield=True):
                await self.run_log.finish_call(seq, outcome)

    def _finish(self, entry: dict[str, Any], reply: ReplyFrame) -> ReplyFrame:
        entry["outcome"] = reply.error_kind or "ok"
        entry["carries"] = reply.carries
        if reply.value_json is not None:
            entry["result_bytes"] = len(reply.value_json.encode())
        if reply.handle is not None:
            entry["stored_bytes"] = reply.handle["bytes"]
        return reply

    async def _accepted(self, frame: CallFrame) -> ReplyFrame:
        if frame.name in self._suspending:
            return _error(
                frame.id,
                CallErrorKind.APPROVAL_REQUIRED,
                f"{frame.name!r} may suspend the run (it needs approval or a person's answer), "
                "so a program cannot call it; nothing was run. Call it directly as a tool "
                "instead",
            )
        if frame.name not in self._offered:
            return _error(
                frame.id,
                CallErrorKind.UNKNOWN_TOOL,
                f"no tool named {frame.name!r} is offered to this program; TOOLS lists those "
                "that are",
            )
        if frame.name in LOOKUPS:
            try:
                value = self._catalogue.answer(frame.name, frame.arguments)
            except CatalogueError as exc:
                return _error(frame.id, exc.kind, exc.message)
            return self._value(frame.id, _dumps(value), paging_allowed=False)
        if frame.name == READ_TOOL_OUTPUT and self.blob_store is not None:
            try:
                value = await self._read_tool_output(dict(frame.arguments))
            except PagingError as exc:
                return _error(frame.id, exc.kind, exc.message)
            return self._value(frame.id, _dumps(value), paging_allowed=False)
        if frame.name == READ_OUTPUT and self.outputs is not None:
            try:
                value = await self._read_output(dict(frame.arguments))
            except PagingError as exc:
                return _error(frame.id, exc.kind, exc.message)
            return self._value(frame.id, _dumps(value), paging_allowed=False)
        assert self.provider is not None
        try:
            value = await self.provider.call(frame.name, dict(frame.arguments))
        except ToolCallError as exc:
            kind = exc.kind if exc.kind in _KINDS else CallErrorKind.TOOL_ERROR.value
            return _error(frame.id, kind, exc.message)
        except Exception as exc:
            return _error(frame.id, CallErrorKind.TOOL_ERROR, f"{type(exc).__name__}: {exc}")
        try:
            value_json = _dumps(value)
        except (TypeError, ValueError, RecursionError) as exc:
            return _error(
                frame.id, CallErrorKind.TOOL_ERROR, f"the tool returned non-JSON data: {exc}"
            )
        return await self._maybe_page(frame, value_json)

    async def _maybe_page(self, frame: CallFrame, value_json: str) -> ReplyFrame:
        data = value_json.encode()
        ceiling = self.budgets.result_bytes_per_call
        if len(data) <= ceiling:
            return self._value(frame.id, value_json, paging_allowed=True, size=len(data))
        if self.blob_store is None:
            return _error(
                frame.id,
                CallErrorKind.BINDING_RESULT_NOT_PAGED,
                f"{frame.name!r} returned {len(data)} bytes, over the per-call ceiling of "
                f"{ceiling} bytes, and no storage is configured to page it; the result was "
                "not delivered. Ask the tool for less (a filter, a page, a limit)",
            )
        token = _token()
        # Only an opaque id, the tool's name and the size cross: nothing about the storage.
        descriptor = {"id": token, "tool": frame.name, "bytes": len(data)}
        # Every stored byte is paid for before it is stored: a program must not be able to
        # fill the store through tools whose results it never reads.
        refusal = self.meter.admit_stored(len(data) + len(_dumps(descriptor)))
        if refusal is not None:
            return _error(frame.id, CallErrorKind.BUDGET_EXHAUSTED, refusal)
        address = BlobAddress(
            tenant=self.scope.tenant,
            run_id=self.scope.run_id,
            key=f"tool-result/{self.scope.execution_id}/{token}",
        )
        try:
            await self.blob_store.put(address, data)
        except Exception as exc:
            return _error(
                frame.id,
                CallErrorKind.BINDING_RESULT_NOT_PAGED,
                f"{frame.name!r} returned {len(data)} bytes, over the per-call ceiling of "
                f"{ceiling} bytes, and storing it for paging failed ({type(exc).__name__}); "
                "the result was not delivered",
            )
        self._handles[token] = _Handle(address, len(data))
        return ReplyFrame(id=frame.id, carries="handle", handle=descriptor)

    def _value(
        self, call_id: int, value_json: str, *, paging_allowed: bool, size: int | None = None
    ) -> ReplyFrame:
        """The reply carrying ``value_json`` (``size``: its length as UTF-8, if known)."""
        if size is None:
            size = len(value_json.encode())
        if not paging_allowed and size > self.budgets.result_bytes_per_call:
            return _error(
                call_id,
                CallErrorKind.BUDGET_EXHAUSTED,
                f"the answer is {size} bytes, over the per-call ceiling of "
                f"{self.budgets.result_bytes_per_call}; ask for a shorter window or fewer "
                "matches",
            )
        refusal = self.meter.admit_result(size)
        if refusal is not None:
            return _error(call_id, CallErrorKind.BUDGET_EXHAUSTED, refusal)
        # Validated: pydantic's validating constructor costs less than model_construct.
        return ReplyFrame(id=call_id, carries="value", value_json=value_json)

    async def _read_tool_output(self, arguments: dict[str, Any]) -> dict[str, Any]:
        assert self.blob_store is not None
        handle = arguments.get("handle")
        token = handle.get("id") if isinstance(handle, dict) else handle
        if not isinstance(token, str):
            raise PagingError(
                "invalid_arguments",
                "read_tool_output needs handle=, the ToolResultHandle a call returned",
            )
        owned = self._handles.get(token)
        if owned is None:
            raise PagingError(
                "handle_denied",
                "this handle was not produced by this program's own calls; a program can read "
                "only results its own calls returned",
            )
        try:
            data = await self.blob_store.read(owned.address)
        except BlobNotFound:
            raise PagingError("handle_denied", "the stored result is no longer available") from None
        return await self._read(READ_TOOL_OUTPUT, data, arguments)

    async def _read_output(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """An earlier execution's output, resolved under this execution's tenant and run
        like every attachment handle: another run's or tenant's handle is denied."""
        assert self.outputs is not None
        handle = arguments.get("handle")
        if not isinstance(handle, str):
            raise PagingError(
                "invalid_arguments",
                "read_output needs handle=, an attachment handle an earlier result named",
            )
        try:
            data = await self.outputs.read_all(
                handle, tenant=self.scope.tenant, run_id=self.scope.run_id
            )
        except AttachmentDenied:
            raise PagingError(
                "handle_denied",
                "no output of this run has that handle; read_output reads only what earlier "
                "executions of the same run recorded",
            ) from None
        return await self._read(READ_OUTPUT, data, arguments)

    async def _read(self, tool: str, data: bytes, arguments: dict[str, Any]) -> dict[str, Any]:
        return await read(
            data,
            arguments,
            tool=tool,
            # Room for the window's JSON framing and escaping under the per-call ceiling.
            max_window_chars=self.budgets.result_bytes_per_call // 2 - 256,
            settings=self.search,
            work=self.work,
        )


_DEFAULT_LOG: list[RunLog] = []


def _default_log() -> RunLog:
    # One in-memory log for servers built without one (tests, plain host use): per-run
    # counting then lasts as long as this process, which is all such a caller asked for.
    if not _DEFAULT_LOG:
        _DEFAULT_LOG.append(MemoryRunLog())
    return _DEFAULT_LOG[0]


#: Arguments with more elements than this are measured on a worker thread.
_INLINE_ELEMENTS = 1024


def _few_elements(value: Any) -> bool:
    """Whether ``value`` holds at most _INLINE_ELEMENTS containers' members (a walk that
    stops there, so it costs microseconds whatever the value)."""
    seen = 0
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        seen += len(item) if isinstance(item, (dict, list)) else 0
        if seen > _INLINE_ELEMENTS:
            return False
        members = item.values() if isinstance(item, dict) else item
        stack.extend(member for member in members if isinstance(member, (dict, list)))
    return True


def _json_bytes(value: Any) -> int:
    """The size the argument budget counts: compact JSON, as UTF-8."""
    with collector_paused():  # a wide object's items are many short-lived tuples
        return len(_dumps(value).encode())


#: Built once: json.dumps with any argument builds an encoder per call, which costs more
#: than encoding a small value.
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def _dumps(value: Any) -> str:
    return _ENCODER.encode(value)


def _token() -> str:
    return secrets.token_urlsafe(18)


def _error(call_id: int, kind: str, message: str) -> ReplyFrame:
    value = kind.value if isinstance(kind, CallErrorKind) else kind
    return ReplyFrame(id=call_id, carries="error", error_kind=value, message=message)
