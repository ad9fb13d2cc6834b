"""The content type of a program's bytes, sniffed from the bytes alone (never a name)."""

from __future__ import annotations

import json

from ..errors import ProtocolViolation
from ..protocol.limits import MAX_JSON_DEPTH, MAX_JSON_ELEMENTS
from ..protocol.shape import ShapeLimits, check_shape

#: A file is called JSON only when parsing it is as bounded as parsing a frame's value.
_SNIFF_SHAPE = ShapeLimits(MAX_JSON_DEPTH, MAX_JSON_ELEMENTS, "depth", "elements")

_MAGIC: tuple[tuple[bytes, int, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", 0, "image/png"),
    (b"\xff\xd8\xff", 0, "image/jpeg"),
    (b"GIF87a", 0, "image/gif"),
    (b"GIF89a", 0, "image/gif"),
    (b"BM", 0, "image/bmp"),
    (b"II*\x00", 0, "image/tiff"),
    (b"MM\x00*", 0, "image/tiff"),
    (b"%PDF-", 0, "application/pdf"),
    (b"PK\x03\x04", 0, "application/zip"),
    (b"PK\x05\x06", 0, "application/zip"),
    (b"\x1f\x8b", 0, "application/gzip"),
    (b"BZh", 0, "application/x-bzip2"),
    (b"\xfd7zXZ\x00", 0, "application/x-xz"),
    (b"\x28\xb5\x2f\xfd", 0, "application/zstd"),
    (b"7z\xbc\xaf\x27\x1c", 0, "application/x-7z-compressed"),
    (b"\x7fELF", 0, "application/x-elf"),
    (b"SQLite format 3\x00", 0, "application/vnd.sqlite3"),
    (b"\x00asm", 0, "application/wasm"),
    (b"OggS", 0, "audio/ogg"),
    (b"ID3", 0, "audio/mpeg"),
    (b"fLaC", 0, "audio/flac"),
    (b"\x93NUMPY", 0, "application/x-npy"),
    (b"PAR1", 0, "application/vnd.apache.parquet"),
)


def sniff_content_type(data: bytes) -> str:
    """A content type from the bytes alone.

    Text is reported as ``text/plain`` or ``application/json`` and never as HTML or SVG,
    even when it is markup: whatever serves an artifact must not render the sandbox's bytes
    as a page from a trusted origin.
    """
    for magic, offset, kind in _MAGIC:
        if data[offset : offset + len(magic)] == magic:
            return kind
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "audio/wav"
    if data[4:8] == b"ftyp":
        return "video/mp4"
    if not data:
        return "application/octet-stream"
    if b"\x00" in data[:8192]:
        return "application/octet-stream"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "application/octet-stream"
    controls = sum(1 for ch in text[:8192] if ord(ch) < 32 and ch not in "\t\n\r\f\b")
    if controls * 100 > min(len(text), 8192):
        return "application/octet-stream"
    stripped = text.lstrip()
    if stripped[:1] in ("{", "[") and len(data) <= 8 * 1024 * 1024:
        try:
            # The program wrote these bytes: measured before parsing, like any frame, so a
            # deep or wide text costs the host a scan, never a recursion or a huge tree.
            check_shape(data, _SNIFF_SHAPE, "the file")
            json.loads(text)
        except (ValueError, ProtocolViolation, RecursionError):
            pass
        else:
            return "application/json"
    return "text/plain; charset=utf-8"
