"""What a tool is and how it is described: to the program, to the model, and on the wire.

A :class:`ToolSpec` carries a tool's name, a description and a JSON schema of its input (for
a Python function, taken from its signature and docstring by :func:`spec_from_function`).
One execution's :class:`Catalogue` is built from the specs listed for it. It gives

- the entries the run frame carries, so ``TOOLS`` in the program exposes each tool's name,
  alias, description and schema (bounded: a huge catalogue sends the rest by name only);
- the two catalogue lookups a program may call, ``list_tools`` and ``get_tool_info``:
  bounded, read-only, answered on the host like any binding call;
- :func:`describe_tools`, the compact text a model needs to write a program against them.

The alias rule (which names get a direct alias in the program) is the bootstrap's; the child
keeps its own copy of :func:`alias_for`, and a test keeps the two in step.
"""

from __future__ import annotations

import builtins
import inspect
import json
import keyword
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ..protocol.frames import CatalogueEntry
from ..protocol.limits import (
    MAX_CATALOGUE_CHARS,
    MAX_CATALOGUE_DESCRIPTION_CHARS,
    MAX_CATALOGUE_SCHEMA_CHARS,
)

#: The built-in catalogue lookups, answered by the host from this execution's catalogue.
LIST_TOOLS = "list_tools"
GET_TOOL_INFO = "get_tool_info"
LOOKUPS = (LIST_TOOLS, GET_TOOL_INFO)
#: Names the program's namespace defines itself: never a tool's alias.
NAMESPACE_NAMES = frozenset({"TOOLS", "ToolError", "ToolResultHandle", "call_tool", *LOOKUPS})
#: Tools one list_tools answer holds at most, and when the program names no limit.
MAX_LIST_LIMIT = 500
DEFAULT_LIST_LIMIT = 100
#: Characters of a description list_tools hands back per tool (its first line).
LIST_DESCRIPTION_CHARS = 200
#: Longest description a spec keeps; get_tool_info hands back at most this much.
MAX_DESCRIPTION_CHARS = 16 * 1024
#: Longest query list_tools accepts.
MAX_QUERY_CHARS = 256


@dataclass(frozen=True)
class ToolSpec:
    """One tool a provider offers right now."""

    name: str
    #: Whether calling it may suspend the run (approval-gated, elicitation, a question to a
    #: person). Such tools are never offered to a program.
    may_suspend: bool = False
    #: What the tool does, for the model and the program (a docstring, an MCP description).
    description: str = ""
    #: JSON schema of its arguments object; its ``properties`` order is the order an alias
    #: takes positional arguments in. None: unknown (the alias takes keywords only).
    input_schema: dict[str, Any] | None = None


class CatalogueError(Exception):
    """A lookup the program asked for cannot be answered; ``kind`` says why."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def alias_for(name: str) -> str | None:
    """The direct alias a tool gets in the program: its own name when that is a usable
    identifier that hides nothing (no keyword, builtin or name of the namespace's own);
    never a mangled one, so two tools can never answer for each other."""
    if (
        name.isidentifier()
        and not keyword.iskeyword(name)
        and name not in NAMESPACE_NAMES
        and not hasattr(builtins, name)
    ):
        return name
    return None


def spec_from_function(
    function: Callable[..., Any], *, name: str | None = None, may_suspend: bool = False
) -> ToolSpec:
    """A tool's spec from a Python function: its docstring and a JSON schema of its
    parameters (pydantic's, as validate_call sees them; untyped parameters accept anything)."""
    description = _clip(inspect.getdoc(function) or "", MAX_DESCRIPTION_CHARS)
    return ToolSpec(
        name=name or str(getattr(function, "__name__", "tool")),
        may_suspend=may_suspend,
        description=description,
        input_schema=_function_schema(function),
    )


def _function_schema(function: Callable[..., Any]) -> dict[str, Any] | None:
    from pydantic import TypeAdapter

    try:
        schema = TypeAdapter(cast(Any, function)).json_schema()
    except Exception:
        # A type pydantic cannot describe: the parameters' names and order, nothing more.
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError):
            return None
        return _signature_schema(signature)
    properties = schema.get("properties")
    if isinstance(properties, dict):
        for parameter, member in properties.items():
            # pydantic titles every property after its name: noise to a model.
            if isinstance(member, dict) and member.get("title") == _auto_title(parameter):
                del member["title"]
    return schema


def _signature_schema(signature: inspect.Signature) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    required: list[str] = []
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        properties[parameter.name] = {}
        if parameter.default is parameter.empty:
            required.append(parameter.name)
    return {"type": "object", "properties": properties, "required": required}


def _auto_title(name: str) -> str:
    return name.replace("_", " ").strip().title()


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _first_line(text: str, limit: int) -> str:
    line = text.strip().split("\n", 1)[0].strip()
    return _clip(line, limit)


def _dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))


class Catalogue:
    """The tools one execution's program can see, and the lookups it may make over them."""

    def __init__(self, specs: Sequence[ToolSpec]) -> None:
        self._specs = {spec.name: spec for spec in specs}
        self._order = [spec.name for spec in specs]
        # What a query is matched against (name and the description's head, lower-cased),
        # built at the first query: every query then costs the same, whatever the tools say.
        self._haystacks: list[tuple[str, ToolSpec]] | None = None

    def entries(self) -> list[CatalogueEntry]:
        """What the run frame carries for each tool, in order. Bounded: past
        MAX_CATALOGUE_CHARS of descriptions and schemas, tools travel by name alone (the
        program learns the rest through get_tool_info)."""
        room = MAX_CATALOGUE_CHARS
        entries = []
        for name in self._order:
            spec = self._specs[name]
            description = _clip(spec.description, MAX_CATALOGUE_DESCRIPTION_CHARS)
            schema = _schema_json(spec.input_schema)
            if schema is not None and len(schema) > MAX_CATALOGUE_SCHEMA_CHARS:
                schema = None
            size = len(description) + len(schema or "")
            if size > room:
                description, schema, size = "", None, 0
            room -= size
            entries.append(
                CatalogueEntry.model_construct(
                    name=name, description=description, input_schema_json=schema
                )
            )
        return entries

    def answer(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """A lookup's answer (``name`` is one of LOOKUPS); raises CatalogueError."""
        if name == LIST_TOOLS:
            return self.list_tools(arguments)
        return self.get_tool_info(arguments)

    def list_tools(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        unexpected = sorted(set(arguments) - {"query", "offset", "limit"})
        if unexpected:
            raise CatalogueError(
                "invalid_arguments",
                f"list_tools got unexpected arguments {unexpected}; it takes query=, offset= "
                "and limit=",
            )
        query = arguments.get("query")
        offset = arguments.get("offset", 0)
        limit = arguments.get("limit", DEFAULT_LIST_LIMIT)
        if query is not None and (not isinstance(query, str) or len(query) > MAX_QUERY_CHARS):
            raise CatalogueError(
                "invalid_arguments", f"query must be a str of at most {MAX_QUERY_CHARS} characters"
            )
        if not _is_int(offset) or offset < 0:
            raise CatalogueError("invalid_arguments", "offset must be an int >= 0")
        if not _is_int(limit) or not 0 < limit <= MAX_LIST_LIMIT:
            raise CatalogueError(
                "invalid_arguments", f"limit must be an int from 1 to {MAX_LIST_LIMIT}"
            )
        words = (query or "").lower().split()
        if self._haystacks is None:
            self._haystacks = [
                (f"{spec.name}\n{spec.description[:MAX_CATALOGUE_DESCRIPTION_CHARS]}".lower(), spec)
                for spec in (self._specs[name] for name in self._order)
            ]
        matching = [spec for text, spec in self._haystacks if all(w in text for w in words)]
        page = matching[offset : offset + limit]
        end = offset + len(page)
        return {
            "tools": [
                {
                    "name": spec.name,
                    "description": _first_line(spec.description, LIST_DESCRIPTION_CHARS),
                }
                for spec in page
            ],
            "total": len(matching),
            "next_offset": end if end < len(matching) else None,
        }

    def get_tool_info(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        unexpected = sorted(set(arguments) - {"name"})
        name = arguments.get("name")
        if unexpected or not isinstance(name, str):
            raise CatalogueError("invalid_arguments", "get_tool_info takes one argument, name=")
        spec = self._specs.get(name)
        if spec is None:
            raise CatalogueError(
                "unknown_tool",
                f"no tool named {name[:300]!r} is offered to this program; list_tools() "
                "lists those that are",
            )
        return {
            "name": spec.name,
            "description": _clip(spec.description, MAX_DESCRIPTION_CHARS),
            "input_schema": spec.input_schema,
        }


def _schema_json(schema: dict[str, Any] | None) -> str | None:
    if schema is None:
        return None
    try:
        return _dumps(schema)
    except (TypeError, ValueError, RecursionError):
        return None  # not JSON data: nothing the program could read


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ---------------------------------------------------------------- the model's catalogue

#: Why a call fails, as a program sees it on ToolError.kind (bindings.CallErrorKind).
_KIND_LINES = (
    ("approval_required", "the tool needs a person; call it directly, not from a program"),
    ("refused", "policy refused the call"),
    ("unreachable", "the tool's server could not be reached"),
    ("tool_error", "the tool ran and failed"),
    ("invalid_arguments", "the arguments are not what the tool takes"),
    ("unknown_tool", "no such tool is offered"),
    ("budget_exhausted", "the program has spent a call or byte budget"),
    ("binding_result_not_paged", "the result was too large and could not be stored"),
    ("cancelled", "the execution was cancelled"),
)

#: Default size of describe_tools' text, in characters.
DEFAULT_DESCRIBE_CHARS = 24_000


def describe_tools(
    tools: Iterable[ToolSpec | str],
    *,
    max_chars: int = DEFAULT_DESCRIBE_CHARS,
    description_chars: int = 160,
    paging: bool = False,
    read_output: bool = False,
) -> str:
    """The text a model needs to write a program against ``tools``: how to call them (aliases,
    positional arguments in schema order, ``call_tool`` for any name), the await rule, the
    catalogue lookups and the ToolError kinds, then one line per tool.

    At most ``max_chars`` characters: with hundreds of tools, those that no longer fit are
    named without their signature, and past that counted, with how to list them
    (``list_tools``/``get_tool_info`` from the program). ``paging`` and ``read_output`` say
    whether read_tool_output and read_output are offered (a blob store, a profile setting).
    """
    specs = [ToolSpec(t) if isinstance(t, str) else t for t in tools]
    specs = [s for s in specs if not s.may_suspend]
    head = [
        "Write one Python program; it runs in a sandbox. Top-level `await` works, and the "
        "value of the last expression is returned (JSON data). print() output is returned too.",
        "Every tool is an async function: write `result = await tool(...)`. A call without "
        "`await` does nothing, and the program fails saying so. Run calls together with "
        "`await asyncio.gather(tool_a(...), tool_b(...))`.",
        "Call a tool by its name below, with keyword arguments or positional ones in the "
        "order shown. A name that is not a Python identifier is called as "
        '`await call_tool("name", {"arg": value})`.',
        "`TOOLS` lists the tools (each has .name, .alias, .description, .schema); "
        '`await list_tools(query="words")` searches them and `await get_tool_info("name")` '
        "returns one tool's description and input schema.",
    ]
    if paging:
        head.append(
            "A result too large to hand over whole arrives as a ToolResultHandle: read it with "
            "`await read_tool_output(handle, offset=0, length=...)` or `pattern=...`."
        )
    if read_output:
        head.append(
            "`await read_output(handle, offset=0, length=...)` (or `pattern=...`) reads an "
            "earlier execution's truncated output by the handle its result named."
        )
    head.append(
        "A failed call raises ToolError; branch on its .kind: "
        + "; ".join(f"{kind} ({why})" for kind, why in _KIND_LINES)
        + "."
    )
    text = "\n".join(head) + f"\n\nTools ({len(specs)}):\n"
    lines: list[str] = []
    used = len(text)
    index = 0
    # Signatures and a line of description while they fit in the budget...
    for index, spec in enumerate(specs):  # noqa: B007 (index is read after the loop)
        line = "- " + tool_line(spec, description_chars)
        if used + len(line) + 1 > max_chars - 200:
            break
        lines.append(line)
        used += len(line) + 1
    else:
        index = len(specs)
    # ...then bare names, then a count: the model can still list the rest from its program.
    rest = specs[index:]
    named: list[str] = []
    for spec in rest:
        shown = _call_form(spec)
        if used + len(shown) + 2 > max_chars - 120:
            break
        named.append(shown)
        used += len(shown) + 2
    if named:
        lines.append(
            "More tools (`await get_tool_info(name)` for their arguments): " + ", ".join(named)
        )
    unlisted = len(rest) - len(named)
    if unlisted:
        lines.append(
            f"…and {unlisted} more: `await list_tools(offset={len(specs) - unlisted})` lists them."
        )
    return text + "\n".join(lines)


def _call_form(spec: ToolSpec) -> str:
    alias = alias_for(spec.name)
    return alias if alias is not None else f"call_tool({spec.name!r}, ...)"


#: Characters of a tool's description in one line of a listing.
LISTING_DESCRIPTION_CHARS = 160


def tool_line(spec: ToolSpec, description_chars: int = LISTING_DESCRIPTION_CHARS) -> str:
    """One tool in one line, in the form a program calls it: ``name(arg: type, ...): what
    it does``, or through ``call_tool`` where it has no alias."""
    parameters = _parameters(spec.input_schema)
    alias = alias_for(spec.name)
    if alias is not None:
        call = f"{alias}({parameters})" if parameters is not None else f"{alias}(**arguments)"
    else:
        call = f"call_tool({spec.name!r}, {{{parameters or '...'}}})"
    description = _first_line(spec.description, description_chars)
    return call + (f": {description}" if description else "")


def _parameters(schema: dict[str, Any] | None) -> str | None:
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return None
    required = schema.get("required")
    required = set(required) if isinstance(required, list) else set()
    out = []
    for name, member in schema["properties"].items():
        shown = f"{name}: {_type_of(member)}"
        if name not in required:
            default = member.get("default") if isinstance(member, dict) else None
            shown += f" = {_short(default)}"
        out.append(shown)
    return ", ".join(out)


_JSON_TYPES = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "array": "list",
    "object": "dict",
    "null": "None",
}


def _type_of(member: Any, depth: int = 0) -> str:
    if not isinstance(member, dict) or depth > 3:
        return "Any"
    if "enum" in member and isinstance(member["enum"], list):
        return " | ".join(_short(v) for v in member["enum"][:8])
    options = member.get("anyOf") or member.get("oneOf")
    if isinstance(options, list) and options:
        return " | ".join(_type_of(option, depth + 1) for option in options[:6])
    kind = member.get("type")
    if isinstance(kind, list):
        return " | ".join(_JSON_TYPES.get(k, "Any") for k in kind if isinstance(k, str))
    if kind == "array" and isinstance(member.get("items"), dict):
        return f"list[{_type_of(member['items'], depth + 1)}]"
    return _JSON_TYPES.get(kind, "Any") if isinstance(kind, str) else "Any"


def _short(value: Any) -> str:
    return _clip(repr(value), 40)
