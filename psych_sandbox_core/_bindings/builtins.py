"""The built-in bindings the host itself answers: their names and how TOOLS describes them.

read_tool_output reads a result too large to hand over whole (paged through the blob store);
read_output reads an earlier execution's output of the same tenant and run. The call server
(call_server.py) offers them and answers them; a provider's tool of the same name is
shadowed.
"""

from __future__ import annotations

from typing import Any

from .._output.paging import DEFAULT_MAX_MATCHES, DEFAULT_WINDOW_CHARS
from .catalogue import ToolSpec

#: The built-in binding that reads a result too large to hand over whole.
READ_TOOL_OUTPUT = "read_tool_output"
#: The built-in binding (enabled by a profile's ``output.read_output``) that reads an earlier
#: execution's output of the same tenant and run by its attachment handle.
READ_OUTPUT = "read_output"

_READ_PROPERTIES: dict[str, Any] = {
    "offset": {"type": "integer", "default": 0},
    "length": {"type": "integer", "default": DEFAULT_WINDOW_CHARS},
    "pattern": {"type": "string"},
    "ignore_case": {"type": "boolean", "default": False},
    "max_matches": {"type": "integer", "default": DEFAULT_MAX_MATCHES},
}
BUILTIN_SPECS = {
    READ_TOOL_OUTPUT: ToolSpec(
        READ_TOOL_OUTPUT,
        description=(
            "Read a tool result too large to hand over whole, by its ToolResultHandle: a "
            "window of its JSON text (offset, length, in characters) or the matches of a "
            "regular expression (pattern, ignore_case, max_matches)."
        ),
        input_schema={
            "type": "object",
            "properties": {"handle": {"type": "object"}, **_READ_PROPERTIES},
            "required": ["handle"],
        },
    ),
    READ_OUTPUT: ToolSpec(
        READ_OUTPUT,
        description=(
            "Read an earlier execution's output (stdout, stderr, return value, an artifact) "
            "by the attachment handle its result named: a window of its text (offset, "
            "length, in characters) or the matches of a regular expression (pattern, "
            "ignore_case, max_matches)."
        ),
        input_schema={
            "type": "object",
            "properties": {"handle": {"type": "string"}, **_READ_PROPERTIES},
            "required": ["handle"],
        },
    ),
}
