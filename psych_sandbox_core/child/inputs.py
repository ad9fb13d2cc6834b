"""The run's input files, written into the fresh workspace: each created anew, never through a
link."""

# Uses names the other modules define: they run as one namespace (loader.py).
# ruff: noqa: F821

import os

MAX_INPUT_NAME_CHARS = 255


def write_inputs(inputs):
    """Write the run's input files into the workspace (this process's working directory,
    fresh, not yet touched by any program): each created anew, never through a link. None,
    or the error of the first that could not be written (the workspace's cap reached)."""
    import binascii

    for item in inputs:
        name = item.get("name") if isinstance(item, dict) else None
        try:
            if not isinstance(name, str) or not _safe_input_name(name):
                raise ValueError(f"{name!r} cannot name an input file")
            data = binascii.a2b_base64(item.get("data") or "")
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            fd = os.open(name, flags | getattr(os, "O_NOFOLLOW", 0), 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
        except (OSError, ValueError, binascii.Error) as exc:
            if isinstance(exc, OSError):
                exc = OSError(exc.errno, f"writing input file {name!r}: {exc.strerror}")
            return {"outcome": "raised", "error": describe_exception(exc)}
    return None


def _safe_input_name(name):
    return (
        0 < len(name) <= MAX_INPUT_NAME_CHARS
        and name not in (".", "..")
        and not any(c in name for c in "/\\\0")
    )
