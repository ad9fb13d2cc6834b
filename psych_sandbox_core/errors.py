"""Exceptions raised by psych-sandbox, and the closed set of failure kinds.

Only misuse of the API and impossible configuration raise. A program's failure is never
an exception: it is an :class:`ExecutionError` carried as data on the result.

Exception tree::

    SandboxError
    ├── ConfigurationError          impossible or invalid configuration, found at load
    │   ├── UnknownProfileError     a profile name nothing is registered under
    │   ├── UnknownBackendError     a backend id no installed plugin provides
    │   └── InterpreterNotFoundError  an interpreter that cannot be resolved
    ├── SandboxClosedError          run() called after close()
    ├── InvalidRequestError         a run's own arguments no execution can take (a command,
    │                               inputs=: names, sizes, count); also a ValueError
    └── ProtocolViolation           internal: a child broke the wire protocol
                                    (never escapes the host; becomes protocol_error)
"""

from __future__ import annotations

import enum


class SandboxError(Exception):
    """Root of every exception psych-sandbox raises."""


class ConfigurationError(SandboxError):
    """Configuration that can never work; raised when it is loaded, not at the first run."""


class UnknownProfileError(ConfigurationError):
    """A profile name nothing is registered under."""


class UnknownBackendError(ConfigurationError):
    """A backend id that no installed plugin provides."""


class InterpreterNotFoundError(ConfigurationError):
    """The configured interpreter cannot be resolved to an absolute, runnable path."""


class SandboxClosedError(SandboxError):
    """The sandbox was used after it was closed."""


class InvalidRequestError(SandboxError, ValueError):
    """A call's own arguments that no execution can take: a command or files given to the
    run (inputs=). Raised by the call, before anything starts; the caller's mistake."""


class ProtocolViolation(SandboxError):
    """The child sent something the protocol does not allow. Never escapes the host."""


class ErrorKind(str, enum.Enum):
    """Why an execution failed. A closed set: a model can branch on it."""

    # What the program did.
    EXCEPTION = "exception"
    TIMEOUT = "timeout"
    ABORT = "abort"
    WORKER_EXIT = "worker_exit"
    INVALID_OUTPUT = "invalid_output"
    OUTPUT_LIMIT = "output_limit"
    MEMORY_LIMIT = "memory_limit"
    PROTOCOL_ERROR = "protocol_error"
    #: The program text itself was refused before anything ran (too large to send, or not
    #: valid Unicode).
    PROGRAM_REJECTED = "program_rejected"
    # What the deployment could not do for it.
    ISOLATION_UNAVAILABLE = "isolation_unavailable"
    NETWORK_NOT_ALLOWED = "network_not_allowed"
    BACKEND_NOT_READY = "backend_not_ready"
    POLICY_REFUSED = "policy_refused"
    CANCELLED = "cancelled"
    PROVIDER_ERROR = "provider_error"
    ARTIFACTS_UNAVAILABLE = "artifacts_unavailable"
    # What a remote service did (never retried: see docs/remote.md).
    REMOTE_TIMEOUT = "remote_timeout"
    REMOTE_DISCONNECTED = "remote_disconnected"
    REMOTE_MALFORMED = "remote_malformed"
    REMOTE_ERROR = "remote_error"


_NOT_YOUR_PROGRAM = (
    "The program was never the problem: this is a limit of the deployment, not of your code. "
    "Do not rewrite the program to work around it."
)

GUIDANCE: dict[ErrorKind, str] = {
    ErrorKind.EXCEPTION: (
        "Your program raised an exception. Read the traceback: its line numbers are lines of "
        "your program. Fix the cause and run it again."
    ),
    ErrorKind.TIMEOUT: (
        "Your program ran out of time (CPU or wall clock). Make it do less work, avoid "
        "unbounded loops, or process the data in smaller pieces."
    ),
    ErrorKind.ABORT: (
        "Your program aborted (SIGABRT): os.abort(), or a failed assertion inside native code "
        "such as a C extension. Avoid the call that aborts, or check its inputs first."
    ),
    ErrorKind.WORKER_EXIT: (
        "The process running your program exited abruptly (for example os._exit, a signal, or "
        "a crash in native code). Avoid exiting the interpreter; return a value instead."
    ),
    ErrorKind.INVALID_OUTPUT: (
        "Your program's return value could not be sent back. Return only JSON-serialisable data "
        "(dict, list, str, int, float, bool, None)."
    ),
    ErrorKind.OUTPUT_LIMIT: (
        "Your program produced more output than is allowed. Print or return a summary "
        "instead of the whole data."
    ),
    ErrorKind.MEMORY_LIMIT: (
        "Your program used more memory than is allowed. Process the data in smaller pieces or "
        "use less memory-hungry structures."
    ),
    ErrorKind.PROTOCOL_ERROR: (
        "Your program interfered with the sandbox's private control channel, so the execution "
        "was ended. Do not read or write the sandbox's file descriptors."
    ),
    ErrorKind.PROGRAM_REJECTED: (
        "Your program was not run: its text was refused before it started (see the message: "
        "too large, or not valid Unicode). Send a shorter program; fetch large data through "
        "the tools you were given instead of writing it into the program."
    ),
    ErrorKind.ISOLATION_UNAVAILABLE: (
        "The sandbox could not provide the isolation this execution requires, so it did not "
        "run (or its output was withheld). " + _NOT_YOUR_PROGRAM
    ),
    ErrorKind.NETWORK_NOT_ALLOWED: (
        "Network access was requested but is not allowed here, so the program did not run. "
        "Fetch data through the tools you were given instead. " + _NOT_YOUR_PROGRAM
    ),
    ErrorKind.BACKEND_NOT_READY: (
        "The sandbox backend is not ready on this host (not installed or not working). "
        + _NOT_YOUR_PROGRAM
    ),
    ErrorKind.POLICY_REFUSED: ("Policy does not allow this execution. " + _NOT_YOUR_PROGRAM),
    ErrorKind.CANCELLED: (
        "The execution was cancelled from outside before it finished. " + _NOT_YOUR_PROGRAM
    ),
    ErrorKind.PROVIDER_ERROR: (
        "A provider this execution depends on failed: the remote execution service, or the "
        "provider of the tools a program may call (listing them failed). " + _NOT_YOUR_PROGRAM
    ),
    ErrorKind.ARTIFACTS_UNAVAILABLE: (
        "Output had to be preserved but no storage was available to preserve it, so the "
        "result was not returned. " + _NOT_YOUR_PROGRAM
    ),
    ErrorKind.REMOTE_TIMEOUT: (
        "The remote sandbox service stopped answering, so the execution was ended; it was not "
        "run again. If the program may have had effects through its tools, check before "
        "running it again. " + _NOT_YOUR_PROGRAM
    ),
    ErrorKind.REMOTE_DISCONNECTED: (
        "The connection to the remote sandbox service was lost or refused, so the execution "
        "was ended; it was not run again. If the program may have had effects through its "
        "tools, check before running it again. " + _NOT_YOUR_PROGRAM
    ),
    ErrorKind.REMOTE_MALFORMED: (
        "The remote sandbox service answered with something the protocol does not allow (or "
        "more than its ceilings), so its answer was discarded; it was not run again. "
        + _NOT_YOUR_PROGRAM
    ),
    ErrorKind.REMOTE_ERROR: (
        "The remote sandbox service refused or failed the request (see the message: at "
        "capacity, not authorised, terms it cannot meet); nothing was run again. "
        + _NOT_YOUR_PROGRAM
    ),
}

#: Guidance for kind=exception when the program raised one of these (by type name), where
#: the general advice would mislead.
EXCEPTION_GUIDANCE: dict[str, str] = {
    "NotAwaitedError": (
        "Your program called a tool without `await`, so the tool never ran. Every tool is an "
        "async function: write `result = await tool(...)` (or gather several with "
        "`await asyncio.gather(...)`). The message names the line."
    ),
}

#: Kinds that say something about the deployment rather than the program.
DEPLOYMENT_KINDS = frozenset(
    {
        ErrorKind.ISOLATION_UNAVAILABLE,
        ErrorKind.NETWORK_NOT_ALLOWED,
        ErrorKind.BACKEND_NOT_READY,
        ErrorKind.POLICY_REFUSED,
        ErrorKind.CANCELLED,
        ErrorKind.PROVIDER_ERROR,
        ErrorKind.ARTIFACTS_UNAVAILABLE,
        ErrorKind.REMOTE_TIMEOUT,
        ErrorKind.REMOTE_DISCONNECTED,
        ErrorKind.REMOTE_MALFORMED,
        ErrorKind.REMOTE_ERROR,
    }
)
