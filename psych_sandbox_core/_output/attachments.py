"""Durable copies of what an execution produced, and reading them back by window or pattern.

Each stream, the returned value and each collected artifact becomes a named attachment with
its own handle. Small ones are kept inline with the run's record, larger ones in the blob
store, and without a blob store only a preview is kept, unless the caller required
preservation, in which case the execution fails with ``artifacts_unavailable`` rather than
losing bytes quietly (preservation.py decides what each execution keeps; this module is the
ledger that keeps it).

A handle is ``att:<slot>:<token>``: the slot names the execution within its run, the token is
random. A handle resolves only against the record of the run (and tenant) that minted it, and
only if its slot prefix matches the slot it was recorded under; a fabricated handle, or a real
one presented for another run or tenant, is denied exactly like one that never existed.
Behind it, the blob address folds in the tenant and the run, so even a lookup that bypassed
the record could not reach another tenant's bytes. Nothing about the storage is ever shown.

With a blob store, each attachment's record (its slot, its description and, when small, its
bytes) is also written to the store, under the same tenant and run, before the handle is handed
out: a host that restarts resolves the handle from there, with the same checks. Memory then
holds only the most recent runs. Without a blob store the records live in memory alone, every
run until :meth:`AttachmentLedger.forget`.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import re
import secrets
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import SandboxError
from ..result import Attachment, AttachmentKind, Storage
from .blobstore import BlobAddress, BlobNotFound, BlobStore
from .capture import OutputPolicy, StreamCapture
from .content_type import sniff_content_type
from .pattern_search import SearchResult, search_bytes

#: Largest window one read returns; a reader pages through anything larger.
MAX_WINDOW_BYTES = 1024 * 1024
#: Window returned when the caller does not say.
DEFAULT_WINDOW_BYTES = 16 * 1024

#: Runs whose records a ledger keeps in memory when they are also in the blob store.
DEFAULT_RUNS_IN_MEMORY = 256


class AttachmentDenied(SandboxError, LookupError):
    """This handle does not resolve for this run and tenant (or never existed)."""


@dataclass(frozen=True)
class Window:
    """Bytes ``[offset, offset + len(data))`` of an attachment's kept bytes."""

    handle: str
    offset: int
    data: bytes
    #: Length of what is kept (the preview's length for a preview-only attachment).
    kept_bytes: int
    #: Whether the window reaches the end of what is kept.
    eof: bool
    #: Whether what is kept is everything (see Attachment.complete).
    complete: bool

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


@dataclass
class _Record:
    slot: str
    attachment: Attachment
    inline: bytes | None = None
    address: BlobAddress | None = None
    #: Whether the record is also in the blob store (so memory may let it go).
    durable: bool = False


@dataclass
class _Run:
    records: dict[str, _Record] = field(default_factory=dict)
    slots: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    #: Records only memory holds; a run with any is never evicted.
    volatile: int = 0
    #: Set when slots must stay unique across hosts and restarts (a blob store is configured):
    #: a counter alone would start again at 1 in the next process, or after an eviction.
    epoch: str = ""


class _DurableRecord(BaseModel):
    """What the blob store holds for one handle. No storage key or path: the bytes' address
    is derived from the handle, tenant and run, never read from the record."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal[1] = 1
    #: Checked again on load, so a record copied under another tenant or run is refused.
    tenant: str
    run_id: str
    slot: str
    attachment: Attachment
    #: base64 of the kept bytes when they are not in a blob of their own.
    inline: str | None = None


# A slot is "x<n>" (no blob store) or "x<n>-<epoch>"; a token is token_urlsafe(18). Checked
# before anything is looked up, so no stranger string ever reaches the store as part of a key.
_HANDLE = re.compile(r"att:(x[0-9]{1,9}(?:-[A-Za-z0-9_-]{1,16})?):([A-Za-z0-9_-]{24})")


def _bytes_address(tenant: str, run_id: str, handle: str) -> BlobAddress:
    return BlobAddress(tenant=tenant, run_id=run_id, key=handle)


def _record_address(tenant: str, run_id: str, handle: str) -> BlobAddress:
    return BlobAddress(tenant=tenant, run_id=run_id, key=f"attachments/record/{handle}")


class AttachmentLedger:
    """The recorded handles of every run, per tenant, and the blob store behind them.

    Held by a Sandbox. With a blob store every record is written there too, and memory keeps
    at most ``runs_in_memory`` runs (the least recently used are let go; their handles still
    resolve from the store). Without one, records and inline bytes live in memory only, every
    run until :meth:`forget` is called for it: nothing that exists nowhere else is dropped.
    """

    def __init__(
        self, blob_store: BlobStore | None = None, *, runs_in_memory: int = DEFAULT_RUNS_IN_MEMORY
    ) -> None:
        if (
            isinstance(runs_in_memory, bool)
            or not isinstance(runs_in_memory, int)
            or (runs_in_memory < 1)
        ):
            raise ValueError("runs_in_memory must be a positive integer")
        self.blob_store = blob_store
        self.runs_in_memory = runs_in_memory
        # Insertion order is recency order: a run is moved to the end whenever it is touched.
        self._runs: dict[tuple[str, str], _Run] = {}
        # The runs memory may let go (every record also in the store), in the same order:
        # eviction looks at these alone, so its cost does not grow with the runs that must
        # stay (without a blob store, every run).
        self._evictable: dict[tuple[str, str], None] = {}

    def _run(self, tenant: str, run_id: str) -> _Run:
        key = (tenant, run_id)
        run = self._runs.pop(key, None)
        if run is None:
            run = _Run(epoch=secrets.token_urlsafe(6) if self.blob_store is not None else "")
        self._runs[key] = run
        if run.volatile == 0:
            self._evictable.pop(key, None)
            self._evictable[key] = None
        self._evict(key)
        return run

    def _evict(self, touched: tuple[str, str]) -> None:
        """Let the least recently used evictable runs go while more than ``runs_in_memory``
        are held; never ``touched``, the run being used."""
        excess = len(self._runs) - self.runs_in_memory
        if excess <= 0:
            return
        for key in list(itertools.islice(self._evictable, excess + 1)):
            if excess <= 0:
                return
            if key != touched:
                del self._evictable[key]
                del self._runs[key]
                excess -= 1

    def new_slot(self, tenant: str, run_id: str) -> str:
        run = self._run(tenant, run_id)
        number = next(run.slots)
        return f"x{number}-{run.epoch}" if run.epoch else f"x{number}"

    def forget(self, tenant: str, run_id: str) -> None:
        """Drop a run's records from memory. Its blobs, and with a blob store its durable
        records, stay in the store under the store's own retention."""
        self._runs.pop((tenant, run_id), None)
        self._evictable.pop((tenant, run_id), None)

    def handles(self, tenant: str, run_id: str) -> list[str]:
        """The run's handles this ledger holds in memory (not those only in the store)."""
        run = self._runs.get((tenant, run_id))
        return [] if run is None else list(run.records)

    def _record(self, tenant: str, run_id: str, record: _Record) -> None:
        run = self._run(tenant, run_id)
        run.records[record.attachment.handle] = record
        if not record.durable:
            run.volatile += 1
            self._evictable.pop((tenant, run_id), None)  # it holds what exists nowhere else

    async def _persist(self, tenant: str, run_id: str, record: _Record) -> bool:
        """Write the record to the blob store; False when there is none or it failed."""
        if self.blob_store is None:
            return False
        durable = _DurableRecord(
            tenant=tenant,
            run_id=run_id,
            slot=record.slot,
            attachment=record.attachment,
            inline=None if record.inline is None else base64.b64encode(record.inline).decode(),
        )
        address = _record_address(tenant, run_id, record.attachment.handle)
        try:
            await self.blob_store.put(address, durable.model_dump_json().encode())
        except OSError:
            return False  # kept in memory only, and never evicted from there
        return True

    async def _load(self, tenant: str, run_id: str, handle: str, slot: str) -> _Record | None:
        if self.blob_store is None:
            return None
        try:
            raw = await self.blob_store.read(_record_address(tenant, run_id, handle))
            durable = _DurableRecord.model_validate_json(raw)
            inline = (
                None if durable.inline is None else base64.b64decode(durable.inline, validate=True)
            )
        except (BlobNotFound, OSError, ValidationError, ValueError):
            return None  # absent, unreadable or damaged: denied like a handle never minted
        if (durable.tenant, durable.run_id, durable.slot, durable.attachment.handle) != (
            tenant,
            run_id,
            slot,
            handle,
        ):
            return None
        address = None if inline is not None else _bytes_address(tenant, run_id, handle)
        return _Record(durable.slot, durable.attachment, inline, address, durable=True)

    async def _resolve(self, handle: object, tenant: str, run_id: str, slot: str | None) -> _Record:
        denied = AttachmentDenied(f"no attachment {handle!r} in this run")
        if not isinstance(handle, str) or len(handle) > 200:
            raise denied
        match = _HANDLE.fullmatch(handle)
        if match is None or (slot is not None and match.group(1) != slot):
            raise denied
        run = self._runs.get((tenant, run_id))
        record = None if run is None else run.records.get(handle)
        if record is None:
            # Not in memory: evicted, or minted by an earlier host. The store is asked under
            # this tenant and run only, so another's record is simply not there.
            record = await self._load(tenant, run_id, handle, match.group(1))
        if record is None or record.slot != match.group(1):
            raise denied
        return record

    async def describe(
        self, handle: str, *, tenant: str, run_id: str, slot: str | None = None
    ) -> Attachment:
        return (await self._resolve(handle, tenant, run_id, slot)).attachment

    async def read(
        self,
        handle: str,
        *,
        tenant: str,
        run_id: str,
        offset: int = 0,
        length: int = DEFAULT_WINDOW_BYTES,
        slot: str | None = None,
    ) -> Window:
        """A window of an attachment. ``slot`` narrows resolution to one execution's outputs."""
        record = await self._resolve(handle, tenant, run_id, slot)
        if not isinstance(offset, int) or offset < 0:
            raise ValueError("offset must be a non-negative integer")
        if not isinstance(length, int) or length < 0:
            raise ValueError("length must be a non-negative integer")
        length = min(length, MAX_WINDOW_BYTES)
        if record.inline is not None:
            kept = len(record.inline)
            data = record.inline[offset : offset + length]
        else:
            assert record.address is not None
            store = self._store()
            try:
                kept = await store.size(record.address)
                data = await store.read(record.address, offset, length) if length else b""
            except BlobNotFound:
                raise AttachmentDenied(f"attachment {handle!r} is no longer stored") from None
        return Window(
            handle=handle,
            offset=offset,
            data=data,
            kept_bytes=kept,
            eof=offset + len(data) >= kept,
            complete=record.attachment.complete,
        )

    async def read_all(
        self, handle: str, *, tenant: str, run_id: str, slot: str | None = None
    ) -> bytes:
        """Every kept byte of an attachment (bounded by the caps it was collected under)."""
        chunks: list[bytes] = []
        offset = 0
        while True:
            window = await self.read(
                handle,
                tenant=tenant,
                run_id=run_id,
                offset=offset,
                length=MAX_WINDOW_BYTES,
                slot=slot,
            )
            chunks.append(window.data)
            offset += len(window.data)
            if window.eof or not window.data:
                return b"".join(chunks)

    async def search(
        self,
        handle: str,
        pattern: str,
        *,
        tenant: str,
        run_id: str,
        ignore_case: bool = False,
        max_matches: int = 100,
        slot: str | None = None,
    ) -> SearchResult:
        """Matches of a regular expression in an attachment, run where it cannot hang us."""
        data = await self.read_all(handle, tenant=tenant, run_id=run_id, slot=slot)
        return await search_bytes(data, pattern, ignore_case=ignore_case, max_matches=max_matches)

    def _store(self) -> BlobStore:
        if self.blob_store is None:
            raise AttachmentDenied("no blob store is configured")
        return self.blob_store

    async def keep(
        self,
        *,
        tenant: str,
        run_id: str,
        slot: str,
        name: str,
        kind: AttachmentKind,
        data: bytes,
        policy: OutputPolicy,
        complete: bool = True,
        content_type: str | None = None,
        admitted: bool = True,
    ) -> tuple[Attachment, bool]:
        """Record ``data`` under a fresh handle. Returns the attachment and whether every
        byte was preserved (False when only a preview could be kept). ``admitted=False``
        (the execution's byte budget cannot pay for the bytes) keeps only a preview."""
        handle = f"att:{slot}:{secrets.token_urlsafe(18)}"
        digest = hashlib.sha256(data).hexdigest()
        kind_of = content_type or sniff_content_type(data)
        inline: bytes | None = None
        address: BlobAddress | None = None
        stored: Storage
        preserved = True
        if admitted and len(data) <= policy.inline_bytes:
            inline, stored = data, "inline"
        else:
            stored = "preview_only"
            if admitted and self.blob_store is not None:
                candidate = _bytes_address(tenant, run_id, handle)
                try:
                    await self.blob_store.put(candidate, data)
                except OSError:
                    pass  # the store failed: fall back to a preview, below
                else:
                    address, stored = candidate, "blob"
            if address is None:
                preserved = False
                preview = StreamCapture(policy.preview_bytes)
                preview.feed(data)
                inline = preview.data
        attachment = Attachment(
            handle=handle,
            name=name,
            kind=kind,
            size_bytes=len(data),
            sha256=digest,
            content_type=kind_of,
            stored=stored,
            complete=complete and stored != "preview_only",
        )
        record = _Record(slot, attachment, inline, address)
        # Durable before the handle is handed out, so no one ever holds a handle that a
        # restarted host could not resolve (unless the store failed: then memory keeps it).
        record.durable = await self._persist(tenant, run_id, record)
        self._record(tenant, run_id, record)
        return attachment, preserved
