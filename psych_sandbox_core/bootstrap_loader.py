"""How the bootstrap reaches a child's interpreter: as ``-c`` source, or precompiled.

Compiling the bootstrap's source costs a few milliseconds on every start. Where the host can
run the very interpreter the child will run (the subprocess and bwrap backends bind the same
binary), it compiles the bootstrap once with that interpreter and passes the marshalled code
on the command line; a short ``-c`` stub loads it. It does so from the second start with an
interpreter on: compiling costs a start of that interpreter, more than the child's own
compile, so a process that starts one child (the ``psych-sandbox`` command) never pays it.
Marshal data is only valid for the interpreter that wrote it, so it is never reused across
interpreters, and anything unexpected falls back to the plain source, which works everywhere.
"""

from __future__ import annotations

import hashlib
import subprocess
from functools import lru_cache
from importlib import resources

#: Loads the marshalled bootstrap passed as the first argument into ``__main__`` (as ``-c``
#: source would run), leaving argv as the bootstrap expects it: ``-c`` and its options. The
#: code travels compressed (zlib is built into CPython; decompressing costs well under a
#: millisecond): marshalled code is about twice its source, and must fit in one argument.
_STUB = (
    "import sys,marshal,binascii,zlib;"
    "exec(marshal.loads(zlib.decompress(binascii.a2b_base64(sys.argv.pop(1)))))"
)
_COMPILER = (
    "import sys,marshal,binascii,zlib;"
    "sys.stdout.write(binascii.b2a_base64(zlib.compress(marshal.dumps(compile(sys.stdin.read(),"
    "'<bootstrap>','exec',dont_inherit=True)),9),newline=False).decode())"
)
#: Linux refuses a single argument longer than 128 KiB (MAX_ARG_STRLEN); stay below it.
MAX_PAYLOAD_CHARS = 120 * 1024


def bootstrap_arguments(interpreter: str | None, source: str) -> list[str]:
    """The interpreter arguments that run ``source``: precompiled for ``interpreter`` when
    the host can run it and has started it with this source before, else the source itself."""
    if interpreter is not None:
        start = (interpreter, hashlib.sha256(source.encode()).hexdigest())
        if start in _STARTED:
            payload = _compiled(*start, source)
            if payload is not None:
                return ["-c", _STUB, payload]
        _STARTED.add(start)
    return ["-c", source]


#: (interpreter, digest of the source) of every start so far in this process.
_STARTED: set[tuple[str, str]] = set()


@lru_cache(maxsize=16)
def _compiled(interpreter: str, digest: str, source: str) -> str | None:
    try:
        completed = subprocess.run(
            [interpreter, "-I", "-S", "-c", _COMPILER],
            input=source.encode(),
            capture_output=True,
            env={},
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    payload = completed.stdout.decode("ascii", errors="replace")
    if not payload or len(payload) > MAX_PAYLOAD_CHARS:
        return None
    return payload


@lru_cache(maxsize=1)
def bootstrap_source() -> str:
    """The child-side bootstrap, passed to the interpreter as ``-c`` source."""
    return resources.files(__package__).joinpath("bootstrap.py").read_text(encoding="utf-8")
