"""Running the program: the caller's variables and preamble in its namespace, then the program,
and its result (a JSON return value within the cap, the variables kept, a call never awaited
named)."""

# Uses names the other modules define: they run as one namespace (loader.py).
# ruff: noqa: F821

#: The caller's code run ahead of the program, compiled apart so the program's own line
#: numbers and file name are what its tracebacks show.
PREAMBLE_FILENAME = "<preamble>"


def run_program(channel, frame):
    tools = frame.get("tools") or []
    limits = frame.get("limits") or {}
    cap = int(limits.get("return_value_bytes") or 0)
    argument_bytes = limits.get("argument_bytes")
    if not isinstance(argument_bytes, int) or argument_bytes <= 0:
        argument_bytes = MAX_CHILD_FRAME_BYTES - 1 - CALL_FRAME_ENVELOPE_BYTES
    channel.start_calls(limits.get("calls_in_flight"))
    namespace = _make_namespace(channel, tools, argument_bytes, frame.get("catalogue"))
    given = _give_names(namespace, frame)
    if given is not None:
        return given
    try:
        code, is_async = build_program(frame["source"])
    except SyntaxError as exc:
        return {"outcome": "raised", "error": describe_exception(exc)}
    except ValueError as exc:
        # The compiler refuses what it cannot build (a NUL byte in the text).
        return {"outcome": "raised", "error": describe_exception(exc)}
    except (MemoryError, RecursionError):
        # Nesting beyond the parser's stack: the program's shape, not the memory limit.
        error = SyntaxError("the program is nested too deeply for the compiler")
        return {"outcome": "raised", "error": describe_exception(error)}
    global _PROGRAM_SOURCE
    _PROGRAM_SOURCE = frame["source"]
    try:
        exec(code, namespace)
        main = namespace.pop(MAIN_NAME)
        main.__code__ = main.__code__.replace(co_name="<module>")
        if is_async:
            import asyncio

            value = asyncio.run(main())
        else:
            value = main()
    except SystemExit as exc:
        if exc.code in (None, 0):
            value = None
        else:
            return {"outcome": "raised", "error": describe_exception(exc)}
    except BaseException as exc:
        return {"outcome": "raised", "error": describe_exception(exc)}
    returned = _returned(value, cap)
    if returned["outcome"] != "returned" or not frame.get("keep_variables"):
        return returned
    # Only after a return: a raised result's text and the variables together could outweigh
    # the result frame's ceiling, which allows for one or the other.
    return _kept(returned, namespace, cap - len((returned.get("value_json") or "").encode()))


def _give_names(namespace, frame):
    """The caller's names (variables, then its preamble) put in the program's namespace;
    a result when that failed (the program then does not run)."""
    variables_json = frame.get("variables_json")
    if isinstance(variables_json, str):
        namespace.update(json_loads(variables_json))  # identifiers, checked by the host
    preamble = frame.get("preamble")
    if not isinstance(preamble, str):
        return None
    try:
        exec(compile(preamble, PREAMBLE_FILENAME, "exec", dont_inherit=True), namespace)
    except BaseException as exc:
        error = describe_exception(exc)
        error["message"] = ("the preamble raised, so the program did not run: " + error["message"])[
            : 256 * 1024
        ]
        return {"outcome": "raised", "error": error}
    return None


def _kept(result, namespace, room):
    """``result`` with the program's global names that hold JSON data (the run frame's
    keep_variables): names starting with "_", the namespace's own and those whose value is
    not JSON data (modules, functions, objects) are left out. They share the return value's
    cap with it (``room`` is what the value left); past it the result is output_limit."""
    own = NAMESPACE_NAMES | {"__name__", "__builtins__", "__doc__"}
    kept = {}
    for name, value in list(namespace.items()):
        if not isinstance(name, str) or name.startswith("_") or name in own:
            continue
        try:
            json_dumps(value)
        except Exception:  # not JSON data, or an object of the program's that fails to say
            continue
        if json_problem(value) is None:
            kept[name] = value
    problem = json_problem(kept)
    if problem is not None:
        return {
            "outcome": "invalid_output",
            "detail": f"the program's variables cannot be sent: {problem}",
        }
    encoded = json_dumps(kept)
    if len(encoded.encode()) > room:
        detail = (
            f"the program's variables are {len(encoded.encode())} bytes as JSON, over "
            f"the {max(room, 0)} bytes left of the return value's limit"
        )
        return {"outcome": "output_limit", "detail": detail}
    return dict(result, variables_json=encoded)


def _returned(value, cap):
    """The result of a program that returned ``value``."""
    if isinstance(value, _ToolCall):
        value.close()
        return _not_awaited(value._what, value._line)
    if _NOT_AWAITED:
        return _not_awaited(*_NOT_AWAITED[0])
    if isinstance(value, ToolResultHandle):
        value = value.to_json()
    try:
        encoded = json_dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        return {
            "outcome": "invalid_output",
            "detail": (
                f"the return value of type {type(value).__name__} is not JSON-serialisable: {exc}"
            )[:4096],
        }
    problem = json_problem(value) if len(encoded) <= cap else None
    if problem is not None:
        return {
            "outcome": "invalid_output",
            "detail": f"the return value of type {type(value).__name__} cannot be sent: {problem}",
        }
    if len(encoded.encode()) > cap:
        return {
            "outcome": "output_limit",
            "detail": (
                f"the return value is {len(encoded.encode())} bytes as JSON, over the "
                f"{cap}-byte limit"
            ),
        }
    return {"outcome": "returned", "value_json": encoded}


def _not_awaited(what, line):
    error = describe_exception(NotAwaitedError(_not_awaited_message(what, line)))
    error["line"] = line
    return {"outcome": "raised", "error": error}
