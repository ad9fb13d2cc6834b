"""Every ceiling of the wire protocol, each with the reason for its number.

Pure constants: no I/O. The bootstrap keeps its own copies (it is stdlib-only and must not
import this package); a test keeps the two in step.
"""

from __future__ import annotations

#: Version spoken by this host and the bootstrap shipped beside it.
PROTOCOL_VERSION = 1

#: Largest frame the host accepts from a child, in bytes, newline included: the channel's
#: absolute ceiling, whatever the frame's kind. A child frame carries either the containment
#: report (a few KB), one binding call (its arguments are separately capped by the budget, a
#: few MB at most) or the result (the return value is capped by configuration, tens of KB by
#: default). 16 MiB leaves room for every configured cap we allow while bounding what a
#: hostile child can make the host buffer. Each kind has a tighter ceiling of its own, below.
MAX_CHILD_FRAME_BYTES = 16 * 1024 * 1024

#: Every child frame begins with its type, ``{"type":"KIND",``, within this many bytes (the
#: bootstrap writes it first, without spaces). The reader knows a frame's kind, and so its
#: ceiling, from these first bytes: a frame longer than its kind allows is cut off while it
#: arrives, before any of it is parsed.
MAX_FRAME_HEAD_BYTES = 64

#: Longest hello frame. The report's fields are all bounded by the frame model: 256 interface
#: names of 64 characters and two 4096-character strings, each character at most 12 bytes
#: once escaped, plus 32 limits, come to about 300 KB.
MAX_HELLO_FRAME_BYTES = 512 * 1024

#: A call frame's bytes around its arguments: the type, an id of at most 16 digits and a
#: tool name of at most 256 characters (12 bytes each at worst, escaped). The call frame
#: ceiling is the execution's argument budget plus this, so arguments over the budget are
#: refused by the frame's length, before they are parsed.
CALL_FRAME_ENVELOPE_BYTES = 4 * 1024

#: Longest cancel frame: its type and an id of at most 16 digits come to about 40 bytes;
#: the rest is room for JSON whitespace.
MAX_CANCEL_FRAME_BYTES = 256

#: An artifact frame's bytes around its chunk: a path of at most 4096 characters (12 bytes
#: each at worst, escaped), an offset and a flag. Also the ceiling of an artifact_skipped
#: frame, which carries a path and a reason only.
ARTIFACT_FRAME_ENVELOPE_BYTES = 64 * 1024

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

#: What the run frame says about each tool, so the program can read it from TOOLS: a
#: description cut to this many characters, and an input schema (compact JSON text) only up
#: to this many; all descriptions and schemas together at most MAX_CATALOGUE_CHARS, past which
#: tools travel by name alone. With the names and the source that keeps a run frame under
#: MAX_HOST_FRAME_BYTES at 12 bytes a character, escaped; the program asks get_tool_info for
#: what was left out.
MAX_CATALOGUE_DESCRIPTION_CHARS = 1024
MAX_CATALOGUE_SCHEMA_CHARS = 16 * 1024
MAX_CATALOGUE_CHARS = 2 * 1024 * 1024

#: Longest free-text field (messages, tracebacks, type names) the host keeps from a child.
MAX_TEXT_CHARS = 256 * 1024

#: Call ids are JSON integers; bounding them keeps them exact in every JSON implementation.
MAX_CALL_ID = 2**53 - 1

#: Frames a child may send in one execution: hello, calls and result. A child that
#: sends more than its call budget plus a margin is spamming the channel.
MAX_FRAMES_MARGIN = 16


#: Room for a raised result's text: its message and traceback, each at most MAX_TEXT_CHARS
#: characters of up to 12 bytes once escaped (a character outside the BMP as a surrogate
#: pair). A result carries this text or a value, never both.
RESULT_TEXT_BYTES = 2 * MAX_TEXT_CHARS * 12


def max_return_value_bytes() -> int:
    """Largest return-value cap a configuration may set and still fit in one frame."""
    return (MAX_CHILD_FRAME_BYTES - RESULT_FRAME_OVERHEAD_BYTES) // JSON_STRING_ESCAPE_FACTOR


def call_frame_ceiling(argument_bytes: int) -> int:
    """Longest call frame for an argument budget of ``argument_bytes`` (newline excluded)."""
    return min(argument_bytes + CALL_FRAME_ENVELOPE_BYTES, MAX_CHILD_FRAME_BYTES - 1)


def result_frame_ceiling(return_value_bytes: int) -> int:
    """Longest result frame for a return-value cap of ``return_value_bytes``."""
    carried = max(return_value_bytes * JSON_STRING_ESCAPE_FACTOR, RESULT_TEXT_BYTES)
    return min(carried + RESULT_FRAME_OVERHEAD_BYTES, MAX_CHILD_FRAME_BYTES - 1)


#: Deepest JSON nesting a program may return or pass to a tool. The host's JSON parser stops
#: at 200 levels and a value sits a few levels down inside its frame; the bootstrap refuses
#: deeper data itself (as invalid output, or a TypeError in the program) rather than let an
#: honest program's frame be taken for a protocol violation.
MAX_JSON_DEPTH = 128

#: Most elements in a JSON value a program may return or pass to a tool, counted on the raw
#: text as the ``[``, ``{``, ``,`` and ``:`` outside strings (one per value or key the parser
#: builds; see protocol/shape.py). A parse costs up to a few hundred nanoseconds and about a
#: hundred bytes per element, holding the interpreter lock: 2**17 elements bounds one frame
#: to tens of milliseconds and megabytes, while a list of a hundred thousand numbers still
#: fits. The bootstrap refuses larger data itself, as it does deeper data.
MAX_JSON_ELEMENTS = 2**16

#: Nesting a frame adds around the value it carries (a call's arguments sit one level down),
#: and elements of its own (the hello's report is the widest: 32 limits, 256 interface
#: names). A frame deeper or wider than this allows is refused before it is parsed, so the
#: parser's own recursion limit (about 200 levels) is never what stops it.
FRAME_NESTING = 2
FRAME_ELEMENTS = 1024
MAX_FRAME_DEPTH = MAX_JSON_DEPTH + FRAME_NESTING
MAX_FRAME_ELEMENTS = MAX_JSON_ELEMENTS + FRAME_ELEMENTS


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
#: Longest artifact or artifact_skipped frame: a full chunk and its envelope.
MAX_ARTIFACT_FRAME_BYTES = ARTIFACT_CHUNK_BASE64_CHARS + ARTIFACT_FRAME_ENVELOPE_BYTES


#: A command (command mode) in a run frame: at most this many arguments, and this many
#: characters in all, each at most 12 bytes once escaped (3 MiB): Linux's own ceiling on one
#: argument is 128 KiB, and a command line a model writes is far shorter.
MAX_COMMAND_ARGS = 4096
MAX_COMMAND_CHARS = 256 * 1024

#: Files a run frame may place in the workspace before the program starts (inputs=): at most
#: this many, named by at most MAX_INPUT_NAME_CHARS characters (a file name's own ceiling on
#: Linux is 255 bytes), holding at most MAX_INPUT_BYTES together. Their base64 (8 MiB) fits
#: beside the largest source, tool list and catalogue a run frame carries (about 54 MiB at
#: their worst, escaped) under MAX_HOST_FRAME_BYTES. Larger data is a binding's to serve.
MAX_INPUTS = 64
MAX_INPUT_NAME_CHARS = 255
MAX_INPUT_BYTES = 6 * 1024 * 1024
#: The base64 length of MAX_INPUT_BYTES: the bound of one input's field, checked before
#: anything is decoded.
MAX_INPUT_BASE64_CHARS = 4 * ((MAX_INPUT_BYTES + 2) // 3)
