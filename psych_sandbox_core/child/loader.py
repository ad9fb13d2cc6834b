"""How the bootstrap reaches a child's interpreter: as ``-c`` source, or precompiled.

Compiling the bootstrap's source costs a few milliseconds on every start. Where the host can
run the very interpreter the child will run (the subprocess and bwrap backends bind the same
binary), it compiles the bootstrap once with that interpreter and passes the marshalled code
on the command line; a short ``-c`` stub loads it. It does so from the second start with an
interpreter on: compiling costs a start of that interpreter, more than the child's own
compile, so a process that starts one child (the ``psych-sandbox`` command) never pays it.
Marshal data is only valid for the interpreter that wrote it, so it is never reused across
interpreters, and anything unexpected falls back to the plain source, which works everywhere.

Where the backend passes the child descriptors of its own (the subprocess and bwrap
backends), the code travels in a memory file instead, as it is: about 110 KiB of command
line costs an interpreter 2 to 3 ms of start-up decoding it (into sys.argv and
sys.orig_argv), and the text form's decompression more. The stub reads it and closes the
descriptor before the bootstrap runs, so no program ever holds it.

Where the child runs an interpreter the host cannot run and cannot be handed descriptors (a
container's, from its image), the host writes the code it compiled itself, after its
bytecode magic, with the source beside it, into a directory the child reads and can never
write (a container's read-only run directory); the child runs the code only if its own
interpreter has the same magic, and the source otherwise. Every start checks; nothing is
assumed about the image.

The source itself is assembled here from the bootstrap's modules (PARTS, in order): one text,
one namespace, with the first module's docstring as its own.
"""

from __future__ import annotations

import binascii
import hashlib
import importlib.util
import marshal
import os
import subprocess
import types
import zlib
from collections.abc import Iterable
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
#: The same from a memory file: its descriptor and size are the first two arguments.
_FILE_STUB = (
    "import sys,marshal,os;"
    "f=int(sys.argv.pop(1));c=os.pread(f,int(sys.argv.pop(1)),0);os.close(f);"
    "exec(marshal.loads(c))"
)
#: The files the directory stub below reads.
CODE_FILE = "bootstrap.code"
SOURCE_FILE = "bootstrap.py"
#: The same from files in a directory of the host's (its path in the child is the first
#: argument): the code after the magic of the interpreter that compiled it, which the child
#: runs only if its own has the same magic (marshalled code is valid for no other), else the
#: source. ``_frozen_importlib_external`` is loaded at every start: importing it costs nothing.
_DIRECTORY_STUB = (
    "import sys,marshal,_frozen_importlib_external as m\n"
    "d=sys.argv.pop(1)\n"
    f"with open(d+'/{CODE_FILE}','rb') as f:c=f.read()\n"
    "if c[:4]==m.MAGIC_NUMBER:c=marshal.loads(c[4:])\n"
    "else:\n"
    f" with open(d+'/{SOURCE_FILE}','rb') as f:c=f.read()\n"
    "exec(c)"
)
_COMPILER = (
    "import sys,marshal;"
    "sys.stdout.buffer.write(marshal.dumps(compile(sys.stdin.read(),"
    "'<bootstrap>','exec',dont_inherit=True)))"
)
#: Linux refuses a single argument longer than 128 KiB (MAX_ARG_STRLEN); stay below it.
MAX_PAYLOAD_CHARS = 120 * 1024


def bootstrap_arguments(
    interpreter: str | None, source: str, passed_fds: list[int] | None = None
) -> list[str]:
    """The interpreter arguments that run ``source``: precompiled for ``interpreter`` when
    the host can run it and has started it with this source before, else the source itself.

    With ``passed_fds`` (descriptors the caller passes to the child, then closes once it is
    spawned), precompiled code travels in a memory file whose descriptor is added to it."""
    if interpreter is not None:
        start = (interpreter, _digest(source))
        if start in _STARTED:
            code = _compiled(*start, source)
            if code is not None and passed_fds is not None:
                fd = _memory_file(code)
                if fd is not None:
                    passed_fds.append(fd)
                    return ["-c", _FILE_STUB, str(fd), str(len(code))]
            payload = None if code is None else _payload(code)
            if payload is not None:
                return ["-c", _STUB, payload]
        _STARTED.add(start)
    return ["-c", source]


#: (interpreter, digest of the source) of every start so far in this process.
_STARTED: set[tuple[str, str]] = set()


@lru_cache(maxsize=16)
def _digest(source: str) -> str:
    """The source's digest, once per source: hashing the bootstrap's 85 KB costs a host
    0.15 ms, on every execution's start otherwise (the source is the same object each time,
    so finding it here costs nothing)."""
    return hashlib.sha256(source.encode()).hexdigest()


@lru_cache(maxsize=16)
def _compiled(interpreter: str, digest: str, source: str) -> bytes | None:
    """The bootstrap compiled and marshalled by ``interpreter`` itself."""
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
    return completed.stdout or None


def directory_arguments(source: str, directory: str, child_directory: str) -> list[str]:
    """The interpreter arguments that run ``source`` from ``directory``, a directory of the
    host's that the child sees at ``child_directory``, can read and can never write: the
    bootstrap's files are written there now (readable by anyone, writable by no one but
    the host's owner). The child runs the code compiled here where its interpreter has this
    one's bytecode magic, else the source."""
    for name, data in (
        (CODE_FILE, _compiled_here(_digest(source), source)),
        (SOURCE_FILE, source.encode()),
    ):
        fd = os.open(
            os.path.join(directory, name),
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
            0o444,
        )
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
    return ["-c", _DIRECTORY_STUB, child_directory]


@lru_cache(maxsize=16)
def _compiled_here(digest: str, source: str) -> bytes:
    """The bootstrap compiled and marshalled by this process, after its bytecode magic (as
    a child started without -O would compile it)."""
    code = compile(source, "<bootstrap>", "exec", dont_inherit=True, optimize=0)
    return importlib.util.MAGIC_NUMBER + marshal.dumps(code)


@lru_cache(maxsize=16)
def _payload(code: bytes) -> str | None:
    """The compiled bootstrap as one command-line argument, if it fits in one."""
    payload = binascii.b2a_base64(zlib.compress(code, 9), newline=False).decode("ascii")
    return payload if len(payload) <= MAX_PAYLOAD_CHARS else None


def _memory_file(code: bytes) -> int | None:
    """A memory file holding ``code``, for one child (None where there are none)."""
    try:
        fd = os.memfd_create("psych-sandbox-bootstrap", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        return None
    try:
        _write_all(fd, code)
    except OSError:
        os.close(fd)
        return None
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


#: The bootstrap's modules, in the order they are assembled: their top-level code runs in this
#: order when the child starts (what one defines at load, a later one may use at load), and
#: the entry point, which calls main, comes last. The one place the order is named.
PARTS = (
    "header",
    "json_codec",
    "channel",
    "tool_calls",
    "probe",
    "resource_limits",
    "compiling",
    "tracebacks",
    "running",
    "command",
    "inputs",
    "artifacts",
    "containment",
    "late_terms",
    "pid_init",
    "output",
    "idle",
    "site_paths",
    "entry",
)
_DOCSTRING = '"""'


def assemble(parts: Iterable[tuple[str, str]]) -> str:
    """One source from the bootstrap's modules, as (name, text) in order: the first whole (its
    docstring is the source's), each other after a line naming it, without its docstring."""
    texts: list[str] = []
    for name, text in parts:
        if texts:
            if text.startswith(_DOCSTRING):
                text = text[text.index(_DOCSTRING, 3) + 3 :].lstrip("\n")
            text = f"\n\n# {'-' * 66} {name}.py\n\n{text}"
        texts.append(text)
    return "".join(texts)


@lru_cache(maxsize=1)
def bootstrap_source() -> str:
    """The child-side bootstrap, passed to the interpreter as ``-c`` source."""
    folder = resources.files(__package__)
    return assemble(
        (name, folder.joinpath(f"{name}.py").read_text(encoding="utf-8")) for name in PARTS
    )


def bootstrap_module() -> types.ModuleType:
    """The bootstrap's source run as a new module of this process, without its entry point
    (its name is not ``__main__``): the child's functions and constants, for tests."""
    module = types.ModuleType("bootstrap")
    exec(compile(bootstrap_source(), "<bootstrap>", "exec", dont_inherit=True), module.__dict__)
    return module
