"""Durable storage for bytes too large to keep inline (oversized tool results, output
attachments, artifacts). An interface with an embedded filesystem default.

Every address folds in the tenant and the run: the same key under another tenant or run is a
different blob, so a handle minted for one can never resolve for another. Nothing about the
storage (paths, keys) is ever shown to a program.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import anyio


@dataclass(frozen=True)
class BlobAddress:
    tenant: str
    run_id: str
    key: str

    def digest(self) -> str:
        """A stable name for this address; the tenant and run are part of what is hashed."""
        material = "\x00".join((self.tenant, self.run_id, self.key)).encode()
        return hashlib.sha256(material).hexdigest()


class BlobNotFound(KeyError):
    """No blob at this address (never existed, or belongs to someone else)."""


class BlobStore(ABC):
    @abstractmethod
    async def put(self, address: BlobAddress, data: bytes) -> None: ...

    @abstractmethod
    async def read(self, address: BlobAddress, offset: int = 0, length: int | None = None) -> bytes:
        """Bytes ``[offset, offset+length)`` of the blob; raises BlobNotFound."""

    @abstractmethod
    async def size(self, address: BlobAddress) -> int:
        """Length of the blob in bytes; raises BlobNotFound."""


class FilesystemBlobStore(BlobStore):
    """Blobs as files under one private directory, named by the hashed address."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)

    def _path(self, address: BlobAddress) -> Path:
        digest = address.digest()
        tenant = hashlib.sha256(address.tenant.encode()).hexdigest()[:16]
        return self.root / tenant / digest[:2] / digest

    async def put(self, address: BlobAddress, data: bytes) -> None:
        path = self._path(address)

        def write() -> None:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                os.replace(temporary, path)
            except BaseException:
                os.unlink(temporary)
                raise

        await anyio.to_thread.run_sync(write)

    async def read(self, address: BlobAddress, offset: int = 0, length: int | None = None) -> bytes:
        path = self._path(address)

        def read() -> bytes:
            try:
                with open(path, "rb") as fh:
                    fh.seek(max(offset, 0))
                    return fh.read() if length is None else fh.read(max(length, 0))
            except FileNotFoundError:
                raise BlobNotFound(address.key) from None

        return await anyio.to_thread.run_sync(read)

    async def size(self, address: BlobAddress) -> int:
        try:
            return self._path(address).stat().st_size
        except FileNotFoundError:
            raise BlobNotFound(address.key) from None

    async def delete(self, address: BlobAddress) -> None:
        """Remove the blob, if it is there (retention is the store owner's to decide)."""
        path = self._path(address)
        await anyio.to_thread.run_sync(functools.partial(path.unlink, missing_ok=True))
