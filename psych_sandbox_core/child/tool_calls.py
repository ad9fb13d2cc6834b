"""What the program calls tools with: its namespace (TOOLS, call_tool, the catalogue lookups,
a direct alias per tool), a call that runs only once awaited and says so when it is not,
ToolError and ToolResultHandle, and a reply made into the call's value."""

# Uses names the other modules define: they run as one namespace (loader.py).
# ruff: noqa: F821

import sys

#: A call frame's bytes around its arguments; the host's ceiling for a call frame is the
#: argument budget plus this. A copy of protocol/limits.py.
CALL_FRAME_ENVELOPE_BYTES = 4 * 1024
#: No tool has a longer name (the envelope above counts on it). A copy of protocol/limits.py.
MAX_TOOL_NAME_CHARS = 256


class ToolError(Exception):
    """A binding call failed; ``kind`` says how (see docs/protocol.md)."""

    def __init__(self, kind, message):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class ToolResultHandle:
    """A result too large to hand over whole: read it with read_tool_output()."""

    __slots__ = ("_descriptor",)

    def __init__(self, descriptor):
        self._descriptor = descriptor

    def _refuse(self, *args, **kwargs):
        raise TypeError(
            "this is a ToolResultHandle, not the tool's result: the result was too large to "
            "send whole. Read it in windows or search it with "
            "await read_tool_output(handle=..., offset=..., length=...) or pattern=..."
        )

    __len__ = __iter__ = __getitem__ = __contains__ = get = keys = items = values = _refuse

    def __repr__(self):
        return f"ToolResultHandle({self._descriptor!r})"

    def to_json(self):
        return dict(self._descriptor)


def _reply_value(reply):
    carries = reply.get("carries")
    if carries == "value":
        return json_loads(reply["value_json"])
    if carries == "handle":
        return ToolResultHandle(reply["handle"])
    raise ToolError(reply.get("error_kind") or "tool_error", reply.get("message") or "")


#: Names the namespace defines itself, never a tool's alias. A copy of catalogue.py's.
NAMESPACE_NAMES = frozenset(
    {"TOOLS", "ToolError", "ToolResultHandle", "call_tool", "list_tools", "get_tool_info"}
)
#: The catalogue lookups the host answers, when it offers them.
LOOKUPS = ("list_tools", "get_tool_info")


def alias_for(name):
    """A tool's direct alias: its own name when that is a usable identifier hiding nothing
    (no keyword, builtin or namespace name); never a mangled one. A copy of catalogue.py's."""
    import builtins
    import keyword

    if (
        name.isidentifier()
        and not keyword.iskeyword(name)
        and name not in NAMESPACE_NAMES
        and not hasattr(builtins, name)
    ):
        return name
    return None


class Tool(str):
    """One tool offered to the program: its name (it is that str), with ``.alias`` (the
    direct alias, or None: call it through call_tool), ``.description`` and ``.schema`` (the
    JSON schema of its arguments, or None when the host sent none: get_tool_info has it)."""

    name = ""
    alias = None
    description = ""
    _schema_json = None
    _schema = None

    def __new__(cls, name, description="", schema_json=None):
        self = str.__new__(cls, name)
        self.name = name
        self.alias = alias_for(name)
        self.description = description
        self._schema_json = schema_json
        self._schema = None
        return self

    @property
    def schema(self):
        if self._schema is None and self._schema_json is not None:
            self._schema = json_loads(self._schema_json)
        return self._schema

    def positional_order(self):
        schema = self.schema
        properties = schema.get("properties") if isinstance(schema, dict) else None
        return list(properties) if isinstance(properties, dict) else None


class NotAwaitedError(TypeError):
    """A tool was called without ``await``: the call never ran."""


class _NotAwaitedAttribute(NotAwaitedError, AttributeError):
    pass


#: Tool calls made and dropped without being awaited, as (what, line): the program fails
#: with the first when it otherwise finished, since the tools it meant to call never ran.
_NOT_AWAITED = []  # type: list[tuple[str, int | None]]


def _program_line():
    """The line of the model's program that is calling us (None if none is on the stack)."""
    frame = sys._getframe(2)
    for _ in range(32):
        if frame.f_code.co_filename == PROGRAM_FILENAME:
            return frame.f_lineno
        if frame.f_back is None:
            return None
        frame = frame.f_back
    return None


def _not_awaited_message(what, line):
    where = f"line {line}: " if line is not None else ""
    return (
        f"{where}{what} was called without await, so the tool never ran; every tool is an "
        f"async function: write `result = await {what}`"
    )


class _ToolCall:
    """What calling a tool returns: awaited (or gathered, or made a task) it makes the call.
    To asyncio it is a coroutine; used as a value it raises NotAwaitedError naming the line
    of the call, and dropped unawaited it fails the program saying so."""

    __slots__ = ("__weakref__", "_coroutine", "_factory", "_line", "_what")

    def __init__(self, factory, what, line):
        self._factory = factory
        self._coroutine = None
        self._what = what
        self._line = line

    def _started(self):
        if self._coroutine is None:
            self._coroutine = self._factory()
            self._factory = None
        return self._coroutine

    def __await__(self):
        return self._started().__await__()

    def send(self, value):
        return self._started().send(value)

    def throw(self, *args):
        return self._started().throw(*args)

    def close(self):
        self._factory = None  # closed: deliberately never run
        if self._coroutine is not None:
            self._coroutine.close()

    def __del__(self):
        if self._factory is not None:
            _NOT_AWAITED.append((self._what, self._line))

    def __repr__(self):
        return f"<call of {self._what}, not awaited>"

    def _misused(self, *args, **kwargs):
        raise NotAwaitedError(_not_awaited_message(self._what, self._line))

    def __getattr__(self, name):
        raise _NotAwaitedAttribute(_not_awaited_message(self._what, self._line))

    __getitem__ = __iter__ = __len__ = __contains__ = __bool__ = __str__ = _misused
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _misused
    __truediv__ = __floordiv__ = __mod__ = __lt__ = __le__ = __gt__ = __ge__ = _misused
    __int__ = __float__ = __index__ = __call__ = _misused


def _running_loop():
    """The asyncio loop running in this thread, if any (without importing asyncio)."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return None
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _make_namespace(channel, tools, argument_bytes, catalogue=None):
    import builtins

    async def perform(name, arguments):
        if not isinstance(name, str):
            raise TypeError("call_tool(name, arguments): name must be a str")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise TypeError("call_tool(name, arguments): arguments must be a dict")
        # A handle travels as its opaque descriptor (how read_tool_output names it).
        arguments = {
            key: value.to_json() if isinstance(value, ToolResultHandle) else value
            for key, value in arguments.items()
        }
        if json_problem(name) is not None:
            raise TypeError("call_tool(name, arguments): name must be valid Unicode text")
        if len(name) > MAX_TOOL_NAME_CHARS:
            raise ToolError(
                "unknown_tool",
                f"no tool has a name longer than {MAX_TOOL_NAME_CHARS} characters; TOOLS "
                "lists those offered",
            )
        try:
            encoded = json_text(arguments)
        except (TypeError, ValueError, RecursionError) as exc:
            raise TypeError(f"call_tool({name!r}): arguments must be JSON data: {exc}") from None
        problem = json_problem(arguments)
        if problem is not None:
            raise TypeError(f"call_tool({name!r}): arguments cannot be sent: {problem}")
        size = len(encoded.encode("utf-8"))
        if size > argument_bytes:
            # Checked here, before an id is spent: the host refuses a call frame longer than
            # the budget allows by its length alone, as a protocol violation. The words are
            # the host's own for arguments over the budget.
            raise ToolError(
                "budget_exhausted",
                f"the arguments are {size} bytes as JSON, over the per-call budget of "
                f"{argument_bytes} bytes",
            )
        loop = _running_loop()
        if loop is None:
            return channel.call(name, encoded)
        return await channel.call_async(name, encoded, loop)

    def call_tool(name, arguments=None):
        what = f"call_tool({name!r}, ...)" if isinstance(name, str) else "call_tool(...)"
        return _ToolCall(lambda: perform(name, arguments), what, _program_line())

    if catalogue is None:
        listed = [Tool(name) for name in tools if name not in LOOKUPS]
    else:
        listed = [
            Tool(entry.get("name"), entry.get("description") or "", entry.get("input_schema_json"))
            for entry in catalogue
        ]
    namespace = {
        "__name__": "__main__",
        "__builtins__": builtins,
        "__doc__": None,
        "TOOLS": tuple(listed),
        "ToolError": ToolError,
        "ToolResultHandle": ToolResultHandle,
        "call_tool": call_tool,
    }
    if all(name in tools for name in LOOKUPS):
        aliases = {tool.name: tool.alias for tool in listed}

        def list_tools(query=None, offset=0, limit=100):
            arguments = {"offset": offset, "limit": limit}
            if query is not None:
                arguments["query"] = query
            return _ToolCall(
                lambda: perform("list_tools", arguments), "list_tools(...)", _program_line()
            )

        async def info(name):
            answer = await perform("get_tool_info", {"name": name})
            if isinstance(answer, dict):
                answer["alias"] = aliases.get(name)
            return answer

        def get_tool_info(name):
            return _ToolCall(lambda: info(name), "get_tool_info(...)", _program_line())

        namespace["list_tools"] = list_tools
        namespace["get_tool_info"] = get_tool_info
    for tool in listed:
        # A direct alias only for names that are usable identifiers; never a mangled one, so
        # two tools whose names mangle alike can never answer for each other; and never one
        # that would hide a builtin (a tool named "print" stays reachable through call_tool).
        if tool.alias is not None and tool.alias not in namespace:
            namespace[tool.alias] = _alias(perform, tool)
    return namespace


def _alias(perform, tool):
    name = str(tool)
    what = f"{name}(...)"

    def alias(*args, **arguments):
        if args:
            # Positional arguments in the order of the tool's input schema.
            order = tool.positional_order()
            if order is None:
                raise TypeError(
                    f"{name}() takes keyword arguments only: its input schema is unknown "
                    f"(await get_tool_info({name!r}) may say more)"
                )
            if len(args) > len(order):
                raise TypeError(
                    f"{name}() takes at most {len(order)} positional arguments "
                    f"({', '.join(order)}) but {len(args)} were given"
                )
            for key, value in zip(order, args, strict=False):
                if key in arguments:
                    raise TypeError(f"{name}() got multiple values for argument {key!r}")
                arguments[key] = value
        return _ToolCall(lambda: perform(name, arguments), what, _program_line())

    alias.__name__ = alias.__qualname__ = name
    alias.__doc__ = tool.description or None
    return alias
