"""Command mode: what a command is, checked before anything starts.

A command runs where a program would (the same child, containment, limits, grades and output
caps): the bootstrap, once graded, starts it as its own child and reports its exit status
(see bootstrap.run_command and docs/command-mode.md). Here the caller's command is checked and
put in the run frame's shape; a command no child could run raises InvalidRequestError.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InvalidRequestError
from ..protocol.frames import CommandSpec
from ..protocol.limits import MAX_COMMAND_ARGS, MAX_COMMAND_CHARS


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
