"""An exception described for the result: its traceback cut to the program's own frames, the
program's line and column."""

# Uses names the other modules define: they run as one namespace (loader.py).
# ruff: noqa: F821


def _filter_exception(te):
    import traceback

    seen = set()
    stack = [te]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        current.stack = traceback.StackSummary.from_list(
            [frame for frame in current.stack if frame.filename == PROGRAM_FILENAME]
        )
        stack.append(current.__cause__)
        stack.append(current.__context__)
        stack.extend(getattr(current, "exceptions", None) or [])


_PROGRAM_SOURCE = None


def _register_source():
    # Only when a traceback is formatted: linecache pulls in tokenize and re, which every
    # successful run would otherwise pay for at start-up.
    import linecache

    if _PROGRAM_SOURCE is not None:
        linecache.cache[PROGRAM_FILENAME] = (
            len(_PROGRAM_SOURCE),
            None,
            _PROGRAM_SOURCE.splitlines(True),
            PROGRAM_FILENAME,
        )


def describe_exception(exc):
    import traceback

    _register_source()

    te = traceback.TracebackException(type(exc), exc, exc.__traceback__, capture_locals=False)
    _filter_exception(te)
    text = "".join(te.format())
    line = column = None
    if isinstance(exc, SyntaxError) and exc.filename == PROGRAM_FILENAME:
        line, column = exc.lineno, exc.offset
    elif te.stack:
        line = te.stack[-1].lineno
    try:
        message = str(exc)
    except Exception:  # a hostile __str__ must not take the bootstrap down
        message = f"<unprintable {type(exc).__name__}>"
    return {
        "type": type(exc).__name__[:256],
        "message": message[: 256 * 1024],
        "traceback": text[-256 * 1024 :],
        "line": line if isinstance(line, int) and line >= 0 else None,
        "column": column if isinstance(column, int) and column >= 0 else None,
    }
