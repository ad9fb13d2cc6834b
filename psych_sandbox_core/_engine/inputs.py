"""Files given to a run (``inputs=``): checked, read and put in the run frame's shape.

The child writes them into its fresh workspace itself, before the program or command starts
(see bootstrap.write_inputs): they are then the child's own files on every backend, remote
ones included (they travel in the run frame over the channel the service relays), owned as
the child's identity, held to the workspace's own size cap, and the host never writes into a
directory the child may have touched, so no link there can lead the host anywhere.

Everything here is the caller's and is checked before anything starts; a violation raises
InvalidRequestError (the caller's mistake, never a failure of the program).
"""

from __future__ import annotations

import base64
import os
import stat
from collections.abc import Mapping
from typing import Union

from ..errors import InvalidRequestError
from ..protocol.frames import InputFile
from ..protocol.limits import MAX_INPUT_BYTES, MAX_INPUT_NAME_CHARS, MAX_INPUTS

#: What one input may be: its bytes, or the path of a host file to read them from.
InputSource = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]"]
Inputs = Mapping[str, InputSource]


def check_name(name: object) -> str:
    """``name`` if it names one file directly in the workspace; InvalidRequestError if not."""
    if not isinstance(name, str):
        raise InvalidRequestError("an input's name is a str")
    if not name or name in (".", ".."):
        raise InvalidRequestError(f"{name!r} cannot name an input file")
    if len(name) > MAX_INPUT_NAME_CHARS or len(name.encode("utf-8", "replace")) > 255:
        raise InvalidRequestError(
            f"an input's name is at most {MAX_INPUT_NAME_CHARS} characters and 255 bytes"
        )
    if "/" in name or "\\" in name or "\0" in name:
        raise InvalidRequestError(f"input name {name!r}: one file name, without separators or NUL")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequestError(f"input name {name!r} is not valid Unicode") from None
    return name


def input_files(
    inputs: Inputs | None, *, file_size_bytes: int | None, workspace_bytes: int | None
) -> tuple[InputFile, ...]:
    """The run frame's inputs: every name checked, every path read (blocking: call it off the
    event loop), each file within the execution's file-size limit and all of them together
    within MAX_INPUT_BYTES and the backend's workspace cap. Raises InvalidRequestError."""
    if not inputs:
        return ()
    if not isinstance(inputs, Mapping):
        raise InvalidRequestError("inputs is a mapping of file name to bytes or a path")
    if len(inputs) > MAX_INPUTS:
        raise InvalidRequestError(f"at most {MAX_INPUTS} input files, not {len(inputs)}")
    budget = MAX_INPUT_BYTES if workspace_bytes is None else min(MAX_INPUT_BYTES, workspace_bytes)
    files: list[InputFile] = []
    total = 0
    for name, source in inputs.items():
        check_name(name)
        room = budget - total
        data = _contents(name, source, room)
        if len(data) > room:
            raise InvalidRequestError(
                f"input {name!r} does not fit: inputs hold at most {budget} bytes together"
            )
        if file_size_bytes is not None and len(data) > file_size_bytes:
            raise InvalidRequestError(
                f"input {name!r} is {len(data)} bytes, over the file-size limit of "
                f"{file_size_bytes} bytes"
            )
        total += len(data)
        files.append(InputFile(name=name, data=base64.b64encode(data).decode("ascii")))
    return tuple(files)


def _contents(name: str, source: InputSource, cap: int) -> bytes:
    """The bytes of one input, reading a path no further than one byte past ``cap``."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, (str, os.PathLike)):
        try:
            # Without blocking on a FIFO's open: only a regular file is read.
            fd = os.open(source, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            with open(fd, "rb") as file:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise InvalidRequestError(
                        f"input {name!r}: {os.fsdecode(source)!r} is not a regular file"
                    )
                return file.read(cap + 1)
        except OSError as exc:
            raise InvalidRequestError(
                f"input {name!r}: cannot read {os.fsdecode(source)!r}: {exc.strerror}"
            ) from None
    raise InvalidRequestError(f"input {name!r} is bytes or a path, not {type(source).__name__}")
