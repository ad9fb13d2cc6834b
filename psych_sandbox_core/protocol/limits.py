"""Every ceiling of the wire protocol, each with the reason for its number.

Pure constants: no I/O. The bootstrap keeps its own copies (it is stdlib-only and must not
import this package); a test keeps the two in step.
"""

from __future__ import annotations

#: Version spoken by this host and the bootstrap shipped beside it.
PROTOCOL_VERSION = 1

#: Largest frame the host accepts from a child, in bytes, newline included. A child frame
#: carries either the containment report (a few KB), one binding call (its arguments are
#: separately capped by the budget, a few MB at most) or the result (the return value is
#: capped by configuration, tens of KB by default). 16 MiB leaves room for every configured
#: cap we allow while bounding what a hostile child can make the host buffer.
MAX_CHILD_FRAME_BYTES = 16 * 1024 * 1024

#: Largest frame the host sends to a child. The run frame carries the program source and the
#: tool names; a reply carries one binding result under the per-call result ceiling.
MAX_HOST_FRAME_BYTES = 64 * 1024 * 1024

#: Bytes of framing around a JSON-encoded return value inside a result frame. A configured
#: return-value cap plus this must fit in MAX_CHILD_FRAME_BYTES; the value travels as JSON
#: text inside a JSON string, so escaping can grow it up to 6x (a control character as \\u00XX).
RESULT_FRAME_OVERHEAD_BYTES = 1024 * 1024
JSON_STRING_ESCAPE_FACTOR = 6

#: Longest program source accepted in a run frame (a model writes programs, not data dumps).
MAX_SOURCE_BYTES = 4 * 1024 * 1024

#: Most tool names one execution can be offered, and the longest name. An MCP server may hold
#: hundreds of tools; a few thousand bounds the run frame without limiting real agents.
MAX_TOOLS = 4096
MAX_TOOL_NAME_CHARS = 256

#: Longest free-text field (messages, tracebacks, type names) the host keeps from a child.
MAX_TEXT_CHARS = 256 * 1024

#: Call ids are JSON integers; bounding them keeps them exact in every JSON implementation.
MAX_CALL_ID = 2**53 - 1

#: Frames a child may send in one execution: hello, calls and result. A child that
#: sends more than its call budget plus a margin is spamming the channel.
MAX_FRAMES_MARGIN = 16


def max_return_value_bytes() -> int:
    """Largest return-value cap a configuration may set and still fit in one frame."""
    return (MAX_CHILD_FRAME_BYTES - RESULT_FRAME_OVERHEAD_BYTES) // JSON_STRING_ESCAPE_FACTOR


#: Deepest JSON nesting a program may return or pass to a tool. The host's JSON parser stops
#: at 200 levels and a value sits a few levels down inside its frame; the bootstrap refuses
#: deeper data itself (as invalid output, or a TypeError in the program) rather than let an
#: honest program's frame be taken for a protocol violation.
MAX_JSON_DEPTH = 128


#: Raw bytes in one artifact frame. A file travels as consecutive chunks of exactly this size
#: (the last may be shorter), so a child cannot make the host handle millions of tiny frames
#: for one file; 1 MiB encodes to about 1.4 MB of base64, far under the child frame ceiling.
ARTIFACT_CHUNK_BYTES = 1024 * 1024
#: The base64 length of a full chunk: the field's bound, checked before anything is decoded.
ARTIFACT_CHUNK_BASE64_CHARS = 4 * ((ARTIFACT_CHUNK_BYTES + 2) // 3)
#: Longest artifact path, in characters: Linux's PATH_MAX. Deeper trees are skipped anyway.
MAX_ARTIFACT_PATH_CHARS = 4096
#: Directory entries the child examines when it sends its workspace's files, and so the most
#: artifact paths it may name (plus the folder itself and the entry that hit the limit). The
#: same number bounds the host's own walk (artifacts.MAX_ENTRIES).
MAX_ARTIFACT_ENTRIES = 10_000
#: Deepest directory either walk enters below the collected folder.
MAX_ARTIFACT_DEPTH = 32
