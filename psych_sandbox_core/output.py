"""Capturing a child's stdout and stderr: bounded memory, never blocking the child."""

from __future__ import annotations

from anyio.abc import ByteReceiveStream


class StreamCapture:
    """Holds at most ``cap`` bytes of a stream and counts everything that arrived."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._chunks: list[bytes] = []
        self._held = 0
        self.total_bytes = 0

    def feed(self, data: bytes) -> None:
        self.total_bytes += len(data)
        room = self.cap - self._held
        if room > 0:
            kept = data[:room]
            self._chunks.append(kept)
            self._held += len(kept)

    @property
    def data(self) -> bytes:
        return b"".join(self._chunks)

    @property
    def truncated(self) -> bool:
        return self.total_bytes > self._held

    @property
    def dropped_bytes(self) -> int:
        return self.total_bytes - self._held

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")

    async def drain(self, stream: ByteReceiveStream) -> None:
        """Read until EOF, keeping what fits: the child never blocks on a full pipe."""
        from anyio import BrokenResourceError, ClosedResourceError, EndOfStream

        try:
            while True:
                self.feed(await stream.receive(256 * 1024))
        except (EndOfStream, BrokenResourceError, ClosedResourceError):
            return
