"""Tools listed for a model, one compact line each, in the form a program calls them."""

from __future__ import annotations

import builtins
import json
import keyword

from .bindings import ToolSpec

#: Names the program's namespace already holds (bootstrap.py), which no alias replaces.
_PROGRAM_NAMES = frozenset(
    {
        "__name__",
        "__builtins__",
        "__doc__",
        "TOOLS",
        "ToolError",
        "ToolResultHandle",
        "call_tool",
        "read_tool_output",
    }
)

#: Characters of a tool's description in a listing line.
LISTING_DESCRIPTION_CHARS = 160


def listing_line(spec: ToolSpec) -> str:
    """``name(arg: type, optional?: type) - what it does``, in the form a program calls it."""
    schema = spec.input_schema or {}
    properties = schema.get("properties")
    required = schema.get("required")
    arguments = []
    if isinstance(properties, dict):
        needed = set(required) if isinstance(required, list) else set()
        for name, prop in properties.items():
            kind = prop.get("type", "any") if isinstance(prop, dict) else "any"
            if isinstance(prop, dict) and isinstance(prop.get("enum"), list):
                kind = "|".join(json.dumps(v) for v in prop["enum"][:8])
            mark = "" if name in needed else "?"
            arguments.append(f"{name}{mark}: {kind}")
    call = (
        f"{spec.name}({', '.join(arguments)})"
        if has_alias(spec.name)
        else f"call_tool({json.dumps(spec.name)}, {{{', '.join(arguments)}}})"
    )
    description = " ".join(spec.description.split())
    if len(description) > LISTING_DESCRIPTION_CHARS:
        description = description[: LISTING_DESCRIPTION_CHARS - 1] + "…"
    return f"{call} - {description}" if description else call


def has_alias(name: str) -> bool:
    """Whether the program gets a direct alias for the tool (the child's rule: a usable
    identifier that is no keyword and hides neither a builtin nor a name it already has)."""
    return (
        name.isidentifier()
        and not keyword.iskeyword(name)
        and name not in _PROGRAM_NAMES
        and not hasattr(builtins, name)
    )
