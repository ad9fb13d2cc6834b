"""What the caller gives a child to run, as one frozen value checked before anything starts.

A :class:`Program` is the program's text or a command, the files placed in its workspace, the
caller's preamble and variables, and whether its variables come back. ``Sandbox.run`` and
``Sandbox.exec`` build it once; it is carried unchanged, through the execution's plan and
the conversation's terms, to :meth:`Program.run_frame`, the one function that makes the run
frame. Everything here is the caller's: a violation raises InvalidRequestError (or TypeError
and ValueError for variables), the caller's mistake, never a failure of the program.

Command mode: a command runs where a program would (the same child, containment, limits,
grades and output caps); the bootstrap, once graded, starts it as its own child and reports
its exit status (see child/command.py's run_command and docs/command-mode.md).

Inputs: the child writes them into its fresh workspace itself, before the program or command
starts (see child/inputs.py's write_inputs): they are then the child's own files on every backend,
remote ones included (they travel in the run frame over the channel the service relays),
owned as the child's identity, held to the workspace's own size cap, and the host never
writes into a directory the child may have touched, so no link there can lead the host
anywhere. They are read once, within MAX_INPUT_BYTES; what an execution's limits and backend
allow of them is checked per execution (:meth:`Program.check_inputs`).
"""

from __future__ import annotations

import base64
import json
import keyword
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

from .._bindings.catalogue import NAMESPACE_NAMES
from ..errors import InvalidRequestError
from ..protocol.frames import (
    ArtifactRequest,
    CatalogueEntry,
    ChildLimits,
    CommandSpec,
    InputFile,
    RunFrame,
)
from ..protocol.limits import (
    MAX_COMMAND_ARGS,
    MAX_COMMAND_CHARS,
    MAX_INPUT_BYTES,
    MAX_INPUT_NAME_CHARS,
    MAX_INPUTS,
)

#: What one input may be: its bytes, or the path of a host file to read them from.
InputSource = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]"]
Inputs = Mapping[str, InputSource]


@dataclass(frozen=True)
class Program:
    """One program (or command) as the caller gave it, checked (see the module)."""

    #: The program's text ("" for a command).
    source: str = ""
    #: Command mode: run this instead of a program.
    command: CommandSpec | None = None
    #: Files the child places in its workspace before the program starts.
    inputs: tuple[InputFile, ...] = ()
    #: Code run ahead of the program in its namespace (Sandbox.run's ``preamble``).
    preamble: str | None = None
    #: Names given to the program as a JSON object's text (Sandbox.run's ``variables``).
    variables_json: str | None = None
    #: Hand back the program's global names that hold JSON data (``result.variables``).
    keep_variables: bool = False

    @property
    def what(self) -> str:
        """What a result's messages call it: "program" or "command"."""
        return "program" if self.command is None else "command"

    @property
    def caller_chars(self) -> int:
        """The characters of the caller's own text sent beside the source (preamble and
        variables), which count toward the program size limit."""
        return len(self.preamble or "") + len(self.variables_json or "")

    def check_inputs(self, *, file_size_bytes: int | None, workspace_bytes: int | None) -> None:
        """Raise InvalidRequestError unless each input is within the execution's file-size
        limit and all of them together within MAX_INPUT_BYTES and the backend's workspace
        cap."""
        budget = MAX_INPUT_BYTES
        if workspace_bytes is not None:
            budget = min(budget, workspace_bytes)
        total = 0
        for given in self.inputs:
            size = _decoded_size(given.data)
            if size > budget - total:
                raise InvalidRequestError(
                    f"input {given.name!r} does not fit: inputs hold at most {budget} bytes "
                    "together"
                )
            if file_size_bytes is not None and size > file_size_bytes:
                raise InvalidRequestError(
                    f"input {given.name!r} is {size} bytes, over the file-size limit of "
                    f"{file_size_bytes} bytes"
                )
            total += size

    def run_frame(
        self,
        *,
        tools: list[str],
        catalogue: list[CatalogueEntry] | None,
        limits: ChildLimits,
        artifacts: ArtifactRequest | None,
        end_marker: str | None,
    ) -> RunFrame:
        """The run frame that gives this program to a graded child, with the execution's
        tools, limits, artifact request and end marker."""
        return RunFrame(
            source=self.source,
            command=self.command,
            inputs=list(self.inputs) or None,
            tools=tools,
            catalogue=catalogue,
            limits=limits,
            artifacts=artifacts,
            end_marker=end_marker,
            preamble=self.preamble,
            variables_json=self.variables_json,
            keep_variables=self.keep_variables,
        )


def python_program(
    source: str,
    *,
    inputs: Inputs | None = None,
    preamble: str | None = None,
    variables: Mapping[str, Any] | None = None,
    keep_variables: bool = False,
) -> Program:
    """A Python program: ``source`` with the caller's preamble, variables and inputs, checked
    (TypeError, ValueError or UnicodeEncodeError for the caller's mistakes, then
    InvalidRequestError for its inputs: see input_files, which reads them)."""
    if not isinstance(source, str):
        raise TypeError("source must be a str")
    if preamble is not None and not isinstance(preamble, str):
        raise TypeError("preamble must be a str")
    variables_json = None if variables is None else given_variables(variables)
    for given in (preamble, variables_json):
        # The caller's text, not the model's: a lone surrogate is a mistake said at once
        # (UnicodeEncodeError), where the program's own is refused on the result.
        if given is not None:
            given.encode("utf-8")
    return Program(
        source=source,
        inputs=input_files(inputs),
        preamble=preamble,
        variables_json=variables_json,
        keep_variables=keep_variables,
    )


def command_program(
    command: str | Sequence[str], *, shell: bool = False, inputs: Inputs | None = None
) -> Program:
    """A command run where a program would (see command_spec), with its inputs (read: see
    input_files). Raises InvalidRequestError."""
    spec = command_spec(command, shell=shell)
    return Program(command=spec, inputs=input_files(inputs))


def given_variables(variables: Mapping[str, Any]) -> str:
    """``variables`` as the JSON object text a run frame carries; raises TypeError or
    ValueError for a name that is not a plain identifier (or is the namespace's own, or
    starts with "_") or a value that is not JSON data: the caller's mistake, said at once."""
    for name in variables:
        if (
            not isinstance(name, str)
            or not name.isidentifier()
            or keyword.iskeyword(name)
            or name.startswith("_")
            or name in NAMESPACE_NAMES
        ):
            raise ValueError(f"variables: {name!r} cannot be given to a program as a name")
    try:
        return json.dumps(dict(variables), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"variables must be JSON data: {exc}") from None


def command_spec(command: str | Sequence[str], *, shell: bool = False) -> CommandSpec:
    """The run frame's form of ``command``: an argument vector run without a shell, or, only
    when ``shell`` is true, one string run by ``/bin/sh -c``. Raises InvalidRequestError."""
    if shell:
        if not isinstance(command, str):
            raise InvalidRequestError("with shell=True the command is one string")
        argv = [command]
    else:
        if isinstance(command, (str, bytes)):
            # A string is not split here: that is a shell's job, asked for explicitly.
            raise InvalidRequestError(
                "a command is a list of arguments; pass shell=True to run a string with /bin/sh"
            )
        argv = list(command)
        if not argv:
            raise InvalidRequestError("a command needs at least the program to run")
        if len(argv) > MAX_COMMAND_ARGS:
            raise InvalidRequestError(f"a command has at most {MAX_COMMAND_ARGS} arguments")
        if not all(isinstance(argument, str) for argument in argv):
            raise InvalidRequestError("every argument of a command is a str")
        if not argv[0]:
            raise InvalidRequestError("a command's program name is empty")
    if any("\0" in argument for argument in argv):
        # execve takes C strings: a NUL would silently cut the argument.
        raise InvalidRequestError("a command's arguments cannot contain NUL")
    if sum(len(argument) for argument in argv) > MAX_COMMAND_CHARS:
        raise InvalidRequestError(f"a command has at most {MAX_COMMAND_CHARS} characters in all")
    try:
        "".join(argv).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequestError("a command's arguments are not valid Unicode") from None
    return CommandSpec(argv=argv, shell=shell)


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


def input_files(inputs: Inputs | None) -> tuple[InputFile, ...]:
    """The run frame's inputs: every name checked, every path read (blocking: call it off the
    event loop), all of them together within MAX_INPUT_BYTES (what an execution allows of
    them is :meth:`Program.check_inputs`'s). Raises InvalidRequestError."""
    if not inputs:
        return ()
    if not isinstance(inputs, Mapping):
        raise InvalidRequestError("inputs is a mapping of file name to bytes or a path")
    if len(inputs) > MAX_INPUTS:
        raise InvalidRequestError(f"at most {MAX_INPUTS} input files, not {len(inputs)}")
    files: list[InputFile] = []
    total = 0
    for name, source in inputs.items():
        check_name(name)
        room = MAX_INPUT_BYTES - total
        data = _contents(name, source, room)
        if len(data) > room:
            raise InvalidRequestError(
                f"input {name!r} does not fit: inputs hold at most {MAX_INPUT_BYTES} bytes together"
            )
        total += len(data)
        files.append(InputFile(name=name, data=base64.b64encode(data).decode("ascii")))
    return tuple(files)


def _decoded_size(data: str) -> int:
    """The number of bytes a padded base64 text of ours decodes to."""
    return len(data) // 4 * 3 - data[-2:].count("=")


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
